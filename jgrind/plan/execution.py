"""How a run computes its epochs: the in-memory fast path or the out-of-core engine.

`choose_execution` is the one place that decides; the trainer builds what it returns
(`jgrind.train.make_executor`, which `jgrind.predict` uses too). A policy that plans the whole
run (`jgrind.plan.protocols.PlansRun`, `auto`) decides through the planner, which asks
`fits_in_memory` as the others do.

The fast path runs the whole model as one jitted step on the device. It is taken when no
out-of-core argument is given, or when those given allow it: a policy that keeps everything on
the device (`jgrind.plan.protocols.DeviceOnly`), at most one partition, and a device budget
that holds the fast path's peak (`in_memory_bytes`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from jgrind.plan.cost import in_memory_bytes as fast_path_bytes, loss_row_bytes
from jgrind.plan.inventory import layer_widths
from jgrind.plan.protocols import PlansRun, Policy, device_only

DEFAULT_PARTS = 4  # partitions when the engine runs a policy and no count is given


@dataclasses.dataclass(frozen=True)
class Execution:
    """What `choose_execution` decided.

    Attributes:
      in_memory: the in-memory fast path; the other fields are then unused.
      policy: the policy the out-of-core engine runs (a planned run's plan as a policy).
      num_parts: partitions to cut the graph into.
      partitioned: a planned run's `PartitionedGraph`, reused so the graph is not cut twice;
        None: the engine partitions.
      prediction: a planned run's predicted epoch (`jgrind.plan.cost.Prediction`), which
        the trainer holds each epoch against (`jgrind.plan.check`); None otherwise.
      plan: a planned run's `jgrind.plan.planner.Plan` (the trainer re-plans from it,
        `jgrind.plan.replan`); None otherwise.
    """

    in_memory: bool
    policy: Optional[Policy] = None
    num_parts: Optional[int] = None
    partitioned: object = None
    prediction: object = None
    plan: object = None


IN_MEMORY = Execution(in_memory=True)


def in_memory_bytes(graph, model) -> int:
    """Bytes the in-memory fast path holds at its peak (`jgrind.plan.cost.in_memory_bytes`)."""
    structure = 2 * (graph.indptr.nbytes + graph.indices.nbytes + 4 * graph.num_edges)
    return fast_path_bytes(graph.num_nodes, graph.num_edges, graph.num_features,
                           layer_widths(model, graph.num_features), structure,
                           loss_row_bytes(graph.labels))


def fits_in_memory(graph, model, device_budget: Optional[int],
                   num_parts: Optional[int] = None) -> bool:
    """Whether the fast path may run ``model`` on ``graph``: one partition (or no count
    asked for) and its peak within ``device_budget`` (None: unlimited)."""
    return num_parts in (None, 1) and (device_budget is None
                                       or in_memory_bytes(graph, model) <= device_budget)


def choose_execution(graph, model, *, policy: Optional[Policy] = None,
                     num_parts: Optional[int] = None, store=None,
                     device_budget: Optional[int] = None, host_budget: Optional[int] = None,
                     partitioner=None) -> Execution:
    """The fast path when no out-of-core argument is given, or when the policy keeps
    everything on the device and the graph fits (`fits_in_memory`); the out-of-core engine
    otherwise. A `PlansRun` policy plans the run here (partitioning the graph), and its plan
    says which. The arguments are `jgrind.train`'s, already checked."""
    if isinstance(policy, PlansRun):
        plan = policy.prepare(graph, model, device_budget=device_budget,
                              host_budget=host_budget,
                              directory=None if store is None else str(store),
                              partitioner=partitioner, num_parts=num_parts)
        if plan.in_memory:
            return IN_MEMORY
        return Execution(in_memory=False, policy=plan.policy(), num_parts=plan.num_parts,
                         partitioned=plan.partitioned, prediction=plan.prediction,
                         plan=plan)
    asks_for_engine = policy is not None or num_parts not in (None, 1) \
        or device_budget is not None or host_budget is not None
    if not asks_for_engine:
        return IN_MEMORY
    if (policy is None or device_only(policy)) and fits_in_memory(graph, model, device_budget,
                                                                   num_parts):
        return IN_MEMORY
    return Execution(in_memory=False, policy=policy, num_parts=num_parts or DEFAULT_PARTS)
