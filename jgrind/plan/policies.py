"""Offload policies: callables from a `TensorInfo` to a `Fate`, passed to ``train(policy=...)``.

Plain policies are functions or frozen dataclasses with ``__call__`` (hashable, comparable).
A policy that needs to see every tensor before deciding (budget-aware ones) also has
``bind(inventory, context) -> policy``; the engine calls it once with the full tensor
inventory and a `BindContext` (the partitioned workload's shapes and the run's budgets).
`auto` is such a policy: the planner (`jgrind.plan.planner`) chooses the fates.

Write your own in a few lines::

    def activations_on_ssd_after_layer_1(info):
        if info.name == "activation" and info.layer >= 2:
            return Fate.SSD
        return Fate.HOST

    train(..., policy=activations_on_ssd_after_layer_1, store="/mnt/nvme/jgrind")

A policy sees three kinds of tensor (`jgrind.plan.fates`): activations ``H_l``, gradients
``G_l`` and, for layers that aggregate before their matmul, aggregations ``Z_l``. The policy
above keeps aggregations in host RAM too; return ``Fate.RECOMPUTE`` for them to keep nothing
and regather instead, as GriNNder does (what the built-in policies do unless asked).
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import os
from typing import Callable, Optional, Sequence

from jgrind.plan.fates import AGGREGATION, GRADIENT, Fate, PolicyError, TensorInfo

Policy = Callable[[TensorInfo], Fate]


def check_policy(policy, what: str = "policy") -> None:
    """PolicyError unless ``policy`` can be called with a `TensorInfo` (a function, or a frozen
    dataclass with ``__call__``): a fate or a name passed where a policy goes fails here, not
    inside the engine."""
    if not callable(policy):
        hint = (" (a Fate is what a policy returns; for one fate everywhere use e.g. "
                "policies.host_offload())") if isinstance(policy, Fate) else (
                " (for the command line's names use policies.in_memory(), host_offload(), "
                "ssd_offload(dir), recompute_activations(), grinnder(...), auto(...))")
        raise PolicyError(f"{what} must be a function from a TensorInfo to a Fate, got "
                          f"{policy!r}{hint}")


def _check_fate(value, what: str) -> None:
    if not isinstance(value, Fate):
        raise PolicyError(f"{what} must be a jgrind.Fate (DEVICE, HOST, SSD or RECOMPUTE), got "
                          f"{value!r}")


def check_budget(value, name: str) -> Optional[int]:
    """``value`` as bytes (None: unlimited), or PolicyError: a budget is a whole number of
    bytes, 0 or more, e.g. ``2 << 30`` for 2 GiB (the command line reads "2GiB")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise PolicyError(f"{name} must be a whole number of bytes, 0 or more (None: "
                          f"unlimited), e.g. 2 << 30 for 2 GiB; got {value!r}")
    return int(value)


def _directory(value, who: str) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise PolicyError(f"{who} needs the store directory (a path on a fast disk), got "
                          f"{value!r}")
    return os.fspath(value)


@dataclasses.dataclass(frozen=True)
class Constant:
    """Every activation gets ``fate``, every gradient ``gradient_fate`` (by default ``fate``,
    or HOST where ``fate`` is RECOMPUTE, which is for activations), every aggregation
    ``aggregation_fate``; the input features ``features_fate`` when given."""

    fate: Fate
    gradient_fate: Optional[Fate] = None
    features_fate: Optional[Fate] = None
    directory: Optional[str] = None
    aggregation_fate: Fate = Fate.RECOMPUTE

    def __post_init__(self):
        _check_fate(self.fate, "a policy's fate")
        for name, what in (("gradient_fate", "gradients' fate"),
                           ("features_fate", "features' fate")):
            if getattr(self, name) is not None:
                _check_fate(getattr(self, name), what)
        _check_fate(self.aggregation_fate, "aggregations' fate")

    @property
    def gradients(self) -> Fate:
        """Where gradient blocks go."""
        if self.gradient_fate is not None:
            return self.gradient_fate
        return Fate.HOST if self.fate is Fate.RECOMPUTE else self.fate

    def __call__(self, info: TensorInfo) -> Fate:
        if info.name == AGGREGATION:
            return self.aggregation_fate
        if info.name == GRADIENT:
            return self.gradients
        if info.layer == 0 and self.features_fate is not None:
            return self.features_fate
        if self.fate is Fate.RECOMPUTE and not info.recomputable:
            return self.gradients
        return self.fate


