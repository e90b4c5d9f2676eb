"""The predicted epoch of one model trained on several devices (`jgrind.devices.Sharded`).

Each device runs its nodes' rows as one whole-graph program over its rows and halo slots
(the fast path's price, `jgrind.plan.cost.in_memory_seconds`, on the device's shapes), and
the devices wait for each other at every halo exchange, so the compute of an epoch is the
slowest device's; CPU devices of one machine share its cores (the profile measured them all
at work on one program), so there it is the devices' sum. The exchange before every aggregating layer (and its transpose in the
backward pass, except the first layer's) moves, on every device, ``K - 1`` chunks of
`ExchangePlan.slot_rows` rows out and as many in, at the rate of a `Link`; the weight
gradients are summed by a ring all-reduce, ``2 (K - 1) / K`` of their bytes over the same
link. Compute and communication are added, not overlapped: `Sharded` runs them in turn.

A `Link` is a rate and a route: device to device (a GPU's NVLink or peer-to-peer PCIe, or
shared memory between CPU devices), or through host memory (each row goes down to the host
and up again, at the profile's measured link rates). `Sharded` runs the first (one
`jax.lax.all_to_all`); `jgrind.devices.ShardedOutOfCore` runs either per layer: the second
for a layer stored on the host or the SSD (each step gathers its halo rows from there), and
for a layer whose blocks are on the devices, the one asked for (`jax.device_put` between
devices, or through host memory). `choose_exchanges` picks one route per layer
(`jgrind.devices.exchange`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from jgrind.plan.cost import ITEMSIZE, Workload, in_memory_bytes, in_memory_seconds
from jgrind.plan.exchange import ExchangePlan
from jgrind.plan.inventory import layer_widths

__all__ = ["DeviceToDevice", "Link", "ShardedPrediction", "ThroughHost", "calibrate",
           "choose_exchanges", "device_peak_lines", "device_peaks", "device_plan_lines",
           "device_workloads", "links_for", "planned_routes", "predict_sharded", "predictions",
           "print_devices_plan", "process_share_lines", "scaled_profile"]

# NVLink 4 (H100 and H200 SXM): 900 GB/s per GPU in both directions together, by the
# specification; half of it each way. Not measured here: the lent machines have one GPU.
NVLINK4_BYTES_PER_SECOND = 450e9


@dataclasses.dataclass(frozen=True)
class Link:
    """How halo rows travel between devices.

    Attributes:
      name: for the printout, with where the rate comes from.
      to_device: bytes per second into a device (one direction, per device).
      to_host: bytes per second out of a device into host memory; only for
        ``through_host``.
      through_host: rows go device -> host -> device: each byte crosses the link twice, at
        ``to_host`` then ``to_device``.
    """

    name: str
    to_device: float
    to_host: float = 0.0
    through_host: bool = False

    def seconds(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` out of every device and as many into it."""
        if self.through_host:
            return nbytes / self.to_host + nbytes / self.to_device
        return nbytes / self.to_device


@dataclasses.dataclass(frozen=True)
class DeviceToDevice:
    """Halo rows move between devices by a collective; the layer's rows stay on the devices."""

    through_host = False

    def __str__(self) -> str:
        return "device to device"


@dataclasses.dataclass(frozen=True)
class ThroughHost:
    """Halo rows go from the owner's device to host memory and from there to the reader's."""

    through_host = True

    def __str__(self) -> str:
        return "through host memory"


def links_for(profile) -> tuple[Link, ...]:
    """The links to price on the machine ``profile`` describes: on a CPU, its devices share
    the host's memory (an exchange is a copy); on a GPU, device to device over NVLink (the
    specification's rate) and through the host at the profile's measured link rates."""
    if shares_cores(profile):
        return (Link("shared memory between CPU devices (the profile's copy rate)",
                     float(profile.copy_bw)),)
    return (Link("device to device, NVLink 4 (specification: 450 GB/s each way)",
                 NVLINK4_BYTES_PER_SECOND),
            Link("through host memory (the profile's measured link rates)",
                 float(profile.link_to_device_bw), float(profile.link_to_host_bw),
                 through_host=True))


