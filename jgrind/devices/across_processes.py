"""The out-of-core engine over several processes: each process's tiers hold its own
partitions' blocks, and the halo rows that cross between processes travel by a JAX collective.

Every process builds the same plan and schedule (`jgrind.devices.ShardedOutOfCore`: the same
partitions, their placement over the devices of all processes, the same fates) and runs only
the steps of the partitions placed on its own devices. Its tables keep its own partitions'
blocks in their tiers (host RAM, its own SSD folder, recomputed rows), and of every other
process's blocks only the rows its own partitions read as halo (`ProcessTiers`: one small host
array per table and tier). Those are the rows that cross:

* Forward: once a sweep has written a layer's rows (`RowExchange.rows`, at the layer boundary
  the schedule gives), every process sends the rows of its blocks that another process's
  partitions read as halo, and writes those it receives where its gathers find them.
* Backward: a step's input gradient is scatter-added as on one process; the rows of halo
  nodes owned by another process's partitions add up in that table's remote rows, and once
  the sweep is done (`RowExchange.gradients`) they are sent to the owner and added into its
  rows there, before the sweep below reads them.

Both are one ``all_to_all`` under `jax.shard_map` over a mesh of one device per process (gloo
on the CPU, NCCL on GPUs), of a ``[processes, rows, width]`` buffer padded to the most rows
any pair of processes sends. The bytes that cross are counted (``moved``: the real rows;
``moved_padded``: the collective's buffers). The features need no exchange: each process
writes its own partitions' blocks and reads, from the graph, the halo rows of other
processes' blocks that its partitions read (`ProcessTiers.read_halo_rows`); from a saved
graph it reads no other feature row.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jgrind.engine.routes import TierRows
from jgrind.engine.tiers.protocol import NOTHING_HELD, Shared, TierBlocks

__all__ = ["HaloRows", "ProcessTier", "ProcessTiers", "RowExchange", "collective",
           "halo_rows"]

_AXIS = "processes"


@dataclasses.dataclass(frozen=True)
class HaloRows:
    """Which rows cross between processes: ``needed[q]``, the ``(blocks, rows)`` (sorted by
    block, then row; distinct) that process q's partitions read as halo from partitions of
    other processes. ``process_of_block``: ``[P]`` the process of every partition;
    ``me``: this process."""

    needed: tuple
    process_of_block: np.ndarray
    me: int

    @property
    def count(self) -> int:
        return len(self.needed)

    @property
    def local_block(self) -> np.ndarray:
        return self.process_of_block == self.me

    def sent(self, to: int) -> tuple:
        """``(blocks, rows)`` this process sends to process ``to``: of those ``to`` needs,
        the ones of its own blocks."""
        return self.between(self.me, to)

    def received(self, sender: int) -> tuple:
        """``(blocks, rows)`` this process receives from ``sender``."""
        return self.between(sender, self.me)

    def between(self, sender: int, reader: int) -> tuple:
        blocks, rows = self.needed[reader]
        keep = self.process_of_block[blocks] == sender
        return blocks[keep], rows[keep]

    @property
    def most_rows(self) -> int:
        """The most rows one process sends another: the collective's buffer length."""
        return max((self.between(s, r)[0].size for s in range(self.count)
                    for r in range(self.count) if s != r), default=0)

    @property
    def crossing_rows(self) -> int:
        """Rows that cross between processes at one layer boundary, all pairs together."""
        return sum(b.size for b, _ in self.needed)


