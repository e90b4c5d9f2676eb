"""Malformed dataset files: every loader refuses them in one line, never with a traceback or
with a graph of wrong numbers (issue 36, items 10-12 and the loader fuzz test).

The fuzz test writes a tiny valid dataset in every supported file format, breaks it one way
(cut short, emptied, a folder in its place, another format under its name, keys removed or
renamed, wrong dtypes and shapes, NaN, out-of-range ids), and checks that the Python loader
raises `GraphError` (its `DatasetError` subclass when the file cannot be read as its format)
and that ``jgrind convert`` prints one ``jgrind: error:`` line, exits 2 and writes nothing.
"""

import gzip
import json
import pickle
import shutil

import numpy as np
import pytest
import scipy.sparse as sp

import jgrind.datasets as D
from jgrind.cli import main
from jgrind.graph import GraphError

from helpers import fails

N, F = 8, 3  # nodes and features of every tiny dataset
RNG = np.random.default_rng(0)
LABELS = np.array([0, 1, 0, 1, 0, 1, 0, 1])
FEATURES = RNG.normal(size=(N, F)).astype(np.float32)
EDGES = np.array([[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6], [6, 7], [7, 0]])


# -- tiny valid datasets, one writer per format: (folder) -> the name `load` takes ---------------
def _gnn_benchmark(d, n=None, classes=3):
    """The tiny graph, or (`n` given) a ring of `n` nodes whose labels cycle through `classes`:
    large enough for 20/30-per-class splits that differ from seed to seed."""
    edges = EDGES if n is None else np.stack([np.arange(n), (np.arange(n) + 1) % n], 1)
    features = FEATURES if n is None else RNG.normal(size=(n, F)).astype(np.float32)
    labels = LABELS if n is None else np.arange(n) % classes
    n = n or N
    adj = sp.csr_matrix((np.ones(len(edges), np.float32), (edges[:, 0], edges[:, 1])),
                        shape=(n, n))
    attr = sp.csr_matrix(features)
    np.savez(d / "g.npz", adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr,
             adj_shape=np.array(adj.shape), attr_data=attr.data, attr_indices=attr.indices,
             attr_indptr=attr.indptr, attr_shape=np.array(attr.shape), labels=labels)
    return f"npz:{d / 'g.npz'}"


def _heterophilous(d, name="squirrel_filtered.npz", splits=3):
    masks = np.zeros((3, splits, N), bool)
    for s in range(splits):
        for role, ids in enumerate(np.split(np.roll(np.arange(N), s), [4, 6])):
            masks[role, s, ids] = True
    with open(d / name, "wb") as fh:  # a handle: savez would add .npz to a bare name
        np.savez(fh, node_features=FEATURES, node_labels=LABELS, edges=EDGES,
                 train_masks=masks[0], val_masks=masks[1], test_masks=masks[2])
    return f"npz:{d / name}"


def _planetoid(d, train=2, known=506, test=4):
    # Planetoid pickles of NumPy arrays (the loader takes dense matrices as well as sparse):
    # `train` nodes, then the 500 validation nodes the format implies, all in allx; `test` more
    # after them, listed in test.index out of order; a ring of edges
    n = known + test
    features = RNG.normal(size=(n, F)).astype(np.float32)
    onehot = np.eye(2, dtype=np.int64)[np.arange(n) % 2]
    ids = known + np.roll(np.arange(test), 1)
    parts = {"x": features[:train], "y": onehot[:train], "allx": features[:known],
             "ally": onehot[:known], "tx": features[ids], "ty": onehot[ids],
             "graph": {i: [(i + 1) % n] for i in range(n)}}
    for part, obj in parts.items():
        (d / f"ind.tiny.{part}").write_bytes(pickle.dumps(obj, protocol=4))
    (d / "ind.tiny.test.index").write_text("".join(f"{i}\n" for i in ids))
    return "planetoid"


def _edgelist(d):
    (d / "edges.txt").write_text("".join(f"{s} {t}\n" for s, t in EDGES))
    np.save(d / "features.npy", FEATURES)
    np.save(d / "labels.npy", LABELS)
    np.savez(d / "masks.npz", train=np.arange(N) < 4, val=np.arange(N) == 4,
             test=np.arange(N) > 4)
    return f"edgelist:{d / 'edges.txt'}"


def _gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


