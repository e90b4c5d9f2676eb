"""The `HeteroGraph` value: a node-classification graph with several node and edge types.

Node types hold contiguous ranges of ids, each type numbering its own nodes ``0 .. n_t - 1``.
Each relation ``(src_type, name, dst_type)`` is a CSR of shape ``[n_dst, n_src]`` in those
local ids: row ``i`` holds the in-neighbours (sources) of destination ``i``, as in
`jgrind.graph.Graph`. One type, the target, carries the labels and the splits.

Models and the engine read the homogeneous `Graph` that `HeteroGraph.to_graph` builds: types
concatenated in order, every edge tagged with its relation id (``Graph.edge_type``). This
module is the one place that knows how the two correspond.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Mapping, NamedTuple, Optional

import numpy as np
import scipy.sparse as sp

from jgrind.graph import Graph, GraphError, class_count, freeze, index_dtype

RelationKey = tuple[str, str, str]  # (source type, relation name, destination type)

# A featureless type's mean over its in-neighbours is computed this many destination rows at
# a time, so the temporary is a slice, not [n_t, F] (1.1M authors x 128 floats for ogbn-mag).
_MEAN_ROWS = 1 << 16


class RelationCSR(NamedTuple):
    """One relation's edges: row ``i`` (a destination) lists its sources ``indices[indptr[i]:
    indptr[i + 1]]``; both in the local ids of their types."""

    indptr: np.ndarray
    indices: np.ndarray

    @property
    def num_edges(self) -> int:
        return int(self.indices.size)

    def destinations(self) -> np.ndarray:
        """``[E]`` local destination id of every entry of `indices`."""
        return np.repeat(np.arange(self.indptr.size - 1, dtype=self.indices.dtype),
                         np.diff(self.indptr))


def relation_csr(src, dst, num_dst: int) -> RelationCSR:
    """The CSR of the edges ``src[k] -> dst[k]`` (local ids), rows grouped by destination and,
    within a row, in the order given. Ids are checked by `HeteroGraph`, not here."""
    src, dst = np.asarray(src).reshape(-1), np.asarray(dst).reshape(-1)
    if src.shape != dst.shape:
        raise GraphError(f"{src.size} edge sources but {dst.size} destinations")
    if dst.size and (dst.min() < 0 or dst.max() >= num_dst):
        bad = int(dst.min()) if dst.min() < 0 else int(dst.max())
        raise GraphError(f"edge destination {bad} is outside [0, {num_dst})")
    idx_t = index_dtype(max(num_dst, src.size))
    indptr = np.zeros(num_dst + 1, idx_t)
    np.cumsum(np.bincount(dst, minlength=num_dst), out=indptr[1:])
    order = np.argsort(dst, kind="stable")
    return RelationCSR(indptr, src[order].astype(idx_t))


def relation_name(key: RelationKey) -> str:
    """``(src, rel, dst)`` -> ``"src__rel__dst"``, the spelling of `Graph.relations`."""
    return "__".join(key)


@dataclasses.dataclass(frozen=True, eq=False)
class HeteroGraph:
    """A graph with typed nodes and typed edges, labels on one node type.

    Attributes:
      node_types: ``(type name, count)`` pairs, in the order the types' ids follow each other
        in `to_graph`.
      relations: ``(src_type, name, dst_type) -> RelationCSR`` of shape ``[n_dst, n_src]``
        (row: destination, columns: its in-neighbour sources, in local ids). Order is kept:
        it numbers the relations (``Graph.edge_type``).
      features: ``type -> [n_t, F_t]`` float32 features; a type that is missing or None has
        none (see `to_graph` for what it gets). Widths may differ between types.
      target: the node type that is classified.
      labels: ``[n_target]`` int class ids, ``-1`` for an unlabelled node (in no mask).
      train_mask, val_mask, test_mask: ``[S, n_target]`` bool (a ``[n_target]`` mask is one
        split); within a split the three are disjoint.
      num_classes: C; by default counted from the labels (`jgrind.graph.class_count`).
      name: a label for logs and reports.

    The constructor validates everything, raising `GraphError` with one line naming the first
    problem, and freezes the arrays.
    """

    node_types: tuple
    relations: Mapping
    target: str
    labels: Optional[np.ndarray]
    train_mask: np.ndarray
    val_mask: np.ndarray
    test_mask: np.ndarray
    features: Mapping = dataclasses.field(default_factory=dict)
    num_classes: Optional[int] = None
    name: str = "hetero"

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen dataclass
        name = self.name
        node_types = tuple((str(t), _count(name, t, c)) for t, c in self.node_types)
        set_("node_types", node_types)
        if not node_types:
            raise GraphError(f"{name}: a heterogeneous graph needs at least one node type")
        type_names = [t for t, _ in node_types]
        for t in type_names:
            if not t or "__" in t:
                raise GraphError(f"{name}: node type {t!r} must be a non-empty name without "
                                 "'__' (relations are spelt src__rel__dst)")
        if len(set(type_names)) != len(type_names):
            raise GraphError(f"{name}: node type names repeat: {type_names}")
        counts = dict(node_types)
        known = ", ".join(type_names)

        relations = {}
        for key, csr in dict(self.relations).items():
            if not (isinstance(key, tuple) and len(key) == 3):
                raise GraphError(f"{name}: relation key {key!r} must be a (source type, name, "
                                 "destination type) tuple")
            src, rel, dst = (str(k) for k in key)
            for end, t in (("source", src), ("destination", dst)):
                if t not in counts:
                    raise GraphError(f"{name}: relation {relation_name((src, rel, dst))} names "
                                     f"the unknown {end} node type {t!r} (node types: {known})")
            if not rel or "__" in rel:
                raise GraphError(f"{name}: relation name {rel!r} of {src} -> {dst} must be "
                                 "non-empty and without '__'")
            relations[(src, rel, dst)] = _check_csr(name, (src, rel, dst), csr, counts)
        set_("relations", types.MappingProxyType(relations))

        features = {}
        for t, x in dict(self.features).items():
            if t not in counts:
                raise GraphError(f"{name}: features given for the unknown node type {t!r} "
                                 f"(node types: {known})")
            if x is not None:
                features[t] = _check_features(name, t, x, counts[t])
        set_("features", types.MappingProxyType(features))

        target = str(self.target)
        set_("target", target)
        if target not in counts:
            raise GraphError(f"{name}: the target type {target!r} is not a node type (node "
                             f"types: {known})")
        n = counts[target]
        if self.labels is None:
            raise GraphError(f"{name}: the target type {target!r} has no labels; give "
                             f"[{n}] class ids (-1 for unlabelled)")
        labels = np.asarray(self.labels)
        if labels.ndim == 2 and labels.shape[1] == 1:
            labels = labels[:, 0]
        if labels.shape != (n,):
            raise GraphError(f"{name}: the target type {target!r} has {n} nodes but the labels "
                             f"have shape {labels.shape}; give one class id per {target} node")
        if labels.dtype == bool or not np.issubdtype(labels.dtype, np.integer):
            raise GraphError(f"{name}: labels are {labels.dtype}; they must be integer class "
                             "ids (-1 for unlabelled)")
        if labels.size and labels.min() < -1:
            raise GraphError(f"{name}: label {int(labels.min())} is negative; use -1 for an "
                             "unlabelled node")
        set_("labels", freeze(labels.astype(np.int32)))
        set_("num_classes", class_count(self.labels, self.num_classes, name))
        masks = []
        for k in ("train_mask", "val_mask", "test_mask"):
            m = np.asarray(getattr(self, k), dtype=bool)
            m = m[None] if m.ndim == 1 else m
            if m.ndim != 2 or m.shape[1] != n:
                raise GraphError(f"{name}: {k} has shape {m.shape}, expected [splits, {n}] "
                                 f"(one column per {target} node)")
            masks.append(m)
            set_(k, freeze(m))
        if len({m.shape for m in masks}) != 1:
            raise GraphError(f"{name}: the masks differ in shape: "
                             f"{[m.shape for m in masks]}")
        tr, va, te = masks
        if np.any((tr & va) | (tr & te) | (va & te)):
            raise GraphError(f"{name}: the train, val and test masks overlap; a node may be in "
                             "one set only")
        unlabelled = (tr | va | te) & (self.labels < 0)[None]
        if unlabelled.any():
            i = int(np.nonzero(unlabelled)[1][0])
            raise GraphError(f"{name}: {target} node {i} is in a mask but has no label (-1)")

    # -- sizes ------------------------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return sum(c for _, c in self.node_types)

    @property
    def num_edges(self) -> int:
        return sum(csr.num_edges for csr in self.relations.values())

    def count(self, node_type: str) -> int:
        return dict(self.node_types)[node_type]

    def offsets(self) -> dict[str, int]:
        """``type -> first global id`` in `to_graph`'s numbering."""
        out, start = {}, 0
        for t, c in self.node_types:
            out[t] = start
            start += c
        return out

    def relation_names(self) -> tuple[str, ...]:
        """``"src__rel__dst"`` of every relation, in order: `Graph.relations` of `to_graph`."""
        return tuple(relation_name(k) for k in self.relations)

    def __repr__(self) -> str:
        types_ = ", ".join(f"{t}={c:,}" for t, c in self.node_types)
        return (f"HeteroGraph(name={self.name!r}, types=({types_}), "
                f"relations={len(self.relations)}, edges={self.num_edges:,}, "
                f"target={self.target!r}, classes={self.num_classes}, "
                f"splits={self.train_mask.shape[0]})")

    # -- transforms -------------------------------------------------------------------------
    def replace(self, **changes) -> "HeteroGraph":
        return dataclasses.replace(self, **changes)

    def with_inverses(self) -> "HeteroGraph":
        """A copy with ``(dst, "rev_" + name, src)``, the transpose, added after the relations
        for every relation that has no inverse yet: no relation ``(dst, *, src)`` holding
        exactly its edges reversed (a same-type relation that is symmetric is its own). This is
        what R-GCN set-ups on ogbn-mag do (DGL's and PyG's examples), so that every type
        receives messages; DBLP's pickles already hold both directions."""
        relations = dict(self.relations)
        for (src, rel, dst), csr in self.relations.items():
            reverse = _transpose(csr, self.count(src))
            if any(_same_edges(other, reverse) for (s, _, d), other in relations.items()
                   if (s, d) == (dst, src)):
                continue
            key = (dst, f"rev_{rel}", src)
            if key in relations:
                raise GraphError(f"{self.name}: cannot add the inverse of "
                                 f"{relation_name((src, rel, dst))}: {relation_name(key)} "
                                 "exists and is not its transpose")
            relations[key] = reverse
        return self.replace(relations=relations)

    def to_graph(self) -> Graph:
        """The homogeneous `Graph` models and the engine read.

        - Nodes: the types concatenated in `node_types` order (type t's node i is global node
          ``offsets()[t] + i``); ``Graph.node_types`` records the ranges.
        - Edges: every relation's edges in global ids, merged into one CSR grouped by
          destination; ``Graph.edge_type`` holds each edge's relation id (its position in
          `relations`) and ``Graph.relations`` the names ``"src__rel__dst"``. Within a row,
          edges come by relation id, then in the relation's own order.
        - Labels: the target's, ``-1`` on every other node; masks on target nodes only.
        - Features: one width, the widest type's; narrower types are zero-padded. A type
          without features gets, per node, the mean of its in-neighbours' features over every
          relation reaching it from a type whose features are known (pooled over all those
          edges), repeated through the types that get theirs this way (ogbn-mag with inverses:
          authors and fields of study from papers, then institutions from authors); a node
          that nothing reaches gets zeros. This is the neighbour averaging NARS and SeHGNN
          use for featureless types; it needs no learned embedding table, so the graph stays
          a plain feature matrix.
        """
        offsets, n = self.offsets(), self.num_nodes
        relations = list(self.relations.items())
        idx_t = index_dtype(max(n, self.num_edges))
        in_degree = np.zeros(n, np.int64)
        for (_, _, dst), csr in relations:
            in_degree[offsets[dst]:offsets[dst] + self.count(dst)] += np.diff(csr.indptr)
        indptr = np.zeros(n + 1, idx_t)
        np.cumsum(in_degree, out=indptr[1:])
        del in_degree
        indices = np.empty(int(indptr[-1]), idx_t)
        edge_type = np.empty(indices.size, np.int8 if len(relations) <= 127 else np.int16)
        cursor = indptr[:-1].astype(np.int64)  # each global row's next free position
        for rel_id, ((src, _, dst), csr) in enumerate(relations):
            lo, hi = offsets[dst], offsets[dst] + self.count(dst)
            degree = np.diff(csr.indptr).astype(np.int64)
            # entry k of local row i goes to cursor[lo + i] + (k - indptr[i])
            position = np.repeat(cursor[lo:hi] - csr.indptr[:-1], degree)
            position += np.arange(csr.num_edges, dtype=np.int64)
            indices[position] = csr.indices.astype(idx_t) + offsets[src]
            edge_type[position] = rel_id
            cursor[lo:hi] += degree
            del position
        labels = np.full(n, -1, np.int32)
        t0 = offsets[self.target]
        labels[t0:t0 + self.labels.size] = self.labels
        masks = []
        for m in (self.train_mask, self.val_mask, self.test_mask):
            full = np.zeros((m.shape[0], n), bool)
            full[:, t0:t0 + m.shape[1]] = m
            masks.append(full)
        return Graph(indptr=indptr, indices=indices, features=self._global_features(),
                     labels=labels, train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                     num_classes=self.num_classes, name=self.name,
                     edge_type=edge_type if relations else None,
                     relations=self.relation_names(), node_types=self.node_types)

    def _global_features(self) -> np.ndarray:
        """``[N, F]`` float32 for `to_graph` (see there)."""
        if not self.features:
            raise GraphError(f"{self.name}: no node type has features; give at least one type "
                             "features (the others get their in-neighbours' mean)")
        offsets, n = self.offsets(), self.num_nodes
        width = max(x.shape[1] for x in self.features.values())
        out = np.zeros((n, width), np.float32)
        for t, x in self.features.items():
            out[offsets[t]:offsets[t] + x.shape[0], :x.shape[1]] = x
        known = set(self.features)
        while True:
            reached = {dst for (src, _, dst) in self.relations
                       if src in known and dst not in known}
            if not reached:
                break
            for t in [t for t, _ in self.node_types if t in reached]:  # one round, fixed order
                incoming = [(src, csr) for (src, _, dst), csr in self.relations.items()
                            if dst == t and src in known]
                self._mean_into(out, t, incoming, offsets)
            known |= reached
        return out

    def _mean_into(self, out: np.ndarray, t: str, incoming, offsets) -> None:
        """Rows of type ``t`` in ``out``: the mean of their in-neighbours' rows over the
        ``incoming`` relations' edges, pooled (zeros for a node with none)."""
        n_t, lo = self.count(t), offsets[t]
        matrices = [(sp.csr_matrix((np.ones(csr.num_edges, np.float32), csr.indices,
                                    csr.indptr), shape=(n_t, self.count(src))),
                     out[offsets[src]:offsets[src] + self.count(src)])
                    for src, csr in incoming]
        degree = sum(np.diff(csr.indptr) for _, csr in incoming).astype(np.float32)
        for start in range(0, n_t, _MEAN_ROWS):
            stop = min(start + _MEAN_ROWS, n_t)
            total = sum(a[start:stop] @ x for a, x in matrices)
            total /= np.maximum(degree[start:stop], 1)[:, None]
            out[lo + start:lo + stop] = total