def shares_cores(profile) -> bool:
    """Whether the profile's devices are CPU devices of one machine, sharing its cores."""
    return profile.machine.get("backend", "cpu") == "cpu"


def device_workloads(exchange: ExchangePlan, indptr: np.ndarray, model,
                     num_features: int) -> list[Workload]:
    """Every device's whole-graph program as a one-partition `Workload`: its rows, its halo
    slots (``K - 1`` chunks of `ExchangePlan.slot_rows`, as `Sharded` lays them out) and the
    in-edges of its rows. Priced as a graph of ``rows + slots`` nodes, which over-counts the
    output-side work of the slots a little."""
    degree = np.diff(np.asarray(indptr, np.int64))
    slots = (exchange.num_devices - 1) * exchange.slot_rows
    return [Workload.whole(model, num_features, int(rows.size) + slots,
                           int(degree[rows].sum())) for rows in exchange.rows]


@dataclasses.dataclass(frozen=True)
class ShardedPrediction:
    """A predicted epoch on K devices over one `Link`.

    Attributes:
      link: the route the exchange was priced on.
      device_seconds: ``[K]`` each device's compute per epoch.
      exchange_bytes: bytes one device sends per epoch (as many arrive), padding included.
      exchange_seconds: the exchanges' seconds per epoch.
      allreduce_seconds: the weight gradients' all-reduce.
      device_peak: ``[K]`` bytes each device's program holds at its peak (the fast path's
        estimate on the device's shapes).
      shared_cores: the devices share one machine's cores (CPU devices): their compute adds.
    """

    link: Link
    device_seconds: np.ndarray
    exchange_bytes: float
    exchange_seconds: float
    allreduce_seconds: float
    device_peak: np.ndarray
    shared_cores: bool = False

    @property
    def num_devices(self) -> int:
        return int(self.device_seconds.size)

    @property
    def compute_seconds(self) -> float:
        """The slowest device's compute (the others wait for it at every exchange), or all
        devices' together where they share the cores."""
        if self.shared_cores:
            return float(self.device_seconds.sum())
        return float(self.device_seconds.max())

    @property
    def epoch_seconds(self) -> float:
        return self.compute_seconds + self.exchange_seconds + self.allreduce_seconds

    def line(self) -> str:
        return (f"{self.num_devices} device{'s' if self.num_devices > 1 else ''}, "
                f"{self.link.name}: predicted {self.epoch_seconds * 1e3:.1f} ms per epoch "
                f"(compute {self.compute_seconds * 1e3:.1f} ms, "
                f"{'the devices together' if self.shared_cores else 'the slowest device'}; "
                f"exchange "
                f"{self.exchange_seconds * 1e3:.1f} ms, all-reduce "
                f"{self.allreduce_seconds * 1e3:.2f} ms); peak "
                f"{self.device_peak.max() / 2**30:.2f} GiB on the fullest device")


def _exchange_bytes_per_device(exchange: ExchangePlan, model, num_features: int) -> float:
    """Bytes one device sends per epoch: its ``K - 1`` chunks before every aggregating layer,
    and again in the backward pass for every one but the first (features need no gradient)."""
    if not exchange.slot_rows:
        return 0.0
    widths = layer_widths(model, num_features)
    chunk = (exchange.num_devices - 1) * exchange.slot_rows * ITEMSIZE
    total = 0.0
    for l, layer in enumerate(model.layers):
        if layer.aggregates:
            total += (2 if l > 0 else 1) * chunk * widths[l]
    return total


