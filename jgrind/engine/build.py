"""Building an out-of-core engine: everything made once, before the first epoch.

`build` checks the arguments, partitions the graph, binds the policy to the tensors, checks
the plan against the budgets, derives the epoch's `jgrind.plan.schedule.Schedule`, opens the
store, copies the features into it, puts the blocks' structure on the device, starts the
loader and writer threads and jits the steps. It returns a `Built`: a plain record that
`jgrind.engine.runner.Runner` runs epochs on. Nothing in it changes from epoch to epoch except
the stored values and the buffers kept for reuse.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from typing import Callable, Collection, Optional

import jax
import numpy as np
import optax

from jgrind.hostio import host_memory, transfers
from jgrind.arguments import whole_number
from jgrind.engine.pipeline import Pipeline, TransferSettings
from jgrind.engine.spares import Spares
from jgrind.engine.compile_effort import QUICK, CompileEffort
from jgrind.engine.steps import LayerSteps, PaddedPartition, layer_steps, pad_partition
from jgrind.engine.store import BudgetError, Store
from jgrind.graph import Graph
from jgrind.loss import node_weights
from jgrind.models.block import Block
from jgrind.models.conv import derivative_from_output
from jgrind.models.model import GNN
from jgrind.executed.split import as_executed
from jgrind.partition import PartitionedGraph, partition_graph, shape_groups
from jgrind.plan.budgets import UNLIMITED, check_budget
from jgrind.plan.cost import (Assignment, Memory, Workload, fit_masks, format_bytes,
                              format_minimum, least_device_budget, memory)
from jgrind.plan.fates import ACTIVATION, AGGREGATION, GRADIENT, Fate, check_fate, storage_of
from jgrind.plan import process_shares
from jgrind.plan.inventory import aggregation_widths, build_inventory, layer_widths
from jgrind.plan.policies import grinnder
from jgrind.plan.protocols import (BindContext, IOStrategy, bind, check_policy, io_strategy,
                                   least_budgets, store_directory)
from jgrind.plan.schedule import Schedule, epoch_schedule

# Step inputs whose buffers the store keeps for reuse (`_input_buffer_bytes`): the running
# step's, the one loading behind it, and the one before, which XLA may not have released yet.
INPUT_BUFFERS = 3

# Row ranges a large step input is sent to the device in at once (`pipeline._put`), off the CPU
# backend. On an H200 one traced `host_offload` epoch took 2.67 s with 1 and 1.59 s with 8
# (tools/trace_epoch.py --variants default,pieces-8,pageable): the host-side staging of a
# transfer from pageable memory runs on one runtime thread per transfer. On the CPU backend a
# put adopts the buffer without a copy, and 8 made no difference there.
GPU_STAGING_PIECES = 8

# Page-locked input buffers on the CPU backend too (its ``pinned_host`` memory), off by
# default: there a put adopts an aligned buffer without a copy anyway. Tools and tests set it
# to run the GPU's path on a CPU (tools/trace_epoch.py --gpu-paths).
PINNED_STAGING_ON_CPU = False


@dataclasses.dataclass(frozen=True)
class BoundPlan:
    """The policy bound to the run's tensors, and what follows from it: plain values.

    Attributes:
      num_layers, num_parts: layers as executed; partitions of the graph.
      widths: ``[L + 1]`` features of each layer's input (the last: the logits).
      inventory: every stored tensor's description (`jgrind.plan.inventory`).
      workload: shapes the cost model and the budget checks read (`Workload`), with output
        masks on where the device budget holds them.
      policy, io: the bound policy and how it moves inputs (`IOStrategy`).
      fates: ``{(tensor name, layer, partition): Fate}``.
      kept: ``{layer: fates of its aggregation's blocks}`` for the layers whose aggregation is
        kept from forward to backward.
      local: per layer, whether it is node-wise (reads its own block, no halo).
      memory: the plan's peak bytes per tier (`jgrind.plan.cost.memory`).
      schedule: the training epoch's sweeps in order.
    """

    num_layers: int
    num_parts: int
    widths: list
    inventory: list
    workload: Workload
    policy: Callable
    io: IOStrategy
    fates: dict
    kept: dict
    local: list
    memory: Memory
    schedule: Schedule

    def layer_fates(self, name: str, layer: int) -> list[Fate]:
        """The fate of every partition's block of ``name`` at ``layer`` (HOST where the
        policy named none)."""
        return [self.fates.get((name, layer, p), Fate.HOST) for p in range(self.num_parts)]

    def host_bytes(self, name: str, layer: int, fate: Fate = Fate.HOST) -> int:
        """Bytes of layer ``layer``'s blocks of ``name`` that ``fate`` puts in host RAM: host
        blocks in their storage dtype (`Workload.stored_bytes`), a recomputed layer's float32."""
        parts = [p for p in range(self.workload.num_parts)
                 if self.fates.get((name, layer, p), Fate.HOST) is fate]
        if fate is Fate.RECOMPUTE:
            return 4 * int(self.workload.owned[parts].sum()) * self.widths[layer]
        return int(self.workload.stored_bytes(name, layer)[parts].sum())

    def snapshot_rows(self, l: int) -> np.ndarray:
        """Rows of each partition's snapshot of layer l's step input (the naive scheme): its
        own and halo rows, or its own rows only for a node-wise layer."""
        return _snapshot_rows(self.workload, self.local, l)


