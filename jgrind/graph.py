"""The `Graph` value: an immutable node-classification graph in CSR form.

Everything downstream (transforms, partitioning, models, the engine) reads a graph through this
one type. It lives in NumPy host memory on purpose: a graph too large for the accelerator is the
whole point of jgrind, so device copies are made explicitly, per partition, by later stages.
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import numbers
import warnings
import zlib
from typing import Optional

import numpy as np


class GraphError(ValueError):
    """A graph (or a file it was read from) is malformed. The message says what and what to do."""


# More classes than nodes is allowed up to this many (a small graph may not show every class);
# beyond it the class ids are almost certainly not 0..C-1.
MAX_SPARSE_CLASSES = 2**16


def index_dtype(n: int) -> np.dtype:
    """int32 while ids fit (half the memory and the native index type of XLA), else int64."""
    return np.dtype(np.int32) if n < 2**31 - 1 else np.dtype(np.int64)


def freeze(a: np.ndarray) -> np.ndarray:
    """A contiguous read-only view of ``a`` (no copy if it already is one)."""
    a = np.ascontiguousarray(a)
    if a.flags.writeable:
        a = a.view()
        a.flags.writeable = False
    return a


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """A directed graph with node features, labels and one or more train/val/test splits.

    N nodes, E directed edges, F features, S splits, C classes.

    Attributes:
      indptr: ``[N + 1]`` int, CSR row pointers. Row ``i`` holds the *in*-neighbours of node ``i``
        (the sources of edges ``j -> i``), so aggregating messages is ``A @ X`` with
        ``A[dst, src]``. Undirected graphs store both directions.
      indices: ``[E]`` int, source node of every edge, grouped by destination row.
      features: ``[N, F]`` float32 node features, all finite.
      labels: ``[N]`` int32 class ids in ``[0, C)``; ``-1`` marks an unlabelled node, which may
        not appear in any mask. Or, for a multi-label task (ogbn-proteins, PPI, Yelp), ``[N, T]``
        int8 binary targets, 1 or 0, with ``-1`` for a target that is unknown; a node whose
        targets are all unknown may not appear in any mask.
      train_mask, val_mask, test_mask: ``[S, N]`` bool. Split ``s`` is row ``s``; within a split the
        three masks are disjoint.
      num_classes: C, the number of outputs the model predicts (multi-label: T).
      edge_weight: optional ``[E]`` float32 weight of every edge, aligned with ``indices``.
      name: a label for logs and reports.
      edge_type: optional ``[E]`` small int (int8; int16 past 127 relations) relation id of
        every edge, aligned with ``indices``; given exactly when ``relations`` is not empty.
      relations: the relation names, ``"src__rel__dst"``, one per id in ``edge_type``.
      node_types: ``(type name, count)`` pairs in global id order; each type holds a
        contiguous range of ids and the counts sum to N. Empty for a homogeneous graph. The
        features of a heterogeneous graph have one width: narrower types are zero-padded to
        the widest (`jgrind.hetero`), so every layer stores one width.

    Construct through the dataclass constructor; it validates everything and freezes the arrays.
    """

    indptr: np.ndarray
    indices: np.ndarray
    features: np.ndarray
    labels: np.ndarray
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    num_classes: int
    edge_weight: Optional[np.ndarray] = None
    name: str = "graph"
    edge_type: Optional[np.ndarray] = None
    relations: tuple[str, ...] = ()
    node_types: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        indptr = np.asarray(self.indptr)
        if indptr.ndim != 1 or indptr.size < 2:
            raise GraphError(f"{self.name}: the graph is empty (indptr has {indptr.size} entries); "
                             "a graph needs at least one node")
        n = indptr.size - 1
        idx_t = index_dtype(max(n, int(indptr[-1])))
        set_("indptr", freeze(indptr.astype(idx_t, copy=False)))
        set_("indices", freeze(np.asarray(self.indices).astype(idx_t, copy=False)))
        feats = np.asarray(self.features)
        if not (np.issubdtype(feats.dtype, np.floating) or np.issubdtype(feats.dtype, np.integer)
                or feats.dtype == bool):
            raise GraphError(f"{self.name}: features are {feats.dtype}; they must be real "
                             "numbers (float, int or bool)")
        if feats.dtype != np.float32:
            feats = feats.astype(np.float32)
        set_("features", freeze(feats))
        set_("labels", freeze(_targets(self.name, self.labels)))
        for k in ("train_mask", "val_mask", "test_mask"):
            m = np.asarray(getattr(self, k), dtype=bool)
            set_(k, freeze(m[None] if m.ndim == 1 else m))
        if self.edge_weight is not None:
            set_("edge_weight", freeze(np.asarray(self.edge_weight, dtype=np.float32)))
        set_("relations", tuple(str(r) for r in self.relations))
        set_("node_types", tuple((str(t), int(c)) for t, c in self.node_types))
        if (self.edge_type is None) != (not self.relations):
            given = "edge_type" if self.edge_type is not None else "relations"
            raise GraphError(f"{self.name}: edge_type (a relation id per edge) and relations "
                             f"(their names) go together: {given} given without the other")
        if self.edge_type is not None:
            set_("edge_type", freeze(_relation_ids(self.name, self.edge_type,
                                                   len(self.relations))))
        set_("num_classes", int(self.num_classes))
        self.validate()

    # -- sizes ------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return self.indptr.size - 1

    @property
    def num_edges(self) -> int:
        return int(self.indices.size)

    @property
    def num_features(self) -> int:
        return int(self.features.shape[1])

    @property
    def num_splits(self) -> int:
        return int(self.train_mask.shape[0])

    @property
    def num_relations(self) -> int:
        """R, the number of relations (edge types); 1 for a graph without edge types."""
        return max(len(self.relations), 1)

    @property
    def heterogeneous(self) -> bool:
        """True if the edges carry relation ids (`edge_type`)."""
        return self.edge_type is not None

    @property
    def multilabel(self) -> bool:
        """True if every node has ``num_classes`` binary targets (labels ``[N, T]``), False if
        one class id (labels ``[N]``)."""
        return self.labels.ndim == 2

    def labelled(self) -> np.ndarray:
        """``[N]`` bool: the nodes with a label (multi-label: at least one known target)."""
        return (self.labels >= 0).any(axis=1) if self.multilabel else self.labels >= 0

    def check_split(self, split) -> None:
        """ValueError if ``split`` is not one of this graph's splits; GraphError if it has no
        training node (nothing to learn from: every label -1, or an empty train mask)."""
        if isinstance(split, bool) or not isinstance(split, numbers.Integral) \
                or not 0 <= split < self.num_splits:
            raise ValueError(f"split {split!r} does not exist: {self.name} has "
                             f"{self.num_splits} split(s), numbered 0..{self.num_splits - 1}")
        if not self.train_mask[split].any():
            raise GraphError(f"{self.name} has no training node in split {split} (an empty "
                             "train mask, or no labelled node: labels of -1 are unlabelled); "
                             "give it labels and a train mask")

    def in_degree(self) -> np.ndarray:
        """``[N]`` number of in-edges of every node."""
        return np.diff(self.indptr)

    def edge_destinations(self) -> np.ndarray:
        """``[E]`` destination of every edge (the CSR row each entry of `indices` belongs to)."""
        return np.repeat(np.arange(self.num_nodes, dtype=self.indices.dtype), self.in_degree())

    def nbytes(self) -> int:
        arrays = [self.indptr, self.indices, self.features, self.labels,
                  self.train_mask, self.val_mask, self.test_mask]
        arrays += [a for a in (self.edge_weight, self.edge_type) if a is not None]
        return int(sum(a.nbytes for a in arrays))

    def fingerprint(self) -> dict:
        """What a checkpoint records of the graph it was trained on, to refuse resuming on
        another: the sizes, and a CRC-32 of each part training reads (the edges and their
        weights, the features, the labels, the masks). One pass over the arrays, a slice of
        rows at a time (a memory-mapped graph is not read into memory at once), made once per
        graph; zlib's CRC, the same in every process."""
        return dict(self._fingerprint)

    @functools.cached_property
    def _fingerprint(self) -> dict:
        def crc(*arrays) -> int:
            value = 0
            for a in arrays:
                if a is None:
                    continue
                value = zlib.crc32(f"{a.dtype.str}{a.shape}".encode(), value)
                if a.size == 0:
                    continue
                flat = a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1)
                step = max(1, _CHECK_BYTES // max(flat[:1].nbytes, 1))
                for start in range(0, flat.shape[0], step):
                    value = zlib.crc32(np.ascontiguousarray(flat[start:start + step]), value)
            return value
        return {"nodes": self.num_nodes, "edges": self.num_edges,
                "features": self.num_features, "classes": self.num_classes,
                "multilabel": self.multilabel,
                "edges_crc": crc(self.indptr, self.indices, self.edge_weight, self.edge_type),
                "features_crc": crc(self.features), "labels_crc": crc(self.labels),
                "masks_crc": crc(self.train_mask, self.val_mask, self.test_mask)}

    def replace(self, **changes) -> "Graph":
        """A copy with some fields changed (validated again; features that are carried over
        unchanged are not scanned for NaN again)."""
        if "features" in changes:
            return dataclasses.replace(self, **changes)
        token = _CHECKED_FEATURES.set(self.features)
        try:
            return dataclasses.replace(self, **changes)
        finally:
            _CHECKED_FEATURES.reset(token)

    def __repr__(self) -> str:
        return (f"Graph(name={self.name!r}, nodes={self.num_nodes:,}, edges={self.num_edges:,}, "
                f"features={self.num_features}, "
                f"{'tasks' if self.multilabel else 'classes'}={self.num_classes}, "
                f"splits={self.num_splits}, weighted={self.edge_weight is not None}"
                + (f", relations={len(self.relations)}" if self.relations else "")
                + (f", node_types={len(self.node_types)}" if self.node_types else "") + ")")

    # -- validation -------------------------------------------------------------------------
    def _check_class_ids(self) -> None:
        name, n = self.name, self.num_nodes
        if self.labels.shape != (n,):
            raise GraphError(f"{name}: labels have shape {self.labels.shape}, expected [{n}] "
                             f"(a class id per node) or [{n}, T] (T binary targets per node)")
        if self.num_classes > max(n, MAX_SPARSE_CLASSES):
            # the output layer has a column per class: a stray huge label id would allocate
            # gigabytes of parameters (seen: a label of 1e9, 256 GB)
            raise GraphError(f"{name}: {self.num_classes} classes for {n} nodes (the largest "
                             "label + 1); number the classes 0..C-1, e.g. with "
                             "np.unique(labels, return_inverse=True)")
        if np.any(self.labels < -1) or np.any(self.labels >= self.num_classes):
            bad = self.labels[(self.labels < -1) | (self.labels >= self.num_classes)]
            raise GraphError(f"{name}: label {int(bad[0])} is outside [0, {self.num_classes}) "
                             "(use -1 for unlabelled nodes, or raise num_classes)")

    def validate(self) -> None:
        """Raise `GraphError` naming the first problem found."""
        name, n = self.name, self.num_nodes
        ip, ix = self.indptr, self.indices
        if ip[0] != 0 or np.any(ip[1:] < ip[:-1]):
            raise GraphError(f"{name}: indptr must start at 0 and never decrease")
        if ip[-1] != ix.size:
            raise GraphError(f"{name}: indptr ends at {ip[-1]} but there are {ix.size} edge indices")
        if ix.size and (ix.min() < 0 or ix.max() >= n):
            bad = int(ix.min()) if ix.min() < 0 else int(ix.max())
            raise GraphError(f"{name}: edge endpoint {bad} is out of range for {n} nodes "
                             f"(node ids must lie in [0, {n})); check the edge file's id base")
        if self.features.ndim != 2 or self.features.shape[0] != n:
            raise GraphError(f"{name}: features have shape {self.features.shape}, expected "
                             f"[{n}, F] (one row per node)")
        bad_rows = _non_finite_rows(self.features) \
            if self.features is not _CHECKED_FEATURES.get() else ()
        if len(bad_rows):
            raise GraphError(f"{name}: features contain NaN or inf in {len(bad_rows)} rows "
                             f"(first: node {int(bad_rows[0])}); impute or drop them before "
                             "loading")
        if self.num_classes < 1:
            raise GraphError(f"{name}: num_classes must be at least 1, got {self.num_classes}")
        if self.multilabel:
            if self.labels.shape != (n, self.num_classes):
                flipped = " (transposed? a row per node)" if self.labels.shape[1] == n else ""
                raise GraphError(f"{name}: multi-label targets have shape {self.labels.shape}, "
                                 f"expected [{n}, num_classes={self.num_classes}] (a row of "
                                 f"targets per node){flipped}")
        else:
            self._check_class_ids()
        labelled = self.labelled()
        shapes = {k: getattr(self, k).shape for k in ("train_mask", "val_mask", "test_mask")}
        if len(set(shapes.values())) != 1 or self.train_mask.ndim != 2 \
                or self.train_mask.shape[1] != n:
            raise GraphError(f"{name}: masks must all have shape [splits, {n}], got {shapes}")
        tr, va, te = self.train_mask, self.val_mask, self.test_mask
        for a, b, an, bn in ((tr, va, "train", "val"), (tr, te, "train", "test"),
                             (va, te, "val", "test")):
            both = a & b
            if both.any():
                s, i = (int(v[0]) for v in np.nonzero(both))
                raise GraphError(f"{name}: {an} and {bn} masks overlap (split {s}, node {i}, "
                                 f"{int(both.sum())} nodes in all); a node may be in one set only")
        used = tr | va | te
        if np.any(used & ~labelled[None]):
            s, i = (int(v[0]) for v in np.nonzero(used & ~labelled[None]))
            count = int(np.sum(used[s] & ~labelled))
            what, keep = ("every target unknown (-1)", "(labels >= 0).any(axis=1)") \
                if self.multilabel else ("no label (-1)", "(labels >= 0)")
            raise GraphError(f"{name}: node {i} is in a mask of split {s} but has {what}; "
                             f"{count} such node(s) in that split. Drop them from the masks: "
                             f"mask & {keep}")
        if self.edge_weight is not None:
            if self.edge_weight.shape != ix.shape:
                raise GraphError(f"{name}: edge_weight has shape {self.edge_weight.shape}, "
                                 f"expected [{ix.size}] (one weight per edge)")
            if not np.isfinite(self.edge_weight).all():
                raise GraphError(f"{name}: edge weights contain NaN or inf")
        self._check_types()

    def _check_types(self) -> None:
        name, n = self.name, self.num_nodes
        if self.edge_type is not None:
            if self.edge_type.shape != self.indices.shape:
                raise GraphError(f"{name}: edge_type has shape {self.edge_type.shape}, "
                                 f"expected [{self.indices.size}] (one relation id per edge)")
            if len(set(self.relations)) != len(self.relations):
                raise GraphError(f"{name}: relation names repeat: {list(self.relations)}")
        if self.node_types:
            counts = [c for _, c in self.node_types]
            names = [t for t, _ in self.node_types]
            if len(set(names)) != len(names):
                raise GraphError(f"{name}: node type names repeat: {names}")
            if min(counts) < 0 or sum(counts) != n:
                raise GraphError(f"{name}: node type counts {dict(self.node_types)} sum to "
                                 f"{sum(counts)}, but the graph has {n} nodes; each type "
                                 "is a contiguous id range and together they cover every node")


# The features array `Graph.replace` carries over unchanged, from a graph that has checked it:
# not scanned for NaN again. Preparing a model's graph replaces it several times (GCN: drop
# the weights, add self loops, normalise), and for a memory-mapped feature file
# (`jgrind.datasets.stored`) every scan is a pass over the file.
_CHECKED_FEATURES: contextvars.ContextVar = contextvars.ContextVar("checked_features",
                                                                  default=None)

# Rows of features checked for NaN at a time: `np.isfinite` of the whole array would allocate
# a boolean per entry, 12.8 GB for 100M nodes x 128 features, and a memory-mapped feature file
# (`jgrind.datasets.stored`) would be read into memory at once.
_CHECK_BYTES = 64 << 20


def class_count(labels: np.ndarray, stated: Optional[int] = None, name: str = "graph") -> int:
    """C, the number of outputs a model predicts for ``labels``: T for ``[N, T]`` targets; for
    class ids (-1: unlabelled) the ``stated`` number, which must exceed every id, or, when none
    is stated, the largest id + 1 provided that every id below it labels some node.

    A label set with gaps is refused (`GraphError`, saying which ids are used and which are
    not) unless the number is stated: one stray id (99 in a 7-class file) would otherwise make
    a 100-class task without a word, and a model that spreads probability over 93 classes no
    node has."""
    labels = np.asarray(labels)
    if labels.ndim == 2:
        if stated is not None and int(stated) != labels.shape[1]:
            raise GraphError(f"{name}: num_classes={stated}, but the multi-label targets have "
                             f"{labels.shape[1]} columns (one per task); leave num_classes out")
        return int(labels.shape[1])
    labelled = labels[labels >= 0]
    largest = int(labelled.max()) if labelled.size else -1
    if stated is not None:
        if int(stated) < 1 or largest >= int(stated):
            raise GraphError(f"{name}: num_classes={stated}, but the labels run up to class id "
                             f"{largest}; state at least {largest + 1}, or leave num_classes "
                             "out to count the classes from the labels")
        return int(stated)
    if largest < 0:
        return 1
    used = np.unique(labelled)
    if used.size == largest + 1:
        return largest + 1
    state = "" if largest + 1 > max(labels.shape[0], MAX_SPARSE_CLASSES) else \
        (f", or, if those classes are real, state num_classes={largest + 1} (CLI: --set "
         f"num_classes={largest + 1})")
    # the unused ids as ranges between the used ones (never an array of every id: a stray
    # label may be 10**9)
    before = np.concatenate([[-1], used[:-1]])
    gaps = [(int(a) + 1, int(b) - 1) for a, b in zip(before, used) if b - a > 1]
    breaks = np.flatnonzero(np.diff(used) != 1) + 1
    runs = [(int(r[0]), int(r[-1])) for r in np.split(used, breaks)]
    raise GraphError(f"{name}: the labels use {used.size} class ids ({_ranges(runs)}), so "
                     f"the task would have {largest + 1} classes of which "
                     f"{largest + 1 - used.size} ({_ranges(gaps)}) label no node; fix or "
                     "renumber the labels (0..C-1: np.unique(labels, return_inverse=True))"
                     f"{state}")


def _ranges(runs: list[tuple[int, int]], shown: int = 6) -> str:
    """``[(0, 3), (7, 7), (99, 99)]`` -> ``"0-3, 7, 99"`` (the first ``shown``)."""
    text = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs[:shown]]
    return ", ".join(text) + (f", ... ({len(runs) - shown} more ranges)"
                              if len(runs) > shown else "")