def predict_sharded(exchange: ExchangePlan, indptr: np.ndarray, model, num_features: int,
                    profile, link: Link, num_params: int) -> ShardedPrediction:
    """The predicted epoch of ``model`` on the devices of ``exchange`` (K of them; K = 1 is
    the in-memory fast path on one device), exchanging over ``link``."""
    k = exchange.num_devices
    loads = device_workloads(exchange, indptr, model, num_features)
    seconds = np.array([in_memory_seconds(w, profile) for w in loads])
    peaks = _peaks(loads, num_features)
    sent = _exchange_bytes_per_device(exchange, model, num_features)
    ring = 2.0 * (k - 1) / k * num_params * ITEMSIZE if k > 1 else 0.0
    return ShardedPrediction(link=link, device_seconds=seconds, exchange_bytes=sent,
                             exchange_seconds=link.seconds(sent) if sent else 0.0,
                             allreduce_seconds=link.seconds(ring) if ring else 0.0,
                             device_peak=peaks, shared_cores=shares_cores(profile))


def _peaks(loads: Sequence[Workload], num_features: int) -> np.ndarray:
    return np.array([in_memory_bytes(w.num_nodes, w.num_edges, num_features, w.widths)
                     for w in loads], np.float64)


def device_peaks(exchange: ExchangePlan, indptr: np.ndarray, model,
                 num_features: int) -> np.ndarray:
    """``[K]`` bytes each device's whole program holds at its peak when every layer's rows
    stay on the devices (`Sharded`; the fast path's estimate on the device's shapes)."""
    return _peaks(device_workloads(exchange, indptr, model, num_features), num_features)


def scaled_profile(profile, speedup: float):
    """``profile`` with every compute and host-memory rate ``speedup`` times faster (and its
    reference whole-graph steps that much shorter): a profile calibrated to one measured
    epoch of another machine when that machine's own profile was not saved. A uniform
    speed-up is an assumption; a measured profile replaces it."""
    fast = ("matmul_flops", "contraction_bw", "spmm_rate", "spmm_cached_rate", "gather_bw",
            "copy_bw")
    changes = {name: getattr(profile, name) * speedup for name in fast}
    changes["fused_steps"] = tuple((n, e, t / speedup) for n, e, t in profile.fused_steps)
    changes["step_latency"] = profile.step_latency / speedup
    return dataclasses.replace(profile, **changes)


def calibrate(profile, workload: Workload, measured_seconds: float):
    """`scaled_profile` whose fast-path price of ``workload`` is ``measured_seconds``."""
    predicted = in_memory_seconds(workload, profile)
    return scaled_profile(profile, predicted / measured_seconds)


def predictions(exchange: ExchangePlan, indptr, model, num_features: int, profile,
                num_params: int, links: Optional[Sequence[Link]] = None
                ) -> list[ShardedPrediction]:
    """`predict_sharded` over every link of ``links`` (default `links_for(profile)`)."""
    return [predict_sharded(exchange, indptr, model, num_features, profile, link, num_params)
            for link in (links or links_for(profile))]


def _layer_exchange_bytes(exchange: ExchangePlan, model, num_features: int) -> list[float]:
    """Bytes one device sends per epoch for each layer's exchange (0 for a node-wise layer):
    `_exchange_bytes_per_device` layer by layer."""
    widths = layer_widths(model, num_features)
    chunk = (exchange.num_devices - 1) * exchange.slot_rows * ITEMSIZE
    return [(2 if l > 0 else 1) * chunk * widths[l] if layer.aggregates else 0.0
            for l, layer in enumerate(model.layers)]


