"""What a policy is: the protocols the trainer, the engine and the planner rely on.

A policy is any callable from a `TensorInfo` to a `Fate` (`Policy`). A few policies have more
than that, each part declared by a protocol here and asked for with ``isinstance`` (the
protocols are runtime-checkable), never by probing for attribute names:

* `BindingPolicy`: decides from the whole tensor inventory; the engine calls ``bind`` once.
* `ChoosesIO`: changes how the engine moves data (`IOStrategy`; the naive scheme).
* `NamesStore`: names its SSD store directory.
* `PlansRun`: plans the whole run before the graph is partitioned (`jgrind.plan.auto`).
* `StatesLeastBudgets`: once bound, states the least budgets its placement fits.
* `DeviceOnly`: may keep every block on the device, so the in-memory fast path computes the
  same (`jgrind.plan.execution`).

The functions below answer for any policy, plain functions included.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

from jgrind.plan.fates import Fate, PolicyError, TensorInfo


@runtime_checkable
class Policy(Protocol):
    """A fate for every stored block: a function, or a frozen dataclass with ``__call__``
    (hashable and comparable)."""

    def __call__(self, info: TensorInfo) -> Fate:
        ...


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


@runtime_checkable
class BindingPolicy(Policy, Protocol):
    """A policy that needs to see every tensor before deciding (budget-aware ones): the engine
    calls ``bind`` once with the full inventory and its `BindContext`, then runs the policy
    it returns."""

    def bind(self, inventory: Sequence[TensorInfo],
             context: Optional[BindContext] = None) -> Policy:
        ...


@dataclasses.dataclass(frozen=True)
class IOStrategy:
    """How the engine moves a layer's inputs, independently of where blocks live.

    The default is the GriNNder scheme: no snapshot of a partition's gathered input is kept
    (backward *regathers* it from the stored layer outputs), and SSD blocks are read whole,
    through the host cache. A policy changes it by having an ``io`` (`ChoosesIO`; see
    `jgrind.plan.policies.naive`).

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


@runtime_checkable
class ChoosesIO(Protocol):
    """A policy with its own `IOStrategy`."""

    io: IOStrategy


@runtime_checkable
class NamesStore(Protocol):
    """A policy that names the SSD store directory (``ssd_offload(dir)``,
    ``grinnder(..., dir)``); None where it leaves that to the run."""

    directory: Optional[str]


@runtime_checkable
class PlansRun(Protocol):
    """A policy that plans a whole run before the graph is partitioned: the number of
    partitions, the fates, the host cache mode, or the in-memory fast path
    (`jgrind.plan.auto.Auto`). Returns a `jgrind.plan.planner.Plan`."""

    def prepare(self, graph, model, *, device_budget: Optional[int] = None,
                host_budget: Optional[int] = None, directory: Optional[str] = None,
                partitioner=None, num_parts: Optional[int] = None, seed: int = 0,
                progress=None) -> Any:
        ...


@runtime_checkable
class StatesLeastBudgets(Protocol):
    """A bound policy whose placement did not fit: about the least device budget at which it
    does, and the least host budget beside the current device budget (None where raising
    the host budget does not help). Both None when it fits. The engine's `BudgetError`
    states them."""

    least_device_budget: Optional[int]
    least_host_budget: Optional[int]


@runtime_checkable
class DeviceOnly(Protocol):
    """A policy that may keep every activation and gradient on the device (``device_only``
    True): the in-memory fast path then computes the same, faster, when the graph fits."""

    device_only: bool


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


def bind(policy: Policy, inventory: Sequence[TensorInfo],
         context: Optional[BindContext] = None) -> Policy:
    """Give a `BindingPolicy` the whole inventory; other policies come back unchanged."""
    return policy.bind(inventory, context) if isinstance(policy, BindingPolicy) else policy


def io_strategy(policy: Policy) -> IOStrategy:
    """The `IOStrategy` a policy asks for (`ChoosesIO`), else the GriNNder default."""
    if isinstance(policy, ChoosesIO) and isinstance(policy.io, IOStrategy):
        return policy.io
    return IOStrategy()


def store_directory(policy: Policy) -> Optional[str]:
    """The SSD directory a policy names (`NamesStore`), if any."""
    return policy.directory if isinstance(policy, NamesStore) else None


def least_budgets(policy: Policy) -> tuple[Optional[int], Optional[int]]:
    """``(device, host)``: the least budgets a bound policy states (`StatesLeastBudgets`), else
    ``(None, None)``."""
    if isinstance(policy, StatesLeastBudgets):
        return policy.least_device_budget, policy.least_host_budget
    return None, None


def device_only(policy: Policy) -> bool:
    """Whether ``policy`` keeps every activation and gradient on the device (`DeviceOnly`)."""
    return isinstance(policy, DeviceOnly) and bool(policy.device_only)