# ``aggregations``: where the built-in policies keep each layer's aggregated input ``Z_l``
# (`jgrind.plan.fates.AGGREGATION`) from forward to backward. RECOMPUTE, the default, keeps
# none and regathers the layer's input in backward (the GriNNder scheme); a tier keeps them
# there, which costs their bytes (the width of the layer's input, for every node) and saves
# the regather and a sparse product per layer in backward.
def in_memory(aggregations: Fate = Fate.RECOMPUTE) -> Constant:
    """Everything on the device: the fast path when it fits."""
    return Constant(Fate.DEVICE, gradient_fate=Fate.DEVICE, aggregation_fate=aggregations)


def host_offload(aggregations: Fate = Fate.RECOMPUTE) -> Constant:
    """Every activation and gradient block in host RAM; the device holds one partition's
    working set at a time."""
    return Constant(Fate.HOST, gradient_fate=Fate.HOST, aggregation_fate=aggregations)


def ssd_offload(directory: str | os.PathLike, gradients: Fate = Fate.SSD,
                aggregations: Fate = Fate.RECOMPUTE) -> Constant:
    """Every activation block (and, by default, gradient block) in the SSD store under
    ``directory``; the host cache still serves reads within the host budget."""
    return Constant(Fate.SSD, gradient_fate=gradients,
                    directory=_directory(directory, "ssd_offload"),
                    aggregation_fate=aggregations)


def recompute_activations(gradients: Fate = Fate.HOST, features: Fate = Fate.HOST) -> Constant:
    """Keep only the input features; recompute every hidden activation in backward."""
    return Constant(Fate.RECOMPUTE, gradient_fate=gradients, features_fate=features)


@dataclasses.dataclass(frozen=True)
class IOStrategy:
    """How the engine moves a layer's inputs, independently of where blocks live.

    The default is the GriNNder scheme: no snapshot of a partition's gathered input is kept
    (backward *regathers* it from the stored layer outputs), and SSD blocks are read whole,
    through the host cache. A policy changes it by having an ``io`` attribute (see `naive`).

    Attributes:
      snapshots: write every partition's step input (owned + halo rows; a node-wise layer's
        owned rows) to an SSD snapshot in the forward sweep and read it back in backward
        instead of regathering.
      row_reads: read SSD rows one node at a time (one read call per row, no whole-block
        reads, no host cache).
    """

    snapshots: bool = False
    row_reads: bool = False
    cache: bool = True  # a host cache in front of the SSD tier, within the host budget


def io_strategy(policy: Policy) -> IOStrategy:
    """The `IOStrategy` a policy asks for (the GriNNder default unless it has an ``io``)."""
    io = getattr(policy, "io", None)
    return io if isinstance(io, IOStrategy) else IOStrategy()


@dataclasses.dataclass(frozen=True)
class Naive:
    """For comparison only: every block on SSD (as `ssd_offload`), plus the I/O of a naive
    out-of-core scheme: snapshots of the step inputs kept from forward to backward, and
    inputs read node by node. It computes the same gradients and moves more bytes."""

    directory: str
    snapshots: bool = True
    row_reads: bool = True

    def __call__(self, info: TensorInfo) -> Fate:
        return Fate.RECOMPUTE if info.name == AGGREGATION else Fate.SSD

    @property
    def io(self) -> IOStrategy:
        return IOStrategy(snapshots=self.snapshots, row_reads=self.row_reads)


def naive(directory: str | os.PathLike, snapshots: bool = True, row_reads: bool = True) -> Naive:
    """The naive scheme GriNNder is measured against (see `Naive`); not for real training."""
    return Naive(_directory(directory, "naive"), snapshots, row_reads)


@dataclasses.dataclass(frozen=True)
class ByKind:
    """Different policies for activations (aggregations too) and gradients."""

    activations: Policy
    gradients: Policy

    def __post_init__(self):
        check_policy(self.activations, "ByKind's activations policy")
        check_policy(self.gradients, "ByKind's gradients policy")

    def __call__(self, info: TensorInfo) -> Fate:
        return (self.gradients if info.name == GRADIENT else self.activations)(info)

    def bind(self, inventory, context=None) -> "ByKind":
        return ByKind(bind(self.activations, inventory, context),
                      bind(self.gradients, inventory, context))


