"""OGB node-property datasets (ogbn-arxiv, ogbn-products, ogbn-proteins, ...) from the raw
folder that the OGB download unpacks, read without the ``ogb`` package:

  raw/edge.csv.gz            ``src,dst`` a line, 0-based, no header
  raw/node-feat.csv.gz       ``[N, F]`` comma-separated floats (ogbn-proteins has none)
  raw/edge-feat.csv.gz       optional ``[E, D]`` edge features (ogbn-proteins: 8)
  raw/node-label.csv.gz      one class id a line, ``nan`` = unlabelled; or T comma-separated
                             binary targets a line (ogbn-proteins: 112), ``nan`` = unknown
  raw/num-node-list.csv.gz   optional: the node count
  split/<scheme>/{train,valid,test}.csv.gz   node ids, one a line

or in OGB's binary layout (ogbn-papers100M: ``raw/data.npz`` and ``raw/node-label.npz``),
read a slice at a time (`load_ogb_binary`).

A heterogeneous folder (ogbn-mag: ``raw/num-node-dict.csv.gz``) is read by
`jgrind.datasets.ogb_hetero` into one `Graph` with edge types.
"""

from __future__ import annotations

import os
import uuid
import warnings
from pathlib import Path

import numpy as np

from jgrind.datasets import npz
from jgrind.datasets.csr import csr_from_edge_chunks
from jgrind.datasets.edgelist import as_labels, read_text_table
from jgrind.datasets.errors import DatasetError, require_file
from jgrind.datasets.ogb_hetero import is_hetero_folder, load_ogb_hetero
from jgrind.graph import Graph, class_count, from_edges
from jgrind.transforms import make_undirected

_SPLIT_FLAG = "on the command line: --set dataset_options=split:NAME"
# OGB's master.csv ``add_inverse_edge``: these store each undirected edge once, and OGB's own
# loaders add the reverse; the others (ogbn-arxiv, ogbn-papers100M) are directed as stored
_INVERSE_EDGES = ("ogbn_products", "ogbn_proteins")
_DIRECTED = ("ogbn_arxiv", "ogbn_papers100m")
# how `node_features` builds a node's features from its edges' (ogbn-proteins has no others)
EDGE_FEATURE_REDUCTIONS = ("edge_mean", "edge_sum")
_HINT = "re-extract the OGB download (it needs raw/ and split/ as OGB ships them)"


def _read(path: Path, dtype, ncols=None) -> np.ndarray:
    require_file(path, "OGB file", _HINT)
    return read_text_table(path, ncols=ncols, dtype=dtype, delimiter=",", hint=_HINT)


def _split_dir(directory: Path, split) -> Path:
    base = directory / "split"
    if split is not None:
        path = base / split
        if not path.is_dir():
            have = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
            raise DatasetError(f"{directory}: no split folder {path} (found: "
                               f"{', '.join(have) or 'none'}); pass one of those as split= "
                               f"({_SPLIT_FLAG})")
        return path
    schemes = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(schemes) != 1:
        raise DatasetError(f"{directory}: expected one folder under {base}, found "
                           f"{len(schemes)} ({', '.join(p.name for p in schemes) or 'none'}); "
                           f"pass split= to choose ({_SPLIT_FLAG}), or {_HINT}")
    return schemes[0]


def _stored_undirected(directory: Path) -> bool:
    """Whether OGB's own loaders add the reverse of every edge of this dataset, by the folder's
    name (``ogbn_products``, ``products``, ``ogbn-proteins`` ...). A name that is none of
    OGB's is kept directed, with a warning: the files do not say."""
    # the name as given (a link named after the dataset) or of the folder it leads to
    names = {p.name.lower().replace("-", "_") for p in (directory, directory.resolve())}
    named = lambda known: bool(names & {known, known.removeprefix("ogbn_")})  # noqa: E731
    if any(named(known) for known in _INVERSE_EDGES):
        return True
    if not any(named(known) for known in _DIRECTED):
        warnings.warn(f"OGB folder {directory.resolve().name!r} is not named after an OGB "
                      "dataset, so its edges are kept as stored (directed); a copy of "
                      "ogbn-products or ogbn-proteins, which store each undirected edge once, "
                      "needs to_undirected=True (--set dataset_options=to_undirected:true), and "
                      "to_undirected=False silences this", stacklevel=3)
    return False