def _count(name: str, node_type, count) -> int:
    if isinstance(count, (bool, np.bool_)) or not isinstance(count, (int, np.integer)) \
            or count < 1:
        raise GraphError(f"{name}: node type {node_type!r} has count {count!r}; a count is a "
                         "whole number of at least 1")
    return int(count)


def _check_csr(name: str, key: RelationKey, csr, counts: dict) -> RelationCSR:
    src, _, dst = key
    label = relation_name(key)
    if sp.issparse(csr):
        csr = sp.csr_matrix(csr)
        csr = RelationCSR(csr.indptr, csr.indices)
    if not (isinstance(csr, tuple) and len(csr) == 2):
        raise GraphError(f"{name}: relation {label} must be a RelationCSR (indptr, indices), "
                         f"got {type(csr).__name__}")
    indptr, indices = np.asarray(csr[0]), np.asarray(csr[1]).reshape(-1)
    n_dst, n_src = counts[dst], counts[src]
    for what, a in (("indptr", indptr), ("indices", indices)):
        if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
            raise GraphError(f"{name}: relation {label}: {what} are {a.dtype}, not integers")
    if indptr.shape != (n_dst + 1,):
        raise GraphError(f"{name}: relation {label}: indptr has shape {indptr.shape}, expected "
                         f"[{n_dst + 1}] (a row per {dst} node, plus one)")
    if indptr[0] != 0 or np.any(indptr[1:] < indptr[:-1]) or indptr[-1] != indices.size:
        raise GraphError(f"{name}: relation {label}: indptr must start at 0, never decrease "
                         f"and end at the {indices.size} indices")
    if indices.size and (indices.min() < 0 or indices.max() >= n_src):
        bad = int(indices.min()) if indices.min() < 0 else int(indices.max())
        raise GraphError(f"{name}: relation {label}: source id {bad} is outside {src}'s ids "
                         f"[0, {n_src})")
    idx_t = index_dtype(max(n_dst, n_src, indices.size))
    return RelationCSR(freeze(indptr.astype(idx_t, copy=False)),
                       freeze(indices.astype(idx_t, copy=False)))