@dataclasses.dataclass(frozen=True)
class ByLayer:
    """``policies[l]`` for layer l; layers past the end use the last one."""

    policies: tuple

    def __call__(self, info: TensorInfo) -> Fate:
        return self.policies[min(info.layer, len(self.policies) - 1)](info)

    def bind(self, inventory, context=None) -> "ByLayer":
        return ByLayer(tuple(bind(p, inventory, context) for p in self.policies))


def by_layer(*policies: Policy) -> ByLayer:
    """``policies[l]`` for layer l, the last for every later layer."""
    if not policies:
        raise PolicyError("by_layer needs at least one policy (the last serves every later "
                          "layer)")
    for l, policy in enumerate(policies):
        check_policy(policy, f"by_layer's policy for layer {l}")
    return ByLayer(tuple(policies))


@dataclasses.dataclass(frozen=True)
class Budgeted:
    """The GriNNder-style default: fill the device, then host RAM, then the SSD store.

    Blocks are placed in order of first backward use (the tensors backward needs first are
    kept closest), each in the fastest tier with room left. The device tier keeps room for one
    partition's working set (`jgrind.plan.cost.Workload.working_set`, the figure the engine's
    budget check adds to the blocks) and at least ``device_reserve`` bytes. ``bind`` does the
    packing once over the inventory; the bound policy is a table lookup.

    Bound with the engine's `BindContext`, the budgets are the smaller of the policy's and the
    run's, and a store directory (the policy's or the run's) is what lets blocks go to SSD.
    When the packing does not fit them (the working set alone is over the device budget, or
    without a store some blocks fit neither tier), ``least_device_budget`` is a device budget
    at which it does, about the least, checked with the engine's memory model
    (`jgrind.plan.cost.memory`), and ``least_host_budget`` the same for the host budget beside
    the current device budget (None where raising the host budget does not help). The engine's
    `BudgetError` states them.
    """

    device_budget: int
    host_budget: int
    directory: Optional[str] = None
    device_reserve: int = 0
    assignment: Optional[tuple] = None  # ((name, layer, partition), fate) pairs once bound
    least_device_budget: Optional[int] = None
    least_host_budget: Optional[int] = None

    def __post_init__(self):
        check_budget(self.device_budget, "grinnder's device_budget")
        check_budget(self.host_budget, "grinnder's host_budget")

    def bind(self, inventory: Sequence[TensorInfo], context=None) -> "Budgeted":
        device, host = self.device_budget, self.host_budget
        workload = getattr(context, "workload", None)
        if context is not None:
            device = _smaller(device, context.device_budget)
            host = _smaller(host, context.host_budget)
        ssd = context is None or bool(self.directory or context.directory)
        order = sorted((t for t in inventory if t.name != AGGREGATION),
                       key=lambda t: (t.first_backward_use, t.name, t.partition))
        if workload is None:  # no shapes to size the working set by: the reserve as given
            table, _ = _pack(order, device - self.device_reserve, host, ssd)
            return dataclasses.replace(self, assignment=table)
        fit = functools.partial(_budgeted_fit, order, workload, self.device_reserve, ssd)
        table, short = fit(device, host)
        bound = dataclasses.replace(self, assignment=table)
        if not short:
            return bound
        least_device = _least(lambda d: fit(d, host)[1], device)
        least_host = None
        if ssd is False and fit(device, 1 << 62)[1] == 0:
            least_host = _least(lambda h: fit(device, h)[1], host)
        return dataclasses.replace(bound, least_device_budget=least_device,
                                   least_host_budget=least_host)

    def __call__(self, info: TensorInfo) -> Fate:
        if self.assignment is None:
            raise RuntimeError("Budgeted policy used before bind(inventory)")
        if info.name == AGGREGATION:
            return Fate.RECOMPUTE  # GriNNder regathers
        return self._lookup[(info.name, info.layer, info.partition)]

    @functools.cached_property
    def _lookup(self) -> dict:
        return dict(self.assignment)


def _smaller(own: Optional[int], run: Optional[int]) -> Optional[int]:
    return run if own is None else own if run is None else min(own, run)


def _pack(order: Sequence[TensorInfo], device_room: int, host_room: int,
          ssd: bool) -> tuple[tuple, int]:
    """``(table, unplaced)``: each block in order to the device, else host RAM, else SSD, within
    the rooms; ``unplaced``: bytes of the blocks that went to SSD when there is no SSD tier
    (``ssd`` False), which the engine will refuse."""
    left = {Fate.DEVICE: device_room, Fate.HOST: host_room}
    table, unplaced = [], 0
    for info in order:
        for fate in (Fate.DEVICE, Fate.HOST):
            if info.nbytes <= left[fate]:
                left[fate] -= info.nbytes
                break
        else:
            fate = Fate.SSD
            unplaced += 0 if ssd else info.nbytes
        table.append(((info.name, info.layer, info.partition), fate))
    return tuple(table), unplaced