OGB = "ogbn_arxiv/"  # named after an OGB dataset, so its edges are taken as stored, unwarned
OGB_EDGES, OGB_FEATURES, OGB_LABELS = (OGB + f"raw/{f}.csv.gz"
                                       for f in ("edge", "node-feat", "node-label"))
OGB_DATA = OGB + "raw/data.npz"


def _ogb(d):
    d = d / OGB
    _gz(d / "raw/edge.csv.gz", [f"{s},{t}" for s, t in EDGES])
    _gz(d / "raw/node-feat.csv.gz", [",".join(repr(float(v)) for v in r) for r in FEATURES])
    _gz(d / "raw/node-label.csv.gz", [str(v) for v in LABELS])
    _gz(d / "raw/num-node-list.csv.gz", [str(N)])
    for part, ids in zip(("train", "valid", "test"), np.split(np.arange(N), [4, 6])):
        _gz(d / "split/time" / f"{part}.csv.gz", [str(i) for i in ids])
    return f"ogb:{d}"


def _ogb_binary(d, save=np.savez_compressed):
    """OGB's binary layout (ogbn-papers100M's): raw/data.npz and raw/node-label.npz."""
    _ogb(d)
    raw = d / OGB / "raw"
    for f in ("edge", "node-feat", "node-label", "num-node-list"):
        (raw / f"{f}.csv.gz").unlink()
    save(raw / "data.npz", edge_index=EDGES.T.copy(), node_feat=FEATURES,
         num_nodes_list=np.array([N]), num_edges_list=np.array([len(EDGES)]))
    save(raw / "node-label.npz", node_label=LABELS.astype(np.float64)[:, None])
    return f"ogb:{d / OGB}"


def _saved(d):
    from jgrind.graph import from_edges
    g = from_edges(EDGES[:, 0], EDGES[:, 1], FEATURES, LABELS, train_mask=np.arange(N) < 4,
                   val_mask=np.arange(N) == 4, test_mask=np.arange(N) > 4)
    D.save_graph(g, d / "saved")
    return f"npy:{d / 'saved'}"


WRITERS = {"gnn-benchmark": _gnn_benchmark, "heterophilous": _heterophilous,
           "planetoid": _planetoid, "edgelist": _edgelist, "ogb": _ogb,
           "ogb-binary": _ogb_binary, "npy": _saved}


def _load(name, d):
    """`D.load` for the name a writer returned (Planetoid: the built-in loader on `d`)."""
    if name == "planetoid":
        return D.load_planetoid("tiny", d)
    return D.load(name)


# -- ways to break a file ------------------------------------------------------------------------
def cut(rel, keep):
    """Keep the first `keep` bytes of the file (negative: drop the last -keep)."""
    def apply(d):
        data = (d / rel).read_bytes()
        (d / rel).write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    return apply


def replace_with(rel, kind):
    """Another thing under the file's name: empty, a folder, a .npy, text, an .npz, a pickle."""
    def apply(d):
        path = d / rel
        path.unlink()
        if kind == "folder":
            path.mkdir()
            return
        if kind == "npy":
            with open(path, "wb") as fh:
                np.save(fh, np.arange(N))
            return
        if kind == "npz":
            with open(path, "wb") as fh:
                np.savez(fh, something=np.arange(N))
            return
        path.write_bytes({"empty": b"", "text": b"node,label\n0,1\n",
                          "pickle": pickle.dumps([1, 2, 3])}[kind])
    return apply


def edit_npz(rel, change):
    """Rewrite the archive with ``change(arrays)`` applied to its dict of arrays."""
    def apply(d):
        with np.load(d / rel) as z:
            arrays = {k: z[k] for k in z.files}
        change(arrays)
        np.savez(d / rel, **arrays)
    return apply


def drop(key):
    return lambda a: a.pop(key)


def rename(key):
    return lambda a: a.__setitem__(key + "_old", a.pop(key))


def put(key, value):
    """Replace `key` by ``value(old array)``."""
    return lambda a: a.__setitem__(key, value(a[key]))


def edit_text(rel, change, gz=False):
    def apply(d):
        opener = gzip.open if gz else open
        with opener(d / rel, "rt") as f:
            text = f.read()
        with opener(d / rel, "wt") as f:
            f.write(change(text))
    return apply


def edit_pickle(rel, change):
    def apply(d):
        obj = pickle.loads((d / rel).read_bytes())
        (d / rel).write_bytes(pickle.dumps(change(obj), protocol=4))
    return apply


