"""The halo exchange between devices: which rows each device sends to each other device.

With the nodes spread over devices, a layer that aggregates needs, on every device (the
*reader*), the input rows of its nodes' in-neighbours that other devices (the *owners*) hold.
`exchange_plan` lists them for every ordered pair (owner, reader): the owner's local rows the
reader needs, each once, whatever the number of the reader's nodes that read it.

The collective that moves them (`jax.lax.all_to_all`) sends equal-sized chunks: every pair's
list is padded to the longest, ``slot_rows``. `ExchangePlan.bytes_sent` counts what it moves
with that padding; `ExchangePlan.minimum_bytes` the distinct (row, reading device) pairs, what
any exchange must move. Pure NumPy.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from jgrind.plan.cost import ITEMSIZE
from jgrind.plan.inventory import layer_widths

__all__ = ["ExchangePlan", "device_rows", "epoch_exchange_bytes", "exchange_plan"]


@dataclasses.dataclass(frozen=True, eq=False)
class ExchangePlan:
    """Rows per device and the rows each device sends to each other one.

    Attributes:
      num_devices: K.
      device_of: ``[N]`` int32 device holding every node.
      rows: ``rows[d]``: ``[n_d]`` global ids of the nodes device ``d`` holds, ascending (its
        local row order).
      local_index: ``[N]`` int64 row of every node in its device's ``rows``.
      sends: ``sends[o][r]``: ``[c]`` int64 local rows of owner ``o`` that reader ``r`` needs,
        ascending and distinct (empty for ``o == r``).
      counts: ``[K, K]`` int64 ``len(sends[o][r])``.
    """

    num_devices: int
    device_of: np.ndarray
    rows: tuple
    local_index: np.ndarray
    sends: tuple
    counts: np.ndarray

    @property
    def slot_rows(self) -> int:
        """Rows of one (owner, reader) chunk of the collective: the longest list."""
        return int(self.counts.max()) if self.counts.size else 0

    @property
    def max_rows(self) -> int:
        """The most nodes one device holds."""
        return max((r.size for r in self.rows), default=0)

    def bytes_sent(self, width: int) -> int:
        """Bytes one exchange of ``width``-wide float32 rows moves between devices, padding
        included: ``K (K - 1)`` chunks of `slot_rows` rows (a device's chunk to itself stays
        in its memory)."""
        k = self.num_devices
        return k * (k - 1) * self.slot_rows * int(width) * ITEMSIZE

    def minimum_bytes(self, width: int) -> int:
        """Bytes any exchange must move: each distinct (row, reading device) pair once."""
        return int(self.counts.sum()) * int(width) * ITEMSIZE


def device_rows(device_of: np.ndarray, num_devices: int) -> tuple[tuple, np.ndarray]:
    """``(rows, local_index)``: every device's nodes, ascending (its local row order), and
    every node's row in its device's list."""
    k = int(num_devices)
    order = np.argsort(device_of, kind="stable")
    bounds = np.searchsorted(device_of[order], np.arange(k + 1))
    rows = tuple(order[bounds[d]:bounds[d + 1]] for d in range(k))
    local_index = np.empty(device_of.size, np.int64)
    for d in range(k):
        local_index[rows[d]] = np.arange(rows[d].size)
    return rows, local_index


def exchange_plan(indptr: np.ndarray, indices: np.ndarray, device_of: np.ndarray,
                  num_devices: int) -> ExchangePlan:
    """The `ExchangePlan` of a graph (CSR over in-neighbours: row ``v`` lists the sources of
    ``v``'s in-edges) whose node ``v`` is held by device ``device_of[v]``.

    O(N + E) memory; one pass over each reader's edges.
    """
    device_of = np.asarray(device_of, np.int32)
    k = int(num_devices)
    n = device_of.size
    if indptr.size != n + 1:
        raise ValueError(f"indptr has {indptr.size} entries; expected {n + 1} for {n} nodes")
    if n and (device_of.min() < 0 or device_of.max() >= k):
        raise ValueError(f"device_of holds devices outside [0, {k})")
    rows, local_index = device_rows(device_of, k)
    indptr = np.asarray(indptr, np.int64)
    sends = [[np.zeros(0, np.int64) for _ in range(k)] for _ in range(k)]
    counts = np.zeros((k, k), np.int64)
    for r in range(k):
        mine = rows[r]
        starts, ends = indptr[mine], indptr[mine + 1]
        deg = ends - starts
        edge = np.repeat(starts - np.cumsum(deg) + deg, deg) + np.arange(int(deg.sum()))
        src = np.asarray(indices)[edge]
        owner = device_of[src]
        for o in range(k):
            if o == r:
                continue
            needed = np.unique(local_index[src[owner == o]])
            sends[o][r] = needed
            counts[o, r] = needed.size
    return ExchangePlan(num_devices=k, device_of=device_of, rows=rows, local_index=local_index,
                        sends=tuple(tuple(s) for s in sends), counts=counts)


def epoch_exchange_bytes(plan: ExchangePlan, model, num_features: int) -> tuple[int, int]:
    """``(moved, minimum)``: bytes a training epoch moves between devices, padding included
    (an all_to_all before every aggregating layer, and its transpose in the backward pass,
    which the first layer skips: features need no gradient), and the same count of the
    distinct (row, reading device) pairs."""
    moved = minimum = 0
    if plan.slot_rows:
        widths = layer_widths(model, num_features)
        for l, layer in enumerate(model.layers):
            if layer.aggregates:
                times = 2 if l > 0 else 1
                moved += times * plan.bytes_sent(widths[l])
                minimum += times * plan.minimum_bytes(widths[l])
    return moved, minimum

