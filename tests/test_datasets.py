"""Dataset loaders: real files (skipped without them, see conftest) and tiny synthetic ones."""

import gzip
import pickle
import shutil
from collections import Counter

import numpy as np
import pytest
import scipy.sparse as sp

import jgrind.datasets as D
from jgrind.datasets.edgelist import read_text_table
from jgrind.datasets.gnn_benchmark import per_class_split
from jgrind.graph import GraphError
from jgrind.transforms import coo, is_symmetric
from jgrind.cli import main

PLANETOID = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")


def planetoid_files(name):
    return [f"planetoid/ind.{name}.{p}" for p in PLANETOID]


def assert_undirected_simple(g):
    src, dst = coo(g)
    assert is_symmetric(g)
    assert not np.any(src == dst), "self loops left"
    key = dst.astype(np.int64) * g.num_nodes + src
    assert np.unique(key).size == key.size, "duplicate edges left"


def assert_same_graph(a, b):
    for f in ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)
    assert a.num_classes == b.num_classes


# -- Planetoid -----------------------------------------------------------------------------------
def test_cora_planetoid(data_file):
    data_file(*planetoid_files("cora"))
    g = D.load("cora")
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (2708, 10556, 1433, 7)
    assert (g.train_mask.shape, g.num_splits) == ((1, 2708), 1)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [140, 500, 1000]
    assert_undirected_simple(g)
    np.testing.assert_array_equal(np.bincount(g.labels), [351, 217, 418, 818, 426, 298, 180])
    assert set(np.unique(g.features)) == {0.0, 1.0} and int(g.features.sum()) == 49216
    # Kipf split layout: train 0..139, val 140..639, test = the sorted test.index ids 1708..2707.
    np.testing.assert_array_equal(np.flatnonzero(g.train_mask[0]), np.arange(140))
    np.testing.assert_array_equal(np.flatnonzero(g.val_mask[0]), np.arange(140, 640))
    np.testing.assert_array_equal(np.flatnonzero(g.test_mask[0]), np.arange(1708, 2708))
    t = np.flatnonzero(g.test_mask[0])
    np.testing.assert_array_equal(np.bincount(g.labels[t]), [130, 91, 144, 319, 149, 103, 64])
    # Per-node spot checks: class counts cannot see a wrong reorder inside the test set, these
    # can. test.index starts 2692, 2532, 2050, 1715: row i of tx/ty belongs to those nodes.
    assert g.labels[1708:1720].tolist() == [3, 2, 2, 2, 2, 0, 2, 2, 2, 2, 2, 2]
    assert g.labels[[2692, 2532, 2050, 1715]].tolist() == [3, 1, 6, 2]
    assert (g.features[[2692, 2532, 2050, 1715]] != 0).sum(1).tolist() == [15, 17, 19, 23]
    assert int((t * g.labels[t]).sum()) == 6292630


def test_cora_planetoid_matches_gnn_benchmark_cora(data_file):
    """The two public Cora releases, matched node by node through their (mostly unique) feature
    rows, must have the same edges and labels up to renaming the classes. An independent check
    of the test-node reorder: misplaced rows break the edge or label agreement."""
    data_file(*planetoid_files("cora"), "gnn-benchmark/cora.npz")
    a, b = D.load("cora"), D.load("cora-npz")
    key = lambda g: [r.tobytes() for r in np.packbits(g.features > 0, axis=1)]  # noqa: E731
    ka, kb = key(a), key(b)
    pos = {k: i for i, k in enumerate(kb)}
    counts = Counter(ka)  # rows shared by several nodes cannot be matched; skip them
    match = np.array([pos[k] if counts[k] == 1 and k in pos else -1 for k in ka])
    ok = match >= 0
    assert ok.sum() > 2650
    pairs = set(zip(a.labels[ok].tolist(), b.labels[match[ok]].tolist()))
    assert len(pairs) == len({p[0] for p in pairs}) == len({p[1] for p in pairs}) == 7  # 1:1
    sa, da = coo(a)
    both = ok[sa] & ok[da]
    edges_b = set(zip(*(x.tolist() for x in coo(b))))
    assert both.sum() > 10000
    assert all((int(match[s]), int(match[d])) in edges_b for s, d in zip(sa[both], da[both]))