def _check_features(name: str, node_type: str, x, n: int) -> np.ndarray:
    if sp.issparse(x):
        x = x.toarray()
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] != n:
        raise GraphError(f"{name}: features of {node_type!r} have shape {x.shape}, expected "
                         f"[{n}, F] (one row per {node_type} node)")
    if not (np.issubdtype(x.dtype, np.number) or x.dtype == bool) \
            or np.issubdtype(x.dtype, np.complexfloating):
        raise GraphError(f"{name}: features of {node_type!r} are {x.dtype}; they must be real "
                         "numbers")
    x = x.astype(np.float32, copy=False)
    finite = np.isfinite(x).all(axis=1)
    if not finite.all():
        raise GraphError(f"{name}: features of {node_type!r} contain NaN or inf in "
                         f"{int((~finite).sum())} rows (first: node {int(np.argmin(finite))}); "
                         "impute or drop them before loading")
    return freeze(x)


def _transpose(csr: RelationCSR, num_src: int) -> RelationCSR:
    """The reversed edges: a CSR ``[n_src, n_dst]``, each row's sources in increasing order."""
    n_dst = csr.indptr.size - 1
    order = np.argsort(csr.indices, kind="stable")
    idx_t = index_dtype(max(num_src, n_dst, csr.num_edges))
    indptr = np.zeros(num_src + 1, idx_t)
    np.cumsum(np.bincount(csr.indices, minlength=num_src), out=indptr[1:])
    return RelationCSR(indptr, csr.destinations()[order].astype(idx_t))


def _same_edges(a: RelationCSR, b: RelationCSR) -> bool:
    """Whether two CSRs of one shape hold the same edges (as a multiset; order within a row
    aside)."""
    if a.indptr.shape != b.indptr.shape or a.num_edges != b.num_edges \
            or not np.array_equal(a.indptr, b.indptr):
        return False
    width = int(max(a.indices.max(initial=0), b.indices.max(initial=0))) + 1
    keys = [np.sort(r.destinations().astype(np.int64) * width + r.indices) for r in (a, b)]
    return bool(np.array_equal(*keys))
