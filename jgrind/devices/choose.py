"""The executor over several devices that the budgets allow: every row on its device, or the
out-of-core engine's host tier.

`choose` places the partitions as `Sharded` would and asks the planner for every layer's
route (`jgrind.plan.sharded.choose_exchanges`): device to device while the devices' whole
programs fit the per-device budget (`Sharded`, on the same partitions). Where they do not,
the planner chooses per tensor, and so per layer, under the same budget (`ShardedOutOfCore`
with `jgrind.plan.auto`): the layers whose blocks it keeps on the devices exchange device to
device, the others through host memory (FlexGNN's G2G / G2H choice per layer), instead of
sending every layer through host memory because the whole does not fit.
"""

from __future__ import annotations

from typing import Callable, Optional

from jgrind.devices.exchange import DeviceToDevice
from jgrind.devices.executor import Sharded, resolve_devices
from jgrind.devices.out_of_core import ShardedOutOfCore
from jgrind.partition import partition_graph
from jgrind.partition.partitioners import label_propagation
from jgrind.plan import policies
from jgrind.plan.exchange import exchange_plan
from jgrind.plan.placement import place
from jgrind.plan.sharded import choose_exchanges

__all__ = ["choose"]


def choose(graph, model, optimizer, *, devices, device_budget: int,
           num_parts: Optional[int] = None, partitioner: Optional[Callable] = None,
           split: int = 0, loss: Optional[Callable] = None, seed: int = 0, profile=None):
    """`Sharded` or `ShardedOutOfCore` (see the module docstring); ``device_budget`` is per
    device. ``profile``: the hardware profile the planner prices with where the whole does not
    fit (default: `jgrind.plan.profile.load_or_measure`'s, measured once and kept)."""
    k = len(resolve_devices(devices))
    partitioner = label_propagation if partitioner is None else partitioner
    if getattr(partitioner, "num_parts", None) is not None and num_parts is None:
        num_parts = partitioner.num_parts  # a saved assignment's own count
    parts = k if num_parts is None else int(num_parts)
    normalized = model.normalize(graph)
    pg = partition_graph(normalized, partitioner(normalized, parts, seed=seed), num_parts=parts)
    placement = place(pg, model, graph.num_features, k)
    plan = exchange_plan(normalized.indptr, normalized.indices,
                         placement.device_of[pg.assignment], k)
    routes = choose_exchanges(plan, normalized.indptr, model, graph.num_features, None,
                              device_budget)
    if all(route is None or isinstance(route, DeviceToDevice) for route in routes):
        return Sharded(graph, model, optimizer, devices=devices, partitioned=pg, split=split,
                       loss=loss, exchange=routes)
    return ShardedOutOfCore(graph, model, optimizer, devices=devices, num_parts=parts,
                            partitioner=partitioner, split=split, loss=loss, seed=seed,
                            policy=policies.auto(profile=profile), device_budget=device_budget)