def test_citeseer_planetoid(data_file):
    data_file(*planetoid_files("citeseer"))
    g = D.load("citeseer")
    assert (g.num_nodes, g.num_features, g.num_classes) == (3327, 3703, 6)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [120, 500, 1000]
    # 4552 undirected edges; the raw dict also holds 124 self loops (each listed twice).
    assert g.num_edges == 4552 * 2
    assert_undirected_simple(g)
    pad = np.flatnonzero(g.labels == -1)
    assert pad.tolist() == [2407, 2489, 2553, 2682, 2781, 2953, 3042, 3063, 3212, 3214, 3250,
                            3292, 3305, 3306, 3309]
    assert not g.features[pad].any()
    assert not (g.train_mask | g.val_mask | g.test_mask)[0, pad].any()
    assert (g.features.sum(1) == 0).sum() == 15  # only the padded rows are empty
    t = np.flatnonzero(g.test_mask[0])
    np.testing.assert_array_equal(np.bincount(g.labels[t]), [77, 182, 181, 231, 169, 160])
    np.testing.assert_array_equal(np.bincount(g.labels[g.labels >= 0]),
                                  [249, 590, 668, 701, 596, 508])
    assert g.labels[[2488, 2644, 3261, 2804]].tolist() == [2, 0, 1, 3]
    assert int((t * g.labels[t]).sum()) == 7670265


def test_row_normalize_features(data_file):
    data_file(*planetoid_files("citeseer"))
    g = D.row_normalize_features(D.load("citeseer"))
    sums = g.features.sum(1)
    assert np.allclose(sums[g.labels >= 0], 1.0, atol=1e-5)
    assert np.all(sums[g.labels < 0] == 0)
    assert g.features.dtype == np.float32


# -- heterophilous -------------------------------------------------------------------------------
@pytest.mark.parametrize("name, nodes, edges, features", [
    ("tolokers", 11758, 1_038_000, 10), ("minesweeper", 10000, 78_804, 7)])
def test_heterophilous(data_file, name, nodes, edges, features):
    data_file(f"heterophilous/{name}.npz")
    g = D.load(name)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (nodes, edges, features, 2)
    assert g.num_splits == 10 and g.train_mask.shape == (10, nodes)
    assert_undirected_simple(g)
    # Every split covers all nodes, 50/25/25.
    cover = g.train_mask.astype(int) + g.val_mask + g.test_mask
    assert np.all(cover == 1)
    assert g.train_mask.sum(1).tolist() == [nodes // 2] * 10


# -- gnn-benchmark npz ---------------------------------------------------------------------------
def test_gnn_benchmark_both_key_spellings(data_file, tmp_path):
    path = data_file("gnn-benchmark/cora.npz")
    g = D.load_gnn_benchmark(path)
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (2708, 10556, 1433, 7)
    assert_undirected_simple(g)
    with np.load(path) as z:
        alt = {k.replace("adj_", "adj_matrix.").replace("attr_", "attr_matrix."): z[k]
               for k in z.files if k != "node_names" and k != "class_names"}
    assert "adj_matrix.indptr" in alt and "attr_matrix.data" in alt
    np.savez(tmp_path / "cora.npz", **alt)
    assert_same_graph(g, D.load_gnn_benchmark(tmp_path / "cora.npz"))
    # Split: 20 / 30 per class, the rest test.
    for c in range(7):
        in_c = g.labels == c
        assert (g.train_mask[0] & in_c).sum() == 20 and (g.val_mask[0] & in_c).sum() == 30
    assert np.all(g.train_mask | g.val_mask | g.test_mask)


def test_gnn_benchmark_splits_are_seeded():
    labels = np.repeat(np.arange(3), [60, 45, 10])
    tr, va, te = per_class_split(labels, seed=5, splits=3)
    assert tr.shape == (3, 115)
    assert np.all(tr.astype(int) + va + te == 1)
    assert [int((tr[0] & (labels == c)).sum()) for c in range(3)] == [20, 20, 10]
    assert [int((va[0] & (labels == c)).sum()) for c in range(3)] == [30, 25, 0]
    assert not np.array_equal(tr[0], tr[1])
    tr2, _, _ = per_class_split(labels, seed=6, splits=1)
    np.testing.assert_array_equal(tr2[0], tr[1])  # split s uses seed + s


def test_gnn_benchmark_without_attributes_is_refused(tmp_path):
    adj = sp.csr_matrix(np.array([[0, 1], [1, 0]], np.float32))
    np.savez(tmp_path / "g.npz", adj_data=adj.data, adj_indices=adj.indices,
             adj_indptr=adj.indptr, adj_shape=np.array(adj.shape), labels=np.array([0, 1]))
    with pytest.raises(D.DatasetError, match="no node attributes"):
        D.load_gnn_benchmark(tmp_path / "g.npz")


# -- OGB raw layout ------------------------------------------------------------------------------
def _write_gz(path, lines):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(line + "\n" for line in lines))


