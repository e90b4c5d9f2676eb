"""The host tier, and the transient host array of a recomputed layer.

Rows move by the native row loops (`jgrind.hostio.rows`): one pass per row, the GIL released.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from jgrind.engine.routes import TierRows
from jgrind.engine.tiers.protocol import NOTHING_HELD, Shared, TierBlocks
from jgrind.hostio.rows import add_rows, copy_rows, take_rows


class HostTier:
    """A table's host blocks: one float32 NumPy array from the store's `HostArrays` (which
    charges the host account)."""

    on_device = False

    def __init__(self, blocks: TierBlocks, shared: Shared):
        self.blocks = blocks
        self._arrays, self._count = shared.host_arrays, shared.count
        self._row_bytes = blocks.words * 4
        self.array: Optional[np.ndarray] = self._take()

    def _take(self) -> Optional[np.ndarray]:
        return self._arrays.take(self.blocks.rows, self.blocks.words, self.blocks.reserve)

    def _held(self) -> np.ndarray:
        return self.array

    def write_block(self, block: int, values: np.ndarray) -> None:
        start, rows = self.blocks.span(block)
        copy_rows(self._held()[start:start + rows], values)
        self._count(host_written=values.nbytes)

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        start, rows = self.blocks.span(block)
        self._count(host_read=rows * self._row_bytes)
        return self._held()[start:start + rows]

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        take_rows(self._held(), rows.src, out=out, dst=rows.dst)
        self._count(host_read=rows.size * self._row_bytes)

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        target = self._held()
        own = rows.own
        if own:  # the block's own rows come first and are contiguous: a slice add
            start = int(rows.src[0])
            mine = target[start:start + own]
            np.add(mine, values[:own], out=mine)
        # rows within one scatter-add are unique: one addition per row
        add_rows(target, rows.src[own:], values, src=rows.dst[own:])
        self._count(host_written=rows.size * self._row_bytes)

    def hold(self, blocks: tuple):
        return NOTHING_HELD

    def free(self) -> None:
        if self.array is not None:
            self._arrays.give(self.array)
            self.array = None

    def close(self) -> None:
        pass


class TransientTier(HostTier):
    """A recomputed layer's rows (RECOMPUTE): a host array that exists only from
    `materialize` (before the sweep that rebuilds the layer) to `release` (after its last
    reader), taken from and given back to the `HostArrays` like a host table's."""

    def _take(self) -> Optional[np.ndarray]:
        return None

    def _held(self) -> np.ndarray:
        if self.array is None:
            raise RuntimeError(f"{self.blocks.name} {self.blocks.layer} is recomputed and not "
                               "materialised")
        return self.array

    def materialize(self) -> None:
        if self.array is None:
            self.array = self._arrays.take(self.blocks.rows, self.blocks.words)

    def release(self) -> None:
        self.free()
