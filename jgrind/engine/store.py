"""The activation store: device, host RAM and SSD tiers behind one interface, with exact accounts.

A *table* is one layer's activation ``H_l`` or gradient ``G_l``: ``[N, width]`` rows in
partition-major order, split into one block per partition. Every block has a fate (from the
policy); each tier keeps the blocks assigned to it in one compact array (device: a JAX array;
host: a NumPy array; SSD: an `SSDFile`), so gathering a partition's halo rows is one vectorised
index per tier however many partitions there are. RECOMPUTE blocks live in a host-side transient
array that exists only while the layer is needed.

The store keeps exact byte accounts per tier (current and peak, with a timeline for plots) and
counts the bytes moved between tiers.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import shutil
import threading
import time
import uuid
import warnings
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jgrind import disk_space, transfers
from jgrind.buffers import Recycler, aligned_zeros
from jgrind.engine.cache import HostCache
from jgrind.engine.host_arrays import HostArrays
from jgrind.engine.routes import Layout, RouteCache, TierRows
from jgrind.engine.ssd import SSDFile, StoreError
from jgrind.plan.fates import CODES, FATES, Fate
from jgrind.rows import add_rows, copy_rows, take_rows

# the host-cache key (with the table's) of a table's whole SSD file (`Table._whole_file`)
WHOLE_FILE = "whole file"


class BudgetError(ValueError):
    """The budgets cannot hold what the plan needs. The message gives the minimum."""


@dataclasses.dataclass
class Accounts:
    """Bytes per tier, now and at peak, bytes moved (and SSD calls). ``timeline`` holds
    ``(seconds, device, host, ssd)`` samples for the memory-over-time plot."""

    device: int = 0
    host: int = 0
    ssd: int = 0
    peak_device: int = 0
    peak_host: int = 0
    peak_ssd: int = 0
    ssd_read: int = 0
    ssd_written: int = 0
    host_read: int = 0
    host_written: int = 0
    ssd_read_ops: int = 0       # read / write calls on SSD files (row-by-row I/O shows here)
    ssd_write_ops: int = 0
    # Bytes those calls passed. ssd_read / ssd_written count the rows the engine used; a
    # coalesced span (`jgrind.plan.cost.COALESCE_BYTES`) also reads, and a scatter-add writes
    # back, the rows between them, so these are larger (fewer calls, more bytes).
    ssd_file_read: int = 0
    ssd_file_written: int = 0
    # Bytes the engine handed to the device (step inputs, output gradients, blocks not kept
    # there) and step outputs it read back in host memory: what crosses the link on a GPU.
    # Counted on the CPU backend too, where nothing is copied.
    to_device: int = 0
    to_host: int = 0
    timeline: list = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("timeline")
        return d


# Device-side table operations. Index arrays are padded to bucketed lengths with an
# out-of-range index, which `drop`/`fill` modes ignore, so a handful of shapes are compiled.
def _explicit(fn):
    """``fn`` with its NumPy arguments (the store's row indices, host rows bound for device
    blocks) handed to the device by `jax.device_put` first: the transfers are meant, and a
    transfer guard (``jax_transfer_guard="disallow"``) then tells them from accidental ones."""
    @functools.wraps(fn)
    def call(*args):
        return fn(*(jax.device_put(a) if isinstance(a, np.ndarray) else a for a in args))
    return call


# made on the device: op by op, jnp.zeros would copy its Python zero there first
_device_zeros = jax.jit(lambda shape: jnp.zeros(shape, jnp.float32), static_argnums=0)
_device_take = _explicit(jax.jit(
    lambda table, rows: jnp.take(table, rows, axis=0, mode="fill", fill_value=0)))
_device_set = _explicit(jax.jit(
    lambda table, rows, values: table.at[rows].set(values, mode="drop"), donate_argnums=0))
_device_add = _explicit(jax.jit(
    lambda table, rows, values: table.at[rows].add(values, mode="drop"), donate_argnums=0))
# ``table[rows] += values[src]``: a scatter-add's rows that land on the device, taken from the
# step output where it is (`Table.accumulate` with ``keep_device_rows``)
_device_add_taken = _explicit(jax.jit(
    lambda table, rows, values, src: table.at[rows].add(
        jnp.take(values, src, axis=0, mode="fill", fill_value=0), mode="drop"),
    donate_argnums=0))
# ``gathered[rows] = values``, the device's rows set into a gathered input sent from the host
_device_merge = _explicit(jax.jit(
    lambda gathered, rows, values: gathered.at[rows].set(values, mode="drop"),
    donate_argnums=0))


@dataclasses.dataclass(frozen=True)
class DeviceRows:
    """A gathered input whose rows are partly on the device (`Table.gather` with
    ``keep_device_rows``): ``host`` holds every other row, and ``values`` (a device array) the
    rows that go to positions ``rows`` (padded with an out-of-range position). `to_device`
    sends ``host`` and sets those rows there, so the device's rows never cross to the host and
    back."""

    host: np.ndarray
    rows: np.ndarray
    values: jax.Array

    def to_device(self) -> jax.Array:
        return _device_merge(jax.device_put(self.host), self.rows, self.values)


def _padded_buffer(buffers: Recycler, used_rows: int, padded_rows: int,
                   width: int) -> np.ndarray:
    """A float32 ``[padded_rows, width]`` buffer whose first ``used_rows`` rows the caller fills:
    only the padding is zeroed (zero-filling it all would be one more pass over the rows).
    Aligned, so that XLA adopts it without a copy; from ``buffers``, so that the memory of a
    step input the step is done with serves a later one."""
    out = buffers.empty((padded_rows, width), np.float32)
    out[used_rows:] = 0.0
    return out


def _padded_rows(rows: np.ndarray, length: int, fill: int) -> np.ndarray:
    out = np.full(length, fill, np.int32)
    out[: rows.size] = rows
    return out


class Table:
    """One ``[N, width]`` tensor in partition-major order, its blocks spread over the tiers."""

    def __init__(self, store: "Store", name: str, layer: int, width: int, fates: list[Fate],
                 reserve: Optional[int] = None):
        self.store, self.name, self.layer, self.width = store, name, layer, int(width)
        self.key = (name, layer)
        sizes = store.block_rows
        self.tier = np.array([CODES[f] for f in fates], np.int8)
        self.slot = np.zeros(sizes.size, np.int64)      # first row of the block in its tier
        self.tier_rows = []
        for code in range(len(FATES)):
            members = self.tier == code
            starts = np.cumsum(np.where(members, sizes, 0)) - np.where(members, sizes, 0)
            self.slot[members] = starts[members]
            self.tier_rows.append(int(sizes[members].sum()))
        self.device: Optional[jax.Array] = None
        self.host: Optional[np.ndarray] = None
        self.transient: Optional[np.ndarray] = None
        self.ssd: Optional[SSDFile] = None
        nbytes = lambda code: self.tier_rows[code] * self.width * 4  # noqa: E731
        if self.tier_rows[CODES[Fate.DEVICE]]:
            self.device = _device_zeros((self.tier_rows[CODES[Fate.DEVICE]], self.width))
            store._charge(device=nbytes(CODES[Fate.DEVICE]))
        if self.tier_rows[CODES[Fate.HOST]]:  # charged by the store's `HostArrays`
            self.host = store.host_arrays.take(self.tier_rows[CODES[Fate.HOST]], self.width,
                                               reserve)
        if self.tier_rows[CODES[Fate.SSD]]:
            members = self.tier == CODES[Fate.SSD]
            offsets = np.concatenate([[0], np.cumsum(sizes[members])])
            self.ssd_blocks = np.flatnonzero(members)     # block index -> file block order
            self.ssd_index = np.full(sizes.size, -1, np.int64)
            self.ssd_index[self.ssd_blocks] = np.arange(self.ssd_blocks.size)
            self.ssd = SSDFile(store.run_dir / f"{name}-{layer}.bin", offsets, self.width,
                               store.run_id, on_io=store.count)
            store._charge(ssd=nbytes(CODES[Fate.SSD]))
        file_start = np.full(sizes.size, -1, np.int64)
        if self.ssd is not None:
            file_start[self.ssd_blocks] = self.ssd.offsets[:-1]
        self.layout = Layout(self.tier, self.slot, file_start)
        self._device_lock = threading.Lock()

    # -- helpers ---------------------------------------------------------------------------
    def fate(self, block: int) -> Fate:
        return FATES[self.tier[block]]

    def stored_on_host(self, block: int, halo_owner: Optional[np.ndarray] = None) -> bool:
        """Whether storing a step output of ``block`` reads the output in host memory: its
        `write`, or with ``halo_owner`` its `accumulate` into those halo rows too. Only rows
        that all land in device blocks stay on the device."""
        if halo_owner is None:
            return self.tier[block] != CODES[Fate.DEVICE]
        return bool(self.tier[block] != CODES[Fate.DEVICE]
                    or (self.tier[halo_owner] != CODES[Fate.DEVICE]).any())

    def held_on_host(self, block: int, halo_owner: Optional[np.ndarray] = None) -> bool:
        """Whether storing a step output of ``block`` (with ``halo_owner``: accumulating it)
        reads it in host memory only: no row of it lands in a device block, so the store
        needs no device copy of it and takes a host one (`write`, `accumulate`)."""
        if self.tier[block] == CODES[Fate.DEVICE]:
            return False
        return halo_owner is None or not (self.tier[halo_owner] == CODES[Fate.DEVICE]).any()

    @property
    def all_ssd(self) -> bool:
        return self.ssd is not None and self.tier_rows[CODES[Fate.SSD]] == int(
            self.store.block_rows.sum())

    @property
    def recomputed(self) -> bool:
        return self.tier_rows[CODES[Fate.RECOMPUTE]] > 0

    def _rows(self, block: int) -> int:
        return int(self.store.block_rows[block])

    def _host_array(self, code: int) -> np.ndarray:
        if code == CODES[Fate.HOST]:
            return self.host
        if self.transient is None:
            raise RuntimeError(f"{self.name} {self.layer} is recomputed and not materialised")
        return self.transient

    # -- transient (recompute) storage -------------------------------------------------------
    def materialize(self) -> None:
        rows = self.tier_rows[CODES[Fate.RECOMPUTE]]
        if rows and self.transient is None:
            self.transient = self.store.host_arrays.take(rows, self.width)

    def release(self) -> None:
        if self.transient is not None:
            self.store.host_arrays.give(self.transient)
            self.transient = None

    # -- whole blocks ----------------------------------------------------------------------
    def write(self, block: int, values) -> None:
        """Store the first ``rows(block)`` rows of ``values`` (a padded step output)."""
        code, rows = self.tier[block], self._rows(block)
        start = int(self.slot[block])
        if code == CODES[Fate.DEVICE]:
            idx = np.arange(start, start + rows, dtype=np.int32)
            idx = _padded_rows(idx, values.shape[0], self.device.shape[0])
            with self._device_lock:
                self.device = _device_set(self.device, idx, values)
            return
        host_values = transfers.host_view(values)[:rows]
        if code == CODES[Fate.SSD]:
            self.ssd.write_block(int(self.ssd_index[block]), host_values)
            self.store.cache.invalidate((self.key, block))
            self.store.cache.invalidate((self.key, WHOLE_FILE))
            self.store.count(ssd_written=host_values.nbytes)
        else:
            copy_rows(self._host_array(code)[start:start + rows], host_values)
            self.store.count(host_written=host_values.nbytes)

    def read(self, block: int, padded_rows: int):
        """Block ``block`` padded with zero rows to ``padded_rows`` (device array if on device,
        else NumPy)."""
        code, rows = self.tier[block], self._rows(block)
        start = int(self.slot[block])
        if code == CODES[Fate.DEVICE]:
            idx = np.arange(start, start + rows, dtype=np.int32)
            return _device_take(self.device, _padded_rows(idx, padded_rows,
                                                          self.device.shape[0]))
        out = _padded_buffer(self.store.buffers, rows, padded_rows, self.width)
        own = out[:rows]  # one view: `_fill` tells an in-place read by identity
        self._fill(own, self._read_host_or_ssd(block, own))
        return out

    @staticmethod
    def _fill(dst: np.ndarray, src: np.ndarray) -> None:
        if src is not dst:  # not read in place already
            copy_rows(dst, src)

    def _read_host_or_ssd(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        """Block ``block``'s rows from host RAM or SSD: a view of a host array or a cached
        block, or ``into`` itself when the block was read from SSD straight into it."""
        code, rows = self.tier[block], self._rows(block)
        if code == CODES[Fate.SSD]:
            return self._ssd_block(block, into)
        start = int(self.slot[block])
        self.store.count(host_read=rows * self.width * 4)
        return self._host_array(code)[start:start + rows]

    def _ssd_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        """Block ``block`` from the host cache or its SSD file. A block the cache will not keep
        is read into ``into`` when given (the caller's padded step input): one pass from the
        page cache, not a fresh array and a copy."""
        if self.store.row_reads:
            i = int(self.ssd_index[block])
            rows = np.arange(self.ssd.offsets[i], self.ssd.offsets[i + 1])
            data = self.ssd.read_rows(rows, per_row=True)
            self.store.count(ssd_read=data.nbytes)
            return data
        cache = self.store.cache
        whole = cache.get((self.key, WHOLE_FILE)) if cache.capacity > 0 else None
        if whole is not None:
            i = int(self.ssd_index[block])
            return whole[self.ssd.offsets[i]:self.ssd.offsets[i + 1]]
        hit = cache.get((self.key, block))
        if hit is not None:
            return hit
        keep = cache.fits(self._rows(block) * self.width * 4)
        data = self.ssd.read_block(int(self.ssd_index[block]),
                                   out=None if keep else into)
        self.store.count(ssd_read=data.nbytes)
        if keep:
            cache.put((self.key, block), data)
        return data

    # -- gather / accumulate over a partition's inputs ----------------------------------------
    def gather(self, block: int, halo_owner: np.ndarray, halo_row: np.ndarray,
               padded_rows: int, keep_device_rows: bool = False):
        """Rows of ``block``'s owned nodes, then its halo rows, zero-padded to ``padded_rows``.
        Where each row comes from is worked out once per layout and block (`routes`).

        A NumPy array, or a device array when every row is on the device. Where only some
        are, their rows are copied into the NumPy array, or with ``keep_device_rows`` left
        where they are: the result is then a `DeviceRows`, for a consumer that sends the rest
        to the device (on a GPU the device's rows then never cross PCIe twice)."""
        route = self.store.routes.get(self.layout, block, self._rows(block), halo_owner,
                                      halo_row)
        own_rows = route.own_rows
        if route.all_device:
            idx = np.concatenate([np.arange(route.own_start, route.own_start + own_rows)]
                                 + [t.src for t in route.halo]).astype(np.int32)
            return _device_take(self.device, _padded_rows(idx, padded_rows,
                                                          self.device.shape[0]))
        out = _padded_buffer(self.store.buffers, own_rows + halo_row.size, padded_rows,
                             self.width)
        keys = [(self.key, b) for b in route.ssd_blocks] + [(self.key, WHOLE_FILE)]
        self.store.cache.pin(keys)
        on_device = []  # (positions, rows of the device array) left on the device
        try:
            own = out[:own_rows]
            if keep_device_rows and route.own_code == CODES[Fate.DEVICE]:
                on_device.append((np.arange(own_rows),
                                  np.arange(route.own_start, route.own_start + own_rows)))
            else:
                self._fill(own, self._block_rows(block, own))
            for rows in route.halo:
                if rows.code == CODES[Fate.DEVICE] and keep_device_rows:
                    on_device.append((rows.dst, rows.src))
                elif rows.code == CODES[Fate.DEVICE]:
                    idx = rows.src.astype(np.int32)
                    n = _bucket_len(idx.size)
                    got = _device_take(self.device, _padded_rows(idx, n, self.device.shape[0]))
                    out[rows.dst] = jax.device_get(got)[: idx.size]
                elif rows.code == CODES[Fate.SSD]:
                    self._ssd_rows(rows, out)
                else:  # host RAM (or a recomputed layer's transient): one native pass
                    take_rows(self._host_array(rows.code), rows.src, out=out, dst=rows.dst)
                    self.store.count(host_read=rows.size * self.width * 4)
        finally:
            self.store.cache.unpin(keys)
        if not on_device:
            return out
        dst = np.concatenate([d for d, _ in on_device]).astype(np.int32)
        src = np.concatenate([r for _, r in on_device]).astype(np.int32)
        n = _bucket_len(dst.size)
        values = _device_take(self.device, _padded_rows(src, n, self.device.shape[0]))
        return DeviceRows(out, _padded_rows(dst, n, padded_rows), values)

    def _block_rows(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        if self.tier[block] == CODES[Fate.DEVICE]:
            start, rows = int(self.slot[block]), self._rows(block)
            return jax.device_get(self.device[start:start + rows])
        return self._read_host_or_ssd(block, into)

    def _ssd_rows(self, rows: TierRows, out: np.ndarray) -> None:
        """Halo rows held on SSD into ``out[rows.dst]``: from cached blocks, else cache the
        owner block if it fits (a later partition will likely read it too), else read the rows
        directly, all owners' rows in one coalesced `SSDFile.read_rows` (spans across
        neighbouring blocks merge)."""
        cache = self.store.cache
        direct = [(0, rows.size)]
        whole = self._whole_file() if cache.capacity > 0 else None
        if whole is not None:  # one native pass, as from the host tier
            take_rows(whole, rows.src, out=out, dst=rows.dst)
            return
        if cache.capacity > 0:
            direct = []
            for a, b, owner in rows.segments:
                cached = cache.get((self.key, owner))
                if cached is None and cache.fits(self._rows(owner) * self.width * 4):
                    cached = self._ssd_block(owner)
                if cached is not None:
                    take_rows(cached, rows.src[a:b] - self.layout.file_start[owner], out=out,
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
        self.ssd.read_rows(src, per_row=self.store.row_reads, out=out, dst=dst)
        self.store.count(ssd_read=src.size * self.width * 4)

    def _whole_file(self) -> Optional[np.ndarray]:
        """The table's whole SSD file as one host-cache entry, when the cache can hold it.

        Halo rows come from many owner blocks: on 128 partitions a sweep's gathers touch 16k
        (partition, owner) pairs, and a cache lookup and copy per pair cost ~30 us each (the
        top layer's 8-wide gather of `tools/bench_planner.py`'s host-tight took 0.54 s for
        5 MB). From one array, a partition's halo rows are one native pass, as from the host
        tier. The file is read once, block by block with each block's checksum checked (or
        copied from a cached block), the first time a gather needs it after it was written,
        and a write to any block drops it. The issue's cache policy: whole layers while they
        fit, else LRU blocks."""
        cache, key = self.store.cache, (self.key, WHOLE_FILE)
        whole = cache.get(key)
        if whole is not None:
            return whole
        nbytes = self.ssd.rows * self.width * 4
        # a file the cache cannot hold must not evict anything trying (make_room would empty
        # it of every unpinned block, on every gather); where it can, room first, so that the
        # cache and the buffer being filled stay within the budget
        if not cache.fits(nbytes) or not cache.make_room(nbytes):
            return None
        whole = np.empty((self.ssd.rows, self.width), np.float32)
        offsets = self.ssd.offsets
        for i, block in enumerate(self.ssd_blocks):
            part = whole[offsets[i]:offsets[i + 1]]
            cached = cache.get((self.key, int(block)))
            if cached is not None:
                part[:] = cached
                cache.invalidate((self.key, int(block)))  # held twice otherwise
            else:
                self.ssd.read_block(i, out=part)
                self.store.count(ssd_read=part.nbytes)
        return whole if cache.put(key, whole) else None

    def accumulate(self, block: int, halo_owner: np.ndarray, halo_row: np.ndarray,
                   values, keep_device_rows: bool = False) -> None:
        """``G[own rows] += values[:own]`` and ``G[halo rows] += values[own:own+halo]``: halo
        rows are partial gradients of nodes owned by other partitions. With
        ``keep_device_rows`` the rows bound for device blocks are taken from ``values`` (a
        device array) where it is, not from its host copy sent back; on the CPU backend, where
        both are one buffer, the host path was faster (docs/results-history.md, section 8)."""
        route = self.store.routes.get(self.layout, block, self._rows(block), halo_owner,
                                      halo_row, with_own=True)
        if route.all_device:
            (rows,) = route.halo
            idx = _padded_rows(rows.src.astype(np.int32), values.shape[0], self.device.shape[0])
            with self._device_lock:
                self.device = _device_add(self.device, idx, values)
            return
        host_values = transfers.host_view(values)
        for rows in route.halo:
            if rows.code == CODES[Fate.DEVICE]:
                n = _bucket_len(rows.size)
                with self._device_lock:
                    to = _padded_rows(rows.src.astype(np.int32), n, self.device.shape[0])
                    self.device = (
                        _device_add_taken(self.device, to, values,
                                          _padded_rows(rows.dst.astype(np.int32), n,
                                                       values.shape[0]))
                        if keep_device_rows else
                        _device_add(self.device, to, _pad_to(host_values[rows.dst], n)))
            elif rows.code == CODES[Fate.SSD]:
                read = self.ssd.add_rows(rows.src, host_values, src=rows.dst)
                for _, _, owner in rows.segments:
                    self.store.cache.invalidate((self.key, owner))
                self.store.cache.invalidate((self.key, WHOLE_FILE))
                row_bytes = self.width * 4
                self.store.count(ssd_read=read * row_bytes, ssd_written=rows.size * row_bytes)
            else:
                target = self._host_array(rows.code)
                # the block's own rows come first and are contiguous: a slice add
                own = route.own_rows if route.own_code == rows.code else 0
                if own:
                    mine = target[route.own_start:route.own_start + own]
                    np.add(mine, host_values[:own], out=mine)
                # rows within one accumulate are unique: one addition per row
                add_rows(target, rows.src[own:], host_values, src=rows.dst[own:])
                self.store.count(host_written=rows.size * self.width * 4)

    def free(self) -> None:
        """Give back every tier's storage (and delete the SSD file), uncharging the accounts."""
        charge = {}
        if self.device is not None:
            charge["device"] = -int(self.device.size) * 4
        if self.host is not None:
            self.store.host_arrays.give(self.host)
        if self.ssd is not None:
            charge["ssd"] = -self.ssd.rows * self.ssd.width * 4
            self.ssd.close()
            self.ssd.path.unlink(missing_ok=True)
            self.store.cache.drop_table(self.key)
        self.release()
        self.device = self.host = self.ssd = None
        self.store._charge(**charge)

    def close(self) -> None:
        if self.ssd is not None:
            self.ssd.close()


def _bucket_len(n: int) -> int:
    """Round index-array lengths up to a power of two so device gathers compile few shapes."""
    return 1 << max(int(n - 1).bit_length(), 3)


def _pad_to(values: np.ndarray, n: int) -> np.ndarray:
    out = aligned_zeros((n,) + values.shape[1:], values.dtype)
    out[: values.shape[0]] = values
    return out


class Snapshot:
    """The step inputs (owned + halo rows, or a node-wise layer's owned rows) of every
    partition of one layer, kept on SSD from the forward sweep to backward: the naive scheme's
    redundant copy of data the stored layer outputs already hold (GriNNder regathers instead).
    Block ``p`` is partition ``p``'s ``input_rows[p]`` rows, written and read whole."""

    def __init__(self, store: "Store", layer: int, width: int, input_rows: np.ndarray):
        if store.run_dir is None:
            raise StoreError("snapshots need the SSD tier; pass a store directory")
        self.store, self.layer, self.width = store, layer, int(width)
        self.key = ("snapshot", layer)
        self.offsets = np.concatenate([[0], np.cumsum(input_rows)]).astype(np.int64)
        self.nbytes = int(self.offsets[-1]) * self.width * 4
        self.filled = False  # set once the forward sweep has written every block
        self.ssd: Optional[SSDFile] = SSDFile(store.run_dir / f"snapshot-{layer}.bin",
                                              self.offsets, self.width, store.run_id,
                                              on_io=store.count)
        store._charge(ssd=self.nbytes)

    def write(self, block: int, values) -> None:
        """Store the first ``input_rows[block]`` rows of ``values`` (a padded gather)."""
        rows = int(self.offsets[block + 1] - self.offsets[block])
        host_values = transfers.host_view(values)[:rows]
        self.ssd.write_block(block, host_values)
        self.store.count(ssd_written=host_values.nbytes)

    def read(self, block: int, padded_rows: int) -> np.ndarray:
        rows = int(self.offsets[block + 1] - self.offsets[block])
        out = _padded_buffer(self.store.buffers, rows, padded_rows, self.width)
        self.ssd.read_block(block, out[:rows])
        self.store.count(ssd_read=rows * self.width * 4)
        return out

    def free(self) -> None:
        if self.ssd is not None:
            self.ssd.close()
            self.ssd.path.unlink(missing_ok=True)
            self.ssd = None
            self.store._charge(ssd=-self.nbytes)

    def close(self) -> None:
        if self.ssd is not None:
            self.ssd.close()


class Store:
    """All tables of a run, the host cache and the run's private SSD directory.

    Args:
      block_rows: ``[P]`` rows of every partition block.
      directory: where the run's subdirectory is made (needed only if a block goes to SSD).
      host_cache_bytes: capacity of the host cache in front of the SSD tier.
      row_reads: read SSD rows one at a time, with no whole-block reads and no host cache (the
        naive scheme, see `jgrind.plan.protocols.IOStrategy`).
      host_tables_bytes: the most host RAM the tables may hold, freed arrays kept for the next
        table included (`HostArrays`; the engine passes the plan's peak). 0 keeps none.
      input_buffer_bytes: the most host RAM kept for step inputs' buffers between uses (`buffers`,
        a `jgrind.buffers.Recycler`). 0 keeps none.
    """

    def __init__(self, block_rows: np.ndarray, directory: Optional[str | os.PathLike],
                 host_cache_bytes: int, ssd_bytes_needed: int = 0, row_reads: bool = False,
                 host_tables_bytes: int = 0, input_buffer_bytes: int = 0):
        self.block_rows = np.asarray(block_rows, np.int64)
        self.row_reads = bool(row_reads)
        self.accounts = Accounts()
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self.run_id = uuid.uuid4().bytes
        self.run_dir: Optional[pathlib.Path] = None
        self.tables: dict[tuple, Table] = {}
        self.kept: dict[tuple, Table] = {}  # dropped with keep=True, for the next epoch
        self.routes = RouteCache()  # where each partition's rows live, per table layout
        self.host_arrays = HostArrays(host_tables_bytes,
                                      on_change=lambda delta: self._charge(host=delta))
        self.buffers = Recycler(input_buffer_bytes)  # what `read` and `gather` fill
        if ssd_bytes_needed:
            self.run_dir = make_run_dir(directory, ssd_bytes_needed, self.run_id)
        self.cache = HostCache(0 if row_reads else host_cache_bytes, on_change=self._sample)

    def table(self, name: str, layer: int, width: int, fates: list[Fate],
              reserve: Optional[int] = None) -> Table:
        """A zeroed table: the one kept by ``drop(..., keep=True)`` under the same name and
        layer if its width and fates match (zeroed lazily, `SSDFile.zero_lazily`), else new.
        ``reserve``: the most host bytes of tables made while this one lives (`HostArrays`)."""
        stale = self.tables.get((name, layer))  # left behind by an epoch that raised
        if stale is not None:
            self.drop(stale)
        t = self.kept.pop((name, layer), None)
        if t is not None and (t.width != int(width)
                              or [t.fate(b) for b in range(t.tier.size)] != list(fates)):
            t.free()
            t = None
        if t is not None:
            t.ssd.zero_lazily()
            self.cache.drop_table(t.key)  # (every block is also invalidated when next written)
        else:
            t = Table(self, name, layer, width, fates, reserve)
        self.tables[(name, layer)] = t
        return t

    def snapshot(self, layer: int, width: int, input_rows: np.ndarray) -> Snapshot:
        """A fresh `Snapshot` of layer ``layer``'s step inputs (replacing a stale one)."""
        stale = self.tables.get(("snapshot", layer))
        if stale is not None:
            self.drop(stale)
        s = Snapshot(self, layer, width, input_rows)
        self.tables[s.key] = s
        return s

    def count(self, **moved: int) -> None:
        """Add to the moved-bytes / call counters (called from the I/O threads, so locked)."""
        with self._lock:
            for name, n in moved.items():
                setattr(self.accounts, name, getattr(self.accounts, name) + int(n))

    def drop(self, table: Table, keep: bool = False) -> None:
        """Free a table that is no longer needed (e.g. a gradient buffer after its layer).

        ``keep``: a table whose blocks are all on SSD keeps its file (and its charge in the
        accounts) for the next `table` of the same name and layer, which rewrites it instead
        of making a new one: on this tier a new file's pages cost as much as fresh memory (the
        kernel allocates and zeroes every page again), and the disk space is reserved for the
        whole run anyway (`jgrind.plan.cost.memory`, ``ssd_needed``)."""
        self.tables.pop(table.key, None)
        if keep and table.all_ssd:
            self.kept[table.key] = table
            return
        table.free()

    def _charge(self, device: int = 0, host: int = 0, ssd: int = 0) -> None:
        with self._lock:
            a = self.accounts
            a.device += device
            a.host += host
            a.ssd += ssd
            a.peak_device = max(a.peak_device, a.device)
            a.peak_ssd = max(a.peak_ssd, a.ssd)
        self._sample()

    def _sample(self) -> None:
        with self._lock:
            a = self.accounts
            host = a.host + (self.cache.bytes if hasattr(self, "cache") else 0)
            a.peak_host = max(a.peak_host, host)
            a.timeline.append((time.perf_counter() - self._t0, a.device, host, a.ssd))

    def close(self) -> None:
        """Close every file and remove the run's directory (also on error paths)."""
        for t in [*self.tables.values(), *self.kept.values()]:
            t.close()
        self.host_arrays.clear()
        self.buffers.clear()
        if self.run_dir is not None:
            disk_space.release(self.run_dir)
            if self.run_dir.exists():
                shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def make_run_dir(directory, needed_bytes: int, run_id: bytes) -> pathlib.Path:
    """Check the store directory and create this run's private subdirectory in it."""
    if directory is None:
        raise StoreError(f"the plan puts {needed_bytes / 2**30:.2f} GiB of blocks on the SSD "
                         "tier but no store directory was given; pass store=/path/to/fast/disk "
                         "(CLI: --store), or raise the host budget")
    root = pathlib.Path(directory)
    if not root.exists():
        raise StoreError(f"store directory {root} does not exist; create it or pass another "
                         "--store")
    if not root.is_dir():
        raise StoreError(f"store path {root} is not a directory")
    if not os.access(root, os.W_OK | os.X_OK):
        raise StoreError(f"store directory {root} is not writable; choose a directory you "
                         "can write to")
    usage = shutil.disk_usage(root)
    if usage.total == 0:  # /proc, /sys: the kernel's, not a disk
        raise StoreError(f"store directory {root} is on a virtual file system, not a disk; "
                         "choose a directory on a disk (--store)")
    leftovers = leftover_runs(root)
    removed = [(p, n) for p, n in leftovers if disk_space.abandoned_here(p)]
    for path, _ in removed:  # a killed run of this machine's: nothing will use it again
        shutil.rmtree(path, ignore_errors=True)
    if removed:
        names = ", ".join(p.name for p, _ in removed)
        warnings.warn(f"store directory {root}: removed {len(removed)} folder(s) of earlier "
                      f"runs of this machine whose process is gone ({names}; "
                      f"{sum(n for _, n in removed) / 2**30:.2f} GiB)", stacklevel=2)
        leftovers = [run for run in leftovers if run not in removed]
    left = ""
    if leftovers:
        size = sum(nbytes for _, nbytes in leftovers)
        left = (f"; {len(leftovers)} folder(s) of earlier runs whose process is gone hold "
                f"{size / 2**30:.2f} GiB there ({', '.join(p.name for p, _ in leftovers[:3])}"
                f"{', ...' if len(leftovers) > 3 else ''}): remove them if no other "
                "machine's run uses this directory")
        warnings.warn(f"store directory {root}{left}", stacklevel=2)
    run_dir = root / f"jgrind-run-{os.getpid()}-{run_id.hex()[:12]}"

    def check(free: int, promised: list) -> None:
        others = ""
        if promised:
            others = (f", of which {sum(b for _, b in promised) / 2**30:.2f} GiB is promised to "
                      f"{len(promised)} other running jgrind run(s) that have not written it "
                      f"yet ({', '.join(p.name for p, _ in promised[:3])}"
                      f"{', ...' if len(promised) > 3 else ''}; a folder whose process is no "
                      "jgrind run may be removed)")
        if free - sum(b for _, b in promised) < needed_bytes:
            raise StoreError(f"store directory {root} has {free / 2**30:.2f} GiB free{others}, "
                             f"but the plan writes {needed_bytes / 2**30:.2f} GiB to SSD; free "
                             f"space, raise the host budget or choose another disk{left}")

    try:
        disk_space.reserve(root, run_dir, needed_bytes, check)
    except OSError as err:
        raise StoreError(f"cannot create a run directory in {root}: {err.strerror}") from None
    return run_dir


def leftover_runs(root: pathlib.Path) -> list[tuple[pathlib.Path, int]]:
    """``(folder, bytes)`` of every run folder in the store directory ``root`` whose process
    no longer runs on this machine: a run killed outright (SIGKILL, a power cut) could not
    remove its files. `make_run_dir` removes those that provably were this machine's
    (`disk_space.abandoned_here`) and reports the others: on a shared disk the process may be
    another machine's."""
    found = []
    for path in sorted(root.glob(disk_space.RUN_GLOB)):
        pid = path.name.split("-")[2]
        if not (pid.isdigit() and path.is_dir()) or disk_space.owner_running(path):
            continue
        try:
            size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
        except OSError:  # another user's private folder, or one removed meanwhile
            size = 0
        found.append((path, size))
    return found