@dataclasses.dataclass(frozen=True)
class Built:
    """What `build` made: the plan and the resources an epoch runs on.

    Attributes:
      plan: the bound, checked plan (`BoundPlan`).
      model: the layers as executed (narrowing GCN layers split in two); ``given_model``: as
        the user built it; ``executed``: the record that maps one to the other
        (`jgrind.executed.split.as_executed`).
      optimizer: the optax transformation, or None (predictions only); ``update``: its
        jitted step ``(params, opt_state, grads, loss) -> (params, opt_state)``, donating
        the first two.
      device_budget, host_budget: bytes (`UNLIMITED` where none was given).
      pg: the partitioned, normalised graph; ``num_nodes``: its nodes.
      parts: the padded partitions with owned nodes, in the order every sweep runs them.
      steps: per executed layer, its jitted step functions (`LayerSteps`).
      store: the tiers' storage; ``activations``: ``H_l`` per layer (``H_0``: the features);
        ``aggregations``: ``{layer: Z_layer}`` for kept aggregations.
      blocks: ``{partition: block structure on the device}``, empty when it does not fit
        beside the plan; ``local_blocks``: the same without halo for node-wise layers.
      spares: step outputs kept for the next step of their shape (`Spares`).
      pipeline: the loader and writer threads; ``transfers``: its and the runner's
        host-device transfer settings (`TransferSettings`).
      largest_output: bytes of the largest step output ``spares`` may keep.
    """

    plan: BoundPlan
    model: GNN
    given_model: GNN
    executed: object
    optimizer: Optional[optax.GradientTransformation]
    update: Callable
    device_budget: int
    host_budget: int
    pg: PartitionedGraph
    num_nodes: int
    parts: list
    steps: list
    store: Store
    activations: list
    aggregations: dict
    blocks: dict
    local_blocks: dict
    spares: Spares
    pipeline: Pipeline
    transfers: TransferSettings
    largest_output: int

    def close(self) -> None:
        self.pipeline.close()
        self.store.close()