def choose_exchanges(exchange: ExchangePlan, indptr: np.ndarray, model, num_features: int,
                     profile, device_budget: Optional[int] = None,
                     links: Optional[Sequence[Link]] = None) -> tuple:
    """The route of every layer's halo exchange (`jgrind.devices.exchange`; None for a
    node-wise layer, which exchanges nothing), FlexGNN's G2G / G2H choice.

    Device to device keeps every layer's rows on its device: it needs the devices' whole
    programs to fit ``device_budget`` (their predicted peaks, `predict_sharded`). Where they
    do not, every layer goes through host memory (its rows stored on the host or the SSD, as
    `jgrind.devices.ShardedOutOfCore` runs them). Where they fit, each layer takes the route
    that moves its bytes soonest over ``links`` (default `links_for(profile)`; without a
    through-host link, as on CPU devices that share memory, device to device). Without
    ``profile`` or ``links``, the budget alone decides."""
    links = tuple(links or (links_for(profile) if profile is not None else ()))
    direct = [link for link in links if not link.through_host]
    host = [link for link in links if link.through_host]
    aggregating = [layer.aggregates for layer in model.layers]
    if device_budget is not None:
        peak = device_peaks(exchange, indptr, model, num_features)
        if float(peak.max()) > device_budget:
            return tuple(ThroughHost() if a else None for a in aggregating)
    if not host:
        return tuple(DeviceToDevice() if a else None for a in aggregating)
    if not direct:
        return tuple(ThroughHost() if a else None for a in aggregating)
    chosen = []
    for sent, a in zip(_layer_exchange_bytes(exchange, model, num_features), aggregating):
        if not a:
            chosen.append(None)
        elif min(l.seconds(sent) for l in host) < min(l.seconds(sent) for l in direct):
            chosen.append(ThroughHost())
        else:
            chosen.append(DeviceToDevice())
    return tuple(chosen)


def planned_routes(plan, model, profile=None, links: Optional[Sequence[Link]] = None
                   ) -> tuple:
    """The route of every layer of ``model`` for an out-of-core plan over several devices
    (`jgrind.plan.planner.plan_run` with ``devices``), FlexGNN's G2G / G2H choice per layer:
    through host memory where the plan keeps some block of the layer's input on the host or
    the SSD, or recomputes it (every device reads those rows from there); where every block
    is on the devices, the faster of ``links`` (default `links_for(profile)`; as
    `choose_exchanges`: device to device without a through-host link, through host memory
    without a direct one, and without ``profile`` or ``links`` device to device). None for a
    node-wise layer. What `jgrind.devices.ShardedOutOfCore` runs for the plan."""
    from jgrind.executed.split import as_executed
    from jgrind.plan.fates import D
    executed, record = as_executed(model)
    links = tuple(links or (links_for(profile) if profile is not None else ()))
    direct = [link for link in links if not link.through_host]
    host = [link for link in links if link.through_host]
    host_faster = bool(host) and (not direct or min(link.seconds(1.0) for link in host)
                                  < min(link.seconds(1.0) for link in direct))
    a = plan.assignment
    routes = []
    for o, layer in enumerate(model.layers):
        reads = [e for e, of in enumerate(record.origin)
                 if of == o and getattr(executed.layers[e], "aggregates", True)]
        if not layer.aggregates or not reads:
            routes.append(None)
            continue
        stored = plan.in_memory or all(bool(np.all(a.activations[e] == D)) for e in reads)
        routes.append(DeviceToDevice() if stored and not host_faster else ThroughHost())
    return tuple(routes)


def device_plan_lines(plan, routes: Sequence) -> list[str]:
    """An out-of-core plan over several devices for people: `device_peak_lines`,
    `process_share_lines`, each model layer's route and the predicted epoch."""
    lines = device_peak_lines(plan) + process_share_lines(plan)
    lines.append("exchange per layer: " + "; ".join(
        f"layer {l} {route}" for l, route in enumerate(routes) if route is not None))
    lines.append(f"predicted epoch: {plan.epoch_seconds:.3g} s")
    return lines