def _targets(name: str, labels) -> np.ndarray:
    """``labels`` as int32 class ids ``[N]`` (also from a ``[N, 1]`` column) or int8 binary
    targets ``[N, T]`` (T >= 2), or GraphError:
    not truncated from fractions, wrapped from huge integers or cast from NaN without a word."""
    labels = np.asarray(labels)
    if labels.ndim == 2 and labels.shape[1] == 1:
        labels = labels[:, 0]  # a column of class ids (PyG's and OGB's ``y`` for ogbn-arxiv)
    if labels.ndim == 2:
        return _binary_targets(name, labels)
    if labels.dtype == bool or not (np.issubdtype(labels.dtype, np.integer)
                                    or np.issubdtype(labels.dtype, np.floating)):
        raise GraphError(f"{name}: labels are {labels.dtype}; they must be integer class ids "
                         "(-1 for unlabelled)")
    if np.issubdtype(labels.dtype, np.floating):
        if not np.isfinite(labels).all() or np.any(labels != np.round(labels)):
            raise GraphError(f"{name}: labels must be whole numbers (class ids, -1 for "
                             "unlabelled); found NaN, inf or a fraction")
    if labels.size and (labels.min() < np.iinfo(np.int32).min
                        or labels.max() > np.iinfo(np.int32).max):
        raise GraphError(f"{name}: a label is outside the int32 range; number the classes "
                         "0..C-1")
    return labels.astype(np.int32, copy=False)


