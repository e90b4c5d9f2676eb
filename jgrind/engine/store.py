"""The activation store: tables whose blocks live in tiers, with exact accounts.

A *table* is one layer's activation ``H_l``, gradient ``G_l`` or aggregation ``Z_l``:
``[N, width]`` rows in partition-major order, split into one block per partition. Every block
has a fate (from the policy), and each fate is served by a tier class (`TIERS`,
`jgrind.engine.tiers`): the device tier keeps its blocks in one JAX array, the host tier in one
NumPy array, the SSD tier in one `SSDFile` behind the host cache, and a recomputed layer's
blocks in a host array that exists only while the layer is needed. So a partition's halo rows
are one vectorised index per tier however many partitions there are. The table keeps the
fates and routes rows to the tiers; the store makes the tables and hands every tier the run's
shared resources (`jgrind.engine.tiers.Shared`).

The store keeps exact byte accounts per tier (current and peak, with a timeline for plots) and
counts the bytes moved between tiers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import threading
import time
import uuid
import warnings
from typing import Callable, Mapping, Optional

import jax
import numpy as np

from jgrind.hostio import disk_space, transfers
from jgrind.hostio.buffers import Recycler
from jgrind.engine.cache import HostCache
from jgrind.engine.host_arrays import HostArrays
from jgrind.engine.routes import Layout, RouteCache
from jgrind.engine.ssd import SSDFile, StoreError
from jgrind.engine.tiers import (WHOLE_FILE, DeviceRows, DeviceTier, HostTier, RowReadsSSDTier,
                                 Shared, Snapshot, SSDTier, Tier, TierBlocks, TransientTier,
                                 padded_buffer)
from jgrind.engine.tiers.coded import CodedHostTier, CodedSSDTier
from jgrind.engine.tiers.device import padded_rows as pad_index
from jgrind.hostio.codecs import FLOAT32, Codec
from jgrind.plan.fates import CODES, EXACT, FATES, Fate, Storage
from jgrind.hostio.rows import copy_rows

__all__ = ["Accounts", "BudgetError", "CODED_TIERS", "DeviceRows", "Snapshot", "Store", "TIERS",
           "Table", "WHOLE_FILE", "leftover_runs", "make_run_dir"]

# The class that holds each fate's blocks, made once per table that uses the fate as
# ``TIERS[fate](TierBlocks, Shared)``. A run may serve a fate by another class (`Store`'s
# ``tiers``), e.g. compressed host blocks: the class is all a new tier needs.
TIERS: dict[Fate, Callable[..., Tier]] = {
    Fate.DEVICE: DeviceTier,
    Fate.HOST: HostTier,
    Fate.SSD: SSDTier,
    Fate.RECOMPUTE: TransientTier,
}

# The classes that serve a table's HOST and SSD blocks when its storage dtype is lossy
# (`jgrind.hostio.codecs`): blocks are encoded on their way there and decoded on their way
# back. Device blocks are never converted, and a recomputed layer's transient rows stay
# float32 (they live one sweep, and the planner prices them so).
CODED_TIERS: dict[Fate, Callable[..., Tier]] = {
    Fate.HOST: CodedHostTier,
    Fate.SSD: CodedSSDTier,
}


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
    # the storage dtypes of host and SSD blocks (`jgrind.plan.fates.Storage.describe`): the
    # bytes above are theirs
    storage: str = "float32"
    timeline: list = dataclasses.field(default_factory=list)

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("timeline")
        return d


class Table:
    """One ``[N, width]`` tensor in partition-major order, its blocks spread over the tiers.

    The table keeps each block's fate and, per fate it uses, one tier object (made by
    ``tiers[fate](TierBlocks, shared)``, `jgrind.engine.tiers`) that holds those blocks' rows,
    numbered in table order (``slot[b]``: block ``b``'s first row in its tier). Whole-block
    writes and reads go to the block's tier; a gather or scatter-add follows the partition's
    route (`jgrind.engine.routes`), one call per tier that holds some of its rows.

    Args:
      name, layer: the table's key (``"activation"``, ``"gradient"``, ``"aggregation"``).
      width: floats per row.
      fates: the fate of every block.
      block_rows: ``[P]`` rows of every block.
      tiers: the tier class of every fate the table uses.
      shared: the run's resources, passed to every tier (`jgrind.engine.tiers.Shared`).
      routes: the run's route cache.
      reserve: the most host bytes of tables made while this one lives (`HostArrays`).
      codec: the storage dtype of its HOST and SSD blocks (`jgrind.hostio.codecs`); lossy
        ones are served by `CODED_TIERS`.
      generation: how many tables of this key the store made before (`TierBlocks`).
    """

    def __init__(self, name: str, layer: int, width: int, fates: list[Fate],
                 block_rows: np.ndarray, tiers: Mapping[Fate, Callable[..., Tier]],
                 shared: Shared, routes: RouteCache, reserve: Optional[int] = None,
                 codec: Codec = FLOAT32, generation: int = 0):
        self.name, self.layer, self.width = name, layer, int(width)
        self.codec = codec
        if codec.lossy:  # (a run's class that serves ``any_codec`` itself is kept)
            tiers = {**tiers, **{fate: coded for fate, coded in CODED_TIERS.items()
                                 if not getattr(tiers.get(fate), "any_codec", False)}}
        self.key = (name, layer)
        self.block_rows = block_rows
        self._buffers, self._routes = shared.buffers, routes
        self.tier = np.array([CODES[f] for f in fates], np.int8)
        self.slot = np.zeros(block_rows.size, np.int64)  # first row of the block in its tier
        for code in range(len(FATES)):
            sizes = np.where(self.tier == code, block_rows, 0)
            self.slot += np.where(self.tier == code, np.cumsum(sizes) - sizes, 0)
        self._tiers: list[Optional[Tier]] = [None] * len(FATES)  # by tier code
        for code, fate in enumerate(FATES):
            members = self.tier == code
            if block_rows[members].sum():
                coded = codec if fate in CODED_TIERS else FLOAT32
                self._tiers[code] = tiers[fate](
                    TierBlocks(self.key, self.width, block_rows, members, self.slot, reserve,
                               coded, generation),
                    shared)
        # whether each block's rows are device memory (its tier's `on_device`)
        self._on_device = np.array([tiers[fate].on_device for fate in FATES])[self.tier]
        # the tier codes whose tier converts on the device (`CODED_TIERS`): a block there is
        # written from the step output where it is, and read for a step as stored words
        self._converting = frozenset(
            code for code, fate in enumerate(FATES) if self._tiers[code] is not None
            and getattr(self._tiers[code], "converts_on_device", False))
        self._encodes = np.isin(self.tier, list(self._converting))
        self.layout = Layout(self.tier, self.slot)

    # -- what the tiers hold (for inspection and tests) ----------------------------------------
    def _tier(self, fate: Fate):
        return self._tiers[CODES[fate]]

    @property
    def device(self) -> Optional[jax.Array]:
        """The device tier's array, or None."""
        return getattr(self._tier(Fate.DEVICE), "array", None)

    @property
    def host(self) -> Optional[np.ndarray]:
        """The host tier's array, or None."""
        return getattr(self._tier(Fate.HOST), "array", None)

    @property
    def ssd(self) -> Optional[SSDFile]:
        """The SSD tier's file, or None."""
        return getattr(self._tier(Fate.SSD), "file", None)

    # -- helpers ---------------------------------------------------------------------------
    def fate(self, block: int) -> Fate:
        return FATES[self.tier[block]]

    def stored_on_host(self, block: int, halo_owner: Optional[np.ndarray] = None) -> bool:
        """Whether storing a step output of ``block`` reads the output in host memory: its
        `write`, or with ``halo_owner`` its `accumulate` into those halo rows too. Only rows
        that all land in device blocks stay on the device, and a block that a tier encodes on
        the device is written from the output where it is (`jgrind.engine.tiers.coded`)."""
        if halo_owner is None:
            return not (self._on_device[block] or self._encodes[block])
        return bool(not self._on_device[block] or not self._on_device[halo_owner].all())

    def held_on_host(self, block: int, halo_owner: Optional[np.ndarray] = None) -> bool:
        """Whether storing a step output of ``block`` (with ``halo_owner``: accumulating it)
        reads it in host memory only: no row of it lands in a device block, so the store
        needs no device copy of it and takes a host one (`write`, `accumulate`)."""
        if self._on_device[block] or (halo_owner is None and self._encodes[block]):
            return False
        return halo_owner is None or not self._on_device[halo_owner].any()

    @property
    def all_ssd(self) -> bool:
        return self.ssd is not None and bool((self.tier == CODES[Fate.SSD]).all())

    @property
    def recomputed(self) -> bool:
        return self._tier(Fate.RECOMPUTE) is not None

    def _rows(self, block: int) -> int:
        return int(self.block_rows[block])

    def _tier_of(self, block: int) -> Tier:
        return self._tiers[self.tier[block]]

    # -- transient (recompute) storage -------------------------------------------------------
    def materialize(self) -> None:
        """Make a recomputed layer's rows exist (before the sweep that rebuilds them)."""
        transient = self._tier(Fate.RECOMPUTE)
        if transient is not None:
            transient.materialize()

    def release(self) -> None:
        """Give back a recomputed layer's rows (after their last reader)."""
        transient = self._tier(Fate.RECOMPUTE)
        if transient is not None:
            transient.release()

    def zero_lazily(self) -> None:
        """Make a table kept by ``Store.drop(keep=True)`` (all on SSD) read as zeros again."""
        self._tier(Fate.SSD).zero_lazily()

    # -- whole blocks ----------------------------------------------------------------------
    def write(self, block: int, values) -> None:
        """Store the first ``rows(block)`` rows of ``values`` (a padded step output)."""
        tier = self._tier_of(block)
        if tier.on_device or self._encodes[block]:
            tier.write_block(int(block), values)
        else:
            tier.write_block(int(block), transfers.host_view(values)[:self._rows(block)])

    def read(self, block: int, padded_rows: int):
        """Block ``block`` padded with zero rows to ``padded_rows`` (device array if on device,
        else NumPy)."""
        tier, rows = self._tier_of(block), self._rows(block)
        if tier.on_device:
            return tier.read_on_device(int(block), padded_rows)
        if self._encodes[block]:  # its stored words, decoded on the device (`StoredRows`)
            words = tier.stored_buffer(rows, padded_rows)
            tier.read_stored(int(block), words[:rows])
            return tier.stored_rows(words)
        out = padded_buffer(self._buffers, rows, padded_rows, self.width)
        own = out[:rows]  # one view: `_fill` tells an in-place read by identity
        self._fill(own, tier.read_block(int(block), own))
        return out

    @staticmethod
    def _fill(dst: np.ndarray, src: np.ndarray) -> None:
        if src is not dst:  # not read in place already
            copy_rows(dst, src)

    # -- gather / accumulate over a partition's inputs ----------------------------------------
    def gather(self, block: int, halo_owner: np.ndarray, halo_row: np.ndarray,
               padded_rows: int, keep_device_rows: bool = False):
        """Rows of ``block``'s owned nodes, then its halo rows, zero-padded to ``padded_rows``.
        Where each row comes from is worked out once per layout and block (`routes`).

        A NumPy array, or a device array when every row is on the device. Where only some
        are, their rows are copied into the NumPy array, or with ``keep_device_rows`` left
        where they are: the result is then a `DeviceRows`, for a consumer that sends the rest
        to the device (on a GPU the device's rows then never cross PCIe twice)."""
        route = self._routes.get(self.layout, block, self._rows(block), halo_owner, halo_row)
        own_rows, own_tier = route.own_rows, self._tiers[route.own_code]
        own_range = range(route.own_start, route.own_start + own_rows)
        if route.only_code is not None and own_tier.on_device:
            src = np.concatenate([np.arange(own_range.start, own_range.stop)]
                                 + [t.src for t in route.halo])
            return own_tier.take_on_device(src, padded_rows)
        if route.own_code in self._converting and all(
                rows.code in self._converting for rows in route.halo):
            return self._gather_stored(block, route, own_tier, padded_rows)
        out = padded_buffer(self._buffers, own_rows + halo_row.size, padded_rows, self.width)
        kept_tier, on_device = None, []  # (positions, rows) left on the one device tier
        with contextlib.ExitStack() as held:
            for code, tier in enumerate(self._tiers):
                if tier is not None:
                    held.enter_context(tier.hold(route.blocks_in(code)))
            own = out[:own_rows]
            if keep_device_rows and own_tier.on_device:
                kept_tier = own_tier
                on_device.append((np.arange(own_rows),
                                  np.arange(own_range.start, own_range.stop)))
            else:
                self._fill(own, own_tier.read_block(int(block), own))
            for rows in route.halo:
                tier = self._tiers[rows.code]
                if keep_device_rows and tier.on_device and kept_tier in (None, tier):
                    kept_tier = tier
                    on_device.append((rows.dst, rows.src))
                else:
                    tier.take_rows(rows, out)
        if not on_device:
            return out
        dst = np.concatenate([d for d, _ in on_device])
        src = np.concatenate([r for _, r in on_device])
        # as long as the input, not a bucket of the rows' count: the take and the merge then
        # compile once per input shape rather than per shape and bucket (the padding's rows
        # are zeros taken and dropped on the device, where they cost its bandwidth only)
        n = padded_rows
        values = kept_tier.take_on_device(src, n)
        return DeviceRows(out, pad_index(dst, n, padded_rows), values)

    def _gather_stored(self, block: int, route, own_tier, padded_rows: int):
        """`gather` from tiers that all convert on the device: the rows' stored words, one
        width in every coded tier of the table, as a `StoredRows`."""
        words = own_tier.stored_buffer(route.own_rows + sum(r.size for r in route.halo),
                                       padded_rows)
        with contextlib.ExitStack() as held:
            for code in self._converting:
                held.enter_context(self._tiers[code].hold(route.blocks_in(code)))
            own_tier.read_stored(int(block), words[:route.own_rows])
            for rows in route.halo:
                self._tiers[rows.code].take_stored(rows, words)
        return own_tier.stored_rows(words)

    def accumulate(self, block: int, halo_owner: np.ndarray, halo_row: np.ndarray,
                   values, keep_device_rows: bool = False) -> None:
        """``G[own rows] += values[:own]`` and ``G[halo rows] += values[own:own+halo]``: halo
        rows are partial gradients of nodes owned by other partitions. With
        ``keep_device_rows`` the rows bound for device blocks are taken from ``values`` (a
        device array) where it is, not from its host copy sent back; on the CPU backend, where
        both are one buffer, the host path was faster (docs/results-history.md, section 8)."""
        route = self._routes.get(self.layout, block, self._rows(block), halo_owner, halo_row,
                                 with_own=True)
        own_tier = self._tiers[route.own_code]
        if route.only_code is not None and own_tier.on_device:
            (rows,) = route.halo
            own_tier.add_on_device(rows.src, values)
            return
        host_values = transfers.host_view(values)
        for rows in route.halo:
            tier = self._tiers[rows.code]
            if keep_device_rows and tier.on_device:
                tier.add_taken_on_device(rows, values)
            else:
                tier.add_rows(rows, host_values)

    def free(self) -> None:
        """Give back every tier's storage (and delete the SSD file), uncharging the accounts."""
        for tier in self._tiers:
            if tier is not None:
                tier.free()
        self._tiers = [None] * len(FATES)

    def close(self) -> None:
        for tier in self._tiers:
            if tier is not None:
                tier.close()


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
        a `jgrind.hostio.buffers.Recycler`). 0 keeps none.
      tiers: classes that serve some fates instead of `TIERS` (``row_reads`` serves SSD by
        `RowReadsSSDTier`).
      input_staging: page-locked buffers that reads and gathers fill instead
        (`jgrind.hostio.transfers.PinnedStaging`), falling back to ``buffers``; None: ``buffers``.
      storage: the storage dtype of each kind of table's host and SSD blocks
        (`jgrind.plan.fates.Storage`); float32 by default.
    """

    def __init__(self, block_rows: np.ndarray, directory: Optional[str | os.PathLike],
                 host_cache_bytes: int, ssd_bytes_needed: int = 0, row_reads: bool = False,
                 host_tables_bytes: int = 0, input_buffer_bytes: int = 0,
                 tiers: Optional[Mapping[Fate, Callable[..., Tier]]] = None,
                 input_staging=None, storage: Storage = EXACT):
        self.block_rows = np.asarray(block_rows, np.int64)
        self.storage = storage
        self.row_reads = bool(row_reads)
        self.accounts = Accounts(storage=storage.describe())
        self._t0 = time.perf_counter()
        self._lock = threading.Lock()
        self.run_id = uuid.uuid4().bytes
        self.run_dir: Optional[pathlib.Path] = None
        self.tables: dict[tuple, Table] = {}
        self._made: dict[tuple, int] = {}  # tables made per key (stochastic rounding's seeds)
        self.kept: dict[tuple, Table] = {}  # dropped with keep=True, for the next epoch
        self.routes = RouteCache()  # where each partition's rows live, per table layout
        self.host_arrays = HostArrays(host_tables_bytes,
                                      on_change=lambda delta: self._charge(host=delta))
        self.buffers = Recycler(input_buffer_bytes)
        self.input_staging = input_staging
        if input_staging is not None:
            input_staging.fallback = self.buffers
        fills = self.buffers if input_staging is None else input_staging  # `read`, `gather`
        if ssd_bytes_needed:
            self.run_dir = make_run_dir(directory, ssd_bytes_needed, self.run_id)
        self.cache = HostCache(0 if row_reads else host_cache_bytes, on_change=self._sample)
        self.tiers = {**TIERS, **({Fate.SSD: RowReadsSSDTier} if row_reads else {}),
                      **(tiers or {})}
        # what every tier is given: it reaches nothing else of the store
        self.shared = Shared(charge=self._charge, count=self.count,
                             host_arrays=self.host_arrays, buffers=fills,
                             cache=self.cache, run_dir=self.run_dir, run_id=self.run_id)

    def table(self, name: str, layer: int, width: int, fates: list[Fate],
              reserve: Optional[int] = None, codec: Optional[Codec] = None) -> Table:
        """A zeroed table: the one kept by ``drop(..., keep=True)`` under the same name and
        layer if its width, fates and codec match (zeroed lazily, `SSDFile.zero_lazily`), else
        new. ``reserve``: the most host bytes of tables made while this one lives
        (`HostArrays`). ``codec``: the storage dtype of its host and SSD blocks (default: the
        store's `Storage` for tables called ``name``)."""
        codec = self.storage.codec(name) if codec is None else codec
        if codec.lossy and self.row_reads:
            raise ValueError(f"{name} {layer}: the naive scheme's row-by-row reads keep "
                             f"float32 only, not {codec.name}")
        stale = self.tables.get((name, layer))  # left behind by an epoch that raised
        if stale is not None:
            self.drop(stale)
        generation = self._made.get((name, layer), 0)
        self._made[(name, layer)] = generation + 1
        t = self.kept.pop((name, layer), None)
        if t is not None and (t.width != int(width) or t.codec != codec
                              or [t.fate(b) for b in range(t.tier.size)] != list(fates)):
            t.free()
            t = None
        if t is not None:  # (its blocks' write counts go on: its seeds stay fresh)
            t.zero_lazily()
        else:
            t = Table(name, layer, width, fates, self.block_rows, self.tiers, self.shared,
                      self.routes, reserve, codec, generation)
        self.tables[(name, layer)] = t
        return t

    def snapshot(self, layer: int, width: int, input_rows: np.ndarray) -> Snapshot:
        """A fresh `Snapshot` of layer ``layer``'s step inputs (replacing a stale one)."""
        stale = self.tables.get(("snapshot", layer))
        if stale is not None:
            self.drop(stale)
        s = Snapshot(self.shared, layer, width, input_rows)
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
            # its cached blocks are of no further use (the next table of this key reads as
            # zeros until written): held, they filled the host cache with every gradient
            # layer by the end of the backward pass, above the plan's predicted host peak
            self.cache.drop_table(table.key)
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
        (self.buffers if self.input_staging is None else self.input_staging).clear()
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
