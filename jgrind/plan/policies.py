"""Offload policies: callables from a `TensorInfo` to a `Fate`, passed to ``train(policy=...)``.

Plain policies are functions or frozen dataclasses with ``__call__`` (hashable, comparable).
A policy that needs to see every tensor before deciding (budget-aware ones) also has
``bind(inventory, context) -> policy``; the engine calls it once with the full tensor
inventory and a `BindContext` (the partitioned workload's shapes and the run's budgets).
What a policy may declare besides is in `jgrind.plan.protocols`.

This module is the catalogue users reach as ``jgrind.policies``: the fixed policies are
defined here; `auto`, the planner as a policy, is defined on the planner's side
(`jgrind.plan.auto`) and re-exported.

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
import os
from typing import Callable, Optional, Sequence

from jgrind.plan.auto import Auto, auto
from jgrind.plan.budgets import UNLIMITED, check_budget, smaller
from jgrind.plan.cost import Assignment, fit_masks, memory
from jgrind.hostio.codecs import Codec, bfloat16, by_name, float16, float32, int8
from jgrind.plan.fates import (AGGREGATION, GRADIENT, Fate, PolicyError, Storage, TensorInfo,
                               storage_of)
from jgrind.plan.planner import Planned
from jgrind.plan.protocols import (BindContext, IOStrategy, Policy, PlansRun, bind,
                                   check_policy, device_only, io_strategy, least_budgets,
                                   store_directory)

__all__ = ["Auto", "BindContext", "Budgeted", "ByKind", "ByLayer", "Constant", "IOStrategy",
           "Naive", "Planned", "Policy", "Storage", "Stored", "auto", "bfloat16", "bind",
           "by_layer", "check_budget", "check_policy", "float16", "float32", "grinnder",
           "host_offload", "in_memory", "int8", "io_strategy", "naive",
           "recompute_activations", "ssd_offload", "storage_of", "store_directory",
           "with_storage", "with_storage_named"]


def _check_fate(value, what: str) -> None:
    if not isinstance(value, Fate):
        raise PolicyError(f"{what} must be a jgrind.Fate (DEVICE, HOST, SSD or RECOMPUTE), got "
                          f"{value!r}")


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

    @property
    def device_only(self) -> bool:
        """Activations and gradients all on the device (`jgrind.plan.protocols.DeviceOnly`):
        the in-memory fast path computes the same when the graph fits."""
        return self.fate is Fate.DEVICE and self.gradients is Fate.DEVICE

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

    def bind(self, inventory: Sequence[TensorInfo],
             context: Optional[BindContext] = None) -> "ByKind":
        return ByKind(bind(self.activations, inventory, context),
                      bind(self.gradients, inventory, context))


@dataclasses.dataclass(frozen=True)
class ByLayer:
    """``policies[l]`` for layer l; layers past the end use the last one."""

    policies: tuple

    def __call__(self, info: TensorInfo) -> Fate:
        return self.policies[min(info.layer, len(self.policies) - 1)](info)

    def bind(self, inventory: Sequence[TensorInfo],
             context: Optional[BindContext] = None) -> "ByLayer":
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
    kept closest), each in the fastest tier with room left; on several devices (a workload
    with `device_of`), each device's own partitions' blocks within the device budget. The
    device tier keeps room for one partition's working set (`jgrind.plan.cost.Workload.working_set`, the figure the engine's
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

    def bind(self, inventory: Sequence[TensorInfo],
             context: Optional[BindContext] = None) -> "Budgeted":
        device, host = self.device_budget, self.host_budget
        workload = None if context is None else context.workload
        if context is not None:
            device = smaller(device, context.device_budget)
            host = smaller(host, context.host_budget)
        ssd = context is None or bool(self.directory or context.directory)
        blocks = sorted((t for t in inventory if t.name != AGGREGATION),
                        key=lambda t: (t.first_backward_use, t.name, t.partition))
        order = [(t, _host_nbytes(t, workload)) for t in blocks]
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
        if ssd is False and fit(device, UNLIMITED)[1] == 0:
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


def _host_nbytes(info: TensorInfo, workload) -> int:
    """Bytes of block ``info`` in host RAM: in the storage dtype the workload prices its kind
    in (`jgrind.plan.cost.Workload.storage`; float32 without one), as the host tier keeps it."""
    storage = getattr(workload, "storage", None)
    codec = None if storage is None else storage.codec(info.name)
    return info.nbytes if codec is None or not codec.lossy \
        else codec.encoded_nbytes(*info.shape)


def _pack(order: Sequence[tuple], device_room: int, host_room: int, ssd: bool,
          device_of: Optional[Sequence[int]] = None) -> tuple[tuple, int]:
    """``(table, unplaced)``: each block of ``order`` (``(info, host bytes)`` pairs: its
    bytes in host RAM, in its storage dtype) in order to the device (float32), else host RAM,
    else SSD, within the rooms; ``unplaced``: bytes of the blocks that went to SSD when there is
    no SSD tier (``ssd`` False), which the engine will refuse. With ``device_of`` (each
    partition's device, `jgrind.plan.cost.Workload.device_of`) every device has a room of
    ``device_room`` for its own partitions' blocks, as the engine holds the budget per device."""
    device_left = [device_room] * (1 if device_of is None else max(device_of, default=0) + 1)
    host_left = host_room
    table, unplaced = [], 0
    for info, host_nbytes in order:
        d = 0 if device_of is None else device_of[info.partition]
        if info.nbytes <= device_left[d]:
            device_left[d] -= info.nbytes
            fate = Fate.DEVICE
        elif host_nbytes <= host_left:
            host_left -= host_nbytes
            fate = Fate.HOST
        else:
            fate = Fate.SSD
            unplaced += 0 if ssd else host_nbytes
        table.append(((info.name, info.layer, info.partition), fate))
    return tuple(table), unplaced


def _budgeted_fit(order, workload, reserve: int, ssd: bool, device: Optional[int],
                  host: Optional[int]) -> tuple[tuple, int]:
    """``(table, short)`` of the budgeted packing under ``device`` and ``host`` bytes (None:
    unlimited): ``short`` is 0 when the engine's budget check will pass, else about how many
    bytes are missing. The working set is the engine's for that device budget (output masks
    are dropped when they do not fit, `jgrind.plan.cost.fit_masks`), and the check is the
    engine's: `jgrind.plan.cost.memory` against both budgets."""
    device = UNLIMITED if device is None else device
    host = UNLIMITED if host is None else host
    # the engine drops the masks only when they do not fit: start from the workload with them
    w = fit_masks(dataclasses.replace(workload, masks=True), device)
    working_set = max(w.working_set(), reserve)  # the largest: each device's room beside it
    device_of = None if w.device_of is None else w.device_of.tolist()
    table, unplaced = _pack(order, max(device - working_set, 0), host, ssd, device_of)
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


# -- storage dtypes ------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Stored:
    """``policy``'s fates, with its host and SSD blocks kept in ``storage``'s dtypes
    (`jgrind.plan.fates.Storage`). Everything else the policy declares (binding, I/O, store
    directory, least budgets, the in-memory fast path) is the wrapped policy's."""

    policy: Policy
    storage: Storage

    def __post_init__(self):
        check_policy(self.policy, "with_storage's policy")

    def __call__(self, info: TensorInfo) -> Fate:
        return self.policy(info)

    def bind(self, inventory: Sequence[TensorInfo],
             context: Optional[BindContext] = None) -> "Stored":
        """The wrapped policy bound with the workload priced in this storage, so that a
        budgeted packing fills host RAM by the blocks' stored bytes."""
        if context is not None and hasattr(context.workload, "storage"):
            context = dataclasses.replace(context, workload=dataclasses.replace(
                context.workload, storage=self.storage))
        return Stored(bind(self.policy, inventory, context), self.storage)

    @property
    def io(self) -> IOStrategy:
        return io_strategy(self.policy)

    @property
    def directory(self) -> Optional[str]:
        return store_directory(self.policy)

    @property
    def device_only(self) -> bool:
        return device_only(self.policy)

    @property
    def least_device_budget(self) -> Optional[int]:
        return least_budgets(self.policy)[0]

    @property
    def least_host_budget(self) -> Optional[int]:
        return least_budgets(self.policy)[1]


def with_storage(policy: Policy, activations: Optional[Codec] = None,
                 aggregations: Optional[Codec] = None, gradients: Optional[Codec] = None):
    """``policy`` with its host and SSD blocks kept in smaller dtypes, per kind of tensor
    (`jgrind.hostio.codecs`: ``float32()``, ``bfloat16()``, ``float16()``, ``int8()``); a kind
    left out keeps what ``policy`` chose (float32 by default). Computation and device blocks
    stay float32. E.g. ``with_storage(host_offload(), activations=bfloat16(),
    gradients=bfloat16())``.

    For `auto` the storage is what the planner prices (`jgrind.plan.auto.Auto`)."""
    base = storage_of(policy)
    storage = Storage(activations or base.activations, aggregations or base.aggregations,
                      gradients or base.gradients)
    if isinstance(policy, PlansRun):  # auto(): the planner plans with it
        return dataclasses.replace(policy, storage=storage)
    if isinstance(policy, Naive) and storage.lossy:
        raise PolicyError("the naive scheme reads SSD rows one at a time in float32; it "
                          "cannot keep blocks in a storage dtype")
    if isinstance(policy, Stored):
        policy = policy.policy
    return Stored(policy, storage) if storage.lossy else policy


def with_storage_named(policy: Optional[Policy], store_dtype: str = "",
                       activations: str = "", aggregations: str = "",
                       gradients: str = "") -> Optional[Policy]:
    """`with_storage` from the command line's names (`jgrind.hostio.codecs.NAMES`):
    ``store_dtype`` for every kind, the others for one kind each ('' = ``store_dtype``, and
    '' there = float32). ``store_dtype="auto"`` lets `auto` choose (``allow_lossy``).
    PolicyError for an unknown name, or for lossy storage without an out-of-core policy."""
    if store_dtype.strip().lower() == "auto":
        if not isinstance(policy, Auto):
            raise PolicyError("store_dtype=auto lets the auto policy choose the storage dtype; "
                             "use it with policy=auto, or name a dtype")
        policy = dataclasses.replace(policy, allow_lossy=True)
        store_dtype = ""
    names = {"activations": activations or store_dtype,
             "aggregations": aggregations or store_dtype, "gradients": gradients or store_dtype}
    try:
        chosen = {kind: by_name(name) for kind, name in names.items() if name}
    except ValueError as err:
        raise PolicyError(str(err)) from None
    if not any(codec.lossy for codec in chosen.values()):
        return policy
    if policy is None:
        raise PolicyError("a storage dtype applies to blocks offloaded to host RAM or SSD; "
                         "choose an out-of-core policy (e.g. policy=host) or leave it out")
    return with_storage(policy, **chosen)
