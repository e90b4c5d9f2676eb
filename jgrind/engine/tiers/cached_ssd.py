"""The SSD tier, with the host cache in front of it.

A table's SSD blocks are one `SSDFile`, member blocks in table order. The cache holds whole
files while they fit, else blocks with LRU (docs/engine.md, "The store"); writes bypass it and
invalidate stale copies.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import numpy as np

from jgrind.engine.routes import TierRows
from jgrind.engine.ssd import SSDFile
from jgrind.engine.tiers.protocol import Shared, TierBlocks
from jgrind.hostio.rows import take_rows

# the host-cache key (with the table's) of a table's whole SSD file (`SSDTier._whole_file`)
WHOLE_FILE = "whole file"


class SSDTier:
    """A table's SSD blocks: one file under the run's folder, charged to the SSD account, read
    through the host cache. Cache keys are ``(table key, block)`` and ``(table key,
    WHOLE_FILE)``."""

    on_device = False

    def __init__(self, blocks: TierBlocks, shared: Shared):
        self.blocks, self.key = blocks, blocks.key
        self.order = blocks.blocks                     # file block i holds table block order[i]
        self.index = np.full(blocks.block_rows.size, -1, np.int64)  # table block -> file block
        self.index[self.order] = np.arange(self.order.size)
        self.file: Optional[SSDFile] = SSDFile(
            shared.run_dir / f"{blocks.name}-{blocks.layer}.bin", blocks.offsets,
            blocks.words, shared.run_id, on_io=shared.count)
        self.cache, self._count, self._charge = shared.cache, shared.count, shared.charge
        self._row_bytes = blocks.words * 4
        self._charge(ssd=blocks.nbytes)

    def write_block(self, block: int, values: np.ndarray) -> None:
        self.file.write_block(int(self.index[block]), values)
        self.cache.invalidate((self.key, block))
        self.cache.invalidate((self.key, WHOLE_FILE))
        self._count(ssd_written=values.nbytes)

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        """From the host cache or the file. A block the cache will not keep is read into
        ``into`` when given (the caller's padded step input): one pass from the page cache,
        not a fresh array and a copy."""
        cache = self.cache
        whole = cache.get((self.key, WHOLE_FILE)) if cache.capacity > 0 else None
        i = int(self.index[block])
        if whole is not None:
            return whole[self.file.offsets[i]:self.file.offsets[i + 1]]
        hit = cache.get((self.key, block))
        if hit is not None:
            return hit
        keep = cache.fits(int(self.blocks.block_rows[block]) * self._row_bytes)
        data = self.file.read_block(i, out=None if keep else into)
        self._count(ssd_read=data.nbytes)
        if keep:
            cache.put((self.key, block), data)
        return data

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        """From cached blocks, else cache the owner block if it fits (a later partition will
        likely read it too), else read the rows directly, all owners' rows in one coalesced
        `SSDFile.read_rows` (spans across neighbouring blocks merge)."""
        cache = self.cache
        direct = [(0, rows.size)]
        whole = self._whole_file() if cache.capacity > 0 else None
        if whole is not None:  # one native pass, as from the host tier
            take_rows(whole, rows.src, out=out, dst=rows.dst)
            return
        if cache.capacity > 0:
            direct = []
            for a, b, owner in rows.segments:
                cached = cache.get((self.key, owner))
                if cached is None and cache.fits(int(self.blocks.block_rows[owner])
                                                 * self._row_bytes):
                    cached = SSDTier.read_block(self, owner)  # the stored rows, cached
                if cached is not None:
                    take_rows(cached, rows.src[a:b] - self.blocks.start[owner], out=out,
                              dst=rows.dst[a:b])
                else:
                    direct.append((a, b))
        if not direct:
            return
        if len(direct) == 1:
            (a, b), = direct
            src, dst = rows.src[a:b], rows.dst[a:b]
        else:
            src = np.concatenate([rows.src[a:b] for a, b in direct])
            dst = np.concatenate([rows.dst[a:b] for a, b in direct])
        self.file.read_rows(src, out=out, dst=dst)
        self._count(ssd_read=src.size * self._row_bytes)

    def _whole_file(self) -> Optional[np.ndarray]:
        """The whole file as one host-cache entry, when the cache can hold it.

        Halo rows come from many owner blocks: on 128 partitions a sweep's gathers touch 16k
        (partition, owner) pairs, and a cache lookup and copy per pair cost ~30 us each (the
        top layer's 8-wide gather of `tools/bench_planner.py`'s host-tight took 0.54 s for
        5 MB). From one array, a partition's halo rows are one native pass, as from the host
        tier. The file is read once, block by block with each block's checksum checked (or
        copied from a cached block), the first time a gather needs it after it was written,
        and a write to any block drops it. The issue's cache policy: whole layers while they
        fit, else LRU blocks."""
        cache, key = self.cache, (self.key, WHOLE_FILE)
        whole = cache.get(key)
        if whole is not None:
            return whole
        nbytes = self.file.rows * self._row_bytes
        # a file the cache cannot hold must not evict anything trying (make_room would empty
        # it of every unpinned block, on every gather); where it can, room first, so that the
        # cache and the buffer being filled stay within the budget
        if not cache.fits(nbytes) or not cache.make_room(nbytes):
            return None
        whole = np.empty((self.file.rows, self.blocks.words), np.float32)
        offsets = self.file.offsets
        for i, block in enumerate(self.order):
            part = whole[offsets[i]:offsets[i + 1]]
            cached = cache.get((self.key, int(block)))
            if cached is not None:
                part[:] = cached
                cache.invalidate((self.key, int(block)))  # held twice otherwise
            else:
                self.file.read_block(i, out=part)
                self._count(ssd_read=part.nbytes)
        return whole if cache.put(key, whole) else None

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        read = self.file.add_rows(rows.src, values, src=rows.dst)
        for _, _, owner in rows.segments:
            self.cache.invalidate((self.key, owner))
        self.cache.invalidate((self.key, WHOLE_FILE))
        self._count(ssd_read=read * self._row_bytes, ssd_written=rows.size * self._row_bytes)

    @contextlib.contextmanager
    def hold(self, blocks: tuple):
        """Pin ``blocks`` and the whole file in the cache, so that loading one cannot evict
        another while a gather reads them."""
        keys = [(self.key, b) for b in blocks] + [(self.key, WHOLE_FILE)]
        self.cache.pin(keys)
        try:
            yield
        finally:
            self.cache.unpin(keys)

    def zero_lazily(self) -> None:
        """Make every row read as zeros again (`SSDFile.zero_lazily`), for a file kept to the
        next epoch (`jgrind.engine.store.Store.drop`)."""
        self.file.zero_lazily()
        self.cache.drop_table(self.key)  # (every block is also invalidated when next written)

    def free(self) -> None:
        """Delete the file and drop its cached copies."""
        if self.file is not None:
            self._charge(ssd=-self.file.rows * self.file.width * 4)
            self.file.close()
            self.file.path.unlink(missing_ok=True)
            self.cache.drop_table(self.key)
            self.file = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
