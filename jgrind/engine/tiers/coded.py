"""The host and SSD tiers for blocks kept in a lossy storage dtype (`jgrind.hostio.codecs`).

The base tiers (`HostTier`, `SSDTier`) hold a codec's stored words as they hold float32 rows
(the same arrays, files, host cache and checksums, ``TierBlocks.words`` wide), so these classes
only convert at the edges, and on the device (`jgrind.hostio.device_codecs`), so that what
crosses between it and the host is the stored form: a block written is given as the step
output, where it is, encoded there and its words copied to the host; a block or gathered rows
read for a step are the stored words in a step input buffer (`StoredRows`), decoded on the
device once sent. A scatter-add decodes the rows it adds to, adds in float32 and encodes them
again on the host: its values are the step's float32 output, read on the host, as the rounding
of the sum (not of the values) is what the format's error bound counts. The store serves a
HOST or SSD block of a table with a lossy codec by these classes
(`jgrind.engine.store.CODED_TIERS`); float32 tables keep the base tiers, so their path is the
one that ran before storage dtypes existed.

Stochastic rounding is seeded by ``(table generation, layer, block, write count, kind)``: the
generation (`TierBlocks.generation`) counts the epochs of a gradient table, the write count
those of an activation table, so every write rounds with fresh numbers and a rerun with the
same calls rounds the same.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import numpy as np

from jgrind.engine.routes import TierRows
from jgrind.engine.tiers.cached_ssd import WHOLE_FILE, SSDTier
from jgrind.engine.tiers.device import DeviceRows
from jgrind.engine.tiers.host import HostTier
from jgrind.engine.tiers.protocol import Shared, TierBlocks, padded_buffer
from jgrind.hostio import device_codecs, transfers
from jgrind.hostio.codecs import FLOAT32, Codec, to_stored
from jgrind.hostio.rows import copy_rows, take_rows

# a table kind's number in the seed (so that H_l and G_l of one block round differently)
_KIND_SEEDS = {"activation": 1, "gradient": 2, "aggregation": 3}


@dataclasses.dataclass(frozen=True)
class StoredRows(DeviceRows):
    """A step input read from coded tiers: ``host`` holds its rows' stored words (``[padded
    rows, words]``, padding rows all-zero words, which decode to zeros), and `to_device` sends
    them and decodes them on the device (`jgrind.hostio.device_codecs`), so the link carries
    the stored form. The pipeline counts ``host``'s bytes as sent (``to_device``). Read on the
    host instead (``np.asarray``), it is decoded there, to the same values."""

    codec: Codec = FLOAT32
    width: int = 0

    def to_device(self) -> jax.Array:
        return device_codecs.decode(self.codec, self.host, self.width)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = self.codec.decode(self.host, np.empty((self.host.shape[0], self.width),
                                                       np.float32))
        return values if dtype is None else values.astype(dtype, copy=False)


class _Coded:
    """What the coded host and SSD tiers share: the codec, the seeds, the conversions.

    ``converts_on_device``: whether blocks are encoded from the step output on the device and
    reads for a step are decoded there (`StoredRows`); False converts on the host, from the
    step output's float32 host copy and into the step input (the path before device encoding,
    kept for comparison: tests/test_store_dtype_device.py). The table reads it when it is made.
    """

    converts_on_device = True

    def _start_coding(self, blocks: TierBlocks, shared: Shared) -> None:
        self.codec, self.width = blocks.codec, blocks.width
        # (an instance's own: False for a codec the device module does not know)
        self.converts_on_device = (type(self).converts_on_device
                                   and device_codecs.supports(self.codec))
        self._writes = np.zeros(blocks.block_rows.size, np.int64)  # per block, for seeds
        self._buffers = shared.buffers
        # where the stored words of a step output are copied (page-locked off the CPU backend)
        self._host_copies = transfers.host_copies() if self.converts_on_device else None

    def _stored_block(self, block: int, values) -> np.ndarray:
        """The stored words (float32 words, host memory) of ``block``'s first rows of
        ``values``: the step output (padded, a device array, or NumPy rows), encoded on the
        device and copied to the host, which `count` adds as ``to_host``; or with
        ``converts_on_device`` off, its float32 host rows encoded on the host."""
        rows = int(self.blocks.block_rows[block])
        if not self.converts_on_device:
            return to_stored(self.codec, transfers.host_view(values)[:rows], self._seed(block))
        words = device_codecs.encode(self.codec, values, self._seed(block))
        words = transfers.to_host(words, self._host_copies)
        self._count(to_host=words.nbytes)
        return transfers.host_view(words)[:rows].view(np.float32)

    def stored_rows(self, words: np.ndarray) -> StoredRows:
        """A step input of stored ``words`` (filled by `read_stored` and `take_stored`)."""
        return StoredRows(words, None, None, self.codec, self.width)

    def stored_buffer(self, used_rows: int, padded_rows: int) -> np.ndarray:
        """A step input buffer of stored words whose first ``used_rows`` the caller fills."""
        return padded_buffer(self._buffers, used_rows, padded_rows, self.blocks.words)

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
        self._start_coding(blocks, shared)

    def write_block(self, block: int, values) -> None:
        start, rows = self.blocks.span(block)
        copy_rows(self._held()[start:start + rows], self._stored_block(block, values))
        self._count(host_written=rows * self._row_bytes)

    def read_stored(self, block: int, into: np.ndarray) -> None:
        """``into`` = ``block``'s stored words."""
        copy_rows(into, HostTier.read_block(self, block))

    def take_stored(self, rows: TierRows, out: np.ndarray) -> None:
        """``out[rows.dst]`` = the stored words of rows ``rows.src``."""
        HostTier.take_rows(self, rows, out)

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
        self._start_coding(blocks, shared)

    def write_block(self, block: int, values) -> None:
        SSDTier.write_block(self, block, self._stored_block(block, values))

    def read_stored(self, block: int, into: np.ndarray) -> None:
        """``into`` = ``block``'s stored words (read in place when the cache keeps no copy)."""
        data = SSDTier.read_block(self, block, into)
        if data is not into:
            copy_rows(into, data)

    def take_stored(self, rows: TierRows, out: np.ndarray) -> None:
        """``out[rows.dst]`` = the stored words of rows ``rows.src``."""
        SSDTier.take_rows(self, rows, out)

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