def _budgeted_fit(order, workload, reserve: int, ssd: bool, device: Optional[int],
                  host: Optional[int]) -> tuple[tuple, int]:
    """``(table, short)`` of the budgeted packing under ``device`` and ``host`` bytes (None:
    unlimited): ``short`` is 0 when the engine's budget check will pass, else about how many
    bytes are missing. The working set is the engine's for that device budget (output masks
    are dropped when they do not fit, `jgrind.plan.cost.fit_masks`), and the check is the
    engine's: `jgrind.plan.cost.memory` against both budgets."""
    from jgrind.plan.cost import Assignment, fit_masks, memory
    unlimited = 1 << 62
    device = unlimited if device is None else device
    host = unlimited if host is None else host
    # the engine drops the masks only when they do not fit: start from the workload with them
    w = fit_masks(dataclasses.replace(workload, masks=True), device)
    working_set = max(w.working_set(), reserve)
    table, unplaced = _pack(order, max(device - working_set, 0), host, ssd)
    if working_set > device:
        return table, working_set - device
    if unplaced:
        return table, unplaced
    m = memory(w, Assignment.from_fates(dict(table), w.num_layers, w.num_parts))
    return table, max(m.device - device, m.host - host, 0)


def _least(short: Callable[[int], int], failing: Optional[int]) -> int:
    """A budget ``b`` with ``short(b) == 0``, about the smallest above ``failing`` (a budget
    known to fall short, so the figure is one to raise it to): stepping up by the bytes found
    missing, then bisecting between the last budget short and the first that fits."""
    below = -1 if failing is None else failing  # the largest budget known to fall short
    budget = below + 1
    while missing := short(budget):
        below, budget = budget, budget + missing
    while budget - below > 1:
        middle = (below + budget) // 2
        if short(middle):
            below = middle
        else:
            budget = middle
    return budget


def grinnder(device_budget: int, host_budget: int, directory: Optional[str] = None,
             device_reserve: int = 0) -> Budgeted:
    """The default out-of-core policy: device, then host, then SSD, within the budgets."""
    return Budgeted(int(device_budget), int(host_budget),
                    None if directory is None else os.fspath(directory), int(device_reserve))


@dataclasses.dataclass(frozen=True)
class BindContext:
    """What the engine tells a binding policy besides the inventory.

    Attributes:
      workload: the partitioned shapes (`jgrind.plan.cost.Workload`).
      device_budget, host_budget: the run's budgets in bytes (None: unlimited).
      directory: the run's SSD store directory, if any.
    """

    workload: object
    device_budget: Optional[int] = None
    host_budget: Optional[int] = None
    directory: Optional[str] = None


def bind(policy: Policy, inventory: Sequence[TensorInfo],
         context: Optional[BindContext] = None) -> Policy:
    """Give a budget-aware policy the whole inventory; plain policies come back unchanged."""
    binder = getattr(policy, "bind", None)
    return binder(inventory, context) if callable(binder) else policy


def store_directory(policy: Policy) -> Optional[str]:
    """The SSD directory a policy names, if any (``ssd_offload(dir)``, ``grinnder(..., dir)``)."""
    return getattr(policy, "directory", None)


# -- the planner as a policy -------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Planned:
    """A plan's fates as an ordinary policy: a table lookup (see `jgrind.plan.planner.Plan`).

    ``io`` carries the plan's host cache mode; ``in_memory`` marks the fast-path plan."""

    assignment: tuple            # ((name, layer, partition), fate) pairs
    directory: Optional[str] = None
    io: IOStrategy = IOStrategy()
    in_memory: bool = False

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