def device_peak_lines(plan) -> list[str]:
    """Each device's partitions and predicted peak (its device blocks and working set,
    `jgrind.plan.cost.Memory`) of an out-of-core plan over several devices, and the host
    peak; [] for a plan on one device."""
    from jgrind.plan.cost import format_bytes
    if getattr(plan, "placement", None) is None or plan.prediction is None:
        return []
    m = plan.prediction.memory
    lines = []
    for d in range(plan.placement.num_devices):
        # (a last device without partitions holds nothing)
        tables = m.device_tables_each[d] if d < len(m.device_tables_each) else 0
        working = m.device_working_sets[d] if d < len(m.device_working_sets) else 0
        parts = ", ".join(map(str, plan.placement.partitions_of(d))) or "none"
        lines.append(f"device {d}: partitions {parts}; predicted peak "
                     f"{format_bytes(tables + working)} (blocks {format_bytes(tables)} + "
                     f"working set {format_bytes(working)}) of the device budget "
                     f"{format_bytes(plan.device_budget)}")
    every = " (every partition's blocks together)" if getattr(plan, "processes", None) \
        is not None else ""
    lines.append(f"host: predicted peak {format_bytes(m.peak_host)}; SSD "
                 f"{format_bytes(m.peak_ssd)}{every}")
    return lines


def process_share_lines(plan) -> list[str]:
    """Each process's devices, partitions and predicted host share beside the host budget,
    which holds each one's (`jgrind.plan.process_shares`), of a plan over several processes;
    [] for a plan in one process."""
    from jgrind.plan.cost import format_bytes
    split = getattr(plan, "processes", None)
    if split is None or plan.placement is None:
        return []
    lines = []
    for q, (blocks, halo) in enumerate(plan.host_shares):
        devices = np.flatnonzero(split.process_of_device == q)
        parts = ", ".join(map(str, np.flatnonzero(split.process_of == q))) or "none"
        lines.append(f"process {q}: devices {', '.join(map(str, devices))}; partitions "
                     f"{parts}; predicted host share {format_bytes(blocks + halo)} (its "
                     f"blocks {format_bytes(blocks)} + halo rows of other processes' blocks "
                     f"{format_bytes(halo)}) of the host budget per process "
                     f"{format_bytes(plan.host_budget)}")
    return lines


def print_devices_plan(graph, model, profile, devices: int, device_budget, host_budget, *,
                       directory=None, num_parts=None, partitioner=None, seed: int = 0,
                       storages=None, num_processes: int = 1) -> None:
    """`jgrind plan --devices K`'s out-of-core part: the plan `auto` makes for K devices
    (`jgrind.plan.planner.plan_run` with ``devices``; the device budget per device), its
    fates per tensor group and `device_plan_lines`; one line when no plan fits. With
    ``num_processes`` P > 1 the K devices are driven by P processes, K / P each in order (as
    `jgrind launch` starts them), and the host budget is held per process."""
    from jgrind.plan.cost import format_bytes
    from jgrind.plan.fates import EXACT
    from jgrind.plan.planner import PlanError, plan_run
    over = ""
    device_processes = None
    if num_processes > 1:
        device_processes = np.repeat(np.arange(num_processes), devices // num_processes)
        over = f" in {num_processes} processes"
    try:
        plan = plan_run(graph, model, profile, device_budget=device_budget,
                        host_budget=host_budget, directory=directory, num_parts=num_parts,
                        partitioner=partitioner, seed=seed, storages=storages or (EXACT,),
                        devices=devices, device_processes=device_processes)
    except PlanError as err:
        print(f"out of core on {devices} devices{over} (--policy auto): no plan fits: {err}")
        return
    held = "device's own blocks" + ("; the host budget each process's share"
                                     if num_processes > 1 else "")
    print(f"out of core on {devices} devices{over} (--policy auto; the device budget holds "
          f"each {held}): {plan.num_parts} partitions, host cache "
          f"{format_bytes(plan.cache_bytes) if plan.cache_bytes else 'off'}")
    print("  fates: " + ", ".join(f"{row['tensor']} {row['fate']}" for row in plan.groups()))
    for line in device_plan_lines(plan, planned_routes(plan, model, profile)):
        print(f"  {line}")
