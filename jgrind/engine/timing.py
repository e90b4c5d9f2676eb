"""A sweep's measured time in parts: its compute, its reads and writes per tier, and how long
the main thread waited on each.

The cost model prices a sweep from three totals, compute, reads (the loader thread) and
writes (the writer thread), and how much of the I/O hides behind the compute
(`jgrind.plan.cost.Sweep`). `SweepTiming` measures the same parts while the sweep runs:

- ``reads`` and ``writes``: seconds the loader and writer threads spent in the store's reads
  and writes, per tier (``device``, ``host``, ``ssd``). A call that touches blocks in several
  tiers (a gather of halo rows) is counted in the slowest of them. A write's seconds start
  once the step that made its values has finished: waiting for the compute is not a write;
- ``read_wait`` and ``write_wait``: seconds the main thread stood still while a read or a
  write ran (the I/O the compute did not hide). A wait on the loader while it waited for an
  earlier step, or on the writer while it waited for a step's values, is compute, not I/O;
- ``compute``: the rest of the sweep's wall time: dispatch, the steps, the pipeline's hand-offs.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from jgrind.plan.fates import CODES, Fate

TIER_NAMES = ("device", "host", "ssd")
# A fate's tier, ranked by speed: a call touching several tiers is counted in the slowest.
# A recomputed layer's blocks are a host transient while they live.
TIER_RANK = {Fate.DEVICE: 0, Fate.HOST: 1, Fate.RECOMPUTE: 1, Fate.SSD: 2}
_RANK_OF_CODE = np.array([TIER_RANK[fate] for fate in sorted(CODES, key=CODES.get)], np.int8)
SSD_RANK = TIER_RANK[Fate.SSD]  # the naive scheme's snapshots are SSD files


class SweepTiming:
    """One sweep's parts, filled by `jgrind.engine.sweeps.Sweeps` from three threads: each
    field is written by one thread only (loads by the loader, stores by the writer, waits by
    the main thread)."""

    def __init__(self):
        self.reads = [0.0, 0.0, 0.0]   # seconds per tier (`TIER_NAMES`)
        self.writes = [0.0, 0.0, 0.0]
        self.read_wait = 0.0
        self.write_wait = 0.0
        self._load_started: dict = {}  # partition -> when its load began (after its wait)
        self._stores: list = []        # [start, end or None] of every store, in order
        self._first_store = 0          # stores before it ended before the last wait began

    # -- the loader thread --------------------------------------------------------------------
    def loader(self, load: Callable) -> Callable:
        """``load`` (``part -> input``), noting when each partition's load begins: the main
        thread's wait for that input counts as a read from then on."""
        def timed(part):
            self._load_started[part.index] = time.perf_counter()
            return load(part)
        return timed

    def read(self, tier: int, fn: Callable, *args):
        """``fn(*args)``, a store read from ``tier``, its seconds added to ``reads``."""
        start = time.perf_counter()
        out = fn(*args)
        self.reads[tier] += time.perf_counter() - start
        return out

    # -- the writer thread --------------------------------------------------------------------
    def store(self, tier: int, ready, fn: Callable, *args) -> None:
        """``fn(*args)``, a store write into ``tier``, once ``ready`` (the step's output, a JAX
        array, or None) is: its seconds are added to ``writes``."""
        if ready is not None:
            ready.block_until_ready()
        span = [time.perf_counter(), None]
        self._stores.append(span)
        try:
            fn(*args)
        finally:
            span[1] = time.perf_counter()
            self.writes[tier] += span[1] - span[0]

    # -- the main thread ----------------------------------------------------------------------
    def inputs(self, io):
        """Iterate ``io`` (a `jgrind.engine.pipeline.SweepIO`), adding to ``read_wait`` the
        part of each wait for an input that its load ran in."""
        it = iter(io)
        while True:
            start = time.perf_counter()
            try:
                part, value = next(it)
            except StopIteration:
                return
            end = time.perf_counter()
            began = self._load_started.get(part.index, end)
            self.read_wait += max(0.0, end - max(start, began))
            yield part, value

    def write(self, io, fn: Callable, *args) -> None:
        """``io.write(fn, *args)``, adding to ``write_wait`` the stores it waited on."""
        start = time.perf_counter()
        io.write(fn, *args)
        self._waited_on_stores(start, time.perf_counter())

    def finish(self, io) -> None:
        """``io.finish()`` (the queued writes), timed as `write`."""
        start = time.perf_counter()
        io.finish()
        self._waited_on_stores(start, time.perf_counter())

    def _waited_on_stores(self, start: float, end: float) -> None:
        stores, i = self._stores, self._first_store
        waited = 0.0
        while i < len(stores):
            began, ended = stores[i]
            if ended is not None and ended <= start and i == self._first_store:
                self._first_store = i = i + 1  # over before this wait: never again
                continue
            if began >= end:
                break
            waited += max(0.0, min(ended if ended is not None else end, end) - max(began, start))
            i += 1
        self.write_wait += waited

    def parts(self, seconds: float) -> dict:
        """The sweep's parts, for the metrics log: ``compute``, ``read_wait``, ``write_wait``
        (seconds), ``reads`` and ``writes`` (``{tier: seconds}``, tiers with none left out),
        of a sweep that took ``seconds``."""
        return {"compute": max(0.0, seconds - self.read_wait - self.write_wait),
                "reads": _by_tier(self.reads), "writes": _by_tier(self.writes),
                "read_wait": self.read_wait, "write_wait": self.write_wait}


def _by_tier(seconds: list) -> dict:
    return {name: s for name, s in zip(TIER_NAMES, seconds) if s > 0}


class TierOf:
    """The tier each partition's call on a table counts in (`TIER_RANK`): its own block's, or
    the slowest among its own block and the blocks its halo rows come from. Worked out once
    per table and kind of call, for every partition: a sweep asks in every step.

    ``parts``: the engine's partitions (their ``index`` and ``halo_owner``)."""

    def __init__(self, parts):
        self._parts = parts
        self._known: dict = {}  # (the table's block tiers, halo) -> [tier per partition]
        self._owners: dict = {}  # partition -> the partitions its halo rows come from

    def of(self, table, halo: bool) -> list:
        """Every partition's tier for calls on ``table`` (a `jgrind.engine.store.Table`),
        indexed by partition."""
        key = (table.tier.tobytes(), halo)
        tiers = self._known.get(key)
        if tiers is None:
            ranks = _RANK_OF_CODE[table.tier]
            tiers = [int(r) for r in ranks]
            if halo:
                for part in self._parts:
                    owners = self._owners.get(part.index)
                    if owners is None:
                        owners = self._owners[part.index] = np.unique(
                            np.asarray(part.halo_owner))
                    if owners.size:
                        tiers[part.index] = max(tiers[part.index], int(ranks[owners].max()))
            self._known[key] = tiers
        return tiers
