"""`ShardedOutOfCore`: the out-of-core engine with its partitions' steps spread over devices.

One `jgrind.engine.OutOfCore` engine is built as on one device: its plan, its schedule, its
store (the process's host and SSD tiers) and its sweeps. The partitions are then placed on
devices (`jgrind.plan.placement`), and each partition's steps run on its device: its step
inputs are put there, its block structure too, and the jitted steps run where their inputs
are. Every stored tensor is written to the tier it is planned for, and a step gathers its
halo rows from there, whichever device produced them: for rows on the host or the SSD made
on another device, that is the exchange through host memory
(`jgrind.devices.exchange.ThroughHost`, FlexGNN's G2H). Halo input gradients are added into
their owner's rows where those are, as on one device.

Each device keeps its own weight-gradient sum (and loss sum) over its partitions; at the end
of the epoch a ``psum`` under `jax.shard_map` over the devices' mesh adds them, and the
engine's optimizer update runs once on the sum: the update of in-memory training.

Why this design: the engine already places every stored tensor on the host, the SSD or
recompute, regathers and scatter-adds halo rows, and orders the sweeps so a layer's rows are
complete before the next layer reads them. Giving each partition a device needs only the
steps to run there and the gradient sums to stay per device: no tier, schedule or sweep is
copied. The price is that the devices take their partitions' steps in the sweep's order,
one dispatch thread for all of them: the devices overlap only as far as JAX's asynchronous
dispatch lets them.

Stored blocks with the device fate live on the device of their partition
(`jgrind.devices.placed_tier`: one array per device and table), so a plan that keeps some
layers on the device (`in_memory`, `grinnder`, `by_layer`) runs too. A layer whose input's
blocks are all on the devices exchanges its halo rows by its route
(`jgrind.devices.exchange`): device to device by `jax.device_put` to the reading step's
device, or through host memory; a layer stored on the host or the SSD goes through host
memory (its rows are there). One run may mix both, layer by layer.

The device budget is per device: the engine is told each partition's device
(`jgrind.plan.cost.Workload.device_of`), and holds each device's own partitions' device blocks
beside its own working set to it. With `auto` the planner plans for the devices
(`jgrind.plan.planner.plan_run` with ``devices``): the partition count, the placement, every
block's fate under those per-device budgets and the host budget, and each layer's route
(`jgrind.plan.sharded.planned_routes`).

Several processes (`jax.distributed`, `jgrind.devices.processes`): every process builds the
same plan, schedule and placement over the devices of all of them, and runs the steps of the
partitions placed on its own devices only. Its device, host, SSD and recompute tiers hold its
own partitions' blocks (a device block on its partition's device), and of the others' only
the rows its partitions read as halo, in host memory, while a sweep needs them (the host
budget holds that share, `jgrind.engine.build.process_host_need`): before a sweep gathers a
layer's input those rows cross between the processes by ``all_to_all``, and after a backward
sweep the halo gradients go back the same way (`jgrind.devices.across_processes`). The weight
gradients and the loss are summed by the ``psum`` over the mesh of every process's devices,
and every process applies the same update. A process pads only its own partitions and writes only their features, and
reads from the graph the feature rows of other processes' partitions that its own read as
halo. Given a saved graph (`jgrind.datasets.saved_arrays.SavedGraph`, as ``jgrind train
--dataset npy:FOLDER`` hands it to each of several processes) and a partition that needs no
edges (`contiguous`, or a saved assignment ``FILE.npy``), a process reads ``indptr`` and the
in-edges of its own partitions' rows only: the partitions are placed by their rows and
in-edges (`jgrind.devices.local.degree_placement`), and what the plan and the exchange need
of the other partitions (their halos and edge counts) their processes send
(`jgrind.devices.local.own_partitioned`, a ``process_allgather``). With `auto` too: the
planner plans over those partitions and that placement (`jgrind.plan.planner.plan_run`'s
``partitioned``), at the count the assignment or ``num_parts`` gives (by default one per
device; no search over counts, which would cut the graph by its edges), placed by rows and
in-edges at the profile's rates. With a partitioner that reads edges it reads the whole CSR
structure (`jgrind.devices.local.saved_structure`). Of the features it reads only its
partitions' rows and their halo rows (`jgrind.devices.local.FeatureRows`); every process
checks that all cut the same partitions. Host and SSD blocks in a lossy storage dtype cross in their stored
words, so a process reads another's rows as that one's own gathers do. Refused over several
processes, in one line: ``exchange=DeviceToDevice()`` (between processes the rows cross by
the collective, whatever a layer's route; the routes move rows between one process's devices).

Still refused: the naive policy's snapshots (one more tier of step inputs).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jgrind.arguments import whole_number
from jgrind.devices.across_processes import (ProcessTiers, RowExchange, collective,
                                             halo_rows)
from jgrind.devices.exchange import DeviceToDevice, ThroughHost, per_layer
from jgrind.devices.executor import AXIS, resolve_devices
from jgrind.devices.placed_tier import DEVICE_TO_DEVICE, THROUGH_HOST, DeviceTiers
from jgrind.engine.build import process_host_need
from jgrind.engine.engine import OutOfCore
from jgrind.engine.store import CODED_TIERS, TIERS, DeviceRows
from jgrind.engine.sweeps import FROM_KEPT, Sweeps, adopted
from jgrind.plan.cost import ITEMSIZE
from jgrind.executed.split import as_executed
from jgrind.partition import partition_graph
from jgrind.partition.partitioners import label_propagation
from jgrind.plan.fates import ACTIVATION, GRADIENT, Fate
from jgrind.plan.placement import Placement, Rates, place
from jgrind.plan.protocols import PlansRun
from jgrind.plan.sharded import planned_routes
from jgrind.plan.schedule import BACKWARD, FORWARD, RECOMPUTE, Variant

__all__ = ["PerDevice", "ShardedOutOfCore", "through_host_policy"]

# the steps that run on a partition's device (`jgrind.engine.steps.LayerSteps`'s); each names
# its weight-gradient accumulator ``acc`` and its spare buffer ``spare`` (`_arguments`)
_STEPS = frozenset({"forward", "forward_saving", "backward", "backward_params", "top",
                    "masked_backward", "masked_backward_params", "saved_backward",
                    "saved_backward_params"})
_PARAMS_ONLY = frozenset({Variant.BACKWARD_PARAMS, Variant.MASKED_BACKWARD_PARAMS,
                          Variant.SAVED_BACKWARD_PARAMS})


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class PerDevice:
    """One value per device (a tree on each), added device by device: the weight-gradient
    sums and the loss sums of an epoch before the collective adds them up."""

    values: dict  # jax.Device -> tree on that device

    def tree_flatten(self):
        devices = tuple(self.values)
        return tuple(self.values[d] for d in devices), devices

    @classmethod
    def tree_unflatten(cls, devices, children):
        return cls(dict(zip(devices, children)))

    def __add__(self, other):
        if not isinstance(other, PerDevice):
            other = _on_first(other, self)
        merged = dict(self.values)
        for device, value in other.values.items():
            merged[device] = value if device not in merged else \
                jax.tree.map(jnp.add, merged[device], value)
        return PerDevice(merged)

    __radd__ = __add__


def _on_first(value, like: PerDevice) -> PerDevice:
    """A plain value (the runner's zero start) as a `PerDevice` on ``like``'s first device."""
    device = next(iter(like.values))
    return PerDevice({device: jax.device_put(value, device)})


def _device_of(tree) -> Optional[jax.Device]:
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            return next(iter(leaf.devices()))
    return None


def _on(tree, device: jax.Device):
    """``tree``'s arrays on ``device`` (those there already are kept; None stays None). A
    gathered input of stored words (`jgrind.engine.tiers.coded.StoredRows`, a lossy storage
    dtype's) is sent and decoded there, as the pipeline does on one device."""
    def put(a):
        if isinstance(a, DeviceRows):
            with jax.default_device(device):
                a = a.to_device()
        if isinstance(a, jax.Array) and a.devices() == {device}:
            return a
        return jax.device_put(a, device)
    return jax.tree.map(put, tree)


def _replaced(sums: PerDevice, device, value) -> PerDevice:
    """``sums`` with ``device``'s value replaced, that one first: the pipeline waits on a
    step's first output leaf to know it has finished."""
    return PerDevice({device: value, **{d: v for d, v in sums.values.items() if d != device}})


@functools.lru_cache(maxsize=None)
def _arguments(step) -> tuple:
    """The names of a jitted step's arguments: its function's, or those a spared step
    (`jgrind.engine.steps`) lists, its trailing ``spare`` included."""
    fn = getattr(step, "__wrapped__", step)
    names = getattr(fn, "argument_names", None)
    return tuple(names) if names is not None else tuple(inspect.signature(fn).parameters)


class _PlacedSteps:
    """A layer's `jgrind.engine.steps.LayerSteps`, run on the device of the block they are
    given, with the weight-gradient accumulator kept per device (`PerDevice`)."""

    def __init__(self, steps, owner: "ShardedOutOfCore"):
        self._steps, self._owner = steps, owner

    def __getattr__(self, name):
        value = getattr(self._steps, name)
        if name not in _STEPS or value is None:
            return value
        return functools.partial(self._call, name, value)

    def _call(self, name, step, *args):
        args = list(args)
        device = _device_of(args[1])  # the block: put on the partition's device
        names = _arguments(step)
        if names[-1] == "spare" and _device_of(args[-1]) not in (device, None):
            args[-1] = None  # a spare of another device: the step allocates its own
        position = names.index("acc") if "acc" in names else None
        sums = None
        if position is not None:
            sums = args[position]
            if not isinstance(sums, PerDevice):  # the runner's zeros, first step of a sweep
                sums = PerDevice({device: _on(sums, device)})
            args[position] = sums.values.get(device)
            if args[position] is None:
                args[position] = jax.tree.map(
                    lambda a: jnp.zeros(a.shape, a.dtype, device=device),
                    next(iter(sums.values.values())))
        args[0] = self._owner._params_on(args[0], device)
        args = [a if i == position else _on(a, device) for i, a in enumerate(args)]
        out = step(*args)
        if position is None:
            return out
        if not isinstance(out, tuple):  # the accumulator alone
            return _replaced(sums, device, out)
        at = 1 if name == "top" else 0
        out = list(out)
        out[at] = _replaced(sums, device, out[at])
        if name == "top":
            out[0] = PerDevice({device: out[0]})
        return tuple(out)


class _PlacedSweeps(Sweeps):
    """The engine's sweeps, with each partition's step inputs and block structure put on its
    device (the steps then run there: `_PlacedSteps`)."""

    def __init__(self, built, device_of_part: dict, device_tiers: DeviceTiers,
                 row_exchange: Optional[RowExchange] = None):
        super().__init__(built)
        self.device_of_part = device_of_part
        self.device_tiers = device_tiers
        self.row_exchange = row_exchange
        self._halo_held: set = set()  # layers whose other processes' rows are here now
        self._blocks: dict = {}
        # the engine keeps every block's structure on the (first) device when it fits: here
        # each is kept on its own partition's device instead
        self._keep_blocks = bool(built.blocks)
        built.blocks.clear()

    # With several processes, the rows of a layer's input that another process's partitions
    # read as halo cross to it before a sweep gathers them (the input loader: every process
    # makes it once per sweep, in the schedule's order, so all run the same collectives), and
    # are freed after that sweep: a later sweep that regathers brings them again. A process
    # then holds one layer's rows of the others at a time, not every layer's all epoch. The
    # features' rows are read from the graph once, and kept.
    def input_loader(self, l: int, table, snapshot=None, stage: bool = True, timing=None):
        plan = self.built.plan
        if self.row_exchange is not None and l >= 1 and not plan.local[l] \
                and l not in self._halo_held:
            self.row_exchange.rows(ACTIVATION, l, plan.widths[l])
            self._halo_held.add(l)
        return super().input_loader(l, table, snapshot, stage, timing)

    def _drop_halo(self, l: int) -> None:
        if l in self._halo_held:
            self.row_exchange.drop(ACTIVATION, l)
            self._halo_held.discard(l)

    def forward(self, params, l: int, key, variant: Variant = Variant.FORWARD,
                evaluation: bool = False) -> None:
        super().forward(params, l, key, variant, evaluation)
        self._drop_halo(l)  # read
        self._drop_halo(l + 1)  # rewritten: rows held from before (a prediction's) are stale

    def backward(self, params, l: int, variant: Variant, key, upper, lower, loss, acc,
                 masks):
        out = super().backward(params, l, variant, key, upper, lower, loss, acc, masks)
        self._drop_halo(l)
        if self.row_exchange is not None and lower is not None \
                and not self.built.plan.local[l]:
            self.row_exchange.gradients(GRADIENT, l, self.built.plan.widths[l])
        return out

    def _timed(self, load):
        load = super()._timed(load)

        def placed(part):
            device = self.device_of_part[part.index]
            with self.device_tiers.reading_for(device):
                loaded = load(part)
            # counted as the pipeline counts what it puts
            self.built.store.count(to_device=sum(
                a.host.nbytes if isinstance(a, DeviceRows) else a.nbytes
                for a in jax.tree.leaves(loaded) if isinstance(a, (np.ndarray, DeviceRows))))
            return _on(loaded, device)
        return placed

    def device_block(self, part):
        return self._placed(("block", part.index), part.block, part)

    def step_block(self, part, l: int):
        if self.built.plan.local[l]:
            return self._placed(("local", part.index), self.built.local_blocks[part.index],
                                part)
        return self.device_block(part)

    def _placed(self, name, block, part):
        cached = self._blocks.get(name)
        if cached is not None:
            return cached
        device = self.device_of_part[part.index]
        if name[0] == "block":
            self.built.store.count(to_device=part.nbytes())
        placed = jax.device_put(block, device)
        # kept where it holds no device memory of its own (the CPU backend adopts aligned
        # host arrays), where the engine would keep every block on the device, and for the
        # node-wise layers' blocks (the engine keeps them all on the device)
        if name[0] == "local" or self._keep_blocks or adopted(block, placed):
            self._blocks[name] = placed
        return placed


class ShardedOutOfCore:
    """The out-of-core engine over several devices, of this process or of several (see the
    module docstring). Arguments are `jgrind.engine.OutOfCore`'s, and

      devices: a number K (the first K of ``jax.devices()``) or a sequence of ``jax.Device``.
      exchange: the route of every layer's halo rows, `DeviceToDevice()` or `ThroughHost()`,
        for every layer or one per layer (None in a sequence: the default). Device to device
        needs the layer's input stored on the devices (`Fate.DEVICE`). None: device to
        device for every aggregating layer whose input is on the devices, through host
        memory for the others.
      rates: the placement's cost rates (`jgrind.plan.placement.Rates`).
      placement: the partitions' devices (`jgrind.plan.placement.Placement`, of
        ``partitioned``'s partitions); None: placed here by ``rates``.

    ``device_budget`` is per device: each device's partitions' device blocks and its working
    set (one partition step at a time) are held to it (`jgrind.plan.cost.Memory.device`).
    A policy that plans the run (`jgrind.plan.auto`) plans it here for these devices
    (``plan``: the `jgrind.plan.planner.Plan`), and runs each layer by the route it chose
    unless ``exchange`` names one.

    Attributes: ``engine`` (the `OutOfCore` engine; its attributes, such as ``store``,
    ``fates`` and ``memory``, are readable here too), ``devices``, ``mesh``, ``placement``,
    ``exchanges`` (the route of every model layer, None for a node-wise one),
    ``device_tiers`` (`jgrind.devices.placed_tier.DeviceTiers`: the bytes the device tier
    holds on each device, and the halo bytes it moved per route, measured),
    ``exchange_bytes_per_epoch`` (bytes of halo rows from partitions on other devices that
    the epoch's steps read, and halo gradients they send back), ``exchange_bytes_by_route``
    (the same, per route), ``exchange_minimum_per_epoch`` (the least any exchange moves: the
    distinct (row, reading device) pairs of every aggregating layer, forward and back); all
    at the widths of the layers the engine runs (`jgrind.executed.split`);
    ``predicted_device_peaks`` (``[K]`` each device's blocks at their peak, by the plan,
    beside ``device_tiers.peak`` measured) and ``device_working_sets``; ``plan`` (the
    planner's `Plan` with `auto`, else None).

    With several processes ``devices`` are those of every process (a number: the first K of
    the global ``jax.devices()``, each process driving some); ``process_tiers`` (a
    `jgrind.devices.across_processes.ProcessTiers`, its ``halo``: the rows that cross),
    ``row_exchange`` (the `RowExchange`), ``process_exchange_bytes_per_epoch`` (the bytes
    of halo rows and halo gradients this process sent the others in the last epoch; summed
    over the processes, every crossing row at every layer boundary) and
    ``process_exchange_minimum_per_epoch`` (the least it could send: each of those rows
    once forward and once back); ``predicted_host_shares`` (``[processes]`` the host bytes
    each process's tiers need by the plan: its own partitions' blocks and the halo rows of
    the others' that it keeps, `jgrind.engine.build.process_host_need`; the host budget is
    per process and holds each process's own). None and 0 in one process.
    """

    def __init__(self, graph, model, optimizer=None, *, devices=None, policy=None,
                 num_parts: Optional[int] = None, exchange=None,
                 rates: Optional[Rates] = None, placement: Optional[Placement] = None,
                 **engine_arguments):
        self.devices = resolve_devices(len(jax.devices()) if devices is None else devices)
        k = len(self.devices)
        processes = jax.process_count()
        if processes > 1:
            _check_processes(self.devices, exchange)
        asked = per_layer(exchange, len(model.layers), None)
        if getattr(getattr(policy, "io", None), "snapshots", False):
            raise ValueError("the naive policy (snapshots of step inputs) is not run over "
                             "devices; train it without devices=")
        pg = engine_arguments.pop("partitioned", None)
        partitioner = engine_arguments.pop("partitioner", label_propagation)
        plans = isinstance(policy, PlansRun)  # `auto`: planned for these devices
        directory = None if engine_arguments.get("store") is None \
            else str(engine_arguments["store"])
        over = {}
        if plans and processes > 1:  # every process plans with process 0's profile
            over = {"profile": _profile_of_process_zero(policy, directory),
                    "device_processes": [d.process_index for d in self.devices]}
        # a saved graph (`jgrind.devices.local.local_graph`): the in-edges of this process's
        # partitions' rows where the partition needs no edges, else its whole structure; its
        # features read as this process's partitions need them. With `auto` the planner
        # plans over those partitions and their placement (by rows and in-edges, at the
        # profile's rates), at the count the assignment or ``num_parts`` gives.
        own_rows = processes > 1 and pg is None and _reads_own_rows(graph, model, partitioner)
        raw = graph
        if own_rows:
            if plans and rates is None:
                rates = Rates.of(over["profile"])
            pg, placement, graph, feature_rows, saved = _own_partitions(
                graph, model, partitioner, num_parts, self.devices, rates, placement)
            num_parts = pg.num_parts
            over.update(partitioned=pg, placement=placement)
        else:
            graph, feature_rows, saved = _structure_and_features(graph)
        self.plan = None
        if plans:
            self.plan = policy.prepare(
                raw if own_rows else graph, model,
                device_budget=engine_arguments.get("device_budget"),
                host_budget=engine_arguments.get("host_budget"), directory=directory,
                partitioner=partitioner, num_parts=num_parts,
                seed=engine_arguments.get("seed", 0), devices=k, **over)
            if processes > 1:  # (each store folder's free space is its own process's)
                from jgrind.devices import processes as joined
                from jgrind.plan.process_shares import plan_fingerprint
                joined.agree(plan_fingerprint(self.plan), "plan (auto)")
            routes = planned_routes(self.plan, model, over.get("profile")
                                    or policy.load_profile(self.plan.directory))
            asked = tuple(a if a is not None else r for a, r in zip(asked, routes))
            pg, placement = self.plan.partitioned, self.plan.placement
            num_parts, policy = self.plan.num_parts, self.plan.policy()
            engine_arguments.setdefault("prediction", self.plan.prediction)
        if getattr(partitioner, "num_parts", None) is not None and num_parts is None:
            num_parts = partitioner.num_parts  # a saved assignment's own count
        parts = k if num_parts is None else num_parts
        if pg is None and callable(partitioner):  # (not callable: the engine says so)
            model.check_fits(graph)  # the engine's first checks, before the partitioning
            whole_number(parts, "num_parts", 1)
            normalized = as_executed(model)[0].normalize(graph)
            pg = partition_graph(normalized, partitioner(normalized, parts,
                                                         seed=engine_arguments.get("seed", 0)),
                                 num_parts=parts)
        # placed before the engine is built: its store keeps device blocks on their devices
        if placement is None and pg is not None:
            placement = place(pg, model, graph.num_features, k, rates)
        elif placement is not None and (placement.num_devices != k or pg is None
                                        or placement.device_of.size != pg.num_parts):
            raise ValueError(f"placement places {placement.device_of.size} partitions on "
                             f"{placement.num_devices} devices; this run has {k} devices"
                             + ("" if pg is None else f" and {pg.num_parts} partitions"))
        self.placement: Placement = placement
        self.device_tiers = DeviceTiers(
            self.devices, np.zeros(0, np.int64) if pg is None else self.placement.device_of)
        tiers = {Fate.DEVICE: self.device_tiers.tier_class()}
        self.process_tiers = None  # several processes: each one's share of every table
        own_parts = None  # the partitions built here: all of them in one process
        if processes > 1 and pg is not None:
            process_of_block = np.array([self.devices[int(d)].process_index
                                         for d in self.placement.device_of], np.int64)
            _agree_on_partitions(saved, pg)
            self.process_tiers = ProcessTiers(halo_rows(pg, process_of_block, processes,
                                                        jax.process_index()))
            tiers.update({fate: self.process_tiers.wrapping(tiers.get(fate, TIERS[fate]),
                                                            CODED_TIERS.get(fate))
                          for fate in (Fate.DEVICE, Fate.HOST, Fate.SSD, Fate.RECOMPUTE)})
            # another process's partitions' step inputs are never used here: not padded,
            # and of their features only the halo rows these partitions read
            own_parts = np.flatnonzero(process_of_block == jax.process_index())
        self.engine = OutOfCore(graph, model, optimizer, policy=policy, num_parts=parts,
                                partitioned=pg, partitioner=partitioner, tiers=tiers,
                                device_of=None if pg is None else self.placement.device_of,
                                own_parts=own_parts, feature_rows=feature_rows,
                                **engine_arguments)
        try:
            self.predicted_host_shares = None
            if self.process_tiers is not None:
                # what each process's host tier holds, by the plan (the host budget's measure)
                plan = self.engine.built.plan
                self.predicted_host_shares = [
                    sum(process_host_need(plan, pg, np.flatnonzero(process_of_block == q)))
                    for q in range(processes)]
                self.process_tiers.read_halo_rows((ACTIVATION, 0), pg, feature_rows)
            self._place(graph, model, asked)
        except BaseException:
            self.engine.close()
            raise

    def _place(self, graph, model, asked: tuple) -> None:
        built = self.engine.built
        self.mesh = Mesh(np.array(self.devices), (AXIS,))
        self._device_of_part = {p: self.devices[int(d)]
                                for p, d in enumerate(self.placement.device_of)}
        self.exchanges = self._routes(model, asked)
        origin = built.executed.origin
        self.device_tiers.routes = {e: self.exchanges[o] for e, o in enumerate(origin)
                                    if self.exchanges[o] is not None}
        for l, steps in enumerate(built.steps):
            built.steps[l] = _PlacedSteps(steps, self)
        me = jax.process_index()
        # the devices of this process: the parameters' home, and the weight gradients' shards
        self._local_devices = [d for d in self.devices if d.process_index == me]
        self._home = self._local_devices[0]
        self.row_exchange: Optional[RowExchange] = None
        self.process_exchange_bytes_per_epoch = 0
        if self.process_tiers is not None:
            # this process runs its own partitions' steps only: the engine built those
            # (``own_parts``), while its plan covers every partition
            firsts = [next(d for d in self.devices if d.process_index == p)
                      for p in range(jax.process_count())]
            self.row_exchange = RowExchange(self.process_tiers, firsts)
        self.engine.runner.sweeps = _PlacedSweeps(built, self._device_of_part,
                                                  self.device_tiers, self.row_exchange)
        # host copies go to the host memory of the device the output is on, not the first's
        built.transfers.pinned_host = None
        built.transfers.keep_device_rows = False
        self._params: dict = {}
        self._sum = _all_reduce(self.mesh)
        self._count_exchange()
        self.process_exchange_minimum_per_epoch = 0 if self.process_tiers is None else \
            self._process_exchange_minimum()
        # per device, by the plan (a last device without partitions holds nothing)
        memory, k = built.plan.memory, len(self.devices)
        self.predicted_device_peaks = np.zeros(k, np.int64)
        self.predicted_device_peaks[:len(memory.device_tables_each)] = memory.device_tables_each
        self.device_working_sets = np.zeros(k, np.int64)
        self.device_working_sets[:len(memory.device_working_sets)] = memory.device_working_sets

    def _on_devices(self, name: str, layer: int) -> bool:
        """Whether every block of executed layer ``layer``'s table ``name`` is on a device."""
        return all(f is Fate.DEVICE for f in self.engine.built.plan.layer_fates(name, layer))

    def _routes(self, model, asked: tuple) -> tuple:
        """The route of every model layer: ``asked`` where given (device to device only for
        a layer whose aggregating input is on the devices), else device to device where it
        is, through host memory where it is not; None for a node-wise layer."""
        built = self.engine.built
        origin, local = built.executed.origin, built.plan.local
        routes = []
        for o, layer in enumerate(model.layers):
            reads = [e for e, of in enumerate(origin) if of == o and not local[e]]
            if not layer.aggregates or not reads:
                routes.append(None)
                continue
            stored = all(self._on_devices(ACTIVATION, e) for e in reads)
            if isinstance(asked[o], DeviceToDevice) and not stored:
                raise ValueError(f"layer {o}'s halo rows cannot go device to device: the plan "
                                 "stores its input on the host or the SSD, from where every "
                                 "device reads them (through host memory); keep that layer "
                                 "on the device (e.g. policies.by_layer) or ask ThroughHost() "
                                 "for it")
            routes.append(asked[o] if asked[o] is not None else
                          DeviceToDevice() if stored else ThroughHost())
        return tuple(routes)

    def _count_exchange(self) -> None:
        """``exchange_bytes_per_epoch`` (and per route) from the schedule the engine runs, and
        the minimum."""
        built, pg = self.engine.built, self.engine.built.pg
        crossing = 0  # halo rows a step reads from partitions on another device
        for part in pg.partitions:
            owners = np.asarray(part.halo_owner, np.int64)
            crossing += int(np.count_nonzero(self.placement.device_of[owners]
                                             != self.placement.device_of[part.index]))
        distinct = _distinct_crossing(pg, self.placement.device_of)
        widths, local, origin = built.plan.widths, built.plan.local, built.executed.origin
        moved = {DEVICE_TO_DEVICE: 0, THROUGH_HOST: 0}
        minimum = 0

        def route(name: str, l: int) -> str:
            # a table on the devices moves by its layer's route; one on the host or the SSD
            # is read from there
            direct = isinstance(self.exchanges[origin[l]], DeviceToDevice) \
                and self._on_devices(name, l)
            return DEVICE_TO_DEVICE if direct else THROUGH_HOST

        for sweep in built.plan.schedule.sweeps:
            l = sweep.layer
            if local[l]:
                continue
            rows = crossing * widths[l]
            # every gather of the layer's input reads its halo rows: the forward's, a
            # recomputation's, and a backward's that does not start from a kept aggregation
            # (the top layer's, whose forward runs in its backward step, is its only one)
            if sweep.kind in (FORWARD, RECOMPUTE) or (sweep.kind == BACKWARD
                                                     and sweep.variant not in FROM_KEPT):
                moved[route(ACTIVATION, l)] += rows
            if sweep.kind == BACKWARD and sweep.variant not in _PARAMS_ONLY:
                moved[route(GRADIENT, l)] += rows  # halo gradients go back
                minimum += distinct * widths[l]
        # the least: every aggregating layer's halo rows read once
        minimum += distinct * sum(w for w, node_wise in zip(widths, local) if not node_wise)
        # the executed model's widths (a GCN layer aggregates its narrower side,
        # `jgrind.executed.split`): the rows this executor moves
        self.exchange_bytes_by_route = {r: ITEMSIZE * n for r, n in moved.items()}
        self.exchange_bytes_per_epoch = sum(self.exchange_bytes_by_route.values())
        self.exchange_minimum_per_epoch = ITEMSIZE * minimum

    def _process_exchange_minimum(self) -> int:
        """The least this process sends the others per epoch: at every layer boundary that
        aggregates above the features (each process reads those from the graph), the rows of
        its partitions that theirs read as halo, once, and the halo gradients of their rows
        that its partitions read, once; each row in its stored words (`RowExchange`: a host
        or SSD block's in its storage dtype)."""
        halo, plan = self.process_tiers.halo, self.engine.built.plan
        others = [q for q in range(halo.count) if q != halo.me]

        def per_block(blocks: list) -> np.ndarray:
            return np.bincount(np.concatenate(blocks + [np.zeros(0, np.int64)]),
                               minlength=plan.num_parts)
        # [P] rows of each block: those sent forward (this process's), and those whose halo
        # gradients go back (the others')
        sent = per_block([halo.sent(q)[0] for q in others])
        back = per_block([halo.received(q)[0] for q in others])
        storage = plan.workload.storage

        def words(rows: np.ndarray, name: str, l: int) -> int:
            coded = np.array([f in CODED_TIERS for f in plan.layer_fates(name, l)])
            stored = storage.codec(name).words(plan.widths[l])
            return int(np.sum(rows * np.where(coded, stored, plan.widths[l])))
        return ITEMSIZE * sum(words(sent, ACTIVATION, l) + words(back, GRADIENT, l)
                              for l in range(1, plan.num_layers) if not plan.local[l])

    # -- running ------------------------------------------------------------------------------
    def _params_on(self, params, device):
        """``params`` (one layer's) on ``device``, put there once an epoch."""
        key = (id(params), device)
        held = self._params.get(key)
        if held is None or held[0] is not params:
            held = (params, _on(params, device))
            self._params[key] = held
        return held[1]

    def loss_and_grad(self, params, key):
        """``(loss, grads)`` of the full-graph loss: every device's partitions' sums, added
        by the devices' collective."""
        executed = self.engine.built.executed
        self._params.clear()
        if self.row_exchange is not None:
            self.row_exchange.reset()
        try:
            loss, grads = self.engine.runner.loss_and_grad(executed.split_params(params), key)
        finally:
            self._params.clear()
        if self.row_exchange is not None:
            self.process_exchange_bytes_per_epoch = self.row_exchange.moved
        grads = tuple(self._total(g) for g in grads)
        return self._total(loss), executed.merge_params(grads)

    def _total(self, sums):
        """The sum over devices of a `PerDevice` (a ``psum`` on the mesh), on the first
        device; a plain value (no step added to it) as it is."""
        if not isinstance(sums, PerDevice):
            if self.row_exchange is None:
                return jax.device_put(sums, self._home)
            # no step of this process added to it: its zeros join the others' sums (every
            # process runs the same collectives)
            sums = PerDevice({self._home: jax.device_put(sums, self._home)})
        like = next(iter(sums.values.values()))
        parts = [sums.values.get(d) if d in sums.values else
                 jax.tree.map(lambda a, d=d: jnp.zeros(a.shape, a.dtype, device=d), like)
                 for d in self._local_devices]
        sharding = NamedSharding(self.mesh, P(AXIS))
        k = len(self.devices)
        stacked = jax.tree.map(
            lambda *leaves: jax.make_array_from_single_device_arrays(
                (k, *leaves[0].shape), sharding, [a[None] for a in leaves]),
            *parts)
        total = collective("adding the weight gradients", lambda: jax.tree.map(
            lambda a: np.asarray(a.addressable_data(0)), self._sum(stacked)))
        return jax.device_put(total, self._home)

    def step(self, params, opt_state, key):
        if self.engine.optimizer is None:
            raise ValueError("this executor was made without an optimizer, for predictions "
                             "only; pass one (e.g. optax.adam(0.01)) to train with it")
        # on this process's first device before anything reads them: a state restored from
        # a checkpoint arrives as NumPy arrays (`jgrind.checkpoint`)
        params, opt_state = jax.device_put((params, opt_state), self._home)
        loss, grads = self.loss_and_grad(params, key)
        params, opt_state = self.engine.built.update(params, opt_state, grads, loss)
        return params, opt_state, loss

    def predict(self, params) -> np.ndarray:
        self._params.clear()
        return self._whole(self.engine.predict(params))

    def embed(self, params, layer: int) -> np.ndarray:
        self._params.clear()
        return self._whole(self.engine.embed(params, layer))

    def _whole(self, rows: np.ndarray) -> np.ndarray:
        """``[N, width]`` rows of which this process computed its own partitions' nodes',
        completed with every other process's (several processes; else as they are)."""
        if self.row_exchange is None:
            return rows
        from jax.experimental import multihost_utils
        every = collective("gathering the predictions", lambda: np.asarray(
            multihost_utils.process_allgather(np.asarray(rows))))
        pg = self.engine.built.pg
        process_of_node = self.process_tiers.halo.process_of_block[pg.assignment]
        return every[process_of_node, np.arange(rows.shape[0])]

    def close(self) -> None:
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):
        if name == "engine":  # not yet built
            raise AttributeError(name)
        return getattr(self.engine, name)


def _structure_and_features(graph):
    """``(graph, feature_rows, saved)``: a `jgrind.datasets.saved_arrays.SavedGraph` whose
    partition reads edges (`_reads_own_rows` is false: a partitioner that reads them, or a
    ready ``partitioned``) as the `Graph` of its whole CSR structure
    (`jgrind.devices.local.saved_structure`), the reader of its feature rows and its
    `SavedArrays`; any other graph as it is, with ``graph.features[rows]`` and None."""
    from jgrind.datasets.saved_arrays import SavedGraph
    if not isinstance(graph, SavedGraph):
        return graph, graph.features.__getitem__, None
    from jgrind.devices import local
    return local.saved_structure(graph), local.FeatureRows(graph.saved), graph.saved


def _distinct_crossing(pg, device_of_part: np.ndarray) -> int:
    """The distinct (row, reading device) pairs of ``pg`` whose row another device owns: what
    `jgrind.plan.exchange.exchange_plan` counts from the normalised graph's edges, counted
    from every partition's halo (a process reading only its own rows holds no other edges)."""
    offsets = np.asarray(pg.offsets, np.int64)
    device_of_part = np.asarray(device_of_part, np.int64)
    total = 0
    for device in np.unique(device_of_part):
        keys = []
        for part in pg.partitions:
            if device_of_part[part.index] != device:
                continue
            owners = np.asarray(part.halo_owner, np.int64)
            far = device_of_part[owners] != device
            keys.append(offsets[owners[far]] + np.asarray(part.halo_row, np.int64)[far])
        total += np.unique(np.concatenate(keys + [np.zeros(0, np.int64)])).size
    return int(total)


def _reads_own_rows(graph, model, partitioner) -> bool:
    """Whether one process of several reads of `SavedGraph` ``graph`` only the in-edges of its
    own partitions' rows (`_own_partitions`): the partition needs no edges (`contiguous`, or a
    saved assignment) and ``model``'s normalisation has a row-wise form."""
    from jgrind.datasets.saved_arrays import SavedGraph
    from jgrind.devices import local
    from jgrind.partition.partitioners import contiguous
    if not isinstance(graph, SavedGraph) or model.name not in local.SUPPORTED_MODELS:
        return False
    return getattr(partitioner, "path", None) is not None \
        or getattr(partitioner, "__wrapped__", partitioner) is contiguous


def _own_partitions(graph, model, partitioner, num_parts, devices: list, rates, placement):
    """``(partitioned, placement, graph, feature_rows, saved)`` of `SavedGraph` ``graph`` for
    one process of several, reading of its edges only its own partitions' rows' in-edges: the
    assignment without edges (`jgrind.devices.local.local_assignment`), checked the same in
    every process before any other collective; the placement by rows and in-edges
    (`jgrind.devices.local.degree_placement`) unless given; the `PartitionedGraph` of its own
    partitions, the others' halos and sizes sent by their processes
    (`jgrind.devices.local.own_partitioned`)."""
    from jgrind.devices import local, processes
    saved = graph.saved
    executed = as_executed(model)[0]
    model.check_fits(graph)
    local.check_homogeneous(saved)
    assignment = local.local_assignment(saved, partitioner, num_parts, len(devices))
    processes.agree(local.fingerprint(saved, assignment), "saved graph or partition assignment")
    parts = int(assignment.max(initial=-1)) + 1
    if placement is None:
        placement = local.degree_placement(saved, executed, assignment, len(devices), rates)
    elif placement.num_devices != len(devices) or placement.device_of.size != parts:
        raise ValueError(f"placement places {placement.device_of.size} partitions on "
                         f"{placement.num_devices} devices; this run has {len(devices)} "
                         f"devices and {parts} partitions")
    process_of_part = np.array([devices[int(d)].process_index for d in placement.device_of],
                               np.int64)
    pg = local.own_partitioned(graph, executed, assignment, process_of_part)
    return pg, placement, pg.graph, local.FeatureRows(saved), saved


def _agree_on_partitions(saved, pg) -> None:
    """`jgrind.devices.processes.ProcessError` in every process unless every process cut
    the same partitions: each builds only its own, and reads the others' rows as it cut
    them. With a saved graph ``saved`` (each process reading only what it needs), the
    graph's description and the assignment (`jgrind.devices.local.fingerprint`); else the
    assignment."""
    import hashlib

    from jgrind.devices import local, processes
    if saved is not None:
        processes.agree(local.fingerprint(saved, pg.assignment),
                        "saved graph or partition assignment")
        return
    processes.agree(hashlib.sha256(np.ascontiguousarray(pg.assignment).tobytes()).hexdigest(),
                    "partition assignment")


def _check_processes(devices: list, exchange) -> None:
    """One line (a ValueError; `ProcessError` for devices missing a process)
    for what the out-of-core engine does not run over several processes, before anything is
    built."""
    from jgrind.devices.processes import ProcessError
    missing = sorted(set(range(jax.process_count())) - {d.process_index for d in devices})
    if missing:
        raise ProcessError(f"process {missing[0]} drives none of the {len(devices)} devices "
                         "asked for; with several processes, ask for every process's devices "
                         "(--devices: all of them)")
    chosen = exchange if isinstance(exchange, (list, tuple)) else (exchange,)
    if any(isinstance(e, DeviceToDevice) for e in chosen):
        raise ValueError("halo rows go device to device within one process only; between "
                         "processes they cross by a collective from the host and SSD tiers: "
                         "leave exchange= out or ask ThroughHost()")


def _profile_of_process_zero(policy, directory: Optional[str]):
    """The hardware profile `auto` plans with over several processes: process 0's
    (`policy.load_profile`: its saved one, or measured there), sent to every process. A
    profile each process read itself would carry its own free memory, which the budgets come
    from, and where none is saved every process would measure at once; with one profile the
    processes plan the same run. `ProcessError` in the others where process 0 fails (its own
    output says why)."""
    import json

    from jgrind.broadcast import broadcast_bytes
    from jgrind.devices.processes import ProcessError
    from jgrind.plan.hardware import Profile
    data = None
    if jax.process_index() == 0:
        try:
            data = json.dumps(policy.load_profile(directory).to_json()).encode()
        except Exception:
            broadcast_bytes(b"")  # the others stop with a line of their own
            raise
    data = broadcast_bytes(data)
    if not data:
        raise ProcessError("process 0 could not load or measure the hardware profile that "
                           "auto plans with (its own output says why)")
    return Profile.from_json(json.loads(data.decode()))


def through_host_policy():
    """The policy of a run over several devices with out-of-core arguments but none named:
    every activation and gradient block in host RAM (`policies.host_offload`), and each
    layer's aggregation kept there from forward to backward, so that a backward step starts
    from it instead of gathering its halo rows from the other devices again. On the 200k-node
    R-MAT GCN (8 partitions) that cut the halo bytes per epoch from 3.00x the minimum to
    1.97x on 2 devices, and from 2.08x to 1.36x on 4."""
    from jgrind.plan import policies
    return policies.host_offload(aggregations=Fate.HOST)


def _all_reduce(mesh: Mesh):
    """``stacked -> sum over the mesh's devices``: a ``psum`` under `jax.shard_map`."""
    def total(stacked):
        return jax.tree.map(lambda a: jax.lax.psum(a[0], AXIS), stacked)
    return jax.jit(jax.shard_map(total, mesh=mesh, in_specs=P(AXIS), out_specs=P(),
                                 check_vma=False))