def _edge_feature_nodes(edges: np.ndarray, edge_feat: np.ndarray, n: int, reduction: str,
                        both_ends: bool) -> np.ndarray:
    """``[N, D]`` node features: each node's incident edges' features, summed or averaged (PyG's
    and DGL's ogbn-proteins examples: mean and sum over the undirected graph). With
    ``both_ends`` an edge counts at its source too (its reverse is added); otherwise only at
    its destination. A node without edges gets zeros."""
    ends = [edges[:, 1], edges[:, 0]] if both_ends else [edges[:, 1]]
    out = np.zeros((n, edge_feat.shape[1]), np.float64)
    count = np.zeros(n, np.int64)
    for end in ends:
        for d in range(edge_feat.shape[1]):  # bincount: one pass per column, not np.add.at
            out[:, d] += np.bincount(end, weights=edge_feat[:, d], minlength=n)
        count += np.bincount(end, minlength=n)
    if reduction == "edge_mean":
        out /= np.maximum(count, 1)[:, None]
    return out.astype(np.float32)


def _targets(values: np.ndarray, path: Path) -> np.ndarray:
    """Class ids ``[N]`` (one column) or multi-label targets ``[N, T]`` (NaN -> -1)."""
    if values.shape[1] == 1:
        return as_labels(values[:, 0], str(path), _HINT)
    bad = ~np.isnan(values) & (values != 0) & (values != 1)
    if bad.any():
        i, t = (int(v[0]) for v in np.nonzero(bad))
        raise DatasetError(f"{path}: {values.shape[1]} columns, so binary targets (0, 1, nan "
                           f"for unknown), but line {i + 1} column {t + 1} is "
                           f"{values[i, t].item()}; {_HINT}")
    return np.where(np.isnan(values), -1, values).astype(np.int8)


