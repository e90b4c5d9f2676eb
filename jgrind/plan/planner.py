"""The planner: a fate for every block that minimises the predicted epoch time under the budgets.

The problem (see docs/planner.md for the derivation):

* **Decisions.** For every stored tensor group (``H_l``: one layer's activations, ``G_l``: one
  layer's gradients) how many of its P partition blocks live on the device, in host RAM and on
  SSD, and for each hidden activation layer whether it is recomputed instead (all blocks or
  none: recomputing a block needs the whole previous layer).
* **Cost.** `jgrind.plan.cost`: a sweep's I/O is linear in those counts, its compute is fixed
  once the recomputed layers are known, and its time is the maximum of four linear
  functions: where the steps run on the host's cores, ``c + max(e, r, w, (e + r + w) /
  cores)`` for its reads, writes and the engine's own work for its steps
  (`jgrind.plan.cost.HostCores`); on an accelerator
  ``c + io - overlap * min(c, io)``, with ``io = r + w - parallel * min(r, w)``. The epoch is
  the sum over sweeps. (On an accelerator the model also caps ``io`` by what the host's cores
  allow, a minimum, which the program takes in rounds: `CAPPED_ROUNDS`.)
* **Memory.** The store's own accounting: activation blocks for the whole epoch, gradient
  blocks two layers at a time, recomputed layers in a host transient, plus one partition's
  working set on the device. Linear in the counts.

For a fixed set of recomputed layers this is a small mixed-integer linear program (block
counts are integers, one binary per tensor for the all-on-device fast path, one epigraph
variable per sweep), solved exactly by HiGHS through `scipy.optimize.milp`. The recomputed
layers are enumerated (``2^(L-1)`` sets: 16 for a 5-layer model), and so is the host cache
mode. The size of the program depends on the number of layers, not on the number of
partitions, so planning stays fast for thousands of partitions.

`plan_run` also chooses the number of partitions (when the user does not fix it) and picks the
in-memory fast path when everything fits on the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import sys
import time
from typing import Callable, Optional, Sequence

import numpy as np

from jgrind.hostio import disk_space
from jgrind.partition import partition_graph
from jgrind.partition.partitioners import label_propagation
from jgrind.plan.budgets import UNLIMITED
from jgrind.plan.cost import (Assignment, HostCores, Prediction, Workload,
                              accumulate_seconds,
                              backward_kind, fit_masks, format_bytes, format_minimum,
                              fullest_working_set, gather_seconds, in_memory_seconds,
                              least_device_budget, measured_machinery, predict, step_machinery,
                              read_block_seconds, step_seconds, thread_own, uniform,
                              with_page_cache, write_seconds)
from jgrind.plan.execution import fits_in_memory, in_memory_bytes
from jgrind.plan.fates import (ACTIVATION, AGGREGATION, EXACT, FATES, GRADIENT, D, Fate, H, R,
                               S, Storage, TensorInfo)
from jgrind.plan.inventory import layer_widths
from jgrind.plan.process_shares import halo_bytes, host_shares, process_split
from jgrind.plan.protocols import IOStrategy
from jgrind.plan.schedule import epoch_schedule

MAX_PARTS = 4096
# Programs solved per recompute set and cache mode, when the steps run on an accelerator: the
# first prices every sweep's I/O as its threads' time beside each other; each next one prices
# the sweeps whose I/O the host's cores cap at the last solution (`HostCores`) by the cores'
# bound. Each round's plan is predicted no
# slower than the last's, and a choice that repeats ends it. (The minimum of the two prices as
# one program needs a binary per sweep, which made planning 8x slower.)
CAPPED_ROUNDS = 3
# ... unless the cores' prices save less than this share of the first plan's epoch: the plan
# is then kept (and priced by the model, caps included). A second program costs as much
# planning time as the first or more, and where the caps barely move the first plan's price
# they rarely move the choice.
CAPPED_WORTH = 0.02


class PlanError(ValueError):
    """No plan meets the budgets. The message gives the smallest budgets that would work."""


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
    """A fate for every block, the predicted epoch and peak memory, and why.

    Attributes:
      in_memory: the in-memory fast path (everything fits on the device); then there is no
        assignment and ``num_parts`` is 1.
      num_parts: partitions the plan is for.
      assignment: tier codes per block (`jgrind.plan.cost.Assignment`).
      prediction: the cost model's epoch (sweeps, memory); None on the fast path.
      epoch_seconds: predicted seconds per epoch.
      cache_bytes: host cache in front of the SSD tier (0: off).
      reasons: ``{(name, layer): why}`` for every tensor group.
      device_budget, host_budget, directory: what it was planned for.
      workload, partitioned: the shapes planned over and the `PartitionedGraph` (reused by
        the engine so the graph is not partitioned twice).
      planning_seconds: time spent solving (partitioning excluded).
      alternatives: ``[(description, predicted seconds)]`` of the candidates considered.
      placement: on several devices (`plan_run`'s ``devices``), the partitions' devices
        (`jgrind.plan.placement.Placement`), which the device budget is held per device of;
        None: one device.
      processes: over several processes (`plan_run`'s ``device_processes``), the partitions'
        processes (`jgrind.plan.process_shares.ProcessSplit`), which the host budget is held
        per process of; None: one process.
      host_shares: with ``processes``, every process's predicted host bytes, ``(blocks,
        halo)`` (`jgrind.plan.process_shares.host_shares`), each within the host budget.
    """

    in_memory: bool
    num_parts: int
    assignment: Optional[Assignment]
    prediction: Optional[Prediction]
    epoch_seconds: float
    cache_bytes: int
    reasons: dict
    device_budget: int
    host_budget: int
    directory: Optional[str]
    workload: Optional[Workload] = None
    partitioned: object = None
    planning_seconds: float = 0.0
    alternatives: tuple = ()
    in_memory_bytes: int = 0
    placement: object = None
    processes: object = None
    host_shares: tuple = ()

    def fates(self) -> dict:
        return {} if self.assignment is None else self.assignment.fates()

    def policy(self) -> "Planned":
        """The plan as an ordinary policy (`Planned`)."""
        return Planned(assignment=tuple(sorted(self.fates().items(), key=lambda kv: kv[0])),
                       directory=self.directory, io=IOStrategy(cache=self.cache_bytes > 0),
                       in_memory=self.in_memory, storage=self.storage)

    @property
    def storage(self) -> Storage:
        """The storage dtypes the plan was priced with (`jgrind.plan.fates.Storage`)."""
        return EXACT if self.workload is None else self.workload.storage

    def groups(self) -> list[dict]:
        """One row per tensor group: name, layer, bytes, blocks per fate, why."""
        if self.assignment is None:
            return []
        w, a, rows = self.workload, self.assignment, []
        for name, codes_by_layer in ((ACTIVATION, a.activations), (GRADIENT, a.gradients)):
            for l, codes in enumerate(codes_by_layer):
                if name == GRADIENT and l == 0:
                    continue
                counts = {FATES[c].value: int(np.sum(codes == c)) for c in (D, H, S, R)}
                rows.append({"tensor": f"{'H' if name == ACTIVATION else 'G'}_{l}",
                             "name": name, "layer": l,
                             "bytes": int(w.block_bytes(l).sum()), "blocks": counts,
                             "dtype": w.storage.codec(name).name,
                             "stored": sum(w.tier_bytes(l, codes, name)),
                             "fate": _fate_summary(counts),
                             "why": self.reasons.get((name, l), "")})
        for l in sorted(w.aggregated):
            codes = a.aggregations.get(l, np.full(w.num_parts, R, np.int8))
            counts = {FATES[c].value: int(np.sum(codes == c)) for c in (D, H, S, R)}
            rows.append({"tensor": f"Z_{l}", "name": AGGREGATION, "layer": l,
                         "bytes": int(w.aggregation_bytes(l).sum()), "blocks": counts,
                         "dtype": w.storage.codec(AGGREGATION).name,
                         "stored": sum(w.tier_bytes(l, codes, AGGREGATION))
                         if l in a.aggregations else 0,
                         "fate": _fate_summary(counts) if l in a.aggregations else
                         "regather",
                         "why": self.reasons.get((AGGREGATION, l), "")})
        return rows


def _fate_summary(counts: dict) -> str:
    parts = [(k, v) for k, v in counts.items() if v]
    if len(parts) == 1:
        return parts[0][0]
    return " + ".join(f"{k} {v}" for k, v in parts)


# -- a plan as a policy ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Planned:
    """A plan's fates as an ordinary policy: a table lookup (`Plan.policy`).

    ``io`` carries the plan's host cache mode; ``in_memory`` marks the fast-path plan;
    ``storage`` the storage dtypes it was priced with."""

    assignment: tuple            # ((name, layer, partition), fate) pairs
    directory: Optional[str] = None
    io: IOStrategy = IOStrategy()
    in_memory: bool = False
    storage: Storage = EXACT

    def __call__(self, info: TensorInfo) -> Fate:
        fate = self._lookup.get((info.name, info.layer, info.partition))
        if fate is None:
            if info.name == AGGREGATION:
                return Fate.RECOMPUTE  # not kept: the plan lists kept aggregations only
            if self.in_memory:
                return Fate.DEVICE
            raise KeyError(f"the plan has no fate for {info.name} of layer {info.layer}, "
                           f"partition {info.partition}: it was made for another partitioning")
        return fate

    @functools.cached_property
    def _lookup(self) -> dict:
        return dict(self.assignment)


# -- the program for one set of recomputed layers ------------------------------------------------
class _Coefficients:
    """Per-tier I/O seconds of every (operation, tensor) with all blocks in one tier, memoised
    across the recompute sets (they do not depend on it)."""

    def __init__(self, w: Workload, profile):
        self.w, self.profile, self._memo = w, profile, {}

    def __call__(self, op: str, layer: int, code: int, fast: bool = False) -> float:
        key = (op, layer, code, fast)
        if key not in self._memo:
            codes = np.full(self.w.num_parts, code, np.int8)
            if op in ("write Z", "read Z"):  # the kept aggregation Z_layer
                kwargs = {} if op == "write Z" else {"verified": True}
                fn = write_seconds if op == "write Z" else read_block_seconds
                self._memo[key] = fn(self.w, self.profile, layer, codes,
                                     width=self.w.aggregated[layer], **kwargs)
                return self._memo[key]
            fn = {"gather": gather_seconds, "write": write_seconds, "read": read_block_seconds,
                  "accumulate": accumulate_seconds}[op]
            kwargs = ({"fast": fast} if op in ("gather", "accumulate") else
                      # gradient blocks written whole (node-wise layers) are checked on read
                      {"verified": self.w.local(layer)} if op == "read" else {})
            self._memo[key] = fn(self.w, self.profile, layer, codes, **kwargs)
        return self._memo[key]


def _solve(w: Workload, profile, coef: _Coefficients, recomputed: frozenset, *,
           device_room: int, host_room: int, ssd: bool, ssd_room: int,
           keep: bool = True, processes=None,
           process_rooms: Optional[np.ndarray] = None) -> Optional[Assignment]:
    """The exact fate counts for one recompute set, or None if infeasible.

    With ``keep``, every layer with an aggregation (`Workload.aggregated`) also gets a binary
    ``k_l`` (keep ``Z_l`` or regather ``H_l`` in backward) and its kept blocks' tier counts.
    Kept, the backward sweep reads ``Z_l`` instead of gathering ``H_l``: the gather's cost
    enters through ``u_l >= gather - M k_l`` (``u_l`` is the gather when ``k_l = 0``, 0 when
    1). The sweep's compute is linear in ``k_l`` and, where the layer below uses output masks
    (made only by a layer that regathers), in ``k_{l+1}`` and their product ``q_l``.

    With ``processes`` (a `jgrind.plan.process_shares.ProcessSplit`), the host budget holds
    each process's own host blocks within its room ``process_rooms[q]`` (`_process_rooms`)
    instead of the whole plan's within ``host_room``."""
    best, capped = None, None
    for _ in range(CAPPED_ROUNDS):
        program = _Program(w, profile, coef, recomputed, keep, capped, processes)
        program.one_tier_per_block()
        program.sweep_times()
        program.memory(device_room, host_room, ssd, ssd_room, process_rooms)
        counts = program.solve(ssd)
        if counts is None:
            break
        best = program.assignment(counts)
        again, saved = program.capped_at(program.solution)
        if again is None or again == capped or (capped is None and saved < CAPPED_WORTH):
            break
        capped = again
    return best


def _addto(d: dict, key: int, v: float) -> None:
    d[key] = d.get(key, 0.0) + v


class _Program:
    """The mixed-integer program of `_solve`: its variables, its constraint rows in the order
    they are added, its bounds, and the assignment read from a solution.

    Variables, in order: for each stored tensor group ``g``, its blocks per tier ``x[g, D/H/S]``
    and the fast-path binary ``z[g]`` (every block on the device); for each layer whose
    aggregation may be kept, ``Z_l``'s blocks per tier ``y[l, D/H/S]``, the keep binary
    ``k[l]``, the gather ``u[l]`` paid when not kept and ``H_l``'s SSD blocks ``v[l]`` it
    gathers from then (the engine's calls on them, `_sweep_machinery`); ``q[l] = k[l]
    k[l+1]`` where a sweep's compute needs that product; one epigraph ``T[s]`` per sweep (the objective is
    their sum); the device and host peaks ``m_dev``, ``m_host``. On several devices
    (`Workload.device_of`), per device ``d``: each group's device blocks among ``d``'s
    partitions ``x_d[g]`` (and ``y_d[l]`` of each kept layer) and ``d``'s gradient peak
    ``m_d``, so the device budget holds each device's own blocks. Over several processes
    (``processes``, a `jgrind.plan.process_shares.ProcessSplit`), per process ``q`` the
    same for its host blocks: ``x_q[g]``, ``y_q[l]`` and ``m_q``, so the host budget holds
    each process's own blocks. Last, where the profile prices halo calls on a table split
    between the device and other tiers (``machinery_device_mix``): per such table ``a[g]``
    and ``mix[g]``, and per kept layer gathering one ``wm[l]`` (see ``__init__``)."""

    def __init__(self, w: Workload, profile, coef: _Coefficients, recomputed: frozenset,
                 keep: bool, capped: Optional[tuple] = None, processes=None):
        L = w.num_layers
        self.w, self.profile, self.coef, self.P = w, profile, coef, w.num_parts
        self.groups = [(ACTIVATION, l) for l in range(L) if l not in recomputed] + \
                      [(GRADIENT, l) for l in range(1, L)]
        self.gi = {g: i for i, g in enumerate(self.groups)}
        self.order = epoch_schedule(L, recomputed=recomputed).order()
        self.kept_layers = sorted(w.aggregated) if keep else []
        self.n_x = 4 * len(self.groups)
        # y_D, y_H, y_S, k, u, v of each kept layer
        self.zi = {l: self.n_x + 6 * i for i, l in enumerate(self.kept_layers)}
        self.n_y = self.n_x + 6 * len(self.kept_layers)
        pairs = [l for l in self.kept_layers if l + 1 in self.zi and w.masked(l)]
        self.qi = {l: self.n_y + i for i, l in enumerate(pairs)}
        self.t0 = self.n_y + len(pairs)
        self.m_dev, self.m_host = self.t0 + len(self.order), self.t0 + len(self.order) + 1
        # per device: x_d of every group, y_d of every kept layer, m_d
        self.device_of = w.device_of
        self.K = 0 if w.device_of is None else w.num_devices
        self.d0, self.per_device = self.m_host + 1, len(self.groups) + len(self.kept_layers) + 1
        # per process: x_q of every group, y_q of every kept layer, m_q (host blocks)
        self.split = processes
        self.Q = 0 if processes is None else processes.num_processes
        self.p0 = self.d0 + self.K * self.per_device
        # the tables whose halo calls cost more split between the device and other tiers
        # (`jgrind.plan.cost.mixed_halo_call`): per table its binary ``a[g]`` (a block on the
        # device) and ``mix[g] >= a[g] - z[g]``; per kept layer whose gather is one of them,
        # ``wm[l] >= mix[H_l] - k[l]`` (the gather happens only when Z_l is not kept)
        self.mix0 = self.p0 + self.Q * self.per_device
        mixing = measured_machinery(profile) and \
            getattr(profile, "machinery_device_mix", 0.0) > 0.0
        self.mixable = [g for g in self.groups if mixing and not w.local(g[1])]
        self.mi = {g: self.mix0 + 2 * i for i, g in enumerate(self.mixable)}
        self.wmi = {l: self.mix0 + 2 * len(self.mixable) + i for i, l in
                    enumerate(l for l in self.kept_layers if (ACTIVATION, l) in self.mi)}
        self.n = self.mix0 + 2 * len(self.mixable) + len(self.wmi)
        # which price bounds each sweep's I/O (`_epigraph`): 1 where the host's cores cap it
        # (`HostCores`), 0 (and None: everywhere) where the threads' time beside each other
        self.cores = HostCores.of(profile)
        self.capped = capped if self.cores is not None else None
        self.io_forms: list = []  # per sweep: (its threads' forms, its cores' forms)
        self.device_counts = None  # per device, from a solution
        self.process_counts = None  # per process, from a solution
        self.eta = float(profile.overlap)
        self.par = float(profile.io_parallel)
        self.rows, self.lo, self.hi = [], [], []

    # the variables' indices
    def x(self, g, code):
        return 4 * self.gi[g] + code

    def z(self, g):
        return 4 * self.gi[g] + 3

    def y(self, l, code):
        return self.zi[l] + code

    def k(self, l):
        return self.zi[l] + 3

    def u(self, l):
        return self.zi[l] + 4

    def v(self, l):
        return self.zi[l] + 5

    def a(self, g):
        return self.mi[g]

    def mix(self, g):
        return self.mi[g] + 1

    # one block of `per_device` variables per device (from ``d0``) and per process (from
    # ``p0``): each group's count, then each kept layer's, then the peak
    def _in_block(self, start: int, i: int, slot: int) -> int:
        return start + i * self.per_device + slot

    def _kept_slot(self, l) -> int:
        return len(self.groups) + self.kept_layers.index(l)

    def xd(self, g, d):
        return self._in_block(self.d0, d, self.gi[g])

    def yd(self, l, d):
        return self._in_block(self.d0, d, self._kept_slot(l))

    def md(self, d):
        return self._in_block(self.d0, d, self.per_device - 1)

    def xq(self, g, q):
        return self._in_block(self.p0, q, self.gi[g])

    def yq(self, l, q):
        return self._in_block(self.p0, q, self._kept_slot(l))

    def mq(self, q):
        return self._in_block(self.p0, q, self.per_device - 1)

    def add(self, entries: dict, lower: float, upper: float) -> None:
        """One constraint row: ``lower <= sum(v * var[key]) <= upper``."""
        row = np.zeros(self.n)
        for key, v in entries.items():
            row[key] += v
        self.rows.append(row)
        self.lo.append(lower)
        self.hi.append(upper)

    def one_tier_per_block(self) -> None:
        """Every block has exactly one tier; the fast path needs every block on the device; a
        kept aggregation keeps all P blocks or none; ``q`` is the product it stands for."""
        x, z, y, k, P = self.x, self.z, self.y, self.k, self.P
        for g in self.groups:
            self.add({x(g, D): 1, x(g, H): 1, x(g, S): 1}, P, P)
            self.add({z(g): P, x(g, D): -1}, -np.inf, 0)
        for l in self.kept_layers:
            self.add({y(l, D): 1, y(l, H): 1, y(l, S): 1, k(l): -P}, 0, 0)
        for l, q in self.qi.items():  # q = k_l * k_{l+1}
            self.add({q: 1, k(l): -1, k(l + 1): -1}, -1, np.inf)
            self.add({q: 1, k(l): -1}, -np.inf, 0)
            self.add({q: 1, k(l + 1): -1}, -np.inf, 0)
        for g in self.mixable:  # a table with a device block; split unless all are
            self.add({self.a(g): P, x(g, D): -1}, 0, np.inf)
            self.add({self.mix(g): 1, self.a(g): -1, z(g): 1}, 0, np.inf)
        for l, wm in self.wmi.items():
            self.add({wm: 1, self.mix((ACTIVATION, l)): -1, k(l): 1}, 0, np.inf)

    def sweep_times(self) -> None:
        """Each sweep's epigraph ``T_s`` bounded below by the sweep's time."""
        for s, (kind, l) in enumerate(self.order):
            reads, writes, read_const, write_const = self._sweep_io(kind, l)
            c, c_lin = self._sweep_compute(kind, l)
            terms, const = self._sweep_machinery(kind, l)
            own = thread_own(self.w, self.profile, kind, l)
            if self.cores is not None and self.cores.compute_on_host:
                # the kernels, then the engine's work beside the I/O (`HostCores`)
                self._shared_cores(s, (reads, read_const), (writes, write_const), c, c_lin,
                                   (terms, const), own)
                continue
            if terms or const:
                self.add({self.t0 + s: 1.0, **{key: -v for key, v in terms.items()}},
                         const, np.inf)
            # each I/O thread's time is its bytes and its own seconds (`Sweep.io_seconds`)
            self._epigraph(s, (reads, read_const + own[0]), (writes, write_const + own[1]),
                           c, c_lin)

    def _sweep_machinery(self, kind: str, l: int):
        """The engine's own seconds for the sweep's steps, a lower bound on ``T_s``
        (`jgrind.plan.cost.sweep_machinery`): a constant per step and ``{variable: seconds}``
        per SSD block of the tables it calls on, as ``({variable: seconds}, constant)``;
        nothing where the profile has no such figures.
        A backward sweep that may keep ``Z_l`` gathers from ``H_l``'s SSD blocks only if it
        does not keep it: ``v_l >= x[H_l, S] - P k_l``. A gather or scatter-add on a table
        split between the device and other tiers adds its figure per step (``mix[g]``;
        ``wm[l]`` for a gather that keeping ``Z_l`` saves). A layer that may keep ``Z_l``
        adds what a kept step costs beyond a plain one (`step_machinery`) times ``k_l``."""
        w, profile = self.w, self.profile
        if not measured_machinery(profile):
            return {}, 0.0
        active = int(np.sum(w.owned > 0))
        step = step_machinery(w, profile, kind, l)
        per_block = profile.machinery_ssd_call * active / self.P
        per_mixed = getattr(profile, "machinery_device_mix", 0.0) * active
        terms: dict = {}
        if l in self.zi:
            extra = step_machinery(w, profile, kind, l, kept=True) - step
            if extra:
                _addto(terms, self.k(l), extra * active)

        def calls_on(group) -> None:
            if group in self.gi:
                _addto(terms, self.x(group, S), per_block)

        def halo_call_on(group) -> None:
            if group in self.mi:
                _addto(terms, self.mix(group), per_mixed)
        if kind == "backward" and l in self.zi:
            if (ACTIVATION, l) in self.gi:
                self.add({self.v(l): 1.0, self.x((ACTIVATION, l), S): -1.0,
                          self.k(l): float(self.P)}, 0.0, np.inf)
                _addto(terms, self.v(l), per_block)
            if l in self.wmi:
                _addto(terms, self.wmi[l], per_mixed)
            _addto(terms, self.y(l, S), per_block)
        else:
            calls_on((ACTIVATION, l))
            halo_call_on((ACTIVATION, l))
        if kind in ("forward", "recompute"):
            calls_on((ACTIVATION, l + 1))
            if kind == "forward" and l in self.zi:
                _addto(terms, self.y(l, S), per_block)
        else:
            if l < w.num_layers - 1:
                calls_on((GRADIENT, l + 1))
            if l >= 1:
                calls_on((GRADIENT, l))
                halo_call_on((GRADIENT, l))
        return terms, step * active

    def _sweep_io(self, kind: str, l: int):
        """The sweep's reads and writes, each as ``{variable: seconds}`` and the constant
        seconds of recomputed layers (host transients)."""
        reads, writes, read_const, write_const = {}, {}, 0.0, 0.0
        if kind == "backward" and l in self.zi:
            self._gather_unless_kept(l, reads)
        else:
            read_const += self._term("gather", (ACTIVATION, l), l, reads, fast=True)
        if kind in ("forward", "recompute"):
            write_const += self._term("write", (ACTIVATION, l + 1), l + 1, writes)
            if kind == "forward" and l in self.zi:
                for code in (D, H, S):
                    _addto(writes, self.y(l, code), self.coef("write Z", l, code) / self.P)
        else:
            if l < self.w.num_layers - 1:
                read_const += self._term("read", (GRADIENT, l + 1), l + 1, reads)
            if l >= 1:
                write_const += self._term("accumulate", (GRADIENT, l), l, writes, fast=True)
        return reads, writes, read_const, write_const

    def _term(self, op: str, group, layer: int, into: dict, fast: bool = False) -> float:
        """Add one operation's seconds per block in each tier to ``into``; return the constant
        seconds instead when ``group`` is a recomputed activation layer (a host transient)."""
        coef = self.coef
        if group not in self.gi:
            return coef(op, layer, R)
        for code in (D, H, S):
            _addto(into, self.x(group, code), coef(op, layer, code) / self.P)
        if fast:
            _addto(into, self.z(group), coef(op, layer, D, True) - coef(op, layer, D))
        return 0.0

    def _gather_unless_kept(self, l: int, reads: dict) -> None:
        """A backward sweep whose layer may keep ``Z_l`` gathers ``H_l`` only if ``Z_l`` is not
        kept (``u_l >= gather - M k_l``; ``u_l`` then carries the gather's seconds, constant
        ones included), and reads ``Z_l`` if it is."""
        coef, gather = self.coef, {}
        const = self._term("gather", (ACTIVATION, l), l, gather, fast=True)
        big = const + max(coef("gather", l, code) for code in (D, H, S, R)) + 1.0
        self.add({self.u(l): 1, **{key: -v for key, v in gather.items()}, self.k(l): big},
                 const, np.inf)
        reads[self.u(l)] = 1.0
        for code in (D, H, S):
            _addto(reads, self.y(l, code), coef("read Z", l, code) / self.P)

    def _sweep_compute(self, kind: str, l: int):
        """The sweep's compute seconds: a constant ``c`` plus ``{variable: seconds}`` linear
        in the keep binaries (and their product)."""
        w, profile = self.w, self.profile
        if kind in ("forward", "recompute"):
            return step_seconds(w, profile, l, "forward"), {}
        if l == w.num_layers - 1:
            return step_seconds(w, profile, l, "top"), {}

        def sec(kept, masked):
            return step_seconds(w, profile, l, backward_kind(w, l, kept), masked=masked)
        c_lin, k = {}, self.k
        below_kept = l + 1 in self.zi and w.masked(l)  # then no masks when l+1 keeps Z
        if l in self.zi and below_kept:
            rm, ru, km, ku = sec(False, True), sec(False, False), sec(True, True), \
                sec(True, False)
            c = rm
            _addto(c_lin, k(l), km - rm)
            _addto(c_lin, k(l + 1), ru - rm)
            _addto(c_lin, self.qi[l], rm - ru - km + ku)
        elif l in self.zi:
            c = sec(False, True)
            _addto(c_lin, k(l), sec(True, True) - c)
        elif below_kept:
            c = sec(False, True)
            _addto(c_lin, k(l + 1), sec(False, False) - c)
        else:
            c = step_seconds(w, profile, l, backward_kind(w, l, False))
        return c, c_lin

    def _epigraph(self, s: int, reads, writes, c: float, c_lin: dict) -> None:
        """The sweep's price as linear lower bounds on its epigraph ``T_s``. ``reads`` and
        ``writes`` are ``({variable: seconds}, constant seconds)``, the compute ``c_lin`` and
        ``c`` the same. (The engine's own work for the steps bounds ``T_s`` too:
        `sweep_times` adds that row, `_sweep_machinery`.)

        Where the steps run on the host's cores, `_shared_cores` instead. Elsewhere
        ``T_s >= c + (1-eta) io`` and ``T_s >= io + (1-eta) c``, where the sweep's I/O
        ``io = r + w - par min(r, w) = max(r + (1-par) w, w + (1-par) r)``: four
        constraints, as T grows with io; where `capped` marks the sweep, ``io`` is instead
        what the cores allow, ``max(r, w, (r + w) / cores)`` (`HostCores.io_bound`), six
        constraints. The model prices the smaller of the two; `_solve` picks each sweep's
        from the last solution."""
        eta, par = self.eta, self.par
        threads = []
        for (long, long_const), (short, short_const) in ((reads, writes), (writes, reads)):
            io = dict(long)
            for key, v in short.items():
                _addto(io, key, (1 - par) * v)
            threads.append((io, long_const + (1 - par) * short_const))
        cores = []
        if self.cores is not None:
            (r, r_const), (wr, w_const) = reads, writes
            spread = {key: v / self.cores.count for key, v in r.items()}
            for key, v in wr.items():
                _addto(spread, key, v / self.cores.count)
            cores = [(dict(r), r_const), (dict(wr), w_const),
                     (spread, (r_const + w_const) / self.cores.count)]
        self.io_forms.append((threads, cores, c, c_lin))
        forms = cores if self.capped is not None and self.capped[s] else threads
        for io, io_const in forms:
            first, second = {self.t0 + s: 1.0}, {self.t0 + s: 1.0}
            for key, v in io.items():
                _addto(first, key, -(1 - eta) * v)
                _addto(second, key, -v)
            for key, v in c_lin.items():
                _addto(first, key, -v)
                _addto(second, key, -(1 - eta) * v)
            self.add(first, c + (1 - eta) * io_const, np.inf)
            self.add(second, (1 - eta) * c + io_const, np.inf)

    def _shared_cores(self, s: int, reads, writes, c: float, c_lin: dict, machinery,
                      own: tuple = (0.0, 0.0)) -> None:
        """The sweep's price where the steps, the reader and the writer share the host's cores
        (`HostCores.sweep_seconds`): ``T_s >= c + e``, ``c + r + r_own``, ``c + w + w_own``
        and ``c + (e + r + w) / cores``, four constraints, exact; ``machinery``: the engine's
        own work ``e`` (`_sweep_machinery`), ``({variable: seconds}, constant seconds)`` as
        the others; ``own``: the I/O threads' own seconds (`jgrind.plan.cost.thread_own`)."""
        (r, r_const), (wr, w_const), (e, e_const) = reads, writes, machinery
        count = self.cores.count
        spread = {}
        for terms in (r, wr, e):
            for key, v in terms.items():
                _addto(spread, key, v / count)
        for terms, const in ((e, e_const), (r, r_const + own[0]), (wr, w_const + own[1]),
                             (spread, (r_const + w_const + e_const) / count)):
            bound = {self.t0 + s: 1.0}
            for key, v in (*terms.items(), *c_lin.items()):
                _addto(bound, key, -v)
            self.add(bound, const + c, np.inf)

    def capped_at(self, solution: np.ndarray) -> tuple[Optional[tuple], float]:
        """Per sweep, whether the cores' price of its I/O is the smaller at ``solution``, and
        the share of the epoch the cores' prices save there against the threads' everywhere
        (None and 0 without `HostCores`, or where the steps share the cores: that price is
        one exact form)."""
        if self.cores is None or self.cores.compute_on_host:
            return None, 0.0

        def value(terms, const):
            return const + sum(v * solution[key] for key, v in terms.items())

        def most(forms):
            return max(value(terms, const) for terms, const in forms)

        def sweep(c, io):
            return c + io - self.eta * min(c, io)
        capped, threads_total, least_total = [], 0.0, 0.0
        for threads, cores, c, c_lin in self.io_forms:
            c = value(c_lin, c)
            io_threads, io_cores = most(threads), most(cores)
            capped.append(int(io_cores < io_threads))
            threads_total += sweep(c, io_threads)
            least_total += sweep(c, min(io_threads, io_cores))
        return tuple(capped), (threads_total - least_total) / max(threads_total, 1e-12)

    def memory(self, device_room, host_room: int, ssd: bool, ssd_room: int,
               process_rooms: Optional[np.ndarray] = None) -> None:
        """The peaks: activations and kept aggregations all epoch, gradients two layers at a
        time, within each tier's room. On several devices ``device_room`` is ``[K]``, each
        device's room (`per_device_memory`); over several processes the host's room is each
        process's, ``process_rooms`` (`per_process_memory`)."""
        w, L, x, y = self.w, self.w.num_layers, self.x, self.y

        def most(name: str, l: int, code: int) -> float:
            """The largest block's bytes in tier ``code``: host and SSD blocks in their
            storage dtype (`Workload.stored_bytes`)."""
            if code == D:
                full = w.aggregation_bytes(l) if name == AGGREGATION else w.block_bytes(l)
                return float(full.max(initial=0))
            return float(w.stored_bytes(name, l).max(initial=0))
        tiers = ((D, self.m_dev, device_room), (H, self.m_host, host_room))
        if self.K:
            self.per_device_memory(np.asarray(device_room))
            tiers = tiers[1:]
        if self.Q:
            self.per_process_memory(np.asarray(process_rooms))
            tiers = tuple(t for t in tiers if t[0] != H)
        for code, m, room in tiers:
            self.add({**{x((ACTIVATION, l), code): most(ACTIVATION, l, code) for l in range(L)
                         if (ACTIVATION, l) in self.gi},
                      **{y(l, code): most(AGGREGATION, l, code) for l in self.kept_layers},
                      m: 1}, -np.inf, room)
            for l in range(1, L):
                entries = {m: 1, x((GRADIENT, l), code): -most(GRADIENT, l, code)}
                if l + 1 < L:
                    entries[x((GRADIENT, l + 1), code)] = -most(GRADIENT, l + 1, code)
                self.add(entries, 0, np.inf)
        if ssd:
            self.add({**{x(g, S): most(*g, S) for g in self.groups},
                      **{y(l, S): most(AGGREGATION, l, S) for l in self.kept_layers}},
                     -np.inf, ssd_room)

    def per_device_memory(self, rooms: np.ndarray) -> None:
        """Each device's device blocks, within its room: the counts per device add up to
        the group's device blocks, and each device's blocks are priced at its largest."""
        w, L, x, y, xd, yd, md = self.w, self.w.num_layers, self.x, self.y, self.xd, self.yd, \
            self.md
        for g in self.groups:
            self.add({x(g, D): 1, **{xd(g, d): -1 for d in range(self.K)}}, 0, 0)
        for l in self.kept_layers:
            self.add({y(l, D): 1, **{yd(l, d): -1 for d in range(self.K)}}, 0, 0)
        for d in range(self.K):
            members = self.device_of == d

            def most(nbytes: np.ndarray) -> float:
                return float(np.max(nbytes[members], initial=0))
            self.add({**{xd((ACTIVATION, l), d): most(w.block_bytes(l)) for l in range(L)
                         if (ACTIVATION, l) in self.gi},
                      **{yd(l, d): most(w.aggregation_bytes(l)) for l in self.kept_layers},
                      md(d): 1}, -np.inf, float(rooms[d]))
            for l in range(1, L):
                entries = {md(d): 1, xd((GRADIENT, l), d): -most(w.block_bytes(l))}
                if l + 1 < L:
                    entries[xd((GRADIENT, l + 1), d)] = -most(w.block_bytes(l + 1))
                self.add(entries, 0, np.inf)

    def per_process_memory(self, rooms: np.ndarray) -> None:
        """Each process's host blocks, within its room: the counts per process add up to
        the group's host blocks, each process's blocks are priced at its largest (in their
        storage dtype; the halo rows it keeps of the others' are in ``rooms`` already)."""
        w, L, x, y = self.w, self.w.num_layers, self.x, self.y
        xq, yq, mq = self.xq, self.yq, self.mq
        for g in self.groups:
            self.add({x(g, H): 1, **{xq(g, q): -1 for q in range(self.Q)}}, 0, 0)
        for l in self.kept_layers:
            self.add({y(l, H): 1, **{yq(l, q): -1 for q in range(self.Q)}}, 0, 0)
        for q in range(self.Q):
            members = self.split.own(q)

            def most(name: str, l: int) -> float:
                return float(np.max(w.stored_bytes(name, l)[members], initial=0))
            self.add({**{xq((ACTIVATION, l), q): most(ACTIVATION, l) for l in range(L)
                         if (ACTIVATION, l) in self.gi},
                      **{yq(l, q): most(AGGREGATION, l) for l in self.kept_layers},
                      mq(q): 1}, -np.inf, float(rooms[q]))
            for l in range(1, L):
                entries = {mq(q): 1, xq((GRADIENT, l), q): -most(GRADIENT, l)}
                if l + 1 < L:
                    entries[xq((GRADIENT, l + 1), q)] = -most(GRADIENT, l + 1)
                self.add(entries, 0, np.inf)

    def solve(self, ssd: bool) -> Optional[np.ndarray]:
        """The block counts (``x`` and ``y``) of the fastest solution, or None if infeasible."""
        from scipy.optimize import Bounds, LinearConstraint, milp
        x, z, y, k, P, n = self.x, self.z, self.y, self.k, self.P, self.n
        c_obj = np.zeros(n)
        c_obj[self.t0:self.t0 + len(self.order)] = 1.0
        upper = np.full(n, np.inf)
        for g in self.groups:
            upper[x(g, D)] = upper[x(g, H)] = P
            upper[x(g, S)] = P if ssd else 0
            upper[z(g)] = 1
        integrality = np.zeros(n)
        integrality[:self.n_x] = 1
        for l in self.kept_layers:
            upper[y(l, D)] = upper[y(l, H)] = P
            upper[y(l, S)] = P if ssd else 0
            upper[k(l)] = 1
            integrality[[y(l, D), y(l, H), y(l, S), k(l)]] = 1
        for q in self.qi.values():
            upper[q] = 1
        for d in range(self.K):
            on_device = int(np.sum(self.device_of == d))
            for g in self.groups:
                upper[self.xd(g, d)] = on_device
                integrality[self.xd(g, d)] = 1
            for l in self.kept_layers:
                upper[self.yd(l, d)] = on_device
                integrality[self.yd(l, d)] = 1
        for g in self.mixable:
            upper[self.a(g)] = 1
            integrality[self.a(g)] = 1
        for q in range(self.Q):
            in_process = int(np.sum(self.split.own(q)))
            for g in self.groups:
                upper[self.xq(g, q)] = in_process
                integrality[self.xq(g, q)] = 1
            for l in self.kept_layers:
                upper[self.yq(l, q)] = in_process
                integrality[self.yq(l, q)] = 1
        with _quiet_stdout():  # HiGHS' MIP presolve prints a debug line straight to fd 1
            res = milp(c_obj, constraints=LinearConstraint(np.array(self.rows), self.lo,
                                                           self.hi),
                       integrality=integrality, bounds=Bounds(np.zeros(n), upper),
                       options={"time_limit": 10.0})
        if res.x is None:
            return None
        self.solution = res.x
        solution = np.rint(res.x).astype(np.int64)
        if self.K:
            self.device_counts = solution[self.d0:self.p0].reshape(self.K, self.per_device)
        if self.Q:
            self.process_counts = solution[self.p0:self.mix0].reshape(self.Q,
                                                                      self.per_device)
        return solution[:self.n_y]

    def assignment(self, counts: np.ndarray) -> Assignment:
        """Each block's tier from the solution's counts per tier."""
        w, L, P, gi = self.w, self.w.num_layers, self.P, self.gi
        # The program counts blocks per tier as if halo reads were spread evenly over the
        # blocks; the layout then gives the fastest tier the blocks other partitions read most.
        most_read_first = np.argsort(-(w.halo.sum(axis=0) + w.owned), kind="stable")

        def column(counts_each, i: int):
            return None if counts_each is None else counts_each[:, i]

        def codes_for(g) -> np.ndarray:
            if g not in gi:
                return np.full(P, R if g[0] == ACTIVATION else D, np.int8)
            c3 = counts[4 * gi[g]: 4 * gi[g] + 3]
            if self.K or self.Q:
                return self._placed_codes(most_read_first, c3,
                                          column(self.device_counts, gi[g]),
                                          column(self.process_counts, gi[g]))
            codes = np.empty(P, np.int8)
            codes[most_read_first] = np.repeat(np.array([D, H, S], np.int8), c3)[:P]
            return codes

        def kept_codes(l) -> np.ndarray:
            c3 = counts[self.zi[l]: self.zi[l] + 3]
            if self.K or self.Q:
                i = len(self.groups) + self.kept_layers.index(l)
                return self._placed_codes(np.arange(P), c3, column(self.device_counts, i),
                                          column(self.process_counts, i))
            return np.repeat(np.array([D, H, S], np.int8), c3)[:P]

        kept = {l: kept_codes(l) for l in self.kept_layers if counts[self.k(l)] == 1}
        return Assignment(tuple(codes_for((ACTIVATION, l)) for l in range(L)),
                          tuple(codes_for((GRADIENT, l)) if l else np.full(P, D, np.int8)
                                for l in range(L)), kept)

    def _placed_codes(self, order: np.ndarray, c3: np.ndarray,
                      on_devices: Optional[np.ndarray],
                      in_processes: Optional[np.ndarray] = None) -> np.ndarray:
        """Codes with ``on_devices[d]`` device blocks among device ``d``'s partitions (the
        first of them in ``order``; None: ``c3[0]`` first ones), and the other partitions in
        host, then SSD, in ``order``: with ``in_processes``, ``in_processes[q]`` host blocks
        among process ``q``'s partitions."""
        codes = np.full(self.P, -1, np.int8)
        if on_devices is None:
            codes[order[:int(c3[0])]] = D
        else:
            placed = self.device_of[order]
            for d in range(self.K):
                codes[order[placed == d][:int(on_devices[d])]] = D
        rest = order[codes[order] == -1]
        if in_processes is None:
            codes[rest] = np.repeat(np.array([H, S], np.int8), c3[1:3])[:rest.size]
            return codes
        process = self.split.process_of[rest]
        for q in range(self.Q):
            codes[rest[process == q][:int(in_processes[q])]] = H
        codes[codes == -1] = S
        return codes


@contextlib.contextmanager
def _quiet_stdout():
    """Silence file descriptor 1 (C-level prints) for the duration; Python's own stdout is
    flushed first so nothing of ours is lost."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):  # no real fd 1 (e.g. captured differently)
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _recompute_sets(w: Workload, allow: bool):
    """The sets of activation layers to try recomputing. Not the output of a narrowing
    node-wise layer (the transform of a split GCN layer, `jgrind.executed.split`): it is smaller
    than its input, which recomputing it needs, so dropping it saves little, and leaving it
    out halves the sets to solve (planning time, target 3 of the planner issue)."""
    hidden = [l for l in range(1, w.num_layers)
              if not (w.local(l - 1) and w.widths[l] < w.widths[l - 1])]
    if not allow:
        return [frozenset()]
    return [frozenset(c) for k in range(len(hidden) + 1)
            for c in itertools.combinations(hidden, k)]


def plan(w: Workload, profile, *, device_budget: Optional[int] = None,
         host_budget: Optional[int] = None, directory: Optional[str] = None,
         ssd_free: Optional[int] = None, recompute: bool = True, num_params: int = 0,
         partitioned=None, keep: bool = True, least: bool = True, processes=None) -> Plan:
    """The fastest predicted plan for workload ``w`` (a fixed partitioning) under the budgets.

    Args:
      w: `Workload.build(partitioned_graph, model)`.
      profile: a measured `jgrind.plan.profile.Profile`.
      device_budget, host_budget: bytes (None: unlimited).
      directory: the SSD store; without one no block goes to SSD.
      ssd_free: bytes free in ``directory`` (default: unlimited).
      recompute: allow recomputing activation layers.
      keep: allow keeping aggregations (docs/engine.md, "Kept aggregations").
      least: find the budgets to state when nothing fits (False: a bare PlanError, for that
        search itself).
      processes: the partitions' processes (`jgrind.plan.process_shares.ProcessSplit`) when
        they run in several: ``host_budget`` then holds each process's share (its own
        blocks and the halo rows it keeps of the others', `_process_rooms`); None: one
        process.

    Raises:
      PlanError: no assignment fits, with the smallest budgets that would (each checked by
        planning with it).
    """
    start = time.perf_counter()
    given = w

    def too_small() -> PlanError:
        if not least:
            return PlanError("no plan fits the budgets")

        def fits(device: int, host_bytes: int) -> bool:
            try:
                plan(given, profile, device_budget=device, host_budget=host_bytes,
                     directory=directory, ssd_free=ssd_free, recompute=recompute,
                     num_params=num_params, keep=keep, least=False, processes=processes)
            except PlanError:
                return False
            return True
        halo = _halo_floor(given, processes, host)
        if halo is not None:
            return PlanError(_halo_too_large(given, processes, halo, dev, host, fits))
        return PlanError(_too_small(given, dev, host, ssd, recompute, fits))

    dev = UNLIMITED if device_budget is None else int(device_budget)
    host = UNLIMITED if host_budget is None else int(host_budget)
    ssd = directory is not None
    ssd_room = UNLIMITED if ssd_free is None else int(ssd_free)
    w = fit_masks(w, device_budget)
    working_set = fullest_working_set(w)  # on several devices, the largest device's
    device_room = dev - working_set if w.device_of is None else dev - w.device_working_sets()
    L = w.num_layers
    if working_set > dev:
        raise too_small()
    # SSD rates depend on whether the OS page cache will hold the SSD files, which depends on
    # the plan: solve with both and let the exact prediction decide.
    # When everything the run could hold (every block, twice over for the host cache's
    # copies, plus the working set) fits in the RAM the profile saw free, every plan is
    # page-cached and the disk's figures need no program of their own.
    everything = 2 * sum(int(w.block_bytes(l).sum()) * (2 if l else 1)
                         + int(w.aggregation_bytes(l).sum())
                         for l in range(L)) + working_set
    always_cached = everything <= getattr(profile, "host_free", 0)
    regimes = ((True,) if always_cached else (False, True)) if ssd else (False,)
    coefs = [_Coefficients(w, with_page_cache(profile, cached)) for cached in regimes]
    best, candidates, seen = None, [], set()
    for rset, coef in itertools.product(_recompute_sets(w, recompute), coefs):
        transient = 2 * max([int(w.block_bytes(l).sum()) for l in rset] or [0])
        a = _solve(w, coef.profile, coef, rset, device_room=device_room,
                   host_room=host - transient, ssd=ssd, ssd_room=ssd_room, keep=keep,
                   processes=processes, process_rooms=None if processes is None else
                   _process_rooms(w, processes, rset, host))
        if a is None:
            continue
        key = tuple(c.tobytes() for c in a.activations + a.gradients) + tuple(
            (l, c.tobytes()) for l, c in sorted(a.aggregations.items()))
        if key in seen:
            continue
        seen.add(key)
        base = predict(w, a, profile, 0, num_params)
        leftover = _host_left(w, a, base.memory, host, processes)
        for cache in sorted({0, leftover if base.memory.ssd else 0}):
            p = predict(w, a, profile, cache, num_params)
            label = (f"recompute {sorted(rset)}" if rset else "store every layer") + \
                (f", host cache {format_bytes(cache)}" if cache else "")
            candidates.append((label, p.epoch_seconds))
            if best is None or p.epoch_seconds < best[1].epoch_seconds - 1e-12:
                best = (a, p, cache, rset)
    # The fixed policies are candidates too, priced exactly: the program's counts assume
    # evenly spread halo reads, so a uniform plan can come out a little faster, and the plan
    # should never be predicted slower than a fixed policy that fits.
    for label, a in _uniform_candidates(w, ssd, recompute):
        m = predict(w, a, profile, 0, num_params).memory
        if m.device > dev or not _fits_host(w, a, m, host, processes) or \
                m.ssd_needed > ssd_room:
            continue
        leftover = _host_left(w, a, m, host, processes)
        for cache in sorted({0, leftover if m.ssd else 0}):
            p = predict(w, a, profile, cache, num_params)
            candidates.append((label + (f", host cache {format_bytes(cache)}" if cache else ""),
                               p.epoch_seconds))
            if best is None or p.epoch_seconds < best[1].epoch_seconds - 1e-12:
                best = (a, p, cache, a.recomputed)
    if best is None:
        raise too_small()
    a, p, cache, rset = best
    shares = () if processes is None else host_shares(w, a, processes)
    reasons = _reasons(w, a, p, dev, host, working_set, candidates,
                       host_used=max((b + h for b, h in shares), default=None))
    return Plan(in_memory=False, num_parts=w.num_parts, assignment=a, prediction=p,
                epoch_seconds=p.epoch_seconds, cache_bytes=int(cache), reasons=reasons,
                device_budget=dev, host_budget=host, directory=directory, workload=w,
                partitioned=partitioned, planning_seconds=time.perf_counter() - start,
                alternatives=tuple(sorted(candidates, key=lambda c: c[1])),
                processes=processes, host_shares=shares)


def _process_rooms(w: Workload, processes, recomputed: frozenset, host: int) -> np.ndarray:
    """``[Q]`` the host bytes each process's own host blocks may take: the host budget less
    its recomputed layers' transient (two copies of its part of the largest) and the halo rows
    it keeps of the others' blocks (`process_shares.halo_bytes`: the same for any assignment)."""
    rooms = []
    for q in range(processes.num_processes):
        own = processes.own(q)
        transient = 2 * max([int(w.block_bytes(l)[own].sum()) for l in recomputed] or [0])
        halo = halo_bytes(w, processes.halo[q])
        rooms.append(host - transient - halo)
    return np.array(rooms, np.float64)


def _host_needs(w: Workload, a: Assignment, m, processes) -> list[int]:
    """The host bytes the host budget holds for assignment ``a`` (its `Memory` ``m``): the
    plan's, or over several processes (``processes``) each one's share
    (`process_shares.host_shares`)."""
    if processes is None:
        return [m.host]
    return [b + h for b, h in host_shares(w, a, processes)]


def _fits_host(w: Workload, a: Assignment, m, host: int, processes) -> bool:
    return max(_host_needs(w, a, m, processes)) <= host


def _host_left(w: Workload, a: Assignment, m, host: int, processes) -> int:
    """The host bytes assignment ``a`` leaves for the host cache within the host budget (over
    several processes, every process's cache beside its share, summed); without a host
    budget, the SSD bytes (a cache for every block)."""
    if host >= UNLIMITED:
        return m.ssd
    return sum(max(host - need, 0) for need in _host_needs(w, a, m, processes))


def plan_storages(w: Workload, profile, storages: Sequence[Storage] = (EXACT,),
                  **options) -> Plan:
    """`plan` for each storage in ``storages`` (`jgrind.plan.fates.Storage`: the dtypes of
    host and SSD blocks), the fastest predicted; the earlier one on a tie, so float32 listed
    first wins unless a smaller dtype predicts faster (its blocks fit a faster tier, or move
    fewer bytes). PlanError when none fits (the last one's)."""
    best, error = None, None
    for storage in storages:
        try:
            candidate = plan(dataclasses.replace(w, storage=storage), profile, **options)
        except PlanError as err:
            error = err
            continue
        if best is None or candidate.epoch_seconds < best.epoch_seconds * (1 - 1e-9):
            best = candidate
    if best is None:
        raise error or PlanError("no storage dtype to plan with")
    return best


def _uniform_candidates(w: Workload, ssd: bool, recompute: bool):
    """The fixed policies' assignments: everything on one tier, or hidden activations
    recomputed with the rest in host RAM."""
    L, P = w.num_layers, w.num_parts
    tiers = [("all device", D), ("all host", H)] + ([("all ssd", S)] if ssd else [])
    for label, code in tiers:
        yield label, uniform(P, L, [code] * L, [code] * L)
    if L > 1 and recompute:
        yield "recompute all, rest host", uniform(P, L, [H] + [R] * (L - 1), [H] * L)


def _halo_floor(w: Workload, processes, host: int) -> Optional[tuple[int, int]]:
    """Over several processes, ``(process, bytes)`` of the process whose halo rows of the
    others' blocks alone (`_process_rooms`) take more than the host budget ``host``: no
    assignment of the blocks can fit then. None in one process, or when each fits."""
    if processes is None:
        return None
    rooms = _process_rooms(w, processes, frozenset(), host)
    if rooms.size == 0 or rooms.min() >= 0:
        return None
    q = int(np.argmin(rooms))
    return q, int(host - rooms[q])


def _halo_too_large(w: Workload, processes, halo: tuple, dev: int, host: int,
                    fits: Callable[[int, int], bool]) -> str:
    """Why no plan fits when a process's halo rows alone exceed the host budget, and a host
    budget that fits (each figure stated one ``fits`` accepted)."""
    q, need = halo
    everything = need + sum(int(w.block_bytes(l).sum()) for l in range(w.num_layers))
    enough = _least(lambda h: fits(dev, h), need + 1, max(everything, need + 1))
    return (f"the host budget {format_bytes(host)} is below what process {q} of "
            f"{processes.num_processes} keeps in host RAM of the other processes' rows its "
            f"partitions read ({format_bytes(need)} with {w.num_parts} partitions), before "
            f"any block of its own; raise the host budget to at least "
            f"{format_minimum(enough)}, or use fewer processes")


def _too_small(w: Workload, dev: int, host: int, ssd: bool, recompute: bool,
               fits: Callable[[int, int], bool]) -> str:
    """Why no plan fits, and budgets that would (for this partitioning): each figure stated is
    one ``fits(device, host)`` (planning with it) accepted, so following it runs."""
    fb, L = format_minimum, w.num_layers
    acts = [int(w.block_bytes(l).sum()) for l in range(L)]
    pairs = max([acts[l] + (acts[l + 1] if l + 1 < L else 0) for l in range(1, L)] or [0])
    # what must be stored somewhere: the input features and two gradient layers, every
    # activation layer too unless hidden ones can be recomputed (from a host transient)
    stored = acts[0] + pairs + (0 if recompute else sum(acts[1:]))
    everything = sum(acts) + pairs  # every block on the device: always a plan
    # below the smallest working set nothing runs; without SSD, what host RAM cannot hold
    # has to be on the device
    lowest = least_device_budget(w, 0 if ssd else max(stored - host, 0))
    device = _least(lambda d: fits(d, host), max(lowest, dev + 1),
                    least_device_budget(w, everything))
    working_set = fullest_working_set(fit_masks(w, dev))
    if working_set > dev:
        return (f"the device budget {format_bytes(dev)} is below one partition's working set "
                f"({format_bytes(working_set)} with {w.num_parts} partitions); use more "
                f"partitions or a device budget of at least {fb(device)}")
    if ssd:
        return (f"no plan fits a device budget of {format_bytes(dev)} and a host budget of "
                f"{format_bytes(host)}: the SSD store has too little free space for the blocks "
                f"that do not fit in RAM; free space on it, choose another --store, or raise "
                f"the device budget to at least {fb(device)}")
    # without SSD every block not on the device is in host RAM: at most all of them, with
    # the hidden layers recomputed (from a transient of two copies of the largest) if allowed
    most_host = stored + (2 * max(acts[1:] or [0]) if recompute else 0)
    room = dev - working_set
    host_needed = _least(lambda h: fits(dev, h), max(stored - room, host + 1),
                         max(most_host, host + 1))
    return (f"no plan fits a device budget of {format_bytes(dev)} and a host budget of "
            f"{format_bytes(host)} without an SSD store: with {w.num_parts} partitions, raise "
            f"the host budget to at least {fb(host_needed)} or the device budget to at least "
            f"{fb(device)}, or give an SSD store directory (--store) so blocks can go to disk")


def _least(fits: Callable[[int], bool], low: int, high: int) -> int:
    """A budget between ``low`` and ``high`` (which fits) that ``fits``: the first of a few
    steps from ``low`` towards ``high`` that does; each try is a whole plan, so a handful."""
    for share in (0.0, 1 / 64, 1 / 16, 1 / 4, 1 / 2):
        budget = int(low + (high - low) * share)
        if low <= budget < high and fits(budget):
            return budget
    return high


def _reasons(w, a: Assignment, p: Prediction, dev, host, working_set, candidates,
             host_used: Optional[int] = None) -> dict:
    """A short why for every tensor group's fate. ``host_used``: the host bytes the budget
    holds when they are not the plan's (over several processes, the largest share)."""
    m = p.memory
    room = dev - m.device  # device bytes no block has taken (the fullest device's)
    host_full = host < UNLIMITED and (m.host if host_used is None else host_used) > 0.9 * host
    out = {}
    for name, by_layer in ((ACTIVATION, a.activations), (GRADIENT, a.gradients)):
        for l, codes in enumerate(by_layer):
            if name == GRADIENT and l == 0:
                continue
            present = {int(c) for c in codes}
            # full for this tensor: not even its smallest block off the device fits what is left
            off = [4 * int(w.owned[i]) * w.widths[l] for i, c in enumerate(codes) if c != D]
            dev_full = dev < UNLIMITED and bool(off) and room < min(off)
            if present == {R}:
                store_best = min((s for label, s in candidates
                                  if label.startswith("store every layer")), default=None)
                out[(name, l)] = ("recomputing it in backward is cheaper than storing and "
                                  "reloading it" + (f" (best plan storing every layer: "
                                                    f"{store_best:.3g} s)" if store_best else
                                                    "; storing every layer does not fit"))
            elif present == {D}:
                out[(name, l)] = "fits on the device: no transfers"
            elif S in present:
                out[(name, l)] = ("device and host budgets are full" if (dev_full and host_full)
                                  else "host budget is full" if host_full else
                                  "SSD is as fast here (I/O hidden behind compute)")
            elif H in present:
                out[(name, l)] = (f"device budget is full ({format_bytes(max(room, 0))} "
                                  "left beside the device's blocks and one partition's "
                                  f"working set of {format_bytes(working_set)})" if dev_full
                                  else "host is as fast here (transfers hidden behind compute)")
            else:
                out[(name, l)] = "mixed"
    for l in sorted(w.aggregated):
        out[(AGGREGATION, l)] = (
            f"kept: backward reads it instead of regathering H_{l} and redoing the sparse product"
            if l in a.aggregations else
            f"not kept: regathering H_{l} in backward is predicted cheaper, or its bytes do not fit")
    return out


# -- whole runs: partitions and the fast path --------------------------------------------------
def check_num_parts(num_parts: Optional[int], num_nodes: int) -> None:
    """PlanError if `plan_run` cannot plan ``num_parts`` partitions (None: it chooses)."""
    most = min(MAX_PARTS, max(num_nodes, 1))
    if num_parts is not None and num_parts > most:
        why = (f"the graph has {num_nodes:,} nodes" if most < MAX_PARTS
               else f"the planner considers at most {MAX_PARTS:,}")
        raise PlanError(f"cannot plan {num_parts:,} partitions: {why}; ask for at most "
                        f"{most:,} (--parts), or leave the count to the planner")


def plan_run(graph, model, profile, *, device_budget: Optional[int] = None,
             host_budget: Optional[int] = None, directory: Optional[str] = None,
             partitioner: Optional[Callable] = None, num_parts: Optional[int] = None,
             seed: int = 0, recompute: bool = True, progress: Callable = lambda msg: None,
             keep: bool = True, storages: Sequence[Storage] = (EXACT,),
             devices: Optional[int] = None,
             device_processes: Optional[Sequence[int]] = None,
             partitioned=None, placement=None) -> Plan:
    """Plan a whole run of ``model`` on ``graph`` (raw; the model's normalisation is applied):
    the in-memory fast path if everything fits the device budget, otherwise the number of
    partitions (unless ``num_parts`` is given) and the fates with the fastest predicted epoch.

    Candidate partition counts: powers of two from the smallest whose working set fits the
    device budget, and twice that (more partitions shrink the working set and leave more room
    for blocks, but add halo rows and per-step latency).

    With ``devices`` (K), the out-of-core engine over K devices
    (`jgrind.devices.ShardedOutOfCore`): each partition count's partitions are placed on the
    devices by the profile's rates (`jgrind.plan.placement.place`, kept as the plan's
    ``placement``) and the device budget is held per device: each device's own partitions'
    device blocks beside its own working set. Partition counts start at K (at least 2); the
    fast path on one device is not considered.

    With ``device_processes`` (``[K]``: the process driving each device, as
    `jgrind.devices.ShardedOutOfCore` runs over several processes), the host budget is held
    per process: each process's own partitions' host blocks beside the halo rows it keeps of
    the others' (`jgrind.plan.process_shares`; the plan's ``processes`` and
    ``host_shares``).

    ``partitioned``: a ready `PartitionedGraph` of the normalised graph to plan over (its
    count only, no fast path, nothing partitioned here; ``graph`` gives the sizes), and with
    ``devices`` optionally its ``placement``: what one process of several builds reading only
    its own rows (`jgrind.devices.ShardedOutOfCore`), whose other partitions it knows by
    their halos and edge counts alone."""
    partitioner = partitioner or label_propagation
    if partitioned is not None:
        if num_parts is not None and int(num_parts) != partitioned.num_parts:
            raise PlanError(f"num_parts={num_parts} but the partitioned graph has "
                            f"{partitioned.num_parts} partitions")
        num_parts = partitioned.num_parts
    check_num_parts(num_parts, graph.num_nodes)
    dev = UNLIMITED if device_budget is None else int(device_budget)
    fast_bytes = in_memory_bytes(graph, model)
    num_params = dense_parameter_count(layer_widths(model, graph.num_features))
    if devices is not None:
        from jgrind.plan.placement import Rates, place
        if int(devices) < 1:
            raise PlanError(f"devices={devices}: plan for 1 device or more")
        rates = Rates.of(profile)
    split_processes = _several_processes(device_processes, devices)
    if devices is None and partitioned is None \
            and fits_in_memory(graph, model, device_budget, num_parts):
        w = _single_partition_workload(graph, model)
        seconds = in_memory_seconds(w, profile)
        return Plan(in_memory=True, num_parts=1, assignment=None, prediction=None,
                    epoch_seconds=seconds, cache_bytes=0,
                    reasons={}, device_budget=dev,
                    host_budget=UNLIMITED if host_budget is None else int(host_budget),
                    directory=directory, workload=w, in_memory_bytes=fast_bytes,
                    alternatives=(("in-memory fast path", seconds),))
    normalized = model.normalize(graph) if partitioned is None else None
    ssd_free = None
    if directory is not None:
        try:  # less what runs already using the directory will still write there
            ssd_free = disk_space.free_bytes(directory)
        except OSError:
            ssd_free = None  # the store reports a missing directory with the right message
    counts = [int(num_parts)] if num_parts else None
    plans, errors, k = [], [], 2 if devices is None else max(2, int(devices))
    while True:
        if counts is not None:
            if not counts:
                break
            k = counts.pop(0)
        if k > min(MAX_PARTS, max(graph.num_nodes, 1)):
            break
        if partitioned is None:
            progress(f"partitioning into {k} parts")
            pg = partition_graph(normalized, partitioner(normalized, k, seed=seed),
                                 num_parts=k)
        else:
            pg = partitioned
        w = Workload.build(pg, model)
        placed, split = None, None
        if devices is not None:
            placed = placement if placement is not None else \
                place(pg, model, graph.num_features, int(devices), rates)
            w = w.on_devices(placed.device_of)
            if split_processes:
                split = process_split(pg, placed.device_of, device_processes)
        try:
            planned = plan_storages(w, profile, storages, device_budget=device_budget,
                                    host_budget=host_budget, directory=directory,
                                    ssd_free=ssd_free, recompute=recompute,
                                    num_params=num_params, partitioned=pg, keep=keep,
                                    processes=split)
            plans.append(dataclasses.replace(planned, placement=placed))
            progress(f"{k} parts: predicted {plans[-1].epoch_seconds:.3g} s per epoch")
        except PlanError as err:
            errors.append(err)
            if fullest_working_set(fit_masks(w, device_budget)) <= dev:
                break  # the working set fits: more partitions cannot make the tables fit
        if counts is None:
            if len(plans) >= 2:
                break
            k *= 2
    if not plans:
        raise errors[-1] if errors else PlanError("no partition count fits the budgets")
    best = min(plans, key=lambda p: p.epoch_seconds)
    alternatives = tuple((f"{p.num_parts} parts", p.epoch_seconds) for p in plans)
    return dataclasses.replace(best, alternatives=alternatives + best.alternatives,
                               in_memory_bytes=fast_bytes)


def _several_processes(device_processes: Optional[Sequence[int]],
                       devices: Optional[int]) -> bool:
    """Whether ``device_processes`` (`plan_run`'s) names several processes; PlanError where
    it does not name one process per device of ``devices``."""
    if device_processes is None:
        return False
    processes = np.asarray(device_processes, np.int64).reshape(-1)
    if devices is None or processes.size != int(devices):
        raise PlanError(f"device_processes names the processes of {processes.size} devices; "
                        f"the plan is for {devices or 'no'} devices: name one per device")
    if processes.size and (processes.min() < 0 or np.any(np.bincount(processes) == 0)):
        raise PlanError(f"device_processes {processes.tolist()}: number the processes 0, 1, "
                        "... with each driving a device")
    return int(processes.max(initial=0)) > 0


def dense_parameter_count(widths) -> int:
    """The parameters of dense layers of these widths (weights and biases): what the planner
    prices the optimizer's update by."""
    return int(sum(a * b + b for a, b in zip(widths[:-1], widths[1:])))


def _single_partition_workload(graph, model) -> Workload:
    """The whole graph as one partition with no halo: the fast path's shapes."""
    return Workload.whole(model, graph.num_features, graph.num_nodes, graph.num_edges)