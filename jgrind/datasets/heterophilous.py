"""The heterophilous benchmarks of Platonov et al. (ICLR 2023): tolokers, minesweeper, and the
others released in the same ``.npz`` layout (roman_empire, amazon_ratings, questions, and
squirrel, chameleon with their filtered and directed versions), each by the path of its file.

File keys: ``node_features [N, F] float32``, ``node_labels [N] int``, ``edges [E, 2] int`` (every
undirected edge once), ``train_masks / val_masks / test_masks [10, N] bool``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jgrind.datasets.errors import DatasetError, read_npz, require_file
from jgrind.datasets.paths import require_root
from jgrind.graph import class_count, from_edges
from jgrind.transforms import make_undirected

NAMES = ("tolokers", "minesweeper")
KEYS = ("node_features", "node_labels", "edges", "train_masks", "val_masks", "test_masks")
_HINT = ("re-download it from yandex-research/heterophilous-graphs or point JGRIND_DATA at a "
         "folder that has heterophilous/NAME.npz")


def heterophilous_path(name: str, root=None) -> Path:
    """``root/heterophilous/NAME.npz``, or ``root/NAME.npz`` if only that exists."""
    root = require_root(root)
    path = root / "heterophilous" / f"{name}.npz"
    return root / f"{name}.npz" if not path.exists() and (root / f"{name}.npz").exists() else path


def load_heterophilous(name: str, root=None, num_classes=None):
    """Load a heterophilous benchmark by name (or by the path of its ``.npz``).

    Returns a `Graph` with every edge in both directions (duplicates and self loops dropped),
    all 10 fixed splits as masks ``[10, N]``, and C = max label + 1 or ``num_classes``
    (`jgrind.graph.class_count`: a label set with gaps needs it stated).
    """
    is_file = isinstance(name, Path) or str(name).endswith(".npz")
    path = Path(name) if is_file else heterophilous_path(str(name).lower(), root)
    require_file(path, "heterophilous dataset file", _HINT)
    d = read_npz(path, KEYS, _HINT)
    edges, labels = d["edges"], d["node_labels"]
    if edges.ndim != 2 or edges.shape[1] != 2 or not np.issubdtype(edges.dtype, np.integer):
        raise DatasetError(f"{path}: 'edges' must be an integer array [E, 2], found "
                           f"{edges.dtype} {edges.shape}; {_HINT}")
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DatasetError(f"{path}: 'node_labels' must be integers [N], found {labels.dtype} "
                           f"{labels.shape}; {_HINT}")
    n = labels.size
    features = d["node_features"]
    if features.ndim != 2 or features.shape[0] != n:
        raise DatasetError(f"{path}: 'node_features' has shape {features.shape} for the {n} "
                           f"nodes of 'node_labels'; expected [{n}, F]; {_HINT}")
    for key in KEYS[3:]:
        _check_masks(path, key, d[key], n)
    src, dst = edges[:, 0], edges[:, 1]
    keep = src != dst
    g = from_edges(src[keep], dst[keep], features, labels,
                   num_classes=class_count(labels, num_classes, str(path)),
                   train_mask=d["train_masks"], val_mask=d["val_masks"],
                   test_mask=d["test_masks"], name=path.stem, num_nodes=labels.size)
    return make_undirected(g)


def _check_masks(path: Path, key: str, masks: np.ndarray, n: int) -> None:
    """DatasetError unless `masks` is ``[S, N]`` (or ``[N]``) of bools or 0/1 integers: any
    other number would silently count as True."""
    ok_values = masks.dtype == bool or (np.issubdtype(masks.dtype, np.integer)
                                        and not np.any((masks != 0) & (masks != 1)))
    if masks.ndim not in (1, 2) or masks.shape[-1] != n or not ok_values:
        raise DatasetError(f"{path}: {key!r} is {masks.dtype} {masks.shape}; expected bool "
                           f"masks [S, {n}] (one row per split); {_HINT}")