def load_ogb_raw(directory, *, split=None, to_undirected=None, node_features=None, name=None,
                 scratch=None, num_classes=None, inverses=None):
    """Load an OGB node-property dataset from its unpacked folder (the one holding ``raw/``),
    in OGB's text layout (``raw/*.csv.gz``) or its binary one (``raw/data.npz``,
    ogbn-papers100M; see `load_ogb_binary`, the only one that uses ``scratch``).

    Edges: ``to_undirected=None`` (the default) does what OGB's own loaders do, by the folder's
    name: ogbn-products and ogbn-proteins store each undirected edge once and get its reverse
    (OGB's ``add_inverse_edge``); ogbn-arxiv and ogbn-papers100M (directed citation graphs)
    are kept directed as stored, as is a folder with another name, with a warning: the files
    themselves do not say. ``True`` adds the reverse of every edge and drops duplicates,
    ``False`` keeps the edges as stored. Self loops are kept either way.

    Labels: one column is class ids (``nan`` -> -1); T columns are a multi-label task's binary
    targets (ogbn-proteins: 112; ``nan`` -> -1, unknown), scored by mean ROC-AUC over tasks.

    Features: ``raw/node-feat.csv.gz``; a dataset without one (ogbn-proteins) needs
    ``node_features="edge_mean"`` or ``"edge_sum"``: each node's incident edges' features
    (``raw/edge-feat.csv.gz``) averaged or summed over the graph as loaded, as PyG's and DGL's
    ogbn-proteins examples do.

    The split comes from the only folder under ``split/``, or the one named `split`; masks
    ``[1, N]``. The graph is named `name` or the folder's name (e.g. ``ogbn_arxiv``).

    A heterogeneous folder (ogbn-mag) is read by `load_ogb_hetero`, which takes `split`,
    `name`, `num_classes` and ``inverses`` (default True: add every relation's reverse).
    """
    directory = _check_folder(directory)
    if is_hetero_folder(directory):
        given = [k for k, v in (("to_undirected", to_undirected), ("scratch", scratch),
                                ("node_features", node_features)) if v is not None]
        if given:
            raise DatasetError(f"{given[0]}= does not apply to the heterogeneous OGB folder "
                               f"{directory}; it takes split, name, num_classes and inverses")
        return load_ogb_hetero(directory, split=split, name=name, num_classes=num_classes,
                               inverses=True if inverses is None else inverses)
    if inverses is not None:
        raise DatasetError(f"inverses= applies to heterogeneous OGB folders (ogbn-mag); "
                           f"{directory} is a homogeneous one")
    to_undirected = _check_undirected(to_undirected)
    raw = directory / "raw"
    if (raw / "data.npz").exists():  # the binary layout (ogbn-papers100M)
        return load_ogb_binary(directory, split=split, to_undirected=to_undirected,
                               node_features=node_features, name=name, scratch=scratch,
                               num_classes=num_classes)
    if node_features is not None and node_features not in EDGE_FEATURE_REDUCTIONS:
        raise DatasetError(f"node_features={node_features!r}: use one of "
                           f"{', '.join(EDGE_FEATURE_REDUCTIONS)} (or leave it out to read "
                           "raw/node-feat.csv.gz)")
    if not (raw / "edge.csv.gz").exists() and (raw / "node-feat").is_dir():
        raise DatasetError(f"{directory} looks like a heterogeneous OGB dataset (raw/node-feat/ "
                           "is a folder) but has no raw/num-node-dict.csv.gz; " + _HINT)
    feature_file = raw / ("edge-feat.csv.gz" if node_features else "node-feat.csv.gz")
    if node_features and not feature_file.exists() and (raw / "edge.csv.gz").exists():
        raise DatasetError(f"node_features={node_features} averages or sums edge features, but "
                           f"{directory} has no raw/edge-feat.csv.gz; leave node_features out "
                           "to read raw/node-feat.csv.gz")
    if node_features is None and not feature_file.exists() and (raw / "edge.csv.gz").exists():
        edge_hint = (" It has edge features: pass node_features=edge_mean (on the command "
                     "line: --set dataset_options=node_features:edge_mean) to average each "
                     "node's edges' features, as OGB's ogbn-proteins examples do."
                     if (raw / "edge-feat.csv.gz").exists() else "")
        raise DatasetError(f"{directory} has no raw/node-feat.csv.gz; jgrind needs node "
                           f"features and will not invent identity ones.{edge_hint}")
    for f in ("edge.csv.gz", feature_file.name, "node-label.csv.gz"):
        require_file(raw / f, "OGB file", _HINT)
    split_dir = _split_dir(directory, split)  # before the big reads, so mistakes fail fast
    undirected = _stored_undirected(directory) if to_undirected is None else to_undirected
    edges = _read(raw / "edge.csv.gz", np.int64, ncols=2)
    features = _read(feature_file, np.float32)
    labels = _targets(_read(raw / "node-label.csv.gz", np.float64), raw / "node-label.csv.gz")
    n = labels.shape[0] if node_features else features.shape[0]
    if (raw / "num-node-list.csv.gz").exists():
        counts = _read(raw / "num-node-list.csv.gz", np.int64)
        if counts.size != 1:
            raise DatasetError(f"{raw / 'num-node-list.csv.gz'} lists {counts.size} graphs; a "
                               "node-property dataset has one")
        n = int(counts[0, 0])
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        bad = int(edges.min()) if edges.min() < 0 else int(edges.max())
        raise DatasetError(f"{raw / 'edge.csv.gz'}: node id {bad} is out of range for {n} nodes; "
                           f"{_HINT}")
    if node_features:
        if features.shape[0] != edges.shape[0]:
            raise DatasetError(f"{feature_file}: {features.shape[0]} rows for "
                               f"{edges.shape[0]} edges; {_HINT}")
        features = _edge_feature_nodes(edges, features, n, node_features, undirected)
    if features.shape[0] != n or labels.shape[0] != n:
        raise DatasetError(f"{directory}: {n} nodes, but node-feat has {features.shape[0]} rows "
                           f"and node-label {labels.shape[0]}; {_HINT}")

    masks = _masks(split_dir, n)
    g = from_edges(edges[:, 0], edges[:, 1], features, labels,
                   num_classes=class_count(labels, num_classes, name or directory.name),
                   train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                   name=name or directory.name)
    return make_undirected(g) if undirected else g


