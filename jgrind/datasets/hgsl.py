"""The HGSL / GTN heterogeneous datasets (DBLP, ACM, Yelp as HGSL ships them) from their pickles:

  edges.pkl          dict relation name (``'p-a'``) -> SciPy sparse ``[N, N]`` over *global*
                     ids, nonzero where the row node links to the column node
  labels.pkl         list of three ``[n, 2]`` int arrays (train, val, test) of (global id, class)
  node_features.pkl  ``[N, F]`` features of every node (SciPy CSR or a NumPy array)
  meta_data.pkl      dict; ``t_info[type]["ind"]`` is each type's id range, ``r_info[rel]`` a
                     relation's (source start, source stop, target start, target stop);
                     ``n_class`` the number of classes

A pickle can run code when loaded, so these are read with an unpickler that builds only the
NumPy and SciPy classes and the builtins these files hold, and refuses any other name.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from jgrind.datasets.errors import DatasetError, require_file
from jgrind.graph import GraphError
from jgrind.hetero import HeteroGraph, RelationCSR

FILES = ("edges.pkl", "labels.pkl", "node_features.pkl", "meta_data.pkl")
_HINT = "re-download the HGSL data folder (AndyJZhao/HGSL data/<name>/) or point to one"

_SPARSE = {"csr_matrix", "csc_matrix", "coo_matrix"}
# numpy.core became numpy._core in NumPy 2; the pickles name the old module
_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("builtins", "dict"), ("builtins", "list"), ("builtins", "tuple"), ("builtins", "set"),
    ("builtins", "frozenset"), ("builtins", "range"), ("builtins", "int"), ("builtins", "float"),
    ("builtins", "str"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("scipy.sparse") and name in _SPARSE:
            return getattr(sp, name)
        if module == "numpy.core" or module.startswith("numpy.core."):
            module = "numpy._core" + module[len("numpy.core"):]
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}, which is not part "
                                         "of the HGSL format")
        return super().find_class(module, name)


def read_pickle(path: Path):
    """The object in an HGSL pickle, built by the restricted unpickler; `DatasetError` (one
    line) for a missing or damaged file or a pickle naming anything outside the format."""
    require_file(path, "HGSL file", _HINT)
    try:
        with open(path, "rb") as f:
            return _Unpickler(f).load()
    except Exception as e:  # any failure inside the unpickler means a bad file
        detail = " ".join(str(e).split())
        raise DatasetError(f"cannot read {path}: {detail or type(e).__name__}; {_HINT}") \
            from None


def read_hgsl(directory, *, name=None, num_classes=None) -> HeteroGraph:
    """The `HeteroGraph` of an HGSL data folder (see the module docstring).

    Node types in id order (DBLP: ``a`` authors, ``p`` papers, ``c`` conferences), so that
    `HeteroGraph.to_graph` numbers every node as the files do. Each relation ``'x-y'`` becomes
    ``(x, 'x-y', y)``: its row nodes are the sources, its column nodes the destinations. The
    features of every type are its rows of the one feature matrix. The target type is the one
    the labelled ids lie in; the split is the files' (one split). Where ``r_info`` states a
    relation's id ranges, its edges must lie in them.
    """
    directory = Path(directory)
    if not directory.is_dir():
        problem = "is a file" if directory.exists() else "does not exist"
        raise DatasetError(f"HGSL folder {directory} {problem}; pass the folder holding "
                           f"{', '.join(FILES)}")
    for f in FILES:
        require_file(directory / f, "HGSL file", _HINT)
    meta = read_pickle(directory / "meta_data.pkl")
    name = name or directory.name
    node_types, ranges = _node_types(meta, directory / "meta_data.pkl")
    n = sum(c for _, c in node_types)
    edges = read_pickle(directory / "edges.pkl")
    if not isinstance(edges, dict) or not edges:
        raise DatasetError(f"{directory / 'edges.pkl'} holds a {type(edges).__name__}, not a "
                           f"dict of relation name -> sparse matrix; {_HINT}")
    relations = {}
    stated = meta.get("r_info") if isinstance(meta.get("r_info"), dict) else {}
    for rel, matrix in edges.items():
        found = _relation(str(rel), matrix, n, ranges, directory / "edges.pkl")
        for src, _, dst in found:
            if rel in stated and tuple(stated[rel]) != (*ranges[src], *ranges[dst]):
                raise DatasetError(f"{directory / 'edges.pkl'}: relation {rel!r} joins {src} "
                                   f"{ranges[src]} to {dst} {ranges[dst]}, but meta_data's "
                                   f"r_info says {tuple(stated[rel])}; {_HINT}")
        relations.update(found)
    features = read_pickle(directory / "node_features.pkl")
    features = features.toarray() if sp.issparse(features) else features
    if not isinstance(features, np.ndarray) or features.ndim != 2 or features.shape[0] != n:
        shape = getattr(features, "shape", type(features).__name__)
        raise DatasetError(f"{directory / 'node_features.pkl'}: features have shape {shape}, "
                           f"expected [{n}, F] for the {n} nodes of meta_data's t_info; {_HINT}")
    per_type = {t: features[lo:hi] for t, (lo, hi) in ranges.items()}
    target, labels, masks = _labels(read_pickle(directory / "labels.pkl"), ranges,
                                    directory / "labels.pkl")
    if num_classes is None and isinstance(meta.get("n_class"), (int, np.integer)):
        num_classes = int(meta["n_class"])
    try:
        return HeteroGraph(node_types=node_types, relations=relations, features=per_type,
                           target=target, labels=labels, train_mask=masks[0],
                           val_mask=masks[1], test_mask=masks[2], num_classes=num_classes,
                           name=name)
    except GraphError as e:
        raise DatasetError(f"{directory}: {e}") from None


def load_hgsl(directory, *, name=None, num_classes=None, inverses=True):
    """`read_hgsl` as the homogeneous `jgrind.graph.Graph` of `HeteroGraph.to_graph`, with
    every relation's inverse added first where the files lack it (``inverses``; DBLP's
    pickles hold both directions, so it adds none)."""
    if not isinstance(inverses, bool):
        raise DatasetError(f"inverses={inverses!r}: use true or false")
    graph = read_hgsl(directory, name=name, num_classes=num_classes)
    return (graph.with_inverses() if inverses else graph).to_graph()


def _node_types(meta, path: Path):
    """``((type, count), ...)`` in id order and ``{type: (start, stop)}`` from ``t_info``."""
    info = meta.get("t_info") if isinstance(meta, dict) else None
    if not isinstance(info, dict) or not info:
        raise DatasetError(f"{path} has no t_info dict (node type -> id range); {_HINT}")
    ranges = {}
    for t, entry in info.items():
        ind = entry.get("ind") if isinstance(entry, dict) else None
        if not isinstance(ind, range) or ind.step != 1 or len(ind) == 0:
            raise DatasetError(f"{path}: t_info[{t!r}] has no id range 'ind'; {_HINT}")
        ranges[str(t)] = (ind.start, ind.stop)
    order = sorted(ranges, key=lambda t: ranges[t][0])
    start = 0
    for t in order:
        if ranges[t][0] != start:
            raise DatasetError(f"{path}: node type {t!r} starts at id {ranges[t][0]}, expected "
                               f"{start} (the types' id ranges must follow each other from 0); "
                               f"{_HINT}")
        start = ranges[t][1]
    return tuple((t, ranges[t][1] - ranges[t][0]) for t in order), {t: ranges[t] for t in order}


def _type_of(ids: np.ndarray, ranges: dict, what: str) -> str:
    """The one node type whose range holds every id of ``ids``, or `DatasetError`."""
    lo, hi = int(ids.min()), int(ids.max())
    for t, (start, stop) in ranges.items():
        if start <= lo and hi < stop:
            return t
    spans = ", ".join(f"{t} [{a}, {b})" for t, (a, b) in ranges.items())
    raise DatasetError(f"{what}: ids {lo}..{hi} do not lie in one node type's range ({spans}); "
                       f"{_HINT}")


def _relation(rel: str, matrix, n: int, ranges: dict, path: Path) -> dict:
    if not sp.issparse(matrix) or matrix.shape != (n, n):
        shape = getattr(matrix, "shape", type(matrix).__name__)
        raise DatasetError(f"{path}: relation {rel!r} is {shape}, expected a sparse [{n}, {n}] "
                           f"matrix over the global ids; {_HINT}")
    coo = sp.coo_matrix(matrix)
    rows, cols = coo.row.astype(np.int64), coo.col.astype(np.int64)
    if not rows.size:
        return {}  # no edge says which types it joins
    src = _type_of(rows, ranges, f"{path}: relation {rel!r} (rows: sources)")
    dst = _type_of(cols, ranges, f"{path}: relation {rel!r} (columns: destinations)")
    if "__" in rel:
        raise DatasetError(f"{path}: relation name {rel!r} holds '__'; {_HINT}")
    src_lo, dst_lo = ranges[src][0], ranges[dst][0]
    n_src, n_dst = (ranges[t][1] - ranges[t][0] for t in (src, dst))
    local = sp.csr_matrix((np.ones(rows.size, np.int8), (cols - dst_lo, rows - src_lo)),
                          shape=(n_dst, n_src))  # rows: destinations; duplicates summed
    local.sort_indices()
    return {(src, rel, dst): RelationCSR(local.indptr, local.indices)}


def _labels(parts, ranges: dict, path: Path):
    """``(target type, labels [n_t], masks [3, 1, n_t])`` from the three (id, class) lists."""
    try:
        arrays = [np.asarray(p, dtype=np.int64) for p in parts]
        ok = len(arrays) == 3 and all(a.ndim == 2 and a.shape[1] == 2 for a in arrays)
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DatasetError(f"{path}: expected three [n, 2] lists (train, val, test) of "
                           f"(node id, class); {_HINT}")
    ids = np.concatenate([a[:, 0] for a in arrays])
    if not ids.size:
        raise DatasetError(f"{path}: no labelled node; {_HINT}")
    if np.unique(ids).size != ids.size:
        raise DatasetError(f"{path}: a node is listed twice among train, val and test; "
                           f"{_HINT}")
    target = _type_of(ids, ranges, f"{path}: labelled node")
    lo, hi = ranges[target]
    labels = np.full(hi - lo, -1, np.int64)
    masks = np.zeros((3, 1, hi - lo), bool)
    for m, a in zip(masks, arrays):
        local = a[:, 0] - lo
        m[0, local] = True
        labels[local] = a[:, 1]
    if labels.min(initial=0) < -1 or np.any(labels[masks.any(axis=(0, 1))] < 0):
        raise DatasetError(f"{path}: a class id is negative; {_HINT}")
    return target, labels, masks
