"""`PartitionedGraph`: a graph cut into partitions, each with its owned nodes, halo and local CSR.

This is what the engine consumes. A layer runs partition by partition: partition ``p`` computes
the output rows of the nodes it *owns* from the input rows of its owned nodes plus its *halo*
(in-neighbours of owned nodes that other partitions own). Everything is host NumPy, built once
with global sorts plus a per-partition (never per-node) loop, in O(N + E) memory.

Layouts:

* Partition-major: the ``N`` nodes ordered by partition, each partition's block in ascending
  global id. Partition ``p``'s rows are ``offsets[p]:offsets[p + 1]``; node ``v`` is row
  ``position[v]``. A halo node of ``p`` lives at ``offsets[halo_owner] + halo_row`` there.
* Local inputs of partition ``p``: ``input_ids = concat(owned, halo)``; local CSR column
  ``c < n_own`` is ``owned[c]``, ``c >= n_own`` is ``halo[c - n_own]``.

Edge weights are *copied* from the partitioned graph (typically already normalised, e.g. by
`jgrind.transforms.gcn_norm`): normalisation is a property of the whole graph and is never
recomputed per partition, so the partitioned computation is exactly the full-graph one. The
relation id of every edge of a heterogeneous graph is copied the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from jgrind.graph import Graph, GraphError, freeze, index_dtype

__all__ = ["Partition", "PartitionedGraph", "partition_graph", "bucket", "shape_groups",
           "BUCKET_MIN"]

#: Smallest bucket: padded sizes are never below this, so padded arrays are never empty and
#: padding entries can always point at input 0.
BUCKET_MIN = 8


def bucket(n: int) -> int:
    """Round ``n`` up to the ladder ``{m * 2**e : m in 8..15, e >= 0}`` (8, 9, ..., 15, 16, 18,
    ..., 30, 32, 36, ...), with a minimum of `BUCKET_MIN` (so ``bucket(0) == 8``).

    Consecutive ladder values differ by at most 12.5%, so for ``n > 8`` the padding is under
    ``n / 8`` (``bucket(n) < 1.125 * n``) while a range of sizes 1..2**30 maps to only ~200
    distinct shapes: ``jit`` compiles a handful of programs per model, not one per partition.
    """
    n = int(n)
    if n < 0:
        raise ValueError(f"bucket size must be >= 0, got {n}")
    if n <= BUCKET_MIN:
        return BUCKET_MIN
    e = (n - 1).bit_length() - 4  # 2**(e+3) < n <= 2**(e+4), so the mantissa lies in 8..16
    m = -(-n // (1 << e))
    return m << e


def shape_groups(partitions, max_shapes: int = 3) -> dict:
    """``{partition index: (num_out, num_in, nnz)}`` padded block sizes, at most ``max_shapes``
    distinct ones (empty partitions are left out).

    Every distinct shape costs one compilation per jitted layer step. Partitions sorted by input
    rows are cut into ``max_shapes`` groups and each group is padded to its largest member,
    rounded up by `bucket`; one more row and edge than the largest member, so that there is
    always a padded output row for padded edges to point at. Balanced partitions lose a few
    percent to padding.
    """
    order = sorted((p for p in partitions if p.num_owned),
                   key=lambda p: (p.num_inputs, p.num_edges))
    sizes = {}
    for group in np.array_split(np.arange(len(order)), min(max_shapes, len(order)) or 1):
        members = [order[i] for i in group]
        if members:
            shape = (bucket(max(p.num_owned for p in members) + 1),
                     bucket(max(p.num_inputs for p in members) + 1),
                     bucket(max(p.num_edges for p in members) + 1))
            sizes.update({p.index: shape for p in members})
    return sizes


@dataclasses.dataclass(frozen=True, eq=False)
class Partition:
    """One partition: owned nodes, halo, and the local CSR of the owned rows.

    Attributes:
      index: partition id ``p``.
      owned: ``[n_own]`` int32 global ids owned by this partition, ascending.
      halo: ``[n_halo]`` int32 global ids of in-neighbours of owned nodes that other partitions
        own, sorted by (owner partition, row in the owner's `owned`) - i.e. by their row in the
        partition-major layout, so a regather reads each owner's block in order.
      halo_owner: ``[n_halo]`` int32 partition owning each halo node.
      halo_row: ``[n_halo]`` int32 row of each halo node in its owner's block (index into the
        owner's `owned`).
      indptr: ``[n_own + 1]`` local CSR row pointers; row ``r`` is node ``owned[r]`` and lists
        its in-neighbours in the global CSR's order.
      indices: ``[nnz]`` int32 local input column: ``c < n_own`` is ``owned[c]``, otherwise
        ``halo[c - n_own]``.
      weight: ``[nnz]`` float32 edge weights copied from the graph's ``edge_weight``, or None.
      edge_type: ``[nnz]`` relation id of every local edge, copied from the graph's
        ``edge_type``, or None for a graph without relations.
      num_relations: the graph's number of relations (1 without relations).
    """

    index: int
    owned: np.ndarray
    halo: np.ndarray
    halo_owner: np.ndarray
    halo_row: np.ndarray
    indptr: np.ndarray
    indices: np.ndarray
    weight: Optional[np.ndarray]
    edge_type: Optional[np.ndarray] = None
    num_relations: int = 1

    @property
    def num_owned(self) -> int:
        return int(self.owned.size)

    @property
    def num_halo(self) -> int:
        return int(self.halo.size)

    @property
    def num_inputs(self) -> int:
        return self.num_owned + self.num_halo

    @property
    def num_edges(self) -> int:
        return int(self.indices.size)

    @property
    def input_ids(self) -> np.ndarray:
        """``[n_own + n_halo]`` global id of every local input column."""
        return np.concatenate([self.owned, self.halo])

    def rows(self) -> np.ndarray:
        """``[nnz]`` int32 local output row of every edge (COO form of the local CSR)."""
        return np.repeat(np.arange(self.num_owned, dtype=np.int32), np.diff(self.indptr))

    def local_matrix(self):
        """The local block as a scipy CSR matrix ``[n_own, n_own + n_halo]`` (weights, or ones
        for an unweighted graph), e.g. ``local_matrix() @ X[input_ids]``."""
        import scipy.sparse as sp
        data = np.ones(self.num_edges, np.float32) if self.weight is None else self.weight
        return sp.csr_matrix((data, self.indices, self.indptr),
                             shape=(self.num_owned, self.num_inputs))

    def __repr__(self) -> str:
        return (f"Partition({self.index}, owned={self.num_owned:,}, halo={self.num_halo:,}, "
                f"edges={self.num_edges:,})")


@dataclasses.dataclass(frozen=True, eq=False)
class PartitionedGraph:
    """A graph and its partitions.

    Attributes:
      graph: the partitioned graph (typically already normalised: its edge weights are the
        model's global coefficients).
      assignment: ``[N]`` int32 partition of every node.
      partitions: one `Partition` per partition id ``0..P-1`` (possibly empty ones).
      offsets: ``[P + 1]`` int64; partition ``p``'s rows in the partition-major layout are
        ``offsets[p]:offsets[p + 1]``.
      position: ``[N]`` int64 row of node ``v`` in the partition-major layout
        (``offsets[assignment[v]]`` + index of ``v`` in its partition's `owned`).
    """

    graph: Graph
    assignment: np.ndarray
    partitions: tuple
    offsets: np.ndarray
    position: np.ndarray

    @property
    def num_parts(self) -> int:
        return len(self.partitions)

    @property
    def num_nodes(self) -> int:
        return int(self.assignment.size)

    def __len__(self) -> int:
        return len(self.partitions)

    def __getitem__(self, p: int) -> Partition:
        return self.partitions[p]

    def __iter__(self):
        return iter(self.partitions)

    @property
    def order(self) -> np.ndarray:
        """``[N]`` node ids in partition-major order (the inverse of `position`):
        ``x[order]`` turns a node-indexed array into the partition-major layout."""
        if self.num_nodes == 0:
            return np.zeros(0, np.int32)
        return np.concatenate([p.owned for p in self.partitions])

    def to_partition_major(self, x: np.ndarray) -> np.ndarray:
        """Rows of a node-indexed array ``x[N, ...]`` in partition-major order."""
        return np.asarray(x)[self.order]

    def from_partition_major(self, x_pm: np.ndarray) -> np.ndarray:
        """Inverse of `to_partition_major`: node-indexed rows."""
        return np.asarray(x_pm)[self.position]

    def halo_positions(self, p: int) -> np.ndarray:
        """``[n_halo]`` int64 partition-major rows of partition ``p``'s halo (ascending)."""
        part = self.partitions[p]
        return self.offsets[part.halo_owner] + part.halo_row

    def input_positions(self, p: int) -> np.ndarray:
        """``[n_own + n_halo]`` int64 partition-major rows of partition ``p``'s inputs: its own
        block followed by its halo."""
        own = np.arange(self.offsets[p], self.offsets[p + 1], dtype=np.int64)
        return np.concatenate([own, self.halo_positions(p)])

    def shape_groups(self, max_shapes: int = 3) -> dict:
        """Padded block sizes per partition; see `shape_groups`."""
        return shape_groups(self.partitions, max_shapes)

    def __repr__(self) -> str:
        return (f"PartitionedGraph({self.graph.name!r}, parts={self.num_parts}, "
                f"nodes={self.num_nodes:,}, edges={self.graph.num_edges:,}, "
                f"halo={sum(p.num_halo for p in self.partitions):,})")


def _check_assignment(graph: Graph, assignment, num_parts) -> tuple[np.ndarray, int]:
    n = graph.num_nodes
    a = np.asarray(assignment)
    if a.shape != (n,):
        raise GraphError(f"{graph.name}: assignment has shape {a.shape}, expected [{n}] "
                         "(one partition id per node)")
    if a.dtype == bool or not np.issubdtype(a.dtype, np.integer):
        raise GraphError(f"{graph.name}: assignment must hold integer partition ids, got "
                         f"dtype {a.dtype}")
    lo, hi = int(a.min()), int(a.max())
    num_parts = max(hi + 1, 1) if num_parts is None else int(num_parts)
    if num_parts < 1:
        raise GraphError(f"{graph.name}: num_parts must be >= 1, got {num_parts}")
    if lo < 0 or hi >= num_parts:
        bad = lo if lo < 0 else hi
        raise GraphError(f"{graph.name}: assignment holds partition id {bad}, outside "
                         f"[0, {num_parts}) (num_parts={num_parts})")
    return np.array(a, dtype=np.int32), num_parts  # a copy: the caller may reuse its array


def partition_graph(graph: Graph, assignment, num_parts: Optional[int] = None
                    ) -> PartitionedGraph:
    """Build the `PartitionedGraph` for ``assignment`` (``[N]`` ints in ``[0, num_parts)``).

    ``num_parts`` defaults to ``assignment.max() + 1``; pass it to keep trailing empty
    partitions. Empty partitions are allowed (``n_own = 0``: empty halo and CSR).

    Cost: one stable sort of the assignment, then per partition a gather of its rows' edges and
    a sort of its external edge sources; O(N + E) memory in all (the partitions' arrays plus
    transients the size of one partition's edges), vectorised within each partition.
    """
    a, num_parts = _check_assignment(graph, assignment, num_parts)
    n = graph.num_nodes
    counts = np.bincount(a, minlength=num_parts).astype(np.int64)
    offsets = np.zeros(num_parts + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    id_t = index_dtype(n)  # int32 unless N >= 2**31
    order = np.argsort(a, kind="stable").astype(id_t)  # partition-major, ascending ids
    position = np.empty(n, np.int64)
    position[order] = np.arange(n, dtype=np.int64)
    pos_n = position.astype(id_t)  # < N: the narrow index type for the gathers below
    g_indptr = np.asarray(graph.indptr, np.int64)
    g_indices = graph.indices
    weight = graph.edge_weight
    ptr_t = graph.indptr.dtype
    mark = np.zeros(n, id_t)  # scratch: position -> local halo column of the current part
    parts = []
    for p in range(num_parts):
        o0, o1 = int(offsets[p]), int(offsets[p + 1])
        owned = order[o0:o1]
        n_own = o1 - o0
        starts = g_indptr[owned]
        deg = g_indptr[owned + 1] - starts
        indptr = np.zeros(n_own + 1, np.int64)
        np.cumsum(deg, out=indptr[1:])
        nnz = int(indptr[-1])
        # global CSR entries of the owned rows, in order
        gidx = np.repeat(starts - indptr[:-1], deg) + np.arange(nnz, dtype=np.int64)
        spos = pos_n[g_indices[gidx]]
        internal = (spos >= o0) & (spos < o1)
        cols = spos - id_t.type(o0)
        ext = np.flatnonzero(~internal)
        ext_pos = spos[ext]
        hpos = np.sort(ext_pos)  # partition-major rows = (owner, row in owner); dedup:
        if hpos.size > 1:
            hpos = hpos[np.concatenate([[True], hpos[1:] != hpos[:-1]])]
        mark[hpos] = np.arange(n_own, n_own + hpos.size, dtype=id_t)
        cols[ext] = mark[ext_pos]
        halo = order[hpos]
        halo_owner = a[halo]
        halo_row = (hpos - offsets[halo_owner]).astype(np.int32)
        w = None if weight is None else weight[gidx]
        types = None if graph.edge_type is None else freeze(graph.edge_type[gidx])
        parts.append(Partition(
            index=p, owned=freeze(owned), halo=freeze(halo),
            halo_owner=freeze(halo_owner),
            halo_row=freeze(halo_row), indptr=freeze(indptr.astype(ptr_t)),
            indices=freeze(cols),
            weight=None if w is None else freeze(w.astype(np.float32, copy=False)),
            edge_type=types, num_relations=graph.num_relations))
    return PartitionedGraph(graph=graph, assignment=freeze(a), partitions=tuple(parts),
                            offsets=freeze(offsets), position=freeze(position))
