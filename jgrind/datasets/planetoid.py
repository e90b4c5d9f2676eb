"""Cora, CiteSeer and PubMed in the Planetoid release (``ind.NAME.*``), preprocessed exactly as
Kipf & Welling's GCN code (``gcn/utils.py: load_data``) does, so published numbers are comparable.

Files (Python 2 pickles unless noted), with L = len(allx) and T = 1000 test nodes:
  x, y        ``[len(y), F]`` sparse features / ``[len(y), C]`` one-hot labels of the train nodes
              (a prefix of allx / ally; unused here, only ``len(y)`` matters)
  allx, ally  ``[L, F]`` / ``[L, C]``: nodes ``0 .. L-1``
  tx, ty      ``[T, F]`` / ``[T, C]``: row ``i`` belongs to node ``test.index[i]``
  graph       dict node -> list of neighbours
  test.index  text, one node id a line (unsorted)
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from jgrind.datasets.errors import DatasetError, require_file
from jgrind.datasets.paths import require_root
from jgrind.graph import from_edges
from jgrind.transforms import make_undirected

NAMES = ("cora", "citeseer", "pubmed")
PARTS = ("x", "y", "tx", "ty", "allx", "ally", "graph", "test.index")
NUM_VAL = 500  # Kipf: val = the 500 nodes after the train nodes

_HINT = "re-download the Planetoid files or point JGRIND_DATA at a folder that has them"

# The only globals a Planetoid pickle may name. Anything else is refused: unpickling runs code,
# and these files often come from random mirrors. numpy.core was renamed numpy._core in NumPy 2
# and scipy.sparse.csr is a removed module, so the old names are mapped onto the new places.
_SPARSE = {"csr_matrix", "csc_matrix", "coo_matrix"}
_ALLOWED = {
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "scalar"),
    ("collections", "defaultdict"), ("collections", "OrderedDict"),
    ("builtins", "list"), ("builtins", "dict"), ("builtins", "set"), ("builtins", "tuple"),
    ("builtins", "int"),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if module.startswith("scipy.sparse") and name in _SPARSE:
            return getattr(sp, name)
        if module == "__builtin__":  # Python 2's name (super() would map it, but after us)
            module = "builtins"
        if module == "numpy.core" or module.startswith("numpy.core."):
            module = "numpy._core" + module[len("numpy.core"):]
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name}, which is not part of "
                                         "the Planetoid format")
        return super().find_class(module, name)


def planetoid_dir(name: str, root=None) -> Path:
    """The folder holding ``ind.NAME.*``: ``root/planetoid`` if it has them, else ``root``."""
    root = require_root(root)
    sub = root / "planetoid"
    return sub if (sub / f"ind.{name}.x").exists() or not (root / f"ind.{name}.x").exists() \
        else root


def _read_pickle(path: Path):
    require_file(path, "Planetoid file", _HINT)
    try:
        with open(path, "rb") as f:
            return _Unpickler(f, encoding="latin1").load()
    except Exception as e:  # any failure inside the unpickler means a bad file
        detail = " ".join(str(e).split())  # pickle's own messages can span lines
        raise DatasetError(f"cannot read {path}: file is truncated or not a Planetoid pickle "
                           f"({type(e).__name__}: {detail}); {_HINT}") from e


def _matrix(obj, path: Path) -> np.ndarray:
    """A pickled feature (sparse) or one-hot label (dense) matrix as a dense 2-D array."""
    if sp.issparse(obj):
        # Rebuild from the raw pieces: the pickled object carries SciPy-0.x internal state.
        obj = sp.csr_matrix((obj.data, obj.indices, obj.indptr), shape=obj.shape).toarray()
    elif not isinstance(obj, np.ndarray):
        raise DatasetError(f"cannot read {path}: expected a matrix, found {type(obj).__name__}; "
                           f"{_HINT}")
    if obj.ndim != 2:
        raise DatasetError(f"cannot read {path}: expected a 2-D matrix, found shape {obj.shape}; "
                           f"{_HINT}")
    return obj


def _read_test_index(path: Path) -> np.ndarray:
    require_file(path, "Planetoid file", _HINT)
    ids = []
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                try:
                    ids.append(int(line))
                except ValueError:
                    raise DatasetError(f"{path}:{lineno}: expected one node id a line, got "
                                       f"{line.strip()[:40]!r}; {_HINT}") from None
    return np.asarray(ids, dtype=np.int64)


def _labels(onehot: np.ndarray) -> np.ndarray:
    """``[n, C]`` one-hot -> ``[n]`` class ids; an all-zero row (no label) -> -1."""
    return np.where(onehot.any(axis=1), onehot.argmax(axis=1), -1)


def load_planetoid(name: str, root=None):
    """Load Cora / CiteSeer / PubMed with the public Planetoid split (one split).

    N = max(test) + 1 nodes. CiteSeer's test ids have holes: those 15 nodes are padded with
    zero features and label -1 (the GCN code pads them, with a zero one-hot) and are in no mask.
    Edges come from the graph dict, made undirected, self loops and duplicates removed.
    Features are the raw binary bag of words (see `row_normalize_features`).

    Returns a `Graph` with masks ``[1, N]``: train = nodes ``0 .. len(y)-1``, val = the next
    500, test = the sorted test ids.
    """
    name = name.lower()
    folder = planetoid_dir(name, root)
    files = {p: folder / f"ind.{name}.{p}" for p in PARTS}
    for p in PARTS:
        require_file(files[p], f"Planetoid {name} file", _HINT)
    obj = {p: _read_pickle(files[p]) for p in PARTS if p != "test.index"}
    allx, tx, ally, ty, y = (_matrix(obj[p], files[p]) for p in ("allx", "tx", "ally", "ty", "y"))
    test = _read_test_index(files["test.index"])  # Kipf's test_idx_reorder (file order)
    graph = obj["graph"]

    num_l, n_train = allx.shape[0], y.shape[0]
    problem = None
    if ally.shape[0] != num_l or tx.shape[0] != ty.shape[0] or allx.shape[1] != tx.shape[1] \
            or ally.shape[1] != ty.shape[1]:
        problem = (f"allx {allx.shape}, ally {ally.shape}, tx {tx.shape}, ty {ty.shape} do not "
                   "fit together")
    elif test.size != tx.shape[0] or np.unique(test).size != test.size:
        problem = (f"test.index has {test.size} ids ({np.unique(test).size} distinct) for "
                   f"{tx.shape[0]} rows of tx")
    elif test.min() < num_l:
        problem = f"test id {int(test.min())} collides with the {num_l} allx nodes"
    elif n_train + NUM_VAL > num_l:
        problem = f"{n_train} train + {NUM_VAL} val nodes exceed the {num_l} allx nodes"
    elif not isinstance(graph, dict):
        problem = f"ind.{name}.graph holds a {type(graph).__name__}, not a dict"
    if problem:
        raise DatasetError(f"Planetoid {name} in {folder} is inconsistent: {problem}; {_HINT}")

    # Kipf pads the test range [min, max] to contiguous rows after allx (min == L in every
    # release); ids in the holes get no features and no label.
    n = int(test.max()) + 1
    features = np.zeros((n, allx.shape[1]), np.float32)
    features[:num_l] = allx
    features[test] = tx  # == Kipf's features[test_idx_reorder] = features[test_idx_range]
    onehot = np.zeros((n, ally.shape[1]), ally.dtype)
    onehot[:num_l] = ally
    onehot[test] = ty
    labels = _labels(onehot)

    try:
        counts = [len(v) for v in graph.values()]
        src = np.repeat(np.fromiter(graph.keys(), np.int64, len(graph)), counts)
        dst = np.fromiter((j for v in graph.values() for j in v), np.int64, sum(counts))
    except (TypeError, ValueError) as e:
        raise DatasetError(f"cannot read {files['graph']}: expected a dict of node -> neighbour "
                           f"list ({e}); {_HINT}") from None
    for ids in (src, dst):
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise DatasetError(f"{files['graph']}: node {bad} is outside the {n} nodes given by "
                               f"allx and test.index; {_HINT}")

    masks = np.zeros((3, 1, n), bool)
    masks[0, 0, :n_train] = True
    masks[1, 0, n_train:n_train + NUM_VAL] = True
    masks[2, 0, np.sort(test)] = True
    masks &= labels >= 0  # Kipf's zero one-hot rows would be class 0; here they stay unlabelled
    keep = src != dst
    g = from_edges(src[keep], dst[keep], features, labels, num_classes=onehot.shape[1],
                   train_mask=masks[0], val_mask=masks[1], test_mask=masks[2], name=name)
    return make_undirected(g)