def build(graph: Graph, model: GNN, optimizer=None, *, policy=None, num_parts: int = 4,
          partitioner: Callable, partitioned: Optional[PartitionedGraph] = None,
          split: int = 0, store: Optional[str] = None, device_budget: Optional[int] = None,
          host_budget: Optional[int] = None, remat_policy=None, prefetch: bool = True,
          max_shapes: int = 3, seed: int = 0, loss: Optional[Callable] = None,
          tiers: Optional[dict] = None, compile_effort: CompileEffort = QUICK,
          device_of: Optional[np.ndarray] = None,
          own_parts: Optional[Collection[int]] = None,
          feature_rows: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> Built:
    """Everything an out-of-core run needs before its first epoch (the arguments are
    `jgrind.engine.OutOfCore`'s). Raises before any file is written where an argument, the
    plan or a budget is wrong; removes what it wrote when stopped later.

    ``own_parts``: the partitions whose steps run here (one process of several,
    `jgrind.devices.ShardedOutOfCore`); only those are padded and have their features
    written, while the plan still covers every partition. None: all of them.
    ``feature_rows``: ``rows -> [len(rows), F]``, the features of nodes ``rows`` (ascending
    global ids), so that a process can read them from a saved graph instead of holding
    ``graph.features``; None: ``graph.features[rows]``."""
    check_arguments(graph, model, policy, num_parts, partitioner, partitioned, split,
                    max_shapes, seed, store)
    device_budget = check_budget(device_budget, "device_budget")
    host_budget = check_budget(host_budget, "host_budget")
    given_model = model
    model, executed = as_executed(model)
    if partitioned is None:
        normalized = model.normalize(graph)
        partitioned = partition_graph(normalized, partitioner(normalized, num_parts, seed=seed),
                                      num_parts=num_parts)
    pg = partitioned
    # fewer shapes where they cost the same memory and little padding (`shape_count`): the
    # plan and the padded partitions both take this count
    max_shapes = shape_count(pg.partitions, max_shapes)
    plan = bind_plan(model, pg, graph.num_features, policy, device_budget, host_budget, store,
                     max_shapes, prefetch, device_of)
    budgets = (UNLIMITED if device_budget is None else int(device_budget),
               UNLIMITED if host_budget is None else int(host_budget))
    check_budgets(plan, *budgets,
                  share=None if own_parts is None else process_host_need(plan, pg, own_parts))
    parts = _padded_parts(graph, model, pg, split, max_shapes, own_parts)
    common = dict(plan=plan, model=model, given_model=given_model, executed=executed,
                  optimizer=optimizer, update=_jitted_update(optimizer),
                  device_budget=budgets[0], host_budget=budgets[1], pg=pg,
                  num_nodes=graph.num_nodes, parts=parts,
                  steps=_layer_steps(model, plan.workload, remat_policy, loss,
                                     compile_effort),
                  largest_output=_largest_output(parts, plan.widths, plan.num_layers))
    opened = _open_store(plan, pg, parts, budgets, store, common["largest_output"], tiers,
                         own_parts)
    if feature_rows is None:
        feature_rows = graph.features.__getitem__
    return _with_resources(opened, feature_rows, prefetch, common)


def _with_resources(opened: Store, feature_rows: Callable, prefetch: bool,
                    common: dict) -> Built:
    """The record, with the tables, the features copied in, the device blocks, the threads
    and the spares. From here the run has files in its store folder: an error or a signal
    (Ctrl-C, SIGTERM) before the record is returned removes them, as `Built.close` does
    later."""
    plan, parts, budget = common["plan"], common["parts"], common["device_budget"]
    pipeline = None
    try:
        activations = [opened.table(ACTIVATION, l, plan.widths[l],
                                    plan.layer_fates(ACTIVATION, l))
                       for l in range(plan.num_layers)]
        widths = aggregation_widths(common["model"])
        aggregations = {l: opened.table(AGGREGATION, l, widths[l], fates)
                        for l, fates in plan.kept.items()}
        for part in parts:  # the partitions with owned nodes that run here
            activations[0].write(part.index, feature_rows(common["pg"].partitions[
                part.index].owned))
        # The blocks' structure is the same every epoch: keep device copies when they fit
        # next to the plan, instead of transferring every block again in each of the 2L
        # sweeps. (Conservative by one partition's structure: ``memory.device`` counts it in
        # the working set, for the block a step would be sent.)
        structure = sum(part.nbytes() for part in parts)
        blocks = ({part.index: jax.device_put(part.block) for part in parts}
                  if plan.memory.device + structure <= budget else {})
        local_blocks = {part.index: jax.device_put(_local_block(part))
                        for part in parts} if any(plan.local) else {}
        settings = _transfer_settings(opened.input_staging)
        pipeline = Pipeline(prefetch, opened.count, settings)
        # Stored step outputs, donated to the next step of the same shape (no fresh pages).
        # A kept one lives from its write to that step's end, where without it the step's own
        # buffer would live from the step's start: one more output alive, which the device
        # budget must hold beside the plan (the 1M-node benchmark: +0.16-0.25 GiB of peak
        # RSS, docs/results-history.md section 4).
        spares = Spares(enabled=plan.memory.device + common["largest_output"] <= budget)
        return Built(**common, store=opened, activations=activations,
                     aggregations=aggregations, blocks=blocks, local_blocks=local_blocks,
                     spares=spares, pipeline=pipeline, transfers=settings)
    except BaseException:
        if pipeline is not None:
            pipeline.close()
        opened.close()
        raise


def check_arguments(graph, model, policy, num_parts, partitioner, partitioned, split,
                    max_shapes, seed, store) -> None:
    """ValueError (or PolicyError, GraphError) naming a bad argument of `OutOfCore`, before
    any work: not an IndexError from NumPy inside the partitioning later."""
    model.check_fits(graph)
    if policy is not None:
        check_policy(policy)
        named = store_directory(policy)
        if store is not None and named is not None and \
                os.path.abspath(os.fspath(store)) != os.path.abspath(named):
            raise ValueError(f"two store directories: the policy names {named}, store= names "
                             f"{store}; pass one of them")
    if not callable(partitioner):
        raise ValueError(f"partitioner must be a function (graph, num_parts, seed=...) -> "
                         f"assignment, e.g. jgrind.partition.label_propagation; got "
                         f"{partitioner!r}")
    graph.check_split(split)
    whole_number(max_shapes, "max_shapes", 1)
    whole_number(seed, "seed", 0)
    if partitioned is None:
        whole_number(num_parts, "num_parts", 1)
    elif partitioned.num_nodes != graph.num_nodes:
        raise ValueError(f"partitioned is a partitioning of another graph "
                         f"({partitioned.num_nodes} nodes) than {graph.name} "
                         f"({graph.num_nodes}); partition this graph (its model.normalize)")


def bind_plan(model: GNN, pg: PartitionedGraph, num_features: int, policy,
              device_budget: Optional[int], host_budget: Optional[int], store: Optional[str],
              max_shapes: int, prefetch: bool,
              device_of: Optional[np.ndarray] = None) -> BoundPlan:
    """A fate for every block, and the memory and schedule that follow from them. ``model``:
    the layers as executed; the budgets as given (None: unlimited); ``device_of``: the
    device of every partition on several devices (the device budget is then per device,
    `jgrind.plan.cost.Workload.device_of`)."""
    num_layers = len(model.layers)
    inventory = build_inventory(model, pg)
    # output masks (ReLU layers' backward without recomputing the output) when they fit
    workload = fit_masks(Workload.build(pg, model, max_shapes).on_devices(device_of),
                         device_budget)
    if policy is None:
        policy = grinnder(UNLIMITED if device_budget is None else int(device_budget),
                          UNLIMITED if host_budget is None else int(host_budget), store,
                          device_reserve=workload.working_set())
    context = BindContext(workload, device_budget, host_budget,
                          None if store is None else str(store))
    policy = bind(policy, inventory, context)
    # the host and SSD blocks' storage dtypes, which the memory plan prices
    workload = dataclasses.replace(workload, storage=storage_of(policy))
    fates = {(i.name, i.layer, i.partition): check_fate(i, policy(i)) for i in inventory}
    layer_fates = functools.partial(_all_or_none, fates, pg.num_parts)
    for name in (ACTIVATION, GRADIENT):
        for l in range(num_layers):
            layer_fates(name, l)
    # layers whose aggregation is kept (all blocks, or none: then the layer regathers)
    kept = {l: layer_fates(AGGREGATION, l) for l in aggregation_widths(model)}
    kept = {l: f for l, f in kept.items() if Fate.RECOMPUTE not in f}
    # node-wise layers read own blocks (the naive scheme snapshots those)
    local = [not getattr(layer, "aggregates", True) for layer in model.layers]
    io = io_strategy(policy)
    schedule = epoch_schedule(
        num_layers, recomputed=[l for l in range(1, num_layers)
                                if Fate.RECOMPUTE in layer_fates(ACTIVATION, l)],
        kept=kept, masked=[l for l in range(num_layers) if workload.masked(l)],
        snapshots=io.snapshots, prefetch=prefetch)
    return BoundPlan(num_layers, pg.num_parts, layer_widths(model, num_features),
                     inventory, workload, policy, io, fates, kept, local,
                     _memory_plan(workload, fates, local, io, num_layers), schedule)


def _all_or_none(fates: dict, num_parts: int, name: str, layer: int) -> list[Fate]:
    """Every partition's fate of ``name`` at ``layer``; ValueError where RECOMPUTE is chosen
    for some of them only."""
    chosen = [fates.get((name, layer, p), Fate.HOST) for p in range(num_parts)]
    if Fate.RECOMPUTE in chosen and any(f is not Fate.RECOMPUTE for f in chosen):
        why = ("its backward either regathers the layer's input or reads the kept "
               "aggregation, for all partitions" if name == AGGREGATION else
               "recomputing a block needs its whole previous layer")
        raise ValueError(f"{name} of layer {layer}: RECOMPUTE must be chosen for all "
                         f"partitions of a layer or none ({why})")
    return chosen


def _snapshot_rows(workload: Workload, local: list, l: int) -> np.ndarray:
    return np.array(workload.owned if local[l] else workload.inputs, np.int64)


def _memory_plan(workload: Workload, fates: dict, local: list, io: IOStrategy,
                 num_layers: int) -> Memory:
    """Peak bytes per tier by the store's accounting (`jgrind.plan.cost.memory`, the same
    function the planner predicts with)."""
    snapshot = 0
    if io.snapshots:  # step inputs of layers 0..L-2, forward to backward
        snapshot = 4 * sum(int(_snapshot_rows(workload, local, l).sum()) * workload.widths[l]
                           for l in range(num_layers - 1))
    assignment = Assignment.from_fates(fates, num_layers, workload.num_parts)
    return memory(workload, assignment, snapshot_bytes=snapshot)


def check_budgets(plan: BoundPlan, device_budget: int, host_budget: int,
                  share: Optional[tuple] = None) -> None:
    """BudgetError, with the least budgets that run, where the plan does not fit them.

    ``share``: one process's host bytes of several (`process_host_need`, ``(blocks,
    halo)``), which the host budget then holds instead of the whole plan's: each process's
    host tier keeps its own partitions' blocks and the halo rows it reads of the others'."""
    m, num_parts = plan.memory, plan.num_parts
    # The minimum stated is one that runs: a budget-aware policy's own (`Budgeted` finds the
    # device budget its packing fits, beside the working set), else this plan's blocks beside
    # the working set the engine uses at that budget (masks on once they fit).
    least_device, least_host = least_budgets(plan.policy)
    least = least_device or least_device_budget(plan.workload, m.device_tables)
    if m.device_working_set > device_budget:
        raise BudgetError(
            f"the device budget {format_bytes(device_budget)} is below one partition's "
            f"working set ({format_bytes(m.device_working_set)} at least); use more partitions "
            f"(now {num_parts}) or a device budget of at least {format_minimum(least)}")
    if m.device > device_budget:
        raise BudgetError(
            f"the plan keeps {format_bytes(m.device)} on the device (blocks "
            f"{format_bytes(m.device_tables)} + working set "
            f"{format_bytes(m.device_working_set)}) but the device budget is "
            f"{format_bytes(device_budget)}; raise it to at least "
            f"{format_minimum(least)} or choose a policy that offloads more")
    if least_device is not None:
        # the policy fits the device and host budgets but has blocks left for an SSD tier
        # this run has no directory for
        raise BudgetError(
            f"the blocks do not fit in the device budget {format_bytes(device_budget)} "
            f"(beside one partition's working set of {format_bytes(m.device_working_set)}) "
            f"and the host budget {format_bytes(host_budget)}, and there is no store "
            f"directory for the rest; raise the device budget to at least "
            f"{format_minimum(least)}"
            + (f" or the host budget to at least {format_minimum(least_host)}"
               if least_host else "")
            + ", or give a store directory on a fast disk (CLI: --store DIR)")
    offload = ("or send more blocks to the SSD tier (e.g. the ssd_offload or grinnder policy "
               "with a store directory; CLI: --policy ssd --store DIR)")
    if share is not None:
        blocks, halo = share
        if blocks + halo > host_budget:
            raise BudgetError(
                f"this process's share of the plan keeps {format_bytes(blocks + halo)} in "
                f"host RAM (its partitions' blocks {format_bytes(blocks)} + halo rows of "
                f"other processes' blocks {format_bytes(halo)}) but the host budget per "
                f"process is {format_bytes(host_budget)}; raise it to at least "
                f"{format_minimum(blocks + halo)} {offload}")
    elif m.host > host_budget:
        raise BudgetError(
            f"the plan keeps {format_bytes(m.host)} in host RAM but the host budget is "
            f"{format_bytes(host_budget)}; raise it to at least {format_minimum(m.host)} "
            f"{offload}")


def process_host_need(plan: BoundPlan, pg: PartitionedGraph,
                      own_parts: Collection[int]) -> tuple[int, int]:
    """``(blocks, halo)``: the host bytes of one process of several whose partitions are
    ``own_parts`` (`jgrind.devices.ShardedOutOfCore`). ``blocks``: `memory`'s host bytes for
    those partitions' blocks alone, at the plan's fates. ``halo``: the float32 rows of other
    processes' blocks that those partitions read as halo, which the process keeps in host RAM
    whatever the blocks' tiers, the device's included
    (`jgrind.devices.across_processes.ProcessTier`'s ``remote``), while a sweep needs them:
    the features' all run, one layer's input and one layer's gradient at a time
    (`jgrind.plan.process_shares.halo_bytes`)."""
    mine, halo = _process_share(plan, pg, own_parts)
    return int(mine.host), halo


def _process_share(plan: BoundPlan, pg: PartitionedGraph,
                   own_parts: Collection[int]) -> tuple[Memory, int]:
    """`process_host_need`'s parts: the `Memory` of partitions ``own_parts``' blocks alone
    and the halo bytes (`jgrind.plan.process_shares`, as the planner counts them)."""
    own = np.zeros(plan.num_parts, bool)
    own[np.asarray(list(own_parts), np.int64)] = True
    assignment = Assignment.from_fates(plan.fates, plan.num_layers, plan.num_parts)
    return (process_shares.own_memory(plan.workload, assignment, own),
            process_shares.halo_bytes(plan.workload, process_shares.halo_rows_read(pg, own)))


# How much more padding (input rows, edges) `shape_count` accepts for fewer shapes, as a
# fraction of the padded totals at the requested count. Each shape fewer saves a program per
# jitted step and per device-table operation of that shape, compiled in the first epoch (about
# 0.24 s each on an H200 without autotuning, tests/test_program_count.py); 2 % more padded rows
# add at most 2 % to every later epoch's gathers, transfers and dense products.
SHAPE_PADDING_TOLERANCE = 0.02


def shape_count(partitions, max_shapes: int) -> int:
    """The fewest padded shapes, at most ``max_shapes``, that `shape_groups` can cut
    ``partitions`` into without costing memory or more than `SHAPE_PADDING_TOLERANCE` padding.

    Fewer shapes are taken only where every partition keeps its padded output rows and every
    shape is no larger in any dimension than one of ``max_shapes``' shapes: every
    largest-over-partitions term of the memory plan (`jgrind.plan.cost.Workload`), and the
    output rows it sums, are then unchanged, so a plan made for ``max_shapes`` shapes (the
    planner's) fits the same budgets. Three groups of R-MAT 200k partitions padded to 40960,
    45056 and 49152 input rows (16 partitions) take two, 40960 and 49152, for 0.6 % more
    padded input rows: a program fewer for every step and every table gather."""
    wanted = shape_groups(partitions, max_shapes)
    largest = set(wanted.values())

    def totals(sizes: dict) -> np.ndarray:  # padded input rows and edges
        return np.sum([s[1:] for s in sizes.values()], axis=0, dtype=np.float64)

    if len(largest) < 2:
        return max_shapes
    limit = totals(wanted) * (1 + SHAPE_PADDING_TOLERANCE)
    for count in range(1, max_shapes):
        sizes = shape_groups(partitions, count)
        if len(set(sizes.values())) < len(largest) and \
                all(sizes[p][0] == wanted[p][0] for p in wanted) and \
                all(any(all(a <= b for a, b in zip(s, big)) for big in largest)
                    for s in set(sizes.values())) and \
                bool(np.all(totals(sizes) <= limit)):
            return count
    return max_shapes


def _padded_parts(graph: Graph, model: GNN, pg: PartitionedGraph, split: int,
                  max_shapes: int, own_parts: Optional[Collection[int]] = None
                  ) -> list[PaddedPartition]:
    """The partitions with owned nodes (of ``own_parts`` only, where given), padded to at
    most ``max_shapes`` shapes. The shapes are chosen from every partition, so a partition is
    padded alike whichever process pads it. They run grouped by padded shape (in index order
    within a shape): a step's stored output is then reused by a step after it (`Spares`)
    instead of waiting while steps of another shape run, or being dropped."""
    weights = node_weights(graph.train_mask[split])
    shapes = shape_groups(pg.partitions, max_shapes)
    here = None if own_parts is None else {int(p) for p in own_parts}
    parts = [pad_partition(p, shapes[p.index], labels=graph.labels, weights=weights,
                           needs_edges=model.needs_edges, needs_adjacency=model.needs_adjacency)
             for p in pg.partitions if p.num_owned > 0 and (here is None or p.index in here)]
    parts.sort(key=lambda part: (part.num_out, part.num_in))
    return parts


def _layer_steps(model: GNN, workload: Workload, remat_policy, loss,
                 effort: CompileEffort) -> list[LayerSteps]:
    """Each executed layer's jitted steps. Layer l+1's backward steps hand layer l's backward
    the mask of l's output; the loss is fused with the top layer's steps only."""
    rules = [derivative_from_output(layer) if workload.masked(l) else None
             for l, layer in enumerate(model.layers)]
    top = len(model.layers) - 1
    return [_steps(layer, remat_policy, rules[l - 1] if l >= 1 else None,
                   loss if l == top else None, effort)
            for l, layer in enumerate(model.layers)]


def _steps(layer, remat_policy, input_mask, node_loss, effort) -> LayerSteps:
    """`layer_steps`, shared through its cache when its arguments hash; a loss that does not
    (a plain, unfrozen dataclass) gets steps of its own."""
    try:
        hash((layer, remat_policy, input_mask, node_loss))
    except TypeError:
        return layer_steps.__wrapped__(layer, remat_policy, input_mask, node_loss, effort)
    return layer_steps(layer, remat_policy, input_mask, node_loss, effort)


def _jitted_update(optimizer) -> Callable:
    return jax.jit(functools.partial(_apply_update, optimizer), donate_argnums=(0, 1))


def _apply_update(optimizer, params, opt_state, grads, loss):
    # value=: the epoch's loss, for transformations that take it (reduce_on_plateau)
    updates, opt_state = optax.with_extra_args_support(optimizer).update(
        grads, opt_state, params, value=loss)
    return optax.apply_updates(params, updates), opt_state


def _open_store(plan: BoundPlan, pg: PartitionedGraph, parts: list, budgets: tuple,
                directory: Optional[str], largest_output: int,
                tiers: Optional[dict] = None,
                own_parts: Optional[Collection[int]] = None) -> Store:
    """The store, with a host cache within the host budget (without one: at most half the
    host RAM free now, `jgrind.hostio.host_memory`) unless the policy's I/O reads no whole blocks.

    One process of several (``own_parts``: its partitions) holds its own share of the plan's
    host bytes (`process_host_need`): the cache and the freed tables' arrays take what that
    share leaves of the host budget, which holds each process's."""
    device_budget, host_budget = budgets
    m = plan.memory
    host_need, host_peak = m.host, m.stored_peaks[1]
    if own_parts is not None:
        mine, halo = _process_share(plan, pg, own_parts)
        host_need, host_peak = mine.host + halo, mine.stored_peaks[1] + halo
    host_cache = max(host_budget - host_need, 0) if host_budget < UNLIMITED else \
        min(sum(i.nbytes for i in plan.inventory), host_memory.available() // 2)
    if not plan.io.cache:
        host_cache = 0
    return Store(pg.offsets[1:] - pg.offsets[:-1],
                 directory if directory is not None else store_directory(plan.policy),
                 host_cache_bytes=host_cache, ssd_bytes_needed=m.ssd_needed,
                 row_reads=plan.io.row_reads,
                 # freed tables' arrays are kept within the plan's peak (this process's)
                 host_tables_bytes=host_peak,
                 input_buffer_bytes=_input_buffer_bytes(plan, parts, budgets, largest_output,
                                                        host_need),
                 input_staging=_input_staging(), storage=plan.workload.storage,
                 tiers=tiers)


def _input_staging() -> Optional[transfers.PinnedStaging]:
    """Page-locked buffers for step inputs, off the CPU backend, switched off: filled in place
    and put from there, an input skips the runtime's copy into its own transfer buffer (1.79 s
    of a 2.7 s `host_offload` epoch on an H200, docs/results-history.md section 8), but this
    path has not yet run on a GPU (``OutOfCore.pinned_inputs``; tools/trace_epoch.py
    --variants default,pinned-inputs)."""
    if jax.default_backend() == "cpu" and not PINNED_STAGING_ON_CPU:
        return None
    return transfers.pinned_staging(per_shape=INPUT_BUFFERS, enabled=False)


def _input_buffer_bytes(plan: BoundPlan, parts: list, budgets: tuple,
                        largest_output: int, host_need: int) -> int:
    """Host RAM the store may keep for step inputs' buffers between uses: `INPUT_BUFFERS` of
    the largest step input, when the budget that holds step inputs has room for them beside
    the plan, else none. On the CPU backend the plan counts step inputs in the device's
    working set (its memory is host RAM), beside which a kept step output (`Spares`) may also
    live; elsewhere they are host RAM staged for the transfer, beside ``host_need`` (the
    plan's host bytes, or this process's share of them)."""
    device_budget, host_budget = budgets
    largest = 4 * max([math.prod(input_shape(p, l, plan.local, plan.widths))
                       for p in parts for l in range(plan.num_layers)], default=0)
    want = INPUT_BUFFERS * largest
    if jax.default_backend() == "cpu":
        fits = plan.memory.device + largest_output + want <= device_budget
    else:
        fits = host_need + want <= host_budget
    return want if fits else 0


def _largest_output(parts: list, widths: list, num_layers: int) -> int:
    """Bytes of the largest step output `Spares` may keep: a layer's output rows, or an input
    gradient (shaped like the step's input)."""
    return 4 * max([p.num_out * widths[l + 1] for p in parts for l in range(num_layers)]
                   + [p.num_in * widths[l] for p in parts for l in range(num_layers)],
                   default=0)


def input_shape(part: PaddedPartition, l: int, local: list, widths: list) -> tuple:
    """The shape of layer l's step input for ``part`` (and of its input gradient)."""
    return (part.num_out if local[l] else part.num_in, widths[l])


def _transfer_settings(input_staging=None) -> TransferSettings:
    """The backend's transfer settings (`TransferSettings`)."""
    on_cpu = jax.default_backend() == "cpu"
    # Gathers and scatter-adds leave the rows held on the device there unless the device is
    # host RAM: on the CPU backend a gather's merge would copy the whole input once more, and
    # the scatter-add was slower.
    # A step output the store reads on the host goes through page-locked host memory off the
    # CPU backend: JAX's copy into pageable memory ran at 1.1 GB/s on an H200 (np.asarray of
    # 128 MiB: 121 ms, of which copy_to_host_async held its caller 87 ms), a copy to its
    # ``pinned_host`` memory at 42 GB/s, read in place (tools/bench_transfers.py). On the CPU
    # backend the output's host view is its buffer: no copy at all.
    return TransferSettings(keep_device_rows=not on_cpu, pinned_host=transfers.host_copies(),
                            early_host_copies=True,
                            staging_pieces=1 if on_cpu else GPU_STAGING_PIECES,
                            input_staging=input_staging)


def _local_block(part: PaddedPartition) -> Block:
    """``part``'s block for a node-wise layer: its padded output rows are its inputs (their
    global ids key the dropout masks), with no halo and no edges."""
    return Block(adj=None, edge_src=None, edge_dst=None,
                 node_ids=np.asarray(part.block.node_ids)[: part.num_out], num_out=part.num_out)
