"""The out-of-core engine over several processes: each process's tiers hold its own
partitions' blocks, and the halo rows that cross between processes travel by a JAX collective.

Every process builds the same plan and schedule (`jgrind.devices.ShardedOutOfCore`: the same
partitions, their placement over the devices of all processes, the same fates) and runs only
the steps of the partitions placed on its own devices. Its tables keep its own partitions'
blocks in their tiers (its own devices, host RAM, its own SSD folder, recomputed rows), and of
every other process's blocks only the rows its own partitions read as halo (`ProcessTiers`:
one small host array per table and tier, `ProcessDeviceTier` for the device tier), and those
only while a sweep needs them. Those are the rows that cross:

* Forward: before a sweep gathers a layer's input (`RowExchange.rows`, from the sweep's input
  loader: a forward sweep, a backward sweep that regathers, a recomputation), every process
  sends the rows of its blocks that another process's partitions read as halo, and writes
  those it receives where its gathers find them; once the sweep is done they are freed
  (`RowExchange.drop`). A backward sweep that regathers the layer brings them again.
* Backward: a step's input gradient is scatter-added as on one process; the rows of halo
  nodes owned by another process's partitions add up in that table's remote rows (made when
  the first one arrives), and once the sweep is done (`RowExchange.gradients`) they are sent
  to the owner, added into its rows there before the sweep below reads them, and freed here.

So a process keeps of the others' rows at most the features' (read once from the graph, kept
all run), one layer's input and one layer's gradient: not every table's for the whole epoch
(`jgrind.plan.process_shares.halo_bytes` counts it so). A kept aggregation is never gathered
across partitions: it has no remote rows.

Both are ``all_to_all``s under `jax.shard_map` over a mesh of one device per process (gloo
on the CPU, NCCL on GPUs), of ``[processes, rows, words]`` buffers: the rows any pair of
processes sends, in chunks of at most `CHUNK_BYTES` per buffer (the last one padded), so that
the buffers in flight (the send buffer, the collective's input and output) stay small beside
the tables; a row crosses as its tier stores it (a lossy storage dtype's words,
`ProcessTier`). The bytes that cross are counted (``moved``: the real rows;
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
from jgrind.engine.tiers.device import bucket_len, padded_rows, table_set
from jgrind.engine.tiers.protocol import NOTHING_HELD, Shared, TierBlocks

__all__ = ["HaloRows", "ProcessDeviceTier", "ProcessTier", "ProcessTiers", "RowExchange",
           "collective", "halo_rows"]

_AXIS = "processes"

# The most bytes of one collective's send buffer (every process's slot): the exchange's
# buffers in flight are three of these, where one buffer of a whole 256-wide table's crossing
# rows (about 100k on the 1M-node graph in two processes) took 200 MiB each. A collective
# of a few MiB costs the link what a larger one does, plus well under a millisecond.
CHUNK_BYTES = 16 << 20


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

    def wrapping(self, inner: type, coded: Optional[type] = None) -> type:
        """A `ProcessTier` class over tier class ``inner`` (what the store's ``tiers`` maps
        a fate to): a `ProcessDeviceTier` over a tier `on_device`. ``coded``: the class
        that serves the fate's blocks of a table in a lossy storage dtype
        (`jgrind.engine.store.CODED_TIERS`), which the tier then wraps instead (the table
        keeps a class that serves ``any_codec`` itself)."""
        base = ProcessDeviceTier if getattr(inner, "on_device", False) else ProcessTier
        return type(f"Process{inner.__name__}", (base,),
                    {"inner_class": inner, "coded_class": coded,
                     "any_codec": coded is not None, "run": self})

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
            values = np.empty((nodes.size, tier.blocks.width), np.float32)
            values[order] = node_rows(nodes[order])
            tier.set_remote(blocks, rows, tier.stored(values))


class ProcessTier:
    """One tier's share of a table in one process: its own partitions' blocks in a tier of
    ``inner_class`` (the host, SSD or recompute tier, which numbers only those rows), and of
    other processes' blocks the rows its partitions read as halo, in a host array
    (``remote``). Rows are renumbered on the way in (`_split`, once per route).

    A table in a lossy storage dtype (``blocks.codec``) is served by ``coded_class``, and
    ``remote`` holds its rows' stored words, as the owner's tier holds them: the forward
    exchange sends those words, so a gather here decodes to the values the owner's own
    gathers read (one process's), and they cross smaller. Halo gradients are added into
    ``remote`` as the coded tier adds them (decoded, added in float32, encoded again), and
    their words go to the owner, which adds them into its rows the same way."""

    on_device = False
    inner_class: type
    coded_class: Optional[type] = None
    any_codec = False
    run: ProcessTiers

    def __init__(self, blocks: TierBlocks, shared: Shared):
        halo = self.run.halo
        self.blocks = blocks
        self.codec = blocks.codec
        local = blocks.members & halo.local_block
        sizes = np.where(local, blocks.block_rows, 0)
        start = np.cumsum(sizes) - sizes
        self._local = local
        self._shift = np.asarray(blocks.start, np.int64) - start  # tier row -> inner row
        self._remote_adds = 0  # scatter-adds into ``remote``: what seeds their rounding
        self.inner = None
        if int(sizes.sum()):
            inner_class = self.coded_class if self.codec.lossy else self.inner_class
            self.inner = inner_class(dataclasses.replace(blocks, members=local, start=start),
                                     shared)
        wanted, rows = halo.needed[halo.me]
        keep = blocks.members[wanted] & ~local[wanted]
        wanted, rows = wanted[keep], rows[keep]
        self._remote_src = np.asarray(blocks.start, np.int64)[wanted] + rows  # ascending
        self._remote_block = wanted
        # made when rows arrive or gradients are first added, freed once the sweep that
        # needs them is done (`drop_remote`)
        self._remote: Optional[np.ndarray] = None
        self._remote_lock = threading.Lock()
        self._charge = shared.charge
        self._splits: dict = {}
        self.live = True
        self.run.register(self)

    def __getattr__(self, name):  # the inner tier's own attributes (``file``, ``array``)
        if name in ("inner", "_remote", "__setstate__"):
            raise AttributeError(name)
        if self.inner is None:
            raise AttributeError(name)
        return getattr(self.inner, name)

    # -- the other processes' rows ----------------------------------------------------------
    @property
    def remote(self) -> np.ndarray:
        """The other processes' rows this tier keeps, for a gather: brought by the exchange
        before the sweep that reads them."""
        if self._remote is None:
            raise RuntimeError(f"{self.blocks.name} {self.blocks.layer}: a step reads rows of "
                               "another process's partition before the exchange brought them")
        return self._remote

    def _remote_rows(self) -> np.ndarray:
        """The remote rows, made (zeros, charged to the host account) if they are not held:
        for rows arriving, or gradients adding up."""
        with self._remote_lock:
            if self._remote is None:
                self._remote = np.zeros((self._remote_src.size, self.blocks.words), np.float32)
                self._charge(host=self._remote.nbytes)
            return self._remote

    @property
    def holds_remote(self) -> bool:
        return self._remote is not None

    def drop_remote(self) -> None:
        """Free the remote rows (until rows arrive or gradients add up again)."""
        with self._remote_lock:
            if self._remote is not None:
                self._charge(host=-self._remote.nbytes)
                self._remote = None

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
        at, far, positions = self._divide(src, owner)
        inner = None
        if at.size:
            inner = _tier_rows(rows.code, dst[at], src[at] - self._shift[owner[at]],
                               owner[at], rows.own)
        remote = (dst[far], positions) if far.size else None
        self._splits[id(rows)] = (rows, inner, remote)
        return inner, remote

    def _divide(self, src: np.ndarray, owner: np.ndarray) -> tuple:
        """``(mine, far, remote positions)``: the positions in tier rows ``src`` (of blocks
        ``owner``) of own blocks' rows and of other processes' rows, and where the latter
        are in ``remote``."""
        local = self._local[owner]
        mine, far = np.flatnonzero(local), np.flatnonzero(~local)
        positions = np.zeros(0, np.int64)
        if far.size:
            positions = np.searchsorted(self._remote_src, src[far])
            if positions.max() >= self._remote_src.size \
                    or not np.array_equal(self._remote_src[positions], src[far]):
                raise RuntimeError(f"{self.blocks.name} {self.blocks.layer}: a step reads "
                                   "rows of another process's partition that the exchange "
                                   "does not bring")
        return mine, far, positions

    def _remote_positions(self, blocks: np.ndarray, rows: np.ndarray) -> np.ndarray:
        src = np.asarray(self.blocks.start, np.int64)[blocks] + rows
        return np.searchsorted(self._remote_src, src)

    def _inner_rows(self, blocks: np.ndarray, rows: np.ndarray) -> TierRows:
        """Rows ``(blocks, rows)`` of own blocks (sorted, distinct) as the inner tier's, at
        positions ``0 ..``."""
        src = np.asarray(self.blocks.start, np.int64)[blocks] + rows - self._shift[blocks]
        return _tier_rows(0, np.arange(blocks.size), src, blocks, 0)

    # -- stored words (a lossy storage dtype; else the values themselves) ---------------------
    def stored(self, values: np.ndarray) -> np.ndarray:
        """The stored words of float32 rows ``values``, as this table's tiers keep them. A
        codec that rounds to nearest gives the owner's words; a stochastic one rounds with
        numbers of its own."""
        if not self.codec.lossy:
            return values
        seed = (self.blocks.generation, self.blocks.layer, self.blocks.block_rows.size,
                self._remote_adds, self.run.halo.me)
        self._remote_adds += 1
        return self.codec.encode(np.ascontiguousarray(values, np.float32), seed=seed)

    def values(self, words: np.ndarray) -> np.ndarray:
        """The float32 rows of stored ``words``."""
        if not self.codec.lossy:
            return words
        return self.codec.decode(words, np.empty((words.shape[0], self.blocks.width),
                                                 np.float32))

    # -- the `Tier` methods -------------------------------------------------------------------
    def write_block(self, block: int, values) -> None:
        if self._local[block]:
            self.inner.write_block(block, values)
            return
        # another process's block, whole (the engine writes only its own: the features'
        # halo rows come from `ProcessTiers.read_halo_rows`): keep the rows read as halo
        at = np.flatnonzero(self._remote_block == block)
        if at.size:
            self._remote_rows()[at] = self.stored(np.asarray(values)[self._remote_src[at]
                                                             - int(self.blocks.start[block])])

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
            out[remote[0]] = self.values(self.remote[remote[1]])

    def take_stored(self, rows: TierRows, out: np.ndarray) -> None:
        """``out[rows.dst]`` = the stored words of rows ``rows.src`` (a coded tier's
        gather of stored words, `jgrind.engine.tiers.coded`)."""
        inner, remote = self._split(rows)
        if inner is not None:
            self.inner.take_stored(inner, out)
        if remote is not None:
            out[remote[0]] = self.remote[remote[1]]

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        inner, remote = self._split(rows)
        if inner is not None:
            self.inner.add_rows(inner, values)
        if remote is None:
            return
        dst, at = remote  # rows of one scatter-add are distinct
        held = self._remote_rows()
        if self.codec.lossy:
            held[at] = self.stored(self.values(held[at]) + values[dst])
        else:
            held[at] += values[dst]

    def hold(self, blocks: tuple):
        if self.inner is None:
            return NOTHING_HELD
        return self.inner.hold(tuple(b for b in blocks if self._local[b]))

    def zero_lazily(self) -> None:
        if self.inner is not None:
            self.inner.zero_lazily()
        self.drop_remote()  # zeros again once made

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
            self.drop_remote()
            self.live = False

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()

    # -- the exchange's side ----------------------------------------------------------------
    def members(self, blocks: np.ndarray) -> np.ndarray:
        return self.blocks.members[blocks]

    def read_own(self, blocks: np.ndarray, rows: np.ndarray, out: np.ndarray,
                 at: np.ndarray) -> None:
        """``out[at, :words] = self[(blocks, rows)]``, rows of this process's blocks in
        their stored words."""
        if blocks.size:
            buffer = np.zeros((blocks.size, self.blocks.words), np.float32)
            take = self.inner.take_stored if self.codec.lossy else self.inner.take_rows
            take(self._inner_rows(blocks, rows), buffer)
            out[at, :self.blocks.words] = buffer

    def add_own(self, blocks: np.ndarray, rows: np.ndarray, words: np.ndarray) -> None:
        """``self[(blocks, rows)] += values(words)``, rows of this process's blocks
        (distinct)."""
        if blocks.size:
            self.inner.add_rows(self._inner_rows(blocks, rows), np.ascontiguousarray(
                self.values(words[:, :self.blocks.words]), np.float32))

    def remote_rows(self) -> tuple:
        """``(blocks, rows)`` of the other processes' rows this tier keeps, in order."""
        blocks = self._remote_block
        return blocks, self._remote_src - np.asarray(self.blocks.start, np.int64)[blocks]

    def set_remote(self, blocks: np.ndarray, rows: np.ndarray, words: np.ndarray) -> None:
        """The remote rows ``(blocks, rows)`` = stored ``words`` (their first columns)."""
        self._remote_rows()[self._remote_positions(blocks, rows)] = \
            words[:, :self.blocks.words]

    def take_remote(self, blocks: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The stored words of remote rows ``(blocks, rows)``: zeros where none are held
        (no gradient was added to them)."""
        if self._remote is None:
            return np.zeros((blocks.size, self.blocks.words), np.float32)
        return self._remote[self._remote_positions(blocks, rows)]


class ProcessDeviceTier(ProcessTier):
    """A `ProcessTier` over the device tier (`jgrind.devices.placed_tier.PlacedDeviceTier`):
    its own partitions' blocks on their own devices, and of other processes' blocks the rows
    its partitions read as halo in host memory, where the collective leaves them. A gather
    that reads some of those puts them on the reading step's device with the step's own
    rows taken there; a scatter-add leaves those rows' partial gradients in host memory, for
    `RowExchange.gradients` to send to their owner. Rows of own blocks stay on the devices,
    as in one process."""

    on_device = True

    def _divide_rows(self, src: np.ndarray) -> tuple:
        """`_divide` of tier rows ``src`` (any order), with the inner tier's rows of the own
        ones."""
        src = np.asarray(src, np.int64)
        members = self.blocks.blocks
        starts = np.asarray(self.blocks.start, np.int64)[members]
        owner = members[np.searchsorted(starts, src, side="right") - 1]
        mine, far, positions = self._divide(src, owner)
        return mine, src[mine] - self._shift[owner[mine]], owner[mine], far, positions

    def _reading_device(self) -> jax.Device:
        """The device of the step that gathers now (the loader's), else this process's
        first."""
        run = self.inner_class.run
        if run.reader is not None:
            return run.reader
        return next(d for d in run.devices if d.process_index == jax.process_index())

    def read_on_device(self, block: int, length: int) -> jax.Array:
        if not self._local[block]:
            raise RuntimeError(f"{self.blocks.name} {self.blocks.layer}: block {block} is "
                               "another process's")
        return self.inner.read_on_device(block, length)

    def take_on_device(self, src: np.ndarray, length: int) -> jax.Array:
        """Rows ``src`` as a ``[length, width]`` array on the reading step's device: other
        processes' rows sent from host memory, and own rows taken on their devices and set
        among them there."""
        mine, inner_src, _, far, positions = self._divide_rows(src)
        if not far.size:
            return self.inner.take_on_device(inner_src, length)
        host = np.zeros((length, self.blocks.width), np.float32)
        host[far] = self.remote[positions]
        out = jax.device_put(host, self._reading_device())
        if not mine.size:
            return out
        n = bucket_len(mine.size)
        got = self.inner.take_on_device(inner_src, n)
        device = next(iter(got.devices()))
        return table_set(_on(out, device), jax.device_put(padded_rows(mine, n, length), device),
                         got)

    def add_on_device(self, src: np.ndarray, values: jax.Array) -> None:
        """``self[src] += values[:src.size]``: own rows added on their devices, other
        processes' rows into ``remote``."""
        mine, inner_src, owner, far, positions = self._divide_rows(src)
        if not far.size:
            self.inner.add_on_device(inner_src, values)
            return
        if mine.size:
            self.inner.add_taken_on_device(_tier_rows(0, mine, inner_src, owner, 0), values)
        self._remote_rows()[positions] += np.asarray(jax.device_get(values))[far]

    def add_taken_on_device(self, rows: TierRows, values: jax.Array) -> None:
        """``self[rows.src] += values[rows.dst]``, as `add_on_device`."""
        inner, remote = self._split(rows)
        if inner is not None:
            self.inner.add_taken_on_device(inner, values)
        if remote is not None:
            self._remote_rows()[remote[1]] += np.asarray(jax.device_get(values))[remote[0]]


def _on(array: jax.Array, device: jax.Device) -> jax.Array:
    return array if array.devices() == {device} else jax.device_put(array, device)


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
    A row crosses in its stored words (`ProcessTier`): float32 values, or a lossy storage
    dtype's words, as its tier keeps it; the collective moves them as int32, bits as they are.

    ``moved``: bytes of real rows sent by this process since the last `reset`;
    ``moved_padded``: the collective's send buffers' bytes (the padding included);
    ``exchanges``: collectives run."""

    def __init__(self, tiers: ProcessTiers, devices: Sequence[jax.Device]):
        self.tiers, self.halo = tiers, tiers.halo
        self.devices = list(devices)
        self.me = self.halo.me
        self._device = self.devices[self.me]
        self._length = self.halo.most_rows
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
        """``[processes, rows, words]`` out (slot r: to process r) -> in (slot s: from s)."""
        count = self.halo.count
        local = jax.device_put(send.view(np.int32)[None], self._device)
        stacked = jax.make_array_from_single_device_arrays(
            (count, *send.shape), self._sharding, [local])
        self.exchanges += 1
        self.moved_padded += send.nbytes - send[self.me].nbytes
        return collective("the halo exchange", lambda: np.asarray(
            self._swap(stacked).addressable_data(0))[0].view(np.float32))

    def _chunks(self, tiers: list, width: int):
        """``(start, send buffer)`` of each chunk of the rows a table of ``width`` whose tiers
        are ``tiers`` sends: a zeroed ``[processes, rows, words]`` buffer for the crossing
        rows at positions ``start ..`` of every pair's list, as wide as the widest stored
        row. The same tiers and lists in every process: the same chunks, and one program."""
        words = max([t.blocks.words for t in tiers], default=width)
        count = self.halo.count
        rows = max(1, min(self._length, CHUNK_BYTES // (count * words * 4)))
        for start in range(0, self._length, rows):
            yield start, np.zeros((count, rows, words), np.float32)

    @staticmethod
    def _chunk(pair: tuple, start: int, rows: int) -> tuple:
        blocks, at = pair
        return blocks[start:start + rows], at[start:start + rows]

    def rows(self, name: str, layer: int, width: int) -> None:
        """Before a sweep gathers table ``(name, layer)``: every process's rows that others
        read as halo, sent to them and kept in their remote rows (until `drop`)."""
        def pack(tier, blocks, rows, slot, at):
            tier.read_own(blocks, rows, slot, at)
        self._exchange(self.tiers.tiers((name, layer)), width, self.halo.sent, pack,
                       self.halo.received, lambda tier, *received: tier.set_remote(*received))

    def gradients(self, name: str, layer: int, width: int) -> None:
        """After a backward sweep scatter-added into table ``(name, layer)``: the halo rows'
        partial gradients this process holds for other processes' blocks, sent to their
        owners and added into their rows there."""
        def pack(tier, blocks, rows, slot, at):
            slot[at, :tier.blocks.words] = tier.take_remote(blocks, rows)
        tiers = self.tiers.tiers((name, layer))
        self._exchange(tiers, width, self.halo.received, pack, self.halo.sent,
                       lambda tier, *received: tier.add_own(*received))
        for tier in tiers:  # sent: this table's next backward sweep adds up from zeros
            tier.drop_remote()

    def _exchange(self, tiers: list, width: int, going, pack, coming, unpack) -> None:
        """One table's crossing rows, chunk by chunk (`_chunks`): for every other process q,
        ``pack(tier, blocks, rows, slot, at)`` puts the rows ``going(q)`` lists into q's slot
        of the send buffer, and after the collective ``unpack(tier, blocks, rows, words)``
        takes the rows ``coming(q)`` lists from what q sent."""
        others = [q for q in range(self.halo.count) if q != self.me]
        for start, send in self._chunks(tiers, width):
            n = send.shape[1]
            for q in others:
                blocks, rows = self._chunk(going(q), start, n)
                for tier, at in _by_tier(tiers, blocks):
                    pack(tier, blocks[at], rows[at], send[q], at)
                    self.moved += at.size * tier.blocks.words * 4
            got = self._all_to_all(send)
            for q in others:
                blocks, rows = self._chunk(coming(q), start, n)
                for tier, at in _by_tier(tiers, blocks):
                    unpack(tier, blocks[at], rows[at], got[q][at])

    def drop(self, name: str, layer: int) -> None:
        """Free the remote rows of table ``(name, layer)``: the sweep that gathered them is
        done."""
        for tier in self.tiers.tiers((name, layer)):
            tier.drop_remote()


def _by_tier(tiers, blocks: np.ndarray):
    """``(tier, at)`` for each of a table's tiers holding some of ``blocks``: ``at``, the
    positions in ``blocks`` (and in the rows sent with them) of those it holds."""
    for tier in tiers:
        at = np.flatnonzero(tier.members(blocks))
        if at.size:
            yield tier, at
