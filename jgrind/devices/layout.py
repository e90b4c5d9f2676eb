"""What one device holds: its nodes' rows, padded to a shape all devices share.

Device ``d`` holds the nodes of its partitions (`ExchangePlan.rows`), ``R`` rows in all
devices' common count (padding rows have no real edges and zero loss weight), followed in its
layer inputs by the halo slots: ``K - 1`` chunks of ``S`` rows, one per other device, those of
devices ``d + 1, d + 2, ...`` (modulo ``K``) in that order (`halo_chunk`), each holding what
that owner sends it (`ExchangePlan.sends`), in the owner's order. Its `Block` is over
``[R; (K - 1) S]`` input rows with ``R`` outputs, so the layers run on it unchanged. Host NumPy,
built per device, so that a process builds only the devices it drives.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jgrind.models.block import Block, make_block
from jgrind.plan.exchange import ExchangePlan

__all__ = ["DeviceShapes", "DeviceData", "device_data", "device_shapes", "halo_chunk"]


@dataclasses.dataclass(frozen=True)
class DeviceShapes:
    """The padded sizes every device shares.

    Attributes:
      rows: ``R``, the most nodes a device holds plus one padding row (where padded edges
        point).
      slot_rows: ``S``, rows of one (owner, reader) chunk of the exchange.
      edges: the most edges (in-edges of its rows) a device holds, at least 1.
      num_devices: ``K``.
    """

    rows: int
    slot_rows: int
    edges: int
    num_devices: int

    @property
    def inputs(self) -> int:
        """Input rows of an aggregating layer's block: the rows, then the halo slots."""
        return self.rows + (self.num_devices - 1) * self.slot_rows


def halo_chunk(owner: int, reader: int, num_devices: int) -> int:
    """Which of reader's ``K - 1`` halo chunks holds what ``owner`` sends it: the devices after
    the reader, in order, wrapping round (the all_to_all's own chunk is left out)."""
    return (owner - reader - 1) % num_devices


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DeviceData:
    """One device's host arrays.

    Attributes:
      block: the `Block` over its rows and halo slots (`DeviceShapes.inputs` inputs).
      x: ``[R, F]`` features of its rows (zero padding).
      labels: ``[R]`` (``[R, T]``) labels, -1 on padding.
      weights: ``[R]`` float32 loss weights (`jgrind.loss.node_weights`), 0 on padding.
      send: ``[K, S]`` int32 local rows it sends to every reader (0 as padding).
    """

    block: Block
    x: np.ndarray
    labels: np.ndarray
    weights: np.ndarray
    send: np.ndarray


def device_shapes(plan: ExchangePlan, indptr: np.ndarray) -> DeviceShapes:
    degree = np.diff(np.asarray(indptr, np.int64))
    edges = max((int(degree[r].sum()) for r in plan.rows), default=0)
    return DeviceShapes(rows=plan.max_rows + 1, slot_rows=plan.slot_rows, edges=max(edges, 1),
                        num_devices=plan.num_devices)


def device_data(d: int, plan: ExchangePlan, shapes: DeviceShapes, graph, weights: np.ndarray,
                *, needs_edges: bool, needs_adjacency: bool) -> DeviceData:
    """Device ``d``'s arrays; ``graph`` is the normalised graph (its edge weights are the
    model's global coefficients), ``weights`` the ``[N]`` loss weights."""
    rows, k, s, r_pad = plan.rows[d], shapes.num_devices, shapes.slot_rows, shapes.rows
    n = rows.size
    g_indptr = np.asarray(graph.indptr, np.int64)
    starts, deg = g_indptr[rows], g_indptr[rows + 1] - g_indptr[rows]
    nnz = int(deg.sum())
    edge = np.repeat(starts - np.cumsum(deg) + deg, deg) + np.arange(nnz)
    src = np.asarray(graph.indices)[edge]
    owner = plan.device_of[src]
    cols = np.empty(nnz, np.int64)
    local = owner == d
    cols[local] = plan.local_index[src[local]]
    for o in range(k):
        theirs = owner == o
        if o == d or not theirs.any():
            continue
        slot = np.searchsorted(plan.sends[o][d], plan.local_index[src[theirs]])
        cols[theirs] = r_pad + halo_chunk(o, d, k) * s + slot
    extra = shapes.edges - nnz
    indptr = np.empty(r_pad + 1, np.int64)
    indptr[0] = 0
    np.cumsum(deg, out=indptr[1:n + 1])
    indptr[n + 1:] = nnz
    indptr[-1] = nnz + extra  # padded edges: from the last padding row to itself, weight 0
    indices = np.concatenate([cols, np.full(extra, r_pad - 1)]).astype(np.int32)
    w = np.ones(nnz, np.float32) if graph.edge_weight is None else \
        np.asarray(graph.edge_weight, np.float32)[edge]
    w = np.concatenate([w, np.zeros(extra, np.float32)])
    ids = np.zeros(shapes.inputs, np.int32)
    ids[:n] = rows
    for o in range(k):
        if o == d:
            continue
        sent = plan.sends[o][d]
        at = r_pad + halo_chunk(o, d, k) * s
        ids[at: at + sent.size] = plan.rows[o][sent]
    edge_type = None
    if graph.edge_type is not None:  # padded edges are relation 0 (their weight is 0)
        edge_type = np.concatenate([np.asarray(graph.edge_type)[edge],
                                    np.zeros(extra, graph.edge_type.dtype)])
    block = make_block(indptr.astype(np.int32), indices, w, ids, num_out=r_pad,
                       needs_edges=needs_edges, needs_adjacency=needs_adjacency,
                       edge_type=edge_type, num_relations=graph.num_relations)
    x = np.zeros((r_pad, graph.num_features), np.float32)
    x[:n] = graph.features[rows]
    labels = np.full((r_pad, *graph.labels.shape[1:]), -1, graph.labels.dtype)
    labels[:n] = graph.labels[rows]
    own_weights = np.zeros(r_pad, np.float32)
    own_weights[:n] = weights[rows]
    send = np.zeros((k, s), np.int32)
    for r in range(k):
        sent = plan.sends[d][r]
        send[r, :sent.size] = sent
    return DeviceData(block=block, x=x, labels=labels, weights=own_weights, send=send)
