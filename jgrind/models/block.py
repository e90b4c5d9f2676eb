"""`Block`: the slice of a graph that one layer step sees.

A layer maps the rows of its *input* nodes to the rows of its *output* nodes. The first
``num_out`` input rows are the output nodes themselves (so self terms, residuals and attention
targets read ``h[:num_out]``); the remaining input rows are the halo, the in-neighbours that
live elsewhere. The whole graph is the block whose halo is empty, so the in-memory path and the
partitioned engine run the very same jitted layer code.
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
    """

    adj: Optional[Adjacency]
    edge_src: Optional[jax.Array]
    edge_dst: Optional[jax.Array]
    node_ids: jax.Array
    num_out: int = dataclasses.field(metadata=dict(static=True))

    @property
    def num_in(self) -> int:
        return int(self.node_ids.shape[0])


def make_block(indptr: np.ndarray, indices: np.ndarray, weight: Optional[np.ndarray],
               node_ids: np.ndarray, *, num_out: int, needs_edges: bool,
               needs_adjacency: bool) -> Block:
    """A block from a local CSR with ``num_out`` rows over ``len(node_ids)`` input columns.

    Host-side NumPy construction; the caller moves the result to the device explicitly
    (``jax.device_put``) so that no transfer is implicit.
    """
    num_in = int(node_ids.shape[0])
    adj = None
    if needs_adjacency:
        w = np.ones(indices.size, np.float32) if weight is None else weight
        adj = adjacency(indptr, indices, w, num_in)
    src = dst = None
    if needs_edges:
        src = np.asarray(indices, np.int32)
        dst = np.repeat(np.arange(num_out, dtype=np.int32), np.diff(indptr))
    return Block(adj=adj, edge_src=src, edge_dst=dst,
                 node_ids=np.asarray(node_ids, np.int32), num_out=num_out)


def full_block(graph: Graph, *, needs_edges: bool, needs_adjacency: bool) -> Block:
    """The whole graph as one block: every node is an output and there is no halo."""
    return make_block(graph.indptr, graph.indices, graph.edge_weight,
                      np.arange(graph.num_nodes, dtype=np.int32), num_out=graph.num_nodes,
                      needs_edges=needs_edges, needs_adjacency=needs_adjacency)
