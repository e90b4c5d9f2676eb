"""The ``.npz`` graphs of Shchur et al., "Pitfalls of GNN evaluation" (shchur/gnn-benchmark):
cora, citeseer, pubmed, amazon_electronics_*, ms_academic_*.

Keys: the adjacency ``[N, N]`` and attributes ``[N, F]`` as CSR pieces, named either
``adj_data, adj_indices, adj_indptr, adj_shape`` or ``adj_matrix.data, adj_matrix.indices, ...``
(same for ``attr_*`` / ``attr_matrix.*``; a dense ``attr_matrix`` is also accepted), and
``labels [N]``. There is no fixed split: the paper's protocol draws random ones.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.sparse as sp

from jgrind.datasets.errors import DatasetError, check_count, read_npz
from jgrind.datasets.paths import require_root
from jgrind.graph import class_count, from_edges
from jgrind.transforms import largest_connected_component, make_undirected

TRAIN_PER_CLASS = 20
VAL_PER_CLASS = 30
_PIECES = ("data", "indices", "indptr", "shape")
_HINT = ("use an .npz from shchur/gnn-benchmark (data/npz/) or point JGRIND_DATA at a folder "
         "that has gnn-benchmark/NAME.npz")


def gnn_benchmark_path(path_or_name, root=None) -> Path:
    """An existing path as given, else ``root/gnn-benchmark/NAME.npz``."""
    p = Path(path_or_name)
    if p.suffix == ".npz" or p.exists():
        return p
    return require_root(root) / "gnn-benchmark" / f"{path_or_name}.npz"


def _csr(d: dict, prefix: str, path: Path):
    """The CSR matrix stored as ``prefix_*`` or ``prefix_matrix.*`` pieces, or None if absent."""
    for spelling in (f"{prefix}_", f"{prefix}_matrix."):
        keys = [spelling + p for p in _PIECES]
        if any(k in d for k in keys):
            missing = [k for k in keys if k not in d]
            if missing:
                raise DatasetError(f"{path} lacks the key(s) {', '.join(missing)} of its "
                                   f"{prefix} matrix (it has {', '.join(d)}); {_HINT}")
            data, indices, indptr, shape = (d[k] for k in keys)
            if not (np.issubdtype(data.dtype, np.number) or data.dtype == bool):
                raise DatasetError(f"{path}: '{keys[0]}' holds {data.dtype} values, not "
                                   f"numbers; {_HINT}")
            try:
                matrix = sp.csr_matrix((data, indices, indptr),
                                       shape=tuple(int(s) for s in shape))
                matrix.check_format(full_check=True)  # indices in range, indptr ordered
                return matrix
            except (ValueError, TypeError) as e:
                raise DatasetError(f"{path}: the {spelling}* pieces do not form a CSR matrix "
                                   f"({e}); {_HINT}") from None
    return None


def per_class_split(labels: np.ndarray, seed: int, splits: int = 1,
                    train_per_class: int = TRAIN_PER_CLASS, val_per_class: int = VAL_PER_CLASS):
    """Shchur et al.'s random split, `splits` times: per class, `train_per_class` random nodes
    train, `val_per_class` val, every other labelled node test. Split ``s`` draws with seed
    ``seed + s``. A class smaller than train + val gives what it has to train, then to val.

    Returns ``(train, val, test)`` bool masks, each ``[splits, N]``."""
    labels = np.asarray(labels)
    masks = np.zeros((3, splits, labels.size), bool)
    # only the classes present: a stray huge id must not loop over every id below it (and an
    # absent class drew nothing from the generator, so the splits are the same as before)
    classes = [np.flatnonzero(labels == c) for c in np.unique(labels[labels >= 0])]
    for s in range(splits):
        rng = np.random.default_rng(seed + s)
        for ids in classes:
            perm = rng.permutation(ids)
            cuts = [train_per_class, train_per_class + val_per_class]
            for m, part in zip(masks, np.split(perm, cuts)):
                m[s, part] = True
    return masks[0], masks[1], masks[2]


def load_gnn_benchmark(path_or_name, root=None, seed: int = 0, *, splits: int = 1,
                       name=None, num_classes=None, largest_component: bool = False):
    """Load a gnn-benchmark ``.npz`` (a path, or a name under ``root/gnn-benchmark``).

    The adjacency is symmetrised (``A + A^T``, binary) with self loops removed; features are
    dense float32; `splits` random 20/30-per-class splits from `per_class_split`, seeded
    ``seed + s`` (a run of several seeds asks for one per seed: `registry.split_per_seed`).
    `largest_component` keeps only the largest connected component, before the splits are
    drawn, as Shchur et al. evaluate. The graph is named `name` or the file's stem.
    """
    seed = check_count(seed, "seed", least=0)
    splits = check_count(splits, "splits", least=1)
    path = gnn_benchmark_path(path_or_name, root)
    optional = [f"{m}_{p}" for m in ("adj", "attr") for p in _PIECES] + \
               [f"{m}_matrix.{p}" for m in ("adj", "attr") for p in _PIECES] + ["attr_matrix"]
    d = read_npz(path, ("labels",), _HINT, optional=optional)
    adj = _csr(d, "adj", path)
    if adj is None:
        raise DatasetError(f"{path} has no adjacency (adj_data/adj_indices/adj_indptr/adj_shape "
                           f"or adj_matrix.*; it has {', '.join(d)}); {_HINT}")
    attr = _csr(d, "attr", path)
    if attr is not None:
        try:  # dense: a damaged attr_shape can ask for more memory than there is
            features = attr.toarray().astype(np.float32, copy=False)
        except (MemoryError, ValueError) as e:
            raise DatasetError(f"{path}: cannot make the {attr.shape[0]} x {attr.shape[1]} "
                               f"attribute matrix dense ({type(e).__name__}: {e}); check its "
                               f"attr shape; {_HINT}") from None
    elif "attr_matrix" in d and d["attr_matrix"].ndim == 2:
        features = d["attr_matrix"]
        if not (np.issubdtype(features.dtype, np.number) or features.dtype == bool):
            raise DatasetError(f"{path}: 'attr_matrix' holds {features.dtype} values, not "
                               f"numbers; {_HINT}")
        features = features.astype(np.float32, copy=False)
    else:  # identity features would be an N x N dense matrix: wrong at any interesting scale
        raise DatasetError(f"{path} has no node attributes (attr_* or attr_matrix.* keys); "
                           "jgrind needs real features and will not invent N x N identity ones")
    labels = d["labels"]
    if not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{path}: 'labels' holds {labels.dtype} values; they must be integer "
                           f"class ids (-1 for unlabelled); {_HINT}")
    n = adj.shape[0]
    if adj.shape != (n, n) or features.shape[0] != n or labels.shape != (n,):
        raise DatasetError(f"{path}: adjacency {adj.shape}, attributes {features.shape} and "
                           f"labels {labels.shape} do not describe the same nodes (expected "
                           f"[N, N], [N, F] and [N]); {_HINT}")
    coo = adj.tocoo()
    keep = (coo.data != 0) & (coo.row != coo.col)
    g = make_undirected(from_edges(coo.row[keep], coo.col[keep], features, labels,
                                   num_classes=class_count(labels, num_classes, str(path)),
                                   name=name or path.stem))
    if largest_component:
        g = largest_connected_component(g)
    train, val, test = per_class_split(g.labels, seed, splits)
    return g.replace(train_mask=train, val_mask=val, test_mask=test)