def _tiny_ogb(tmp_path, n=50, name="ogbn_arxiv"):
    rng = np.random.default_rng(0)
    src = rng.integers(0, n, 200)
    dst = rng.integers(0, n, 200)
    feats = rng.normal(size=(n, 4)).astype(np.float32)
    labels = rng.integers(0, 3, n).astype(float)
    labels[7] = np.nan
    d = tmp_path / name
    _write_gz(d / "raw/edge.csv.gz", [f"{s},{t}" for s, t in zip(src, dst)])
    _write_gz(d / "raw/node-feat.csv.gz", [",".join(repr(float(v)) for v in r) for r in feats])
    _write_gz(d / "raw/node-label.csv.gz", ["nan" if np.isnan(v) else str(int(v)) for v in labels])
    _write_gz(d / "raw/num-node-list.csv.gz", [str(n)])
    perm = np.setdiff1d(rng.permutation(n), [7], assume_unique=True)
    parts = np.split(perm, [30, 40])
    for part, ids in zip(("train", "valid", "test"), parts):
        _write_gz(d / "split/time" / f"{part}.csv.gz", [str(i) for i in ids])
    return d, src, dst, feats, labels, parts


def test_ogb_raw_round_trip(tmp_path):
    d, src, dst, feats, labels, parts = _tiny_ogb(tmp_path)
    g = D.load(f"ogb:{d}")
    assert g.name == "ogbn_arxiv" and g.num_nodes == 50 and g.num_classes == 3
    np.testing.assert_array_equal(g.features, feats)
    assert g.labels[7] == -1
    np.testing.assert_array_equal(np.delete(g.labels, 7), np.delete(labels, 7).astype(int))
    # Directed, exactly as stored (duplicates and self loops included).
    gs, gd = coo(g)
    assert sorted(zip(gs.tolist(), gd.tolist())) == sorted(zip(src.tolist(), dst.tolist()))
    for mask, ids in zip((g.train_mask, g.val_mask, g.test_mask), parts):
        np.testing.assert_array_equal(np.flatnonzero(mask[0]), np.sort(ids))
    u = D.load_ogb_raw(d, to_undirected=True)
    assert is_symmetric(u)
    pairs = {(a, b) for a, b in zip(src.tolist(), dst.tolist())}
    assert u.num_edges == len(pairs | {(b, a) for a, b in pairs})


def test_ogb_options_from_the_command_line(tmp_path, capsys):
    """split= and to_undirected= reach the OGB loader from the command line as
    ``--set dataset_options=...``, as the loader's own hint says."""
    from jgrind.cli import main
    d, src, dst, *_ = _tiny_ogb(tmp_path)
    shutil.copytree(d / "split/time", d / "split/random")
    assert main(["convert", "--dataset", f"ogb:{d}", "--out", str(tmp_path / "a")]) == 2
    assert "--set dataset_options=split:NAME" in capsys.readouterr().err
    out = tmp_path / "b"
    assert main(["convert", "--dataset", f"ogb:{d}", "--out", str(out), "--set",
                 "dataset_options=split:random, to_undirected:true"]) == 0
    g = D.load(f"npy:{out}")
    assert is_symmetric(g) and g.num_edges > 0
    pairs = {(a, b) for a, b in zip(src.tolist(), dst.tolist())}
    assert g.num_edges == len(pairs | {(b, a) for a, b in pairs})


def test_generator_options_from_the_run_configuration():
    from jgrind.config import RunConfig, load_graph
    g = load_graph(RunConfig(dataset="rmat", num_nodes=500,
                             dataset_options="num_features:5, num_edges:1000,homophily:0.5"))
    assert (g.num_nodes, g.num_edges, g.num_features) == (500, 1000, 5)