@dataclasses.dataclass(frozen=True)
class Auto:
    """The planner as a policy: fates chosen to minimise the predicted epoch time under the
    budgets (`jgrind.plan.planner`), from a measured hardware profile.

    Used as ``train(..., policy=auto())``: the trainer calls `prepare` before partitioning, so
    the planner also chooses the number of partitions, the host cache mode and the in-memory
    fast path when everything fits. Inside a combinator (``by_layer(auto(), ...)``) it is bound
    like any budget-aware policy, for the partitioning the engine already made.

    Attributes:
      device_budget, host_budget: bytes; None: the run's budgets, else what the profile
        measured as free (device) and half the free host RAM. Given with the run's, the
        smaller of the two.
      directory: the SSD store; None: the run's ``store``.
      profile: a `jgrind.plan.profile.Profile`, a path to a saved one, or None for the default
        file (measured on first use, re-measured when stale).
      recompute: allow the planner to recompute activation layers.
      keep_aggregations: allow the planner to keep layers' aggregations instead of
        regathering their inputs in backward (docs/engine.md, "Kept aggregations").
      on_plan: called with the `Plan` of a whole run once `prepare` has made it (``jgrind
        train`` prints it and saves it as plan.txt).
    """

    device_budget: Optional[int] = None
    host_budget: Optional[int] = None
    directory: Optional[str] = None
    profile: object = dataclasses.field(default=None, compare=False, hash=False)
    recompute: bool = True
    keep_aggregations: bool = True
    on_plan: Optional[Callable] = dataclasses.field(default=None, compare=False, hash=False)

    def load_profile(self, directory=None):
        """The profile to plan with; its SSD figures for this policy's store, else the run's
        ``directory``."""
        from jgrind.plan import profile as hw
        if isinstance(self.profile, hw.Profile):
            return self.profile
        return hw.load_or_measure(self.profile, self.directory or directory,
                                  log=lambda msg: print(f"jgrind: {msg}"))

    def budgets(self, device_budget=None, host_budget=None, profile=None):
        """The budgets to plan for: this policy's and the run's, the smaller where both are
        given (the run's are the limits the engine holds every plan to, docs/engine.md), else
        the profile's."""
        def smaller(own, run):
            return run if own is None else own if run is None else min(own, run)
        dev = smaller(self.device_budget, device_budget)
        host = smaller(self.host_budget, host_budget)
        if dev is None and profile is not None:
            dev = int(profile.device_free)
        if host is None and profile is not None:
            host = int(profile.host_free) // 2
        return dev, host

    def prepare(self, graph, model, *, device_budget=None, host_budget=None, directory=None,
                partitioner=None, num_parts=None, seed: int = 0, progress=None):
        """Plan a whole run (`jgrind.plan.planner.plan_run`); returns the `Plan`."""
        from jgrind.plan.planner import plan_run
        profile = self.load_profile(directory)
        dev, host = self.budgets(device_budget, host_budget, profile)
        planned = plan_run(graph, model, profile, device_budget=dev, host_budget=host,
                           directory=self.directory or directory, partitioner=partitioner,
                           num_parts=num_parts, seed=seed, recompute=self.recompute,
                           progress=progress or (lambda msg: None),
                           keep=self.keep_aggregations)
        if self.on_plan is not None:
            self.on_plan(planned)
        return planned

    def bind(self, inventory, context: Optional[BindContext] = None) -> Planned:
        from jgrind.plan.planner import plan
        if context is None:
            raise ValueError("auto() needs the engine's BindContext (the partitioned shapes) "
                             "to plan; pass it to train(policy=auto()) or bind(policy, "
                             "inventory, context)")
        profile = self.load_profile(context.directory)
        dev, host = self.budgets(context.device_budget, context.host_budget, profile)
        return plan(context.workload, profile, device_budget=dev, host_budget=host,
                    directory=self.directory or context.directory,
                    recompute=self.recompute, keep=self.keep_aggregations).policy()

    def __call__(self, info: TensorInfo) -> Fate:
        raise RuntimeError("auto() used before planning; the engine binds it (train(policy="
                           "auto()) or bind(policy, inventory, context))")


def auto(device_budget: Optional[int] = None, host_budget: Optional[int] = None,
         directory: Optional[str | os.PathLike] = None, profile=None,
         recompute: bool = True, keep_aggregations: bool = True,
         on_plan: Optional[Callable] = None) -> Auto:
    """Let the planner choose every fate, the partitions and the cache mode (see `Auto`)."""
    if on_plan is not None and not callable(on_plan):
        raise TypeError(f"on_plan must be a function of the Plan, got {on_plan!r}")
    return Auto(check_budget(device_budget, "auto's device_budget"),
                check_budget(host_budget, "auto's host_budget"),
                None if directory is None else os.fspath(directory), profile, recompute,
                keep_aggregations, on_plan)