def _binary_targets(name: str, targets: np.ndarray) -> np.ndarray:
    """``[N, T]`` multi-label targets as int8 1 / 0 / -1 (unknown). Bool, integer or float
    arrays are taken (PyG and OGB store float or int64 0/1); NaN in a float array is unknown
    (OGB's convention), as is -1."""
    if targets.dtype == bool:
        return targets.astype(np.int8)
    if targets.dtype == np.int8 and not np.any((targets < -1) | (targets > 1)):
        return targets  # as stored (and as `Graph.replace` passes them on): not copied
    if not (np.issubdtype(targets.dtype, np.integer)
            or np.issubdtype(targets.dtype, np.floating)):
        raise GraphError(f"{name}: multi-label targets are {targets.dtype}; they must be 0 or 1 "
                         "(bool, int or float; -1 or NaN for unknown)")
    if np.issubdtype(targets.dtype, np.floating):
        unknown = np.isnan(targets)
        targets = np.where(unknown, -1, targets)
    bad = (targets != 0) & (targets != 1) & (targets != -1)
    if bad.any():
        i, t = (int(v[0]) for v in np.nonzero(bad))
        raise GraphError(f"{name}: multi-label target {targets[i, t].item()} of node {i}, "
                         f"task {t} is not 0 or 1 (-1 or NaN for unknown); a [N, T] label "
                         "array holds binary targets, a class id per node is a [N] array")
    return targets.astype(np.int8)