def test_ogb_raw_split_choice_and_errors(tmp_path):
    d, *_ = _tiny_ogb(tmp_path)
    shutil.copytree(d / "split/time", d / "split/random")
    with pytest.raises(D.DatasetError, match="pass split="):
        D.load_ogb_raw(d)
    assert D.load_ogb_raw(d, split="random").train_mask.sum() == 30
    with pytest.raises(D.DatasetError, match="no split folder .*nope"):
        D.load_ogb_raw(d, split="nope")
    _write_gz(d / "raw/edge.csv.gz", ["1,2", "3,4,5"])
    with pytest.raises(D.DatasetError, match=r"edge\.csv\.gz:2: expected 2 values"):
        D.load_ogb_raw(d, split="time")
    (d / "raw/node-label.csv.gz").write_bytes(b"\x1f\x8b garbage")
    _write_gz(d / "raw/edge.csv.gz", ["1,2"])
    with pytest.raises(D.DatasetError, match=r"cannot read .*node-label\.csv\.gz"):
        D.load_ogb_raw(d, split="time")


# -- edge lists ----------------------------------------------------------------------------------
def _tiny_edgelist(tmp_path, text, n=6):
    (tmp_path / "e.txt").write_text(text)
    np.save(tmp_path / "x.npy", np.eye(n, 3, dtype=np.float32))
    np.save(tmp_path / "y.npy", np.arange(n) % 2)
    return tmp_path / "e.txt", tmp_path / "x.npy", tmp_path / "y.npy"


def test_edge_list(tmp_path):
    e, x, y = _tiny_edgelist(tmp_path, "# a comment\n0 1\n1\t2  # trailing\n\n2 2\n3 4\n1 0\n")
    g = D.load_edge_list(e, x, y)
    assert g.name == "e" and g.num_nodes == 6
    assert sorted(zip(*(a.tolist() for a in coo(g)))) == \
        [(0, 1), (1, 0), (1, 2), (2, 1), (3, 4), (4, 3)]
    # Default split: 60/20/20 of the 6 labelled nodes, seed 0, deterministic.
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [4, 1, 1]
    assert_same_graph(g, D.load(f"edgelist:{e}", features_path=x, labels_path=y))
    d = D.load_edge_list(e, x, y, undirected=False)
    assert sorted(zip(*(a.tolist() for a in coo(d)))) == [(0, 1), (1, 0), (1, 2), (2, 2), (3, 4)]


def test_edge_list_masks(tmp_path):
    e, x, y = _tiny_edgelist(tmp_path, "0 1\n")
    np.savez(tmp_path / "m.npz", train=np.array([0, 1]), val_mask=np.eye(6, dtype=bool)[2],
             test=np.array([[3, 4], [4, 5]]))
    g = D.load_edge_list(e, x, y, masks_path=tmp_path / "m.npz")
    assert g.num_splits == 2
    assert np.flatnonzero(g.train_mask[1]).tolist() == [0, 1]
    assert np.flatnonzero(g.val_mask[1]).tolist() == [2]
    assert np.flatnonzero(g.test_mask[1]).tolist() == [4, 5]
    np.savez(tmp_path / "bad.npz", train=np.array([0]), val=np.array([9]), test=np.array([2]))
    with pytest.raises(D.DatasetError, match="node id 9"):
        D.load_edge_list(e, x, y, masks_path=tmp_path / "bad.npz")


def test_edge_list_by_name_reads_the_files_beside_it(tmp_path, capsys):
    """``edgelist:PATH`` alone (all the command line can pass) reads features.npy, labels.npy
    and masks.npz from the edge list's folder; a missing one is named, with what to do."""
    e, x, y = _tiny_edgelist(tmp_path, "0 1\n1 2\n3 4\n")
    x.rename(tmp_path / "features.npy")
    with pytest.raises(D.DatasetError, match=r"labels file .*labels\.npy does not exist; put "
                                             r"features\.npy and labels\.npy"):
        D.load(f"edgelist:{e}")
    y.rename(tmp_path / "labels.npy")
    g = D.load(f"edgelist:{e}")
    assert_same_graph(g, D.load_edge_list(e, tmp_path / "features.npy", tmp_path / "labels.npy"))
    assert g.num_splits == 1                                  # the random split: no masks file
    np.savez(tmp_path / "masks.npz", train=np.array([[0, 1], [2, 3]]), val=np.array([4]),
             test=np.array([5]))
    g = D.load(f"edgelist:{e}")
    assert g.num_splits == 2 and np.flatnonzero(g.train_mask[1]).tolist() == [2, 3]
    with pytest.raises(D.DatasetError, match="both features_path and labels_path, or neither"):
        D.load_edge_list(e, tmp_path / "features.npy")
    # and from the command line, which could not load an edge list before
    out = tmp_path / "saved"
    assert main(["convert", "--dataset", f"edgelist:{e}", "--out", str(out)]) == 0
    assert_same_graph(D.load(f"npy:{out}"), g)
    assert main(["convert", "--dataset", f"edgelist:{tmp_path / 'none.txt'}", "--out",
                 str(tmp_path / "other")]) == 2
    assert "edge list" in capsys.readouterr().err