def halo_rows(pg, process_of_block: np.ndarray, processes: int, me: int) -> HaloRows:
    """`HaloRows` of partitioned graph ``pg`` whose partitions run in processes
    ``process_of_block``."""
    process_of_block = np.asarray(process_of_block, np.int64)
    sizes = np.array([p.num_owned for p in pg.partitions], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    keys: list = [[] for _ in range(processes)]
    for part in pg.partitions:
        q = int(process_of_block[part.index])
        owners = np.asarray(part.halo_owner, np.int64)
        far = process_of_block[owners] != q
        keys[q].append(offsets[owners[far]] + np.asarray(part.halo_row, np.int64)[far])
    needed = []
    for q in range(processes):
        flat = np.unique(np.concatenate(keys[q])) if keys[q] else np.zeros(0, np.int64)
        blocks = np.searchsorted(offsets, flat, side="right") - 1
        needed.append((blocks.astype(np.int64), (flat - offsets[blocks]).astype(np.int64)))
    return HaloRows(tuple(needed), process_of_block, int(me))


class ProcessTiers:
    """What every `ProcessTier` of a run shares: the `HaloRows`, and the tiers of each table
    (by its key), for `RowExchange` to read and write."""

    def __init__(self, halo: HaloRows):
        self.halo = halo
        self.of_table: dict = {}  # table key -> [ProcessTier]
        self._lock = threading.Lock()

    def wrapping(self, inner: type) -> type:
        """A `ProcessTier` class over tier class ``inner`` (what the store's ``tiers`` maps
        a fate to)."""
        return type(f"Process{inner.__name__}", (ProcessTier,),
                    {"inner_class": inner, "run": self})

    def register(self, tier: "ProcessTier") -> None:
        with self._lock:
            held = [t for t in self.of_table.get(tier.blocks.key, ()) if t.live]
            self.of_table[tier.blocks.key] = held + [tier]

    def tiers(self, key: tuple) -> list:
        return [t for t in self.of_table.get(key, ()) if t.live]

    def read_halo_rows(self, key: tuple, pg, node_rows) -> None:
        """Of table ``key`` (the features, which no step writes), the rows of other
        processes' blocks that this process's partitions read as halo, read by
        ``node_rows(global ids) -> rows`` (ascending ids) into each tier's remote rows. Those
        blocks are written in the processes that run them, not here."""
        for tier in self.tiers(key):
            blocks, rows = tier.remote_rows()
            if not blocks.size:
                continue
            nodes = pg.order[np.asarray(pg.offsets, np.int64)[blocks] + rows]
            order = np.argsort(nodes, kind="stable")
            values = np.empty((nodes.size, tier.blocks.words), np.float32)
            values[order] = node_rows(nodes[order])
            tier.set_remote(blocks, rows, values)


class ProcessTier:
    """One tier's share of a table in one process: its own partitions' blocks in a tier of
    ``inner_class`` (the host, SSD or recompute tier, which numbers only those rows), and of
    other processes' blocks the rows its partitions read as halo, in a host array
    (``remote``). Rows are renumbered on the way in (`_split`, once per route)."""

    on_device = False
    inner_class: type
    run: ProcessTiers

    def __init__(self, blocks: TierBlocks, shared: Shared):
        halo = self.run.halo
        self.blocks = blocks
        local = blocks.members & halo.local_block
        sizes = np.where(local, blocks.block_rows, 0)
        start = np.cumsum(sizes) - sizes
        self._local = local
        self._shift = np.asarray(blocks.start, np.int64) - start  # tier row -> inner row
        self.inner = None
        if int(sizes.sum()):
            self.inner = self.inner_class(dataclasses.replace(blocks, members=local,
                                                              start=start), shared)
        wanted, rows = halo.needed[halo.me]
        keep = blocks.members[wanted] & ~local[wanted]
        wanted, rows = wanted[keep], rows[keep]
        self._remote_src = np.asarray(blocks.start, np.int64)[wanted] + rows  # ascending
        self._remote_block = wanted
        self.remote = np.zeros((wanted.size, blocks.words), np.float32)
        self._charge = shared.charge
        self._charge(host=self.remote.nbytes)
        self._splits: dict = {}
        self.live = True
        self.run.register(self)

    def __getattr__(self, name):  # the inner tier's own attributes (``file``, ``array``)
        if name in ("inner", "__setstate__"):
            raise AttributeError(name)
        if self.inner is None:
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- rows ---------------------------------------------------------------------------------
    def _split(self, rows: TierRows):
        """``(inner rows or None, (dst, remote positions))`` of ``rows``: its rows of own
        blocks renumbered for the inner tier, and those of other processes' blocks."""
        cached = self._splits.get(id(rows))
        if cached is not None and cached[0] is rows:
            return cached[1], cached[2]
        src, dst = np.asarray(rows.src, np.int64), np.asarray(rows.dst)
        owner = np.empty(src.size, np.int64)
        for a, b, o in rows.segments:
            owner[a:b] = o
        mine = self._local[owner]
        inner = None
        if mine.any():
            at = np.flatnonzero(mine)
            inner = _tier_rows(rows.code, dst[at], src[at] - self._shift[owner[at]],
                               owner[at], rows.own)
        far = np.flatnonzero(~mine)
        remote = None
        if far.size:
            positions = np.searchsorted(self._remote_src, src[far])
            if positions.max() >= self._remote_src.size \
                    or not np.array_equal(self._remote_src[positions], src[far]):
                raise RuntimeError(f"{self.blocks.name} {self.blocks.layer}: a step reads "
                                   "rows of another process's partition that the exchange "
                                   "does not bring")
            remote = (dst[far], positions)
        self._splits[id(rows)] = (rows, inner, remote)
        return inner, remote

    def _remote_positions(self, blocks: np.ndarray, rows: np.ndarray) -> np.ndarray:
        src = np.asarray(self.blocks.start, np.int64)[blocks] + rows
        return np.searchsorted(self._remote_src, src)

    def _inner_rows(self, blocks: np.ndarray, rows: np.ndarray) -> TierRows:
        """Rows ``(blocks, rows)`` of own blocks (sorted, distinct) as the inner tier's, at
        positions ``0 ..``."""
        src = np.asarray(self.blocks.start, np.int64)[blocks] + rows - self._shift[blocks]
        return _tier_rows(0, np.arange(blocks.size), src, blocks, 0)

    # -- the `Tier` methods -------------------------------------------------------------------
    def write_block(self, block: int, values) -> None:
        if self._local[block]:
            self.inner.write_block(block, values)
            return
        # another process's block, whole (the engine writes only its own: the features'
        # halo rows come from `ProcessTiers.read_halo_rows`): keep the rows read as halo
        at = np.flatnonzero(self._remote_block == block)
        if at.size:
            self.remote[at] = np.asarray(values)[self._remote_src[at]
                                                 - int(self.blocks.start[block])]

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        if not self._local[block]:
            raise RuntimeError(f"{self.blocks.name} {self.blocks.layer}: block {block} is "
                               "another process's")
        return self.inner.read_block(block, into)

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        inner, remote = self._split(rows)
        if inner is not None:
            self.inner.take_rows(inner, out)
        if remote is not None:
            out[remote[0]] = self.remote[remote[1]]

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        inner, remote = self._split(rows)
        if inner is not None:
            self.inner.add_rows(inner, values)
        if remote is not None:
            self.remote[remote[1]] += values[remote[0]]  # rows of one scatter-add are distinct

    def hold(self, blocks: tuple):
        if self.inner is None:
            return NOTHING_HELD
        return self.inner.hold(tuple(b for b in blocks if self._local[b]))

    def zero_lazily(self) -> None:
        if self.inner is not None:
            self.inner.zero_lazily()
        self.remote[:] = 0.0

    def materialize(self) -> None:
        if self.inner is not None:
            self.inner.materialize()

    def release(self) -> None:
        if self.inner is not None:
            self.inner.release()

    def free(self) -> None:
        if self.inner is not None:
            self.inner.free()
        if self.live:
            self._charge(host=-self.remote.nbytes)
            self.live = False

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    # -- the exchange's side ----------------------------------------------------------------
    def members(self, blocks: np.ndarray) -> np.ndarray:
        return self.blocks.members[blocks]

    def read_own(self, blocks: np.ndarray, rows: np.ndarray, out: np.ndarray,
                 at: np.ndarray) -> None:
        """``out[at] = self[(blocks, rows)]``, rows of this process's blocks."""
        if blocks.size:
            buffer = np.zeros((blocks.size, self.blocks.words), np.float32)
            self.inner.take_rows(self._inner_rows(blocks, rows), buffer)
            out[at] = buffer

    def add_own(self, blocks: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        """``self[(blocks, rows)] += values``, rows of this process's blocks (distinct)."""
        if blocks.size:
            self.inner.add_rows(self._inner_rows(blocks, rows),
                                np.ascontiguousarray(values, np.float32))

    def remote_rows(self) -> tuple:
        """``(blocks, rows)`` of the other processes' rows this tier keeps, in order."""
        blocks = self._remote_block
        return blocks, self._remote_src - np.asarray(self.blocks.start, np.int64)[blocks]

    def set_remote(self, blocks: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
        self.remote[self._remote_positions(blocks, rows)] = values

    def take_remote(self, blocks: np.ndarray, rows: np.ndarray) -> np.ndarray:
        return self.remote[self._remote_positions(blocks, rows)]


def collective(what: str, run):
    """``run()``, a collective of every process: a failure there (gloo's "Connection reset by
    peer" when another process died, which JAX raises as a ValueError or a JaxRuntimeError)
    as one `jgrind.devices.processes.ProcessError` line, which the command line prints and
    exits with status 2."""
    from jgrind.devices.processes import ProcessError
    try:
        return run()
    except (jax.errors.JaxRuntimeError, ValueError) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ProcessError(f"process {jax.process_index()}: {what} with the other processes "
                           f"failed ({first}); another process has probably stopped: see its "
                           "output") from None


def _tier_rows(code: int, dst: np.ndarray, src: np.ndarray, owner: np.ndarray,
               own: int) -> TierRows:
    """A `TierRows` of rows ``src`` (their blocks ``owner``, in runs) to positions ``dst``."""
    cuts = np.flatnonzero(np.diff(owner)) + 1
    starts = np.concatenate([[0], cuts]).astype(np.int64)
    stops = np.concatenate([cuts, [owner.size]]).astype(np.int64)
    segments = tuple((int(a), int(b), int(owner[a])) for a, b in zip(starts, stops))
    index = np.int32 if src.size == 0 or int(src.max()) < 2**31 else np.int64
    return TierRows(int(code), np.asarray(dst, index), np.asarray(src, index), segments,
                    int(own))


class RowExchange:
    """The halo rows and halo gradients that cross between processes at a layer boundary:
    one ``all_to_all`` over ``devices`` (one device of each process, in process order) each.

    ``moved``: bytes of real rows sent by this process since the last `reset`;
    ``moved_padded``: the collective's send buffers' bytes (the padding included);
    ``exchanges``: collectives run."""

    def __init__(self, tiers: ProcessTiers, devices: Sequence[jax.Device]):
        self.tiers, self.halo = tiers, tiers.halo
        self.devices = list(devices)
        self.me = self.halo.me
        self._device = self.devices[self.me]
        self._length = max(1, self.halo.most_rows)
        self._mesh = Mesh(np.array(self.devices), (_AXIS,))
        self._sharding = NamedSharding(self._mesh, P(_AXIS))

        def swap(x):
            return jax.lax.all_to_all(x[0], _AXIS, 0, 0, tiled=False)[None]
        self._swap = jax.jit(jax.shard_map(swap, mesh=self._mesh, in_specs=P(_AXIS),
                                           out_specs=P(_AXIS), check_vma=False))
        self.reset()

    def reset(self) -> None:
        self.moved = 0
        self.moved_padded = 0
        self.exchanges = 0

    def _all_to_all(self, send: np.ndarray) -> np.ndarray:
        """``[processes, rows, width]`` out (slot r: to process r) -> in (slot s: from s)."""
        count = self.halo.count
        local = jax.device_put(send[None], self._device)
        stacked = jax.make_array_from_single_device_arrays(
            (count, *send.shape), self._sharding, [local])
        self.exchanges += 1
        self.moved_padded += send.nbytes - send[self.me].nbytes
        return collective("the halo exchange", lambda: np.asarray(
            self._swap(stacked).addressable_data(0))[0])

    def _buffer(self, width: int) -> np.ndarray:
        return np.zeros((self.halo.count, self._length, width), np.float32)

    def rows(self, name: str, layer: int, width: int) -> None:
        """After a sweep wrote table ``(name, layer)``: every process's rows that others read
        as halo, sent to them and kept in their remote rows."""
        tiers = self.tiers.tiers((name, layer))
        send = self._buffer(width)
        for to in range(self.halo.count):
            if to == self.me:
                continue
            blocks, rows = self.halo.sent(to)
            for tier, at in _by_tier(tiers, blocks):
                tier.read_own(blocks[at], rows[at], send[to], at)
            self.moved += blocks.size * width * 4
        got = self._all_to_all(send)
        for sender in range(self.halo.count):
            if sender == self.me:
                continue
            blocks, rows = self.halo.received(sender)
            for tier, at in _by_tier(tiers, blocks):
                tier.set_remote(blocks[at], rows[at], got[sender][at])

    def gradients(self, name: str, layer: int, width: int) -> None:
        """After a backward sweep scatter-added into table ``(name, layer)``: the halo rows'
        partial gradients this process holds for other processes' blocks, sent to their
        owners and added into their rows there."""
        tiers = self.tiers.tiers((name, layer))
        send = self._buffer(width)
        for owner in range(self.halo.count):
            if owner == self.me:
                continue
            blocks, rows = self.halo.received(owner)
            for tier, at in _by_tier(tiers, blocks):
                send[owner][at] = tier.take_remote(blocks[at], rows[at])
            self.moved += blocks.size * width * 4
        got = self._all_to_all(send)
        for reader in range(self.halo.count):
            if reader == self.me:
                continue
            blocks, rows = self.halo.sent(reader)
            for tier, at in _by_tier(tiers, blocks):
                tier.add_own(blocks[at], rows[at], got[reader][at])


def _by_tier(tiers, blocks: np.ndarray):
    """``(tier, at)`` for each of a table's tiers holding some of ``blocks``: ``at``, the
    positions in ``blocks`` (and in the rows sent with them) of those it holds."""
    for tier in tiers:
        at = np.flatnonzero(tier.members(blocks))
        if at.size:
            yield tier, at