def edit_json(rel, change):
    def apply(d):
        meta = json.loads((d / rel).read_text())
        change(meta)
        (d / rel).write_text(json.dumps(meta))
    return apply


def _nan_row(a):
    a = a.astype(np.float32)
    a[1, 0] = np.nan
    return a


def _with_nan(a):
    a = a.astype(np.float64)
    a[1] = np.nan
    return a


def _first(a, value):
    a = a.copy()
    a.flat[0] = value
    return a


def _files_variants(files):
    """Cut short, emptied, a folder or another format in its place: for every file."""
    out = {}
    for rel, other in files:
        out[f"{rel}-cut-start"] = cut(rel, 10)
        out[f"{rel}-cut-middle"] = lambda d, rel=rel: cut(rel, (d / rel).stat().st_size // 2)(d)
        out[f"{rel}-cut-end"] = cut(rel, -3)
        out[f"{rel}-empty"] = replace_with(rel, "empty")
        out[f"{rel}-folder"] = replace_with(rel, "folder")
        out[f"{rel}-is-{other}"] = replace_with(rel, other)
    return out


GNN = "g.npz"
HET = "squirrel_filtered.npz"
VARIANTS = {
    "gnn-benchmark": {
        **_files_variants([(GNN, "npy"), (GNN, "text")]),
        "npz-of-another-graph": replace_with(GNN, "npz"),
        "no-labels": edit_npz(GNN, drop("labels")),
        "no-adj-indices": edit_npz(GNN, drop("adj_indices")),
        "no-attributes": edit_npz(GNN, lambda a: [a.pop(k) for k in list(a)
                                                  if k.startswith("attr_")]),
        "adj-indptr-renamed": edit_npz(GNN, rename("adj_indptr")),
        "labels-renamed": edit_npz(GNN, rename("labels")),
        "labels-float": edit_npz(GNN, put("labels", lambda x: x.astype(float))),
        "labels-nan": edit_npz(GNN, put("labels", _with_nan)),
        "labels-text": edit_npz(GNN, put("labels", lambda x: x.astype(str))),
        "labels-objects": edit_npz(GNN, put("labels", lambda x: x.astype(object))),
        "labels-too-few": edit_npz(GNN, put("labels", lambda x: x[:-1])),
        "labels-2d": edit_npz(GNN, put("labels", lambda x: np.stack([x, x], 1))),
        "labels-huge-id": edit_npz(GNN, put("labels", lambda x: _first(x, 10**12))),
        "labels-below-minus-one": edit_npz(GNN, put("labels", lambda x: _first(x, -5))),
        "adj-id-out-of-range": edit_npz(GNN, put("adj_indices", lambda x: _first(x, N + 5))),
        "adj-id-negative": edit_npz(GNN, put("adj_indices", lambda x: _first(x, -1))),
        "adj-indptr-decreasing": edit_npz(GNN, put("adj_indptr", lambda x: x[::-1].copy())),
        "adj-shape-not-square": edit_npz(GNN, put("adj_shape", lambda x: np.array([N, N + 1]))),
        "adj-shape-three-numbers": edit_npz(GNN, put("adj_shape", lambda x: np.array([N] * 3))),
        "adj-data-text": edit_npz(GNN, put("adj_data", lambda x: x.astype(str))),
        "attr-shape-huge": edit_npz(GNN, put("attr_shape", lambda x: np.array([N, 2**40]))),
        "attr-rows-wrong": edit_npz(GNN, put("attr_shape", lambda x: np.array([N + 1, F]))),
        "attr-nan": edit_npz(GNN, put("attr_data", lambda x: _first(x.copy(), np.nan))),
        "attr-text": edit_npz(GNN, put("attr_data", lambda x: x.astype(str))),
    },
    "heterophilous": {
        **_files_variants([(HET, "npy"), (HET, "text")]),
        "no-edges": edit_npz(HET, drop("edges")),
        "no-node-labels": edit_npz(HET, drop("node_labels")),
        "no-test-masks": edit_npz(HET, drop("test_masks")),
        "node-features-renamed": edit_npz(HET, rename("node_features")),
        "edges-three-columns": edit_npz(HET, put("edges", lambda x: np.hstack([x, x[:, :1]]))),
        "edges-float": edit_npz(HET, put("edges", lambda x: x + 0.5)),
        "edges-out-of-range": edit_npz(HET, put("edges", lambda x: _first(x, N + 3))),
        "edges-negative": edit_npz(HET, put("edges", lambda x: _first(x, -2))),
        "labels-float": edit_npz(HET, put("node_labels", lambda x: x + 0.5)),
        "labels-2d": edit_npz(HET, put("node_labels", lambda x: x[:, None])),
        "labels-huge-id": edit_npz(HET, put("node_labels", lambda x: _first(x, 10**12))),
        "features-nan": edit_npz(HET, put("node_features", _nan_row)),
        "features-1d": edit_npz(HET, put("node_features", lambda x: x[:, 0])),
        "features-rows-wrong": edit_npz(HET, put("node_features", lambda x: x[:-1])),
        "features-text": edit_npz(HET, put("node_features", lambda x: x.astype(str))),
        "masks-float": edit_npz(HET, put("train_masks", lambda x: x * 0.5)),
        "masks-wrong-length": edit_npz(HET, put("val_masks", lambda x: x[:, :-1])),
        "masks-splits-disagree": edit_npz(HET, put("test_masks", lambda x: x[:-1])),
        "masks-overlap": edit_npz(HET, put("val_masks", lambda x: x | True)),
    },
    "planetoid": {
        **_files_variants([("ind.tiny.allx", "npz"), ("ind.tiny.graph", "text")]),
        "ty-cut-middle": lambda d: cut("ind.tiny.ty", (d / "ind.tiny.ty").stat().st_size // 2)(d),
        "test-index-empty": replace_with("ind.tiny.test.index", "empty"),
        "test-index-folder": replace_with("ind.tiny.test.index", "folder"),
        "test-index-text": edit_text("ind.tiny.test.index", lambda t: "seven\n" + t),
        "test-index-negative": edit_text("ind.tiny.test.index", lambda t: "-" + t),
        "graph-not-a-dict": edit_pickle("ind.tiny.graph", lambda g: list(g.values())),
        "graph-id-out-of-range": edit_pickle("ind.tiny.graph", lambda g: {**g, 0: [999]}),
        "allx-nan": edit_pickle("ind.tiny.allx", _nan_row),
        "allx-1d": edit_pickle("ind.tiny.allx", lambda x: x[:, 0]),
        "ally-rows-wrong": edit_pickle("ind.tiny.ally", lambda y: y[:-1]),
        "ty-not-a-matrix": edit_pickle("ind.tiny.ty", lambda y: "labels"),
        "tx-features-wrong": edit_pickle("ind.tiny.tx", lambda x: x[:, :-1]),
    },
    "edgelist": {
        **_files_variants([("features.npy", "text"), ("labels.npy", "npz"),
                           ("masks.npz", "npy")]),
        "edges-folder": replace_with("edges.txt", "folder"),
        "edges-binary": replace_with("edges.txt", "npy"),
        "edges-three-values": edit_text("edges.txt", lambda t: t + "1 2 3\n"),
        "edges-out-of-range": edit_text("edges.txt", lambda t: t + f"0 {N}\n"),
        "edges-negative": edit_text("edges.txt", lambda t: t + "-1 2\n"),
        "edges-fraction": edit_text("edges.txt", lambda t: t + "1.5 2\n"),
        "edges-word": edit_text("edges.txt", lambda t: t + "a b\n"),
        "features-nan": lambda d: np.save(d / "features.npy", _nan_row(FEATURES)),
        "features-1d": lambda d: np.save(d / "features.npy", FEATURES[:, 0]),
        "features-text": lambda d: np.save(d / "features.npy", FEATURES.astype(str)),
        "labels-fraction": lambda d: np.save(d / "labels.npy", LABELS + 0.5),
        "labels-rows-wrong": lambda d: np.save(d / "labels.npy", LABELS[:-1]),
        "labels-objects": lambda d: np.save(d / "labels.npy", LABELS.astype(object)),
        "masks-no-train": edit_npz("masks.npz", drop("train")),
        "masks-wrong-length": edit_npz("masks.npz", put("val", lambda x: x[:-1])),
        "masks-id-out-of-range": edit_npz("masks.npz", put("test", lambda x: np.array([N]))),
        "masks-float": edit_npz("masks.npz", put("train", lambda x: x * 0.5)),
    },
    "ogb": {
        **_files_variants([(OGB_EDGES, "text"), (OGB_FEATURES, "npy")]),
        "labels-cut-middle": lambda d: cut(OGB_LABELS,
                                           (d / OGB_LABELS).stat().st_size // 2)(d),
        "no-edges": lambda d: (d / OGB_EDGES).unlink(),
        "no-split": lambda d: shutil.rmtree(d / OGB / "split"),
        "edge-out-of-range": edit_text(OGB_EDGES, lambda t: t + f"0,{N}\n", gz=True),
        "edge-negative": edit_text(OGB_EDGES, lambda t: t + "-1,0\n", gz=True),
        "edge-three-values": edit_text(OGB_EDGES, lambda t: t + "0,1,2\n", gz=True),
        "feature-nan": edit_text(OGB_FEATURES, lambda t: "nan" + t[t.index(","):], gz=True),
        "feature-ragged": edit_text(OGB_FEATURES, lambda t: t.replace("\n", ",1.0\n", 1),
                                    gz=True),
        "feature-rows-wrong": edit_text(OGB_FEATURES, lambda t: t.split("\n", 1)[1], gz=True),
        "label-fraction": edit_text(OGB_LABELS, lambda t: "0.5\n" + t[2:], gz=True),
        "label-word": edit_text(OGB_LABELS, lambda t: "cat\n" + t[2:], gz=True),
        "labels-rows-wrong": edit_text(OGB_LABELS, lambda t: t[2:], gz=True),
        "split-id-out-of-range": edit_text(OGB + "split/time/test.csv.gz",
                                           lambda t: t + f"{N + 1}\n", gz=True),
        "node-count-wrong": edit_text(OGB + "raw/num-node-list.csv.gz", lambda t: "3\n", gz=True),
    },
    "ogb-binary": {
        **_files_variants([(OGB_DATA, "npy"), (OGB + "raw/node-label.npz", "text")]),
        "stored-data-cut-end": lambda d: (_ogb_binary(d, np.savez), cut(OGB_DATA, -40)(d)),
        "no-edge-index": edit_npz(OGB_DATA, drop("edge_index")),
        "node-feat-renamed": edit_npz(OGB_DATA, rename("node_feat")),
        "edge-index-three-rows": edit_npz(OGB_DATA, put("edge_index", lambda x: np.vstack(
            [x, x[:1]]))),
        "edge-index-float": edit_npz(OGB_DATA, put("edge_index", lambda x: x + 0.5)),
        "edge-index-out-of-range": edit_npz(OGB_DATA, put("edge_index",
                                                          lambda x: _first(x, N + 2))),
        "edge-index-negative": edit_npz(OGB_DATA, put("edge_index", lambda x: _first(x, -1))),
        "node-feat-1d": edit_npz(OGB_DATA, put("node_feat", lambda x: x[:, 0])),
        "node-feat-text": edit_npz(OGB_DATA, put("node_feat", lambda x: x.astype(str))),
        "node-feat-nan": edit_npz(OGB_DATA, put("node_feat", _nan_row)),
        "node-feat-objects": edit_npz(OGB_DATA, put("node_feat", lambda x: x.astype(object))),
        "node-count-wrong": edit_npz(OGB_DATA, put("num_nodes_list", lambda x: x + 1)),
        "labels-rows-wrong": edit_npz(OGB + "raw/node-label.npz",
                                      put("node_label", lambda x: x[:-1])),
        "labels-fraction": edit_npz(OGB + "raw/node-label.npz",
                                    put("node_label", lambda x: x + 0.5)),
        "labels-text": edit_npz(OGB + "raw/node-label.npz",
                                put("node_label", lambda x: x.astype(str))),
        "no-node-label": edit_npz(OGB + "raw/node-label.npz", rename("node_label")),
    },
    "npy": {
        **_files_variants([("saved/graph.json", "npz"), ("saved/features.npy", "text"),
                           ("saved/indices.npy", "npz")]),
        "json-not-an-object": lambda d: (d / "saved/graph.json").write_text("[1, 2]"),
        "json-no-arrays": edit_json("saved/graph.json", lambda m: m.pop("arrays")),
        "json-other-version": edit_json("saved/graph.json", lambda m: m.update(version=99)),
        "json-wrong-shape": edit_json("saved/graph.json", lambda m: m["arrays"]["features"]
                                      .update(shape=[N, F + 1])),
        "labels-other-dtype": lambda d: np.save(d / "saved/labels.npy",
                                                LABELS.astype(np.float64)),
        "indices-out-of-range": lambda d: np.save(
            d / "saved/indices.npy", _first(np.load(d / "saved/indices.npy"), N + 4)),
        "features-nan": lambda d: np.save(d / "saved/features.npy", _nan_row(FEATURES)),
        "masks-overlap": lambda d: np.save(d / "saved/val_mask.npy",
                                           np.ones((1, N), bool)),
        "no-indptr": lambda d: (d / "saved/indptr.npy").unlink(),
    },
}
CASES = [(fmt, variant) for fmt, variants in VARIANTS.items() for variant in variants]


@pytest.mark.parametrize("fmt", WRITERS)
def test_every_tiny_dataset_loads_unbroken(tmp_path, fmt):
    """The fuzz test's starting point: each variant below breaks a file that loads."""
    g = _load(WRITERS[fmt](tmp_path), tmp_path)
    assert g.num_nodes == (510 if fmt == "planetoid" else N) and g.num_features == F


@pytest.mark.parametrize("fmt, variant", CASES, ids=[f"{f}:{v}" for f, v in CASES])
def test_malformed_file_is_one_error_line(tmp_path, capsys, fmt, variant):
    name = WRITERS[fmt](tmp_path)
    VARIANTS[fmt][variant](tmp_path)
    with pytest.raises(GraphError) as err:
        _load(name, tmp_path)
    message = str(err.value)
    assert "\n" not in message and "Traceback" not in message
    assert "allow_pickle" not in message  # never the advice to unpickle untrusted data
    if fmt == "planetoid":  # the built-in names read the data root: the loader is enough
        return
    out = tmp_path / "converted"
    assert main(["convert", "--dataset", name, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err_line = captured.err.strip()
    assert err_line.startswith("jgrind: error:") and "\n" not in err_line, err_line
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch


# -- item 10: each reported fault, one line ------------------------------------------------------
@pytest.mark.parametrize("file_name", ["array.npy", "array.npz"])
def test_npy_file_given_as_npz_is_named_as_one(tmp_path, capsys, file_name):
    np.save(tmp_path / "array.npy", np.arange(5))
    if file_name.endswith(".npz"):
        (tmp_path / "array.npy").rename(tmp_path / file_name)
    with pytest.raises(D.DatasetError, match="single .npy array, not an .npz archive"):
        D.load(f"npz:{tmp_path / file_name}")
    fails(capsys, ["convert", "--dataset", f"npz:{tmp_path / file_name}",
                   "--out", str(tmp_path / "out")], "single .npy array")


def test_text_file_as_npz_is_not_an_archive_and_pickles_are_not_suggested(tmp_path, capsys):
    (tmp_path / "g.npz").write_text("source,target\n0,1\n")
    err = fails(capsys, ["convert", "--dataset", f"npz:{tmp_path / 'g.npz'}",
                         "--out", str(tmp_path / "out")], "not an .npz archive")
    assert "pickle" not in err


def test_float_labels_are_named_as_the_problem(tmp_path):
    _gnn_benchmark(tmp_path)
    edit_npz(GNN, put("labels", lambda x: x.astype(float)))(tmp_path)
    with pytest.raises(D.DatasetError) as err:
        D.load(f"npz:{tmp_path / GNN}")
    assert "'labels' holds float64" in str(err.value)
    assert "do not describe the same nodes" not in str(err.value)


@pytest.mark.parametrize("splits", [0, -2])
def test_splits_below_one_are_refused(tmp_path, capsys, splits):
    name = _gnn_benchmark(tmp_path)
    with pytest.raises(D.DatasetError, match="splits must be a whole number of at least 1"):
        D.load(name, splits=splits)
    out = tmp_path / "run"
    fails(capsys, ["train", "--dataset", name, "--set",
                   f"dataset_options=splits:{splits}", "--epochs", "1",
                   "--no-progress", "--out", str(out)], f"splits={splits}")
    assert not out.exists()


def test_folder_in_place_of_a_builtin_file_is_called_a_folder(tmp_path, capsys, monkeypatch):
    (tmp_path / "gnn-benchmark" / "cora.npz").mkdir(parents=True)
    monkeypatch.setenv("JGRIND_DATA", str(tmp_path))
    with pytest.raises(D.DatasetError, match="is a folder, not the file"):
        D.load("cora-npz")
    err = fails(capsys, ["convert", "--dataset", "cora-npz", "--out",
                         str(tmp_path / "out")], "is a folder")
    assert "missing" not in err


# -- item 11: every heterophilous-graphs file by path --------------------------------------------
@pytest.mark.parametrize("file_name", ["squirrel.npz", "roman_empire.npz",
                                       "chameleon_filtered.npz", "questions"])
def test_heterophilous_file_loads_by_path_under_any_name(tmp_path, file_name):
    g = D.load(_heterophilous(tmp_path, name=file_name, splits=3))
    assert g.num_nodes == N and g.num_splits == 3  # the file's fixed splits, as stored
    with np.load(tmp_path / file_name) as z:
        np.testing.assert_array_equal(g.train_mask, z["train_masks"])
        np.testing.assert_array_equal(g.test_mask, z["test_masks"])


def test_real_heterophilous_file_by_path_matches_its_name(data_file):
    path = data_file("heterophilous/minesweeper.npz")
    by_path, by_name = D.load(f"npz:{path}"), D.load("minesweeper")
    for field in ("indptr", "indices", "features", "labels", "train_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(by_path, field), getattr(by_name, field))
    assert by_path.num_splits == 10


def test_split_options_are_refused_for_a_file_with_fixed_splits(tmp_path):
    with pytest.raises(D.DatasetError, match="heterophilous file.*takes no option 'splits'"):
        D.load(_heterophilous(tmp_path), splits=3)


def test_datasets_command_says_npz_reads_both_formats(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    assert "heterophilous-graphs .npz" in out and "split per seed" in out
    assert "largest_component:true" in out


# -- item 12: a split per seed, and the largest connected component ------------------------------
def _config(name, **settings):
    from jgrind.config import RunConfig
    return RunConfig(dataset=name, **settings)


def test_random_split_format_draws_a_split_per_seed(tmp_path):
    from jgrind.config import load_graph, split_for
    from jgrind.datasets.gnn_benchmark import per_class_split
    name = _gnn_benchmark(tmp_path, n=180)
    cfg = _config(name, seed=5, seeds=3)
    g = load_graph(cfg)
    assert g.num_splits == 3
    for trial in range(3):  # seed 5 + trial trains on the split drawn from it
        assert split_for(cfg, g, trial) == trial
        drawn = per_class_split(g.labels, cfg.seed + trial)
        for mask, own in zip((g.train_mask, g.val_mask, g.test_mask), drawn):
            np.testing.assert_array_equal(mask[trial], own[0])
    assert g.train_mask[0].sum() == 60 and g.val_mask[0].sum() == 90  # 20 and 30 a class
    assert len({g.train_mask[s].tobytes() for s in range(3)}) == 3  # not one split reused


def test_splits_option_keeps_its_meaning(tmp_path):
    from jgrind.config import load_graph
    from jgrind.datasets.gnn_benchmark import per_class_split
    name = _gnn_benchmark(tmp_path, n=180)
    g = load_graph(_config(name, seed=5, seeds=3, dataset_options="splits:2"))
    assert g.num_splits == 2  # N splits drawn from the loader's seed 0, cycled by the seeds
    np.testing.assert_array_equal(g.train_mask, per_class_split(g.labels, 0, 2)[0])


def test_summary_says_split_per_seed(tmp_path, capsys):
    name = _gnn_benchmark(tmp_path, n=180)
    out = tmp_path / "run"
    assert main(["train", "--dataset", name, "--set", "seeds=2", "--set", "hidden=4",
                 "--epochs", "1", "--no-progress", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert "(a random split per seed)" in summary["line"]
    assert summary["splits"] == [0, 1]
    assert "(a random split per seed)" in capsys.readouterr().out


def _two_components(tmp_path):
    """The tiny gnn-benchmark graph plus a 3-node path of other nodes (ids 8-10)."""
    n = N + 3
    edges = np.vstack([EDGES, [[8, 9], [9, 10]]])
    adj = sp.csr_matrix((np.ones(len(edges), np.float32), (edges[:, 0], edges[:, 1])),
                        shape=(n, n))
    attr = sp.csr_matrix(RNG.normal(size=(n, F)).astype(np.float32))
    labels = np.arange(n) % 2
    np.savez(tmp_path / "two.npz", adj_data=adj.data, adj_indices=adj.indices,
             adj_indptr=adj.indptr, adj_shape=np.array(adj.shape), attr_data=attr.data,
             attr_indices=attr.indices, attr_indptr=attr.indptr,
             attr_shape=np.array(attr.shape), labels=labels)
    return f"npz:{tmp_path / 'two.npz'}", attr.toarray()


def test_largest_component_for_gnn_benchmark_draws_splits_on_it(tmp_path):
    from jgrind.config import load_graph
    name, features = _two_components(tmp_path)
    g = load_graph(_config(name, dataset_options="largest_component:true"))
    assert g.num_nodes == N
    np.testing.assert_array_equal(g.features, features[:N])
    # 4 nodes a class on the component: train 20 a class takes them all, none from outside
    assert g.train_mask.sum() == N
    with pytest.raises(D.DatasetError, match="largest_component=1: use true or false"):
        D.load(name, largest_component=1)


def test_largest_component_for_any_graph(tmp_path):
    from jgrind.graph import from_edges
    from jgrind.transforms import largest_connected_component
    # nodes 0, 2, 4 a path; 1, 3 an edge; 5 alone: the largest keeps 0, 2, 4 as 0, 1, 2
    g = from_edges([0, 2, 1], [2, 4, 3], np.arange(12, dtype=np.float32).reshape(6, 2),
                   [0, 1, 0, 1, 0, 1], train_mask=[1, 1, 0, 0, 0, 0],
                   val_mask=[0, 0, 1, 0, 0, 0], test_mask=[0, 0, 0, 1, 1, 1],
                   edge_weight=[1.0, 2.0, 3.0])
    lcc = largest_connected_component(g)
    assert lcc.num_nodes == 3 and lcc.num_edges == 2
    np.testing.assert_array_equal(lcc.features, g.features[[0, 2, 4]])
    np.testing.assert_array_equal(lcc.labels, [0, 0, 0])
    np.testing.assert_array_equal(lcc.train_mask, [[1, 0, 0]])
    np.testing.assert_array_equal(lcc.test_mask, [[0, 0, 1]])
    np.testing.assert_array_equal(lcc.indptr, [0, 0, 1, 2])
    np.testing.assert_array_equal(lcc.indices, [0, 1])
    np.testing.assert_array_equal(lcc.edge_weight, [1.0, 2.0])
    # and from the command line's option, on a format with fixed splits
    name = _heterophilous(tmp_path)
    edit_npz(HET, put("edges", lambda x: x[:-2]))(tmp_path)  # 0-1-...-6 and 7 alone
    h = D.load(name, largest_component=True)
    assert h.num_nodes == N - 1 and h.num_splits == 3


def _edge_list_folder(folder, n=60, masks=False):
    folder.mkdir()
    (folder / "edges.txt").write_text("".join(f"{i} {(i + 1) % n}\n" for i in range(n)))
    np.save(folder / "features.npy", np.eye(n, 4, dtype=np.float32))
    np.save(folder / "labels.npy", np.arange(n) % 3)
    if masks:
        np.savez(folder / "masks.npz", train=np.arange(n) < 30,
                 val=(np.arange(n) >= 30) & (np.arange(n) < 45), test=np.arange(n) >= 45)
    return f"edgelist:{folder / 'edges.txt'}"


def test_an_edge_list_without_masks_draws_a_split_per_seed(tmp_path):
    """An edge list with no masks beside it is a random-split format too: seed s trains on
    the 60/20/20 split drawn from s, not one split for every seed."""
    from jgrind.config import load_graph, split_for
    from jgrind.datasets.edgelist import random_split
    cfg = _config(_edge_list_folder(tmp_path / "g"), seed=2, seeds=3)
    g = load_graph(cfg)
    assert g.num_splits == 3
    for trial in range(3):
        assert split_for(cfg, g, trial) == trial
        for mask, own in zip((g.train_mask, g.val_mask, g.test_mask),
                             random_split(g.labels, seed=cfg.seed + trial)):
            np.testing.assert_array_equal(mask[trial], own[0])
    assert len({g.train_mask[s].tobytes() for s in range(3)}) == 3
    # one seed, the default: the split drawn from seed 0, as before
    assert load_graph(_config(_edge_list_folder(tmp_path / "h"))).num_splits == 1


def test_an_edge_list_with_masks_keeps_them_and_refuses_split_options(tmp_path):
    from jgrind.config import load_graph
    from jgrind.datasets import DatasetError, load
    name = _edge_list_folder(tmp_path / "g", masks=True)
    g = load_graph(_config(name, seeds=3))
    assert g.num_splits == 1 and g.train_mask[0, :30].all() and g.train_mask.sum() == 30
    with pytest.raises(DatasetError, match="has fixed splits"):
        load(name, splits=2)