def test_edge_list_out_of_range_id(tmp_path):
    e, x, y = _tiny_edgelist(tmp_path, "0 1\n1 17\n")
    with pytest.raises(D.DatasetError, match=r"node id 17 .*edge 2.* 6 nodes"):
        D.load_edge_list(e, x, y)


@pytest.mark.parametrize("text, line", [("0 1\n1 x\n", 2), ("0 1\n\n# c\n1 2 3\n4\n", 4),
                                        ("0 1\n2.5 3\n", 2), ("0 1\n1\n", 2)])
def test_edge_list_malformed_line(tmp_path, text, line):
    e, x, y = _tiny_edgelist(tmp_path, text)
    with pytest.raises(D.DatasetError, match=rf"e\.txt:{line}: expected"):
        D.load_edge_list(e, x, y)


@pytest.mark.parametrize("number", ["99999999999999999999", "-99999999999999999999"])
def test_edge_list_number_too_large_for_int64_names_its_line(tmp_path, number):
    """np.fromstring saturates such a number to the int64 limit, which was then reported as an
    out-of-range node id 9223372036854775807."""
    e, x, y = _tiny_edgelist(tmp_path, f"0 1\n\n# c\n1 {number}\n")
    with pytest.raises(D.DatasetError, match=r"e\.txt:4: a number does not fit a 64-bit "
                                             rf"integer, found '1 {number}'"):
        D.load_edge_list(e, x, y)


@pytest.mark.parametrize("content, needle", [
    (b"0 1 2\n3 4 5\n", "it is not a .npy file (it lacks the header np.save writes)"),
    (None, "it holds Python objects, not numbers"),
    (b"truncated", "it is truncated or damaged"),
])
def test_unreadable_npy_is_described_not_called_pickled(tmp_path, content, needle):
    """np.load without pickles blames "pickled data" for any file lacking the .npy header."""
    e, x, y = _tiny_edgelist(tmp_path, "0 1\n")
    if content is None:
        np.save(x, np.array([{}, 1], dtype=object), allow_pickle=True)
    elif content == b"truncated":
        x.write_bytes(x.read_bytes()[:-20])
    else:
        x.write_bytes(content)
    with pytest.raises(D.DatasetError, match="cannot read features file") as err:
        D.load_edge_list(e, x, y)
    assert needle in str(err.value) and "pickled" not in str(err.value)


def test_read_text_table_chunking_and_gzip(tmp_path):
    rng = np.random.default_rng(1)
    a = rng.integers(-5, 10**6, (500, 3))
    text = "\n".join(f"{p}, {q} ,{r}" for p, q, r in a)  # no final newline, spaces around ","
    (tmp_path / "t.csv").write_text(text)
    _write_gz(tmp_path / "t.csv.gz", text.splitlines())
    for path in (tmp_path / "t.csv", tmp_path / "t.csv.gz"):
        for chunk in (7, 64, 1 << 20):
            got = read_text_table(path, delimiter=",", chunk_bytes=chunk)
            np.testing.assert_array_equal(got, a)
    assert read_text_table(tmp_path / "t.csv", delimiter=",").dtype == np.int32
    (tmp_path / "blank.txt").write_text("  \n\n")
    assert read_text_table(tmp_path / "blank.txt", ncols=2).shape == (0, 2)
    (tmp_path / "gaps.csv").write_text("1,2\n\n  \n3,4")
    np.testing.assert_array_equal(read_text_table(tmp_path / "gaps.csv", delimiter=","),
                                  [[1, 2], [3, 4]])


@pytest.mark.parametrize("text, line", [
    ("1,2\n3,,4\n", 2), ("1,2\n,4 5\n", 2), ("1,2\n4 5,\n", 2), ("1,2\n\n3\n", 3),
    ("1,2\n3,4,\n", 2), ("1,2\n 3 , 4 \n5,6 7\n", 3), ("1,2\n3,nan\n", 2)])
def test_read_text_table_csv_layout_errors(tmp_path, text, line):
    (tmp_path / "bad.csv").write_text(text)
    with pytest.raises(D.DatasetError, match=rf"bad\.csv:{line}: expected"):
        read_text_table(tmp_path / "bad.csv", delimiter=",")


