"""The naive scheme's tiers, kept only for comparison runs (`jgrind.plan.policies.naive`):
SSD rows read one call each with no host cache, and snapshots of every step input kept on SSD
from forward to backward. The production tiers do neither."""

from __future__ import annotations

from typing import Optional

import numpy as np

from jgrind.hostio import transfers
from jgrind.engine.routes import TierRows
from jgrind.engine.ssd import SSDFile, StoreError
from jgrind.engine.tiers.cached_ssd import SSDTier
from jgrind.engine.tiers.protocol import Shared, padded_buffer


class RowReadsSSDTier(SSDTier):
    """The SSD tier read row by row: one read call per row, for whole blocks and halo rows
    alike, and no host cache (the store makes the cache with no capacity for this scheme).
    Writes and scatter-adds are the SSD tier's."""

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        i = int(self.index[block])
        rows = np.arange(self.file.offsets[i], self.file.offsets[i + 1])
        data = self.file.read_rows(rows, per_row=True)
        self._count(ssd_read=data.nbytes)
        return data

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        self.file.read_rows(rows.src, per_row=True, out=out, dst=rows.dst)
        self._count(ssd_read=rows.size * self._row_bytes)


class Snapshot:
    """The step inputs (owned + halo rows, or a node-wise layer's owned rows) of every
    partition of one layer, kept on SSD from the forward sweep to backward: the naive scheme's
    redundant copy of data the stored layer outputs already hold (GriNNder regathers instead).
    Block ``p`` is partition ``p``'s ``input_rows[p]`` rows, written and read whole: a tier of
    whole blocks (`jgrind.engine.tiers.BlockTier`) and its own table, with no host cache."""

    def __init__(self, shared: Shared, layer: int, width: int, input_rows: np.ndarray):
        if shared.run_dir is None:
            raise StoreError("snapshots need the SSD tier; pass a store directory")
        self.layer, self.width = layer, int(width)
        self.key = ("snapshot", layer)
        self.offsets = np.concatenate([[0], np.cumsum(input_rows)]).astype(np.int64)
        self.nbytes = int(self.offsets[-1]) * self.width * 4
        self.filled = False  # set once the forward sweep has written every block
        self._charge, self._count, self._buffers = shared.charge, shared.count, shared.buffers
        self.ssd: Optional[SSDFile] = SSDFile(shared.run_dir / f"snapshot-{layer}.bin",
                                              self.offsets, self.width, shared.run_id,
                                              on_io=shared.count)
        self._charge(ssd=self.nbytes)

    def _rows(self, block: int) -> int:
        return int(self.offsets[block + 1] - self.offsets[block])

    # -- the table's methods ----------------------------------------------------------------
    def write(self, block: int, values) -> None:
        """Store the first ``input_rows[block]`` rows of ``values`` (a padded gather)."""
        self.write_block(block, transfers.host_view(values)[:self._rows(block)])

    def read(self, block: int, padded_rows: int) -> np.ndarray:
        rows = self._rows(block)
        out = padded_buffer(self._buffers, rows, padded_rows, self.width)
        self.read_block(block, out[:rows])
        return out

    # -- the `BlockTier` methods ------------------------------------------------------------
    def write_block(self, block: int, values: np.ndarray) -> None:
        self.ssd.write_block(block, values)
        self._count(ssd_written=values.nbytes)

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        data = self.ssd.read_block(block, into)
        self._count(ssd_read=data.nbytes)
        return data

    def free(self) -> None:
        if self.ssd is not None:
            self.ssd.close()
            self.ssd.path.unlink(missing_ok=True)
            self.ssd = None
            self._charge(ssd=-self.nbytes)

    def close(self) -> None:
        if self.ssd is not None:
            self.ssd.close()
