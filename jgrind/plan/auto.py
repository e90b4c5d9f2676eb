"""`auto`: the planner as a policy.

It lives on the planner's side: the fixed policies (`jgrind.plan.policies`) know nothing of
the planner, and ``jgrind.policies.auto`` is this module's `auto`, re-exported there.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Optional, Sequence

from jgrind.plan import profile as hw
from jgrind.plan.budgets import check_budget, smaller
from jgrind.hostio.codecs import bfloat16, int8
from jgrind.plan.fates import EXACT, Fate, Storage, TensorInfo
from jgrind.plan.planner import Plan, Planned, plan_run, plan_storages
from jgrind.plan.protocols import BindContext

# what ``auto(allow_lossy=True)`` compares beside its own storage: every tensor in bfloat16,
# every tensor in int8 (nearest rounding)
LOSSY_CANDIDATES = (Storage(bfloat16(), bfloat16(), bfloat16()), Storage(int8(), int8(), int8()))


@dataclasses.dataclass(frozen=True)
class Auto:
    """The planner as a policy: fates chosen to minimise the predicted epoch time under the
    budgets (`jgrind.plan.planner`), from a measured hardware profile.

    Used as ``train(..., policy=auto())``: it is a `jgrind.plan.protocols.PlansRun`, so the
    trainer (`jgrind.plan.execution.choose_execution`) calls `prepare` before partitioning, and
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
      replan: re-plan between epochs when the first timed epochs show the plan was wrong
        (`jgrind.plan.replan`; docs/planner.md, "Re-planning").
      storage: the storage dtypes of host and SSD blocks to plan with
        (`jgrind.plan.fates.Storage`; ``with_storage(auto(), ...)`` sets it); float32 by
        default.
      allow_lossy: also plan with every tensor in bfloat16 and in int8
        (`LOSSY_CANDIDATES`) and keep the fastest predicted; ``storage`` wins ties. False:
        only ``storage``, so the planner never picks a lossy dtype by itself.
    """

    device_budget: Optional[int] = None
    host_budget: Optional[int] = None
    directory: Optional[str] = None
    profile: object = dataclasses.field(default=None, compare=False, hash=False)
    recompute: bool = True
    keep_aggregations: bool = True
    on_plan: Optional[Callable] = dataclasses.field(default=None, compare=False, hash=False)
    replan: bool = True
    storage: Storage = EXACT
    allow_lossy: bool = False

    def storages(self) -> tuple:
        """The storages the planner compares (see ``allow_lossy``), ``storage`` first."""
        if not self.allow_lossy:
            return (self.storage,)
        return (self.storage,) + tuple(s for s in LOSSY_CANDIDATES if s != self.storage)

    def load_profile(self, directory=None):
        """The profile to plan with; its SSD figures for this policy's store, else the run's
        ``directory``."""
        if isinstance(self.profile, hw.Profile):
            return self.profile
        return hw.load_or_measure(self.profile, self.directory or directory,
                                  log=lambda msg: print(f"jgrind: {msg}"))

    def budgets(self, device_budget=None, host_budget=None, profile=None):
        """The budgets to plan for: this policy's and the run's, the smaller where both are
        given (the run's are the limits the engine holds every plan to, docs/engine.md), else
        the profile's."""
        dev = smaller(self.device_budget, device_budget)
        host = smaller(self.host_budget, host_budget)
        if dev is None and profile is not None:
            dev = int(profile.device_free)
        if host is None and profile is not None:
            host = int(profile.host_free) // 2
        return dev, host

    def prepare(self, graph, model, *, device_budget=None, host_budget=None, directory=None,
                partitioner=None, num_parts=None, seed: int = 0, progress=None,
                devices: Optional[int] = None, device_processes=None,
                profile: Optional[hw.Profile] = None, partitioned=None,
                placement=None) -> Plan:
        """Plan a whole run (`jgrind.plan.planner.plan_run`); returns the `Plan`. With
        ``devices`` (K), for the out-of-core engine over K devices, the device budget held
        per device; with ``device_processes`` (``[K]`` the process of each device), over
        several processes, the host budget held per process. ``profile``: the profile to
        plan with instead of `load_profile`'s (over several processes, the one they all
        plan with). ``partitioned`` (and ``placement``): ready partitions to plan over, at
        their count (`plan_run`'s)."""
        profile = profile if profile is not None else self.load_profile(directory)
        dev, host = self.budgets(device_budget, host_budget, profile)
        planned = plan_run(graph, model, profile, device_budget=dev, host_budget=host,
                           directory=self.directory or directory, partitioner=partitioner,
                           num_parts=num_parts, seed=seed, recompute=self.recompute,
                           progress=progress or (lambda msg: None),
                           keep=self.keep_aggregations, storages=self.storages(),
                           devices=devices, device_processes=device_processes,
                           partitioned=partitioned, placement=placement)
        if self.on_plan is not None:
            self.on_plan(planned)
        return planned

    def bind(self, inventory: Sequence[TensorInfo],
             context: Optional[BindContext] = None) -> Planned:
        if context is None:
            raise ValueError("auto() needs the engine's BindContext (the partitioned shapes) "
                             "to plan; pass it to train(policy=auto()) or bind(policy, "
                             "inventory, context)")
        profile = self.load_profile(context.directory)
        dev, host = self.budgets(context.device_budget, context.host_budget, profile)
        return plan_storages(context.workload, profile, self.storages(), device_budget=dev,
                             host_budget=host, directory=self.directory or context.directory,
                             recompute=self.recompute, keep=self.keep_aggregations).policy()

    def __call__(self, info: TensorInfo) -> Fate:
        raise RuntimeError("auto() used before planning; the engine binds it (train(policy="
                           "auto()) or bind(policy, inventory, context))")


def auto(device_budget: Optional[int] = None, host_budget: Optional[int] = None,
         directory: Optional[str | os.PathLike] = None, profile=None,
         recompute: bool = True, keep_aggregations: bool = True,
         on_plan: Optional[Callable] = None, replan: bool = True,
         allow_lossy: bool = False) -> Auto:
    """Let the planner choose every fate, the partitions and the cache mode (see `Auto`);
    with ``allow_lossy``, also a smaller storage dtype where it predicts a faster epoch."""
    if on_plan is not None and not callable(on_plan):
        raise TypeError(f"on_plan must be a function of the Plan, got {on_plan!r}")
    return Auto(check_budget(device_budget, "auto's device_budget"),
                check_budget(host_budget, "auto's host_budget"),
                None if directory is None else os.fspath(directory), profile, recompute,
                keep_aggregations, on_plan, replan=bool(replan),
                allow_lossy=bool(allow_lossy))