def load_ogb_binary(directory, *, split=None, to_undirected=None, node_features=None,
                    name=None, scratch=None, num_classes=None):
    """Load an OGB node-property dataset in OGB's binary layout (ogbn-papers100M)::

      raw/data.npz         edge_index [2, E], node_feat [N, F], num_nodes_list [1], ...
      raw/node-label.npz   node_label [N] or [N, 1] (``nan`` = unlabelled), or [N, T]
      split/<scheme>/{train,valid,test}.csv.gz

    without reading an array whole into memory, as OGB's own loader does (see
    `jgrind.datasets.npz`):

    - the edges are read twice, a slice at a time, into the CSR (`jgrind.datasets.csr`):
      besides the CSR's own 4 bytes per edge, memory grows with the nodes, not the edges;
    - features stored uncompressed (``np.savez``) are memory-mapped where they lie. Features
      compressed (``np.savez_compressed``, as OGB ships them), in Fortran order or not
      float32 are decompressed a slice at a time, into memory, or with ``scratch=FOLDER``
      into a new ``.npy`` file there (``node_feat-*.npy``, its space allocated first) that
      is memory-mapped: the process's own memory then holds one slice at a time. The file
      is the caller's to remove with the folder once done with the graph; `jgrind convert`
      does so.

    Edges, labels, the split and `name` work as in `load_ogb_raw`. ``to_undirected=True``
    places each edge in both directions and then sorts the CSR's rows a block at a time
    (`jgrind.datasets.csr`): the same graph as `jgrind.transforms.make_undirected`, in
    little more memory than the CSR's own (4 bytes per directed edge; 8 from 2^31 edges).
    A folder holding both layouts is read in this one. Other arrays in ``data.npz`` (such
    as ``node_year``) are not read.
    """
    directory = _check_folder(directory)
    to_undirected = _check_undirected(to_undirected)
    raw = directory / "raw"
    if node_features is not None:
        raise DatasetError(f"node_features={node_features!r} builds features from edge features "
                           f"in OGB's text layout; {directory} has the binary one "
                           "(raw/data.npz), read with its node_feat: leave node_features out")
    data = npz.members(raw / "data.npz", _HINT)
    npz.require(data, ("edge_index", "node_feat"), raw / "data.npz", _HINT)
    label_file = raw / "node-label.npz"
    labels = npz.members(label_file, _HINT)
    npz.require(labels, ("node_label",), label_file, _HINT)
    split_dir = _split_dir(directory, split)  # before the big reads, so mistakes fail fast
    undirected = _stored_undirected(directory) if to_undirected is None else to_undirected
    feat = data["node_feat"]
    if len(feat.shape) != 2:
        raise DatasetError(f"{raw / 'data.npz'}: node_feat has shape {feat.shape}, expected "
                           f"[N, F]; {_HINT}")
    if not (np.issubdtype(feat.dtype, np.number) or feat.dtype == bool):
        raise DatasetError(f"{raw / 'data.npz'}: node_feat holds {feat.dtype} values, not "
                           f"numbers; {_HINT}")
    n = feat.shape[0]
    if "num_nodes_list" in data:
        counts = npz.read_array(data["num_nodes_list"]).reshape(-1)
        if counts.size != 1:
            raise DatasetError(f"{raw / 'data.npz'}: num_nodes_list lists {counts.size} graphs; "
                               "a node-property dataset has one")
        if int(counts[0]) != n:
            raise DatasetError(f"{raw / 'data.npz'}: num_nodes_list says {int(counts[0])} nodes "
                               f"but node_feat has {n} rows; {_HINT}")
    if scratch is not None:
        scratch = Path(scratch)
        if not scratch.is_dir():
            raise DatasetError(f"scratch folder {scratch} does not exist; create it, or leave "
                               "scratch out to decompress into memory")
    values = np.array(npz.read_array(labels["node_label"]))
    if values.ndim == 1:
        values = values[:, None]
    if values.ndim != 2 or values.shape[0] != n:
        raise DatasetError(f"{label_file}: node_label has shape {values.shape}, expected "
                           f"[{n}, 1] or [{n}, T] for node_feat's {n} rows; {_HINT}")
    if not (np.issubdtype(values.dtype, np.number) or values.dtype == bool):
        raise DatasetError(f"{label_file}: node_label holds {values.dtype} values, not numbers; "
                           f"{_HINT}")
    target = _targets(values.astype(np.float64, copy=False), label_file)
    masks = _masks(split_dir, n)  # small files, read before the big ones
    try:
        edges = npz.edge_chunks(data["edge_index"])
    except ValueError as e:
        raise DatasetError(f"{raw / 'data.npz'}: {e}; {_HINT}") from None
    indptr, indices = csr_from_edge_chunks(edges, n, what=f"{raw / 'data.npz'} edge_index",
                                           hint=_HINT, symmetric=undirected)
    if npz.mappable(feat, np.float32):
        features = npz.read_array(feat)  # mapped where it lies
    else:
        out = None if scratch is None else _scratch_array(scratch, feat.shape)
        features = npz.read_array(feat, dtype=np.float32, out=out,
                                  progress=f"reading {raw / 'data.npz'} node_feat")
    return Graph(indptr=indptr, indices=indices, features=features, labels=target,
                 train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                 num_classes=class_count(target, num_classes, name or directory.name),
                 name=name or directory.name)