def _relation_ids(name: str, edge_type, num_relations: int) -> np.ndarray:
    """``edge_type`` as int8 (int16 past 127 relations) ids in ``[0, num_relations)``, or
    GraphError."""
    ids = np.asarray(edge_type)
    if ids.ndim != 1 or ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise GraphError(f"{name}: edge_type must be a [E] integer array of relation ids, got "
                         f"{ids.dtype} of shape {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_relations):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise GraphError(f"{name}: edge_type holds relation id {bad}, outside [0, "
                         f"{num_relations}) for the {num_relations} named relations")
    want = np.int8 if num_relations <= 127 else np.int16 if num_relations <= 32767 \
        else np.int32
    return ids.astype(want, copy=False)


def _non_finite_rows(features: np.ndarray) -> np.ndarray:
    """Sorted indices of the rows of ``features`` ``[N, F]`` holding NaN or inf, found a
    slice of rows at a time."""
    if features.ndim != 2 or not features.size:
        return np.zeros(0, np.int64)
    step = max(1, _CHECK_BYTES // max(features.shape[1] * features.itemsize, 1))
    found = []
    for start in range(0, features.shape[0], step):
        finite = np.isfinite(features[start:start + step]).all(axis=1)
        if not finite.all():
            found.append(start + np.flatnonzero(~finite))
    return np.concatenate(found) if found else np.zeros(0, np.int64)


def _node_ids(name: str, ids, what: str) -> np.ndarray:
    """Edge endpoints as a flat integer array (an empty list is no edges; whole floats are
    ids), or GraphError."""
    ids = np.asarray(ids).reshape(-1)
    if ids.size == 0:
        return ids.astype(np.int64)
    if np.issubdtype(ids.dtype, np.floating) and np.isfinite(ids).all() \
            and np.all(ids == np.round(ids)):
        return ids.astype(np.int64)
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise GraphError(f"{name}: edge {what}s are {ids.dtype}; they must be integer node "
                         "ids")
    return ids


def from_edges(src, dst, features, labels, *, edge_weight=None, num_classes=None,
               train_mask=None, val_mask=None, test_mask=None, name="graph",
               num_nodes=None, edge_type=None, relations=(), node_types=()) -> Graph:
    """Build a `Graph` from edge lists ``src -> dst`` (kept as given: no symmetrising, no dedup).

    A PyG ``edge_index`` (``[2, E]``, sources first) is ``from_edges(*edge_index, x, y)``.
    ``labels``: ``[N]`` (or ``[N, 1]``) class ids, or ``[N, T]`` binary targets of a
    multi-label task (``num_classes`` defaults to T; for class ids, the largest + 1).
    ``edge_weight``: an optional ``[E]`` weight per edge, in the order of ``src`` / ``dst``;
    ``edge_type`` likewise a relation id per edge, with ``relations`` and ``node_types`` as in
    `Graph`.
    Masks (``[N]`` or ``[splits, N]``) default to empty single splits. Raises `GraphError` for
    out-of-range ids before anything large is allocated.
    """
    src, dst = _node_ids(name, src, "source"), _node_ids(name, dst, "destination")
    features = np.asarray(features)
    if features.ndim != 2:
        raise GraphError(f"{name}: features have shape {features.shape}, expected [N, F] (one "
                         "row per node)")
    n = int(num_nodes if num_nodes is not None else features.shape[0])
    if src.shape != dst.shape:
        raise GraphError(f"{name}: {src.size} edge sources but {dst.size} destinations")
    for ids, what in ((src, "source"), (dst, "destination")):
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise GraphError(f"{name}: edge {what} {bad} is out of range for {n} nodes "
                             f"(ids must lie in [0, {n}))")
    if edge_type is not None:
        edge_type = np.asarray(edge_type).reshape(-1)
        if edge_type.shape != src.shape:
            raise GraphError(f"{name}: edge_type has shape {edge_type.shape}, expected "
                             f"[{src.size}] (one relation id per edge)")
    if edge_weight is not None:
        edge_weight = np.asarray(edge_weight)
        if edge_weight.ndim == 2 and edge_weight.shape[1] == 1:
            edge_weight = edge_weight[:, 0]
        if edge_weight.shape != src.shape:
            raise GraphError(f"{name}: edge_weight has shape {edge_weight.shape}, expected "
                             f"[{src.size}] (one weight per edge)")
    idx_t = index_dtype(max(n, src.size))
    order = np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, dtype=idx_t)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    labels = _targets(name, labels)
    if labels.ndim == 2 and labels.size and np.all(labels.sum(axis=1) == 1) \
            and not np.any(labels < 0):
        warnings.warn(f"{name}: the [N, {labels.shape[1]}] labels have exactly one 1 in every "
                      "row, and are read as that many binary targets (a multi-label task); if "
                      "they are one-hot class labels, pass labels.argmax(1)", stacklevel=2)
    if num_classes is None:  # (the file loaders refuse gaps: `class_count`)
        num_classes = labels.shape[1] if labels.ndim == 2 else \
            int(labels.max()) + 1 if labels.size else 1
    empty = np.zeros((1, n), dtype=bool)
    return Graph(indptr=indptr, indices=src[order].astype(idx_t), features=features,
                 labels=labels, train_mask=empty if train_mask is None else train_mask,
                 val_mask=empty if val_mask is None else val_mask,
                 test_mask=empty if test_mask is None else test_mask,
                 edge_weight=None if edge_weight is None else edge_weight[order],
                 edge_type=None if edge_type is None else edge_type[order],
                 relations=tuple(relations), node_types=tuple(node_types),
                 num_classes=num_classes, name=name)
