"""`Block`: the slice of a graph that one layer step sees.

A layer maps the rows of its *input* nodes to the rows of its *output* nodes. The first
``num_out`` input rows are the output nodes themselves (so self terms, residuals and attention
targets read ``h[:num_out]``); the remaining input rows are the halo, the in-neighbours that
live elsewhere. The whole graph is the block whose halo is empty, so the in-memory path and the
partitioned engine run the very same jitted layer code.

Relational layers (R-GCN, RGAT) read the relation of every edge. For the sparse product, the
block holds one adjacency that interleaves the relations by output row: ``[num_out * R, num_in]``,
where row ``i * R + r`` holds output ``i``'s in-edges of relation ``r``. Then one sparse product
gives every output's per-relation aggregates ``A_r X`` (``[num_out, R, F]`` once reshaped), which
the layer multiplies by its relation weights: the dense work is on the output rows, not on every
input row once per relation, and the sparse product runs at the input width. It holds the block's
own edges: the same number of stored entries (and the same padded shapes) as the homogeneous
block, where one adjacency per relation would each need padding.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import numpy as np

from jgrind.graph import Graph
from jgrind.sparse import Adjacency, adjacency


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Block:
    """Arrays (device or host) describing one layer step.

    Attributes:
      adj: ``Adjacency`` with the model's normalised weights, ``A`` of shape ``[num_out, num_in]``
        (and its transpose for the backward pass). ``None`` for models that do not aggregate by a
        fixed sparse product.
      edge_src: ``[E_b]`` int32 local input row of every edge (attention models only, else None).
      edge_dst: ``[E_b]`` int32 local output row of every edge (attention models only, else None).
      node_ids: ``[num_in]`` int32 global node id of every input row. Dropout masks are hashed
        from these, which is what makes them independent of the partitioning.
      num_out: static number of output rows.
      relation_adj: for a graph with relations, the relations' adjacencies interleaved by
        output row, ``[num_out * R, num_in]`` (see the module docstring), in place of ``adj``;
        else None.
      edge_type: ``[E_b]`` int32 relation of every edge (relational attention models only,
        else None).
    """

    adj: Optional[Adjacency]
    edge_src: Optional[jax.Array]
    edge_dst: Optional[jax.Array]
    node_ids: jax.Array
    num_out: int = dataclasses.field(metadata=dict(static=True))
    relation_adj: Optional[Adjacency] = None
    edge_type: Optional[jax.Array] = None

    @property
    def num_in(self) -> int:
        return int(self.node_ids.shape[0])


def make_block(indptr: np.ndarray, indices: np.ndarray, weight: Optional[np.ndarray],
               node_ids: np.ndarray, *, num_out: int, needs_edges: bool,
               needs_adjacency: bool, edge_type: Optional[np.ndarray] = None,
               num_relations: int = 1) -> Block:
    """A block from a local CSR with ``num_out`` rows over ``len(node_ids)`` input columns.

    ``edge_type``: the relation id in ``[0, num_relations)`` of every edge, or None for a
    graph without relations. Given, the adjacency is the relations' interleaved rows
    (``relation_adj``) instead of ``adj``, and edge lists carry the relation of every edge.

    Host-side NumPy construction; the caller moves the result to the device explicitly
    (``jax.device_put``) so that no transfer is implicit.
    """
    num_in = int(node_ids.shape[0])
    adj = relation_adj = types = None
    if needs_adjacency:
        w = np.ones(indices.size, np.float32) if weight is None else weight
        if edge_type is None:
            adj = adjacency(indptr, indices, w, num_in)
        else:
            relation_adj = _relation_rows(indptr, indices, w, edge_type, num_relations,
                                          num_in)
    src = dst = None
    if needs_edges:
        src = np.asarray(indices, np.int32)
        dst = np.repeat(np.arange(num_out, dtype=np.int32), np.diff(indptr))
        if edge_type is not None:
            types = np.asarray(edge_type, np.int32)
    return Block(adj=adj, edge_src=src, edge_dst=dst,
                 node_ids=np.asarray(node_ids, np.int32), num_out=num_out,
                 relation_adj=relation_adj, edge_type=types)


def _relation_rows(indptr, indices, weight, edge_type, num_relations: int,
                   num_in: int) -> Adjacency:
    """``[num_out * R, num_in]``: output ``i``'s edges of relation ``r`` in row ``i * R + r``,
    each row's edges in their order in the block's CSR."""
    num_relations = int(num_relations)
    num_out = int(np.asarray(indptr).size) - 1
    degree = np.diff(np.asarray(indptr, np.int64))
    rows = np.repeat(np.arange(num_out, dtype=np.int64), degree) * num_relations \
        + np.asarray(edge_type, np.int64)
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    interleaved = np.zeros(num_out * num_relations + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=num_out * num_relations), out=interleaved[1:])
    return adjacency(interleaved, np.asarray(indices)[order], np.asarray(weight)[order],
                     num_in)


def full_block(graph: Graph, *, needs_edges: bool, needs_adjacency: bool) -> Block:
    """The whole graph as one block: every node is an output and there is no halo."""
    return make_block(graph.indptr, graph.indices, graph.edge_weight,
                      np.arange(graph.num_nodes, dtype=np.int32), num_out=graph.num_nodes,
                      needs_edges=needs_edges, needs_adjacency=needs_adjacency,
                      edge_type=graph.edge_type, num_relations=graph.num_relations)
