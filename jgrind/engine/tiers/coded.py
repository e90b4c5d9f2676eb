"""The host and SSD tiers for blocks kept in a lossy storage dtype (`jgrind.hostio.codecs`).

The base tiers (`HostTier`, `SSDTier`) hold a codec's stored words as they hold float32 rows
(the same arrays, files, host cache and checksums, ``TierBlocks.words`` wide), so these classes
only convert at the edges: a block written is encoded (`jgrind.hostio.codecs.to_stored`), a
block or gathered rows read are decoded into the step input, and a scatter-add decodes the rows
it adds to, adds in float32 and encodes them again. The store serves a HOST or SSD block of a
table with a lossy codec by these classes (`jgrind.engine.store.CODED_TIERS`); float32 tables
keep the base tiers, so their path is the one that ran before storage dtypes existed.

Stochastic rounding is seeded by ``(table generation, layer, block, write count, kind)``: the
generation (`TierBlocks.generation`) counts the epochs of a gradient table, the write count
those of an activation table, so every write rounds with fresh numbers and a rerun with the
same calls rounds the same.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from jgrind.engine.routes import TierRows
from jgrind.engine.tiers.cached_ssd import WHOLE_FILE, SSDTier
from jgrind.engine.tiers.host import HostTier
from jgrind.engine.tiers.protocol import Shared, TierBlocks
from jgrind.hostio.codecs import to_stored
from jgrind.hostio.rows import take_rows

# a table kind's number in the seed (so that H_l and G_l of one block round differently)
_KIND_SEEDS = {"activation": 1, "gradient": 2, "aggregation": 3}


class _Coded:
    """What the coded host and SSD tiers share: the codec, the seeds, the decoding of rows."""

    def _start_coding(self, blocks: TierBlocks) -> None:
        self.codec, self.width = blocks.codec, blocks.width
        self._writes = np.zeros(blocks.block_rows.size, np.int64)  # per block, for seeds

    def _seed(self, block: int) -> tuple:
        self._writes[block] += 1
        return (self.blocks.generation, self.blocks.layer, int(block),
                int(self._writes[block]), _KIND_SEEDS.get(self.blocks.name, 0))

    def _decoded(self, stored: np.ndarray, into: Optional[np.ndarray]) -> np.ndarray:
        if into is None:
            into = np.empty((stored.shape[0], self.width), np.float32)
        return self.codec.decode(stored, into)

    def _decode_rows(self, words: np.ndarray, rows: TierRows, out: np.ndarray) -> None:
        """``out[rows.dst]`` = the decoded ``words`` (``words[i]``: row ``rows.src[i]``)."""
        values = self.codec.decode(words, np.empty((rows.size, self.width), np.float32))
        take_rows(values, np.arange(rows.size), out=out, dst=rows.dst)

    def _added(self, stored: np.ndarray, values: np.ndarray, seed: tuple) -> np.ndarray:
        """The stored words of ``decode(stored) + values``."""
        total = self.codec.decode(stored, np.empty(values.shape, np.float32))
        np.add(total, values, out=total)
        return self.codec.encode(total, seed=seed)


class CodedHostTier(_Coded, HostTier):
    """Host blocks in a storage dtype: one array of stored words (`HostTier`'s)."""

    def __init__(self, blocks: TierBlocks, shared: Shared):
        HostTier.__init__(self, blocks, shared)
        self._start_coding(blocks)

    def write_block(self, block: int, values: np.ndarray) -> None:
        start, rows = self.blocks.span(block)
        to_stored(self.codec, values, self._seed(block), out=self._held()[start:start + rows])
        self._count(host_written=rows * self._row_bytes)

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        return self._decoded(HostTier.read_block(self, block), into)

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        self._decode_rows(self._held()[rows.src], rows, out)
        self._count(host_read=rows.size * self._row_bytes)

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        """The block's own rows, then the halo rows: a halo row may be one of the own rows
        (a partition's input gradient reaches its own nodes both ways), so two updates."""
        target = self._held()
        owner = rows.segments[0][2] if rows.segments else 0
        seed = self._seed(owner)
        for part, (a, b) in enumerate(((0, rows.own), (rows.own, rows.size))):
            if b > a:
                src = rows.src[a:b]
                target[src] = self._added(target[src], values[rows.dst[a:b]], seed + (part,))
        self._count(host_written=rows.size * self._row_bytes)


class CodedSSDTier(_Coded, SSDTier):
    """SSD blocks in a storage dtype: a file of stored words, cached as stored words (so the
    host cache holds as many more blocks as the dtype is smaller)."""

    def __init__(self, blocks: TierBlocks, shared: Shared):
        SSDTier.__init__(self, blocks, shared)
        self._start_coding(blocks)

    def write_block(self, block: int, values: np.ndarray) -> None:
        SSDTier.write_block(self, block, to_stored(self.codec, values, self._seed(block)))

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        return self._decoded(SSDTier.read_block(self, block), into)

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        words = np.empty((rows.size, self.blocks.words), np.float32)
        SSDTier.take_rows(self, dataclasses.replace(rows, dst=np.arange(rows.size)), words)
        self._decode_rows(words, rows, out)

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        owner = rows.segments[0][2] if rows.segments else 0
        seed = self._seed(owner)

        def combine(piece: np.ndarray, at: np.ndarray, i: int, j: int) -> None:
            piece[at] = self._added(piece[at], values[rows.dst[i:j]], seed + (i,))

        read = self.file.add_rows(rows.src, values, combine=combine)
        for _, _, owner in rows.segments:
            self.cache.invalidate((self.key, owner))
        self.cache.invalidate((self.key, WHOLE_FILE))
        self._count(ssd_read=read * self._row_bytes, ssd_written=rows.size * self._row_bytes)