def _scratch_array(folder: Path, shape) -> np.ndarray:
    """A new float32 ``.npy`` file of ``shape`` in ``folder``, mapped for writing, with its
    disk space allocated now: a disk without room is an error here, not a crash (SIGBUS)
    when a page of the map is first written."""
    # a new name (not mkstemp's file: its mode 0600 would follow the file into a saved graph)
    name = folder / f"node_feat-{uuid.uuid4().hex}.npy"
    try:
        out = np.lib.format.open_memmap(name, mode="w+", dtype=np.float32, shape=tuple(shape))
        with open(name, "r+b") as fh:
            os.posix_fallocate(fh.fileno(), 0, os.path.getsize(name))
        return out
    except OSError as e:
        name.unlink(missing_ok=True)
        need = 4 * int(np.prod(shape)) / 2**30
        raise DatasetError(f"cannot decompress the features ({need:.2f} GiB) into the scratch "
                           f"folder {folder}: {e.strerror or e}; free space there or choose "
                           "another folder") from e


def _check_folder(directory) -> Path:
    directory = Path(directory)
    if not directory.is_dir():
        problem = "is a file" if directory.exists() else "does not exist"
        raise DatasetError(f"OGB dataset folder {directory} {problem}; pass the folder "
                           "that holds raw/ and split/")
    return directory


def _check_undirected(to_undirected):
    if isinstance(to_undirected, np.bool_):
        to_undirected = bool(to_undirected)
    if to_undirected is not None and not isinstance(to_undirected, bool):
        raise DatasetError(f"to_undirected={to_undirected!r}: use true or false (or leave it "
                           "out for OGB's own choice)")
    return to_undirected


def _masks(split_dir: Path, n: int) -> np.ndarray:
    """``[3, 1, N]``: the train, valid and test node ids of ``split_dir`` as masks."""
    masks = np.zeros((3, 1, n), bool)
    for m, part in zip(masks, ("train", "valid", "test")):
        ids = _read(split_dir / f"{part}.csv.gz", np.int64, ncols=1)[:, 0]
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise DatasetError(f"{split_dir / (part + '.csv.gz')}: node id {bad} is out of range "
                               f"for {n} nodes; {_HINT}")
        m[0, ids] = True
    return masks