# -- bad input -----------------------------------------------------------------------------------
def test_missing_folder(tmp_path):
    with pytest.raises(D.DatasetError, match=r"nope.* does not exist"):
        D.load("cora", root=tmp_path / "nope")
    with pytest.raises(D.DatasetError, match=r"'cora' is not in .*ind\.cora\.x"):
        D.load("cora", root=tmp_path)


def test_data_root_env(tmp_path, monkeypatch):
    monkeypatch.setenv("JGRIND_DATA", str(tmp_path))
    assert D.data_root() == tmp_path
    monkeypatch.setenv("JGRIND_DATA", str(tmp_path / "typo"))
    with pytest.raises(D.DatasetError, match=r"typo \(from \$JGRIND_DATA\) does not exist"):
        D.load("tolokers")


def test_no_data_root(monkeypatch):
    monkeypatch.delenv("JGRIND_DATA", raising=False)
    monkeypatch.setattr("jgrind.datasets.paths.candidate_roots", lambda: [])
    assert D.data_root() is None
    with pytest.raises(D.DatasetError, match="no dataset folder found.*JGRIND_DATA"):
        D.load("cora")


def _copy_planetoid(src_root, dst, name="cora"):
    (dst / "planetoid").mkdir(parents=True)
    for rel in planetoid_files(name):
        shutil.copy(src_root / rel, dst / rel)
    return dst / "planetoid" / f"ind.{name}.graph"


def test_truncated_planetoid_pickle(data_file, data_root, tmp_path):
    data_file(*planetoid_files("cora"))
    graph = _copy_planetoid(data_root, tmp_path)
    graph.write_bytes(graph.read_bytes()[:3000])
    with pytest.raises(D.DatasetError, match=r"cannot read .*ind\.cora\.graph: file is truncated"):
        D.load("cora", root=tmp_path)


def test_planetoid_pickle_with_foreign_global_is_refused(data_file, data_root, tmp_path):
    data_file(*planetoid_files("cora"))
    graph = _copy_planetoid(data_root, tmp_path)
    graph.write_bytes(pickle.dumps(print, protocol=2))  # a pickle naming builtins.print
    with pytest.raises(D.DatasetError, match=r"ind\.cora\.graph.*refusing to load builtins\.print"):
        D.load("cora", root=tmp_path)


def test_npz_missing_key_and_truncated(data_file, tmp_path):
    path = data_file("heterophilous/minesweeper.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(tmp_path / "minesweeper.npz", **{k: v for k, v in arrays.items() if k != "edges"})
    with pytest.raises(D.DatasetError, match=r"minesweeper\.npz lacks the key\(s\) edges"):
        D.load_heterophilous(str(tmp_path / "minesweeper.npz"))
    (tmp_path / "cut.npz").write_bytes(path.read_bytes()[:5000])
    with pytest.raises(D.DatasetError, match=r"cannot read .*cut\.npz"):
        D.load_heterophilous(str(tmp_path / "cut.npz"))


def test_unknown_name():
    with pytest.raises(D.DatasetError, match="unknown dataset 'coraa'.*cora, citeseer"):
        D.load("coraa")


def test_nan_features_surface_as_graph_error(data_file, tmp_path):
    path = data_file("heterophilous/minesweeper.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["node_features"][3, 1] = np.nan
    np.savez(tmp_path / "m.npz", **arrays)
    with pytest.raises(GraphError, match="NaN"):
        D.load_heterophilous(str(tmp_path / "m.npz"))


# -- registry ------------------------------------------------------------------------------------
def test_available_and_register(tmp_path, monkeypatch):
    rows = {r.name: r for r in D.available(root=tmp_path)}
    assert {"cora", "citeseer", "pubmed", "tolokers", "minesweeper", "cora-npz"} <= set(rows)
    assert not rows["cora"].present and rows["cora"].path.endswith("ind.cora.x")
    monkeypatch.setattr("jgrind.datasets.registry._GENERATED", {})
    e, x, y = _tiny_edgelist(tmp_path, "0 1\n")
    D.register("tiny", lambda **kw: D.load_edge_list(e, x, y, **kw), "a tiny test graph")
    assert D.load("TINY", name="t").name == "t"
    assert {r.name: r.present for r in D.available(root=tmp_path)}["tiny"] is True
    with pytest.raises(ValueError):
        D.register("cora", lambda: None, "clash")
