"""`OutOfCore`: exact full-graph training, layer by layer and partition by partition.

The GriNNder scheme in JAX (see docs/architecture.md):

* **Forward**, layer l < L-1: for each partition, gather its owned and halo rows of ``H_l`` from
  whatever tier holds them, run the jitted layer step, write its owned rows of ``H_{l+1}`` to the
  tier the policy names. No snapshot of the gathered input is kept.
* **Backward**: the top layer is fused with the loss. Then for l = L-1 .. 0 and each partition:
  *regather* the same inputs, recompute the layer inside ``jax.vjp``, add the parameter gradient
  to a running sum, and scatter-add the input gradient into ``G_l``; halo rows of that gradient
  are partial gradients of nodes owned elsewhere, so ``G_l`` is complete only after every
  partition of layer l is done.
* One optimizer step per epoch with the summed gradient: the same update as in-memory training.
* **Kept aggregations**: a layer that aggregates before its matmul
  (`jgrind.models.conv.aggregation_split`) can keep its aggregated input ``Z_l`` (owned rows)
  from forward to backward, in the tier the policy names for the ``aggregation`` tensor. Its
  backward then reads ``Z_l`` instead of regathering ``H_l`` and needs no second sparse
  product. The policy's RECOMPUTE (the built-in policies' default) keeps nothing: the scheme
  above.
* **Output masks**: a ReLU layer without a residual needs only its output's sign pattern for its
  backward, not the output itself (`jgrind.models.conv.derivative_from_output`). Layer l+1's
  backward regathers the rows of ``H_{l+1}`` a partition owns anyway, so its step also returns
  their sign bits (packed, 1/32 of the rows' bytes) and layer l's backward uses them: the vjp
  then runs on the pre-activation and XLA drops the recomputed output's last product. The masks
  count towards the device working set and are left out when the device budget cannot hold
  them (`jgrind.plan.cost.fit_masks`).

* **Node-wise layers** (``aggregates = False``: `jgrind.models.Linear`, and the transform half
  of a GCN layer split by `jgrind.models.split.as_executed`) read no neighbours, so their
  steps read the partition's own block of ``H_l`` instead of gathering a halo, on a block
  with no halo rows; their input gradient has no halo rows either and is written as the
  block of ``G_l``, not scatter-added (no other layer adds to it).

The order of an epoch's sweeps, the step variant each runs and the tables made and freed around
them come from one value, `jgrind.plan.schedule.epoch_schedule`, which the cost model prices too.

The `naive` policy (for comparison only) changes the I/O, not the numbers: it keeps an SSD
snapshot of every step input (gathered, or a node-wise layer's own block) from forward to
backward instead of regathering, and reads SSD rows one at a time
(`jgrind.plan.protocols.IOStrategy`).

I/O overlaps compute: while partition p runs, a background thread gathers partition p+1's inputs,
and a writer thread stores p-1's outputs. JAX dispatch is asynchronous, so the main thread only
blocks where a value is needed.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import functools
import math
import os
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jgrind import host_memory, interrupts, transfers
from jgrind.arguments import whole_number
from jgrind.engine.spares import Spares
from jgrind.engine.steps import LayerSteps, PaddedPartition, layer_steps, pad_partition
from jgrind.engine.store import BudgetError, DeviceRows, Snapshot, Store, Table
from jgrind.graph import Graph
from jgrind.loss import node_weights
from jgrind.models.block import Block
from jgrind.models.conv import derivative_from_output
from jgrind.models.model import GNN, layer_key
from jgrind.models.moved_dropout import step_key
from jgrind.models.split import as_executed
from jgrind.partition import PartitionedGraph, partition_graph, shape_groups
from jgrind.partition.partitioners import label_propagation
from jgrind.plan.cost import (Assignment, Memory, Workload, fit_masks, format_bytes,
                              format_minimum, least_device_budget, memory)
from jgrind.plan.fates import ACTIVATION, AGGREGATION, GRADIENT, Fate, check_fate
from jgrind.plan.inventory import aggregation_widths, build_inventory, layer_widths
from jgrind.plan.budgets import UNLIMITED, check_budget
from jgrind.plan.policies import grinnder
from jgrind.plan.protocols import (BindContext, Policy, bind, check_policy, io_strategy,
                                   least_budgets, store_directory)
from jgrind.plan.schedule import (ACTIVATIONS, BACKWARD, GRADIENTS, SNAPSHOTS, Schedule,
                                  Variant, epoch_schedule)

MAX_PENDING_WRITES = 1  # writes queued behind the compute (see OutOfCore._write)
# Step inputs whose buffers the store keeps for reuse (`_input_buffer_bytes`): the running
# step's, the one loading behind it, and the one before, which XLA may not have released yet.
INPUT_BUFFERS = 3


@jax.jit
def _first_element(tree):
    """A one-element slice of a step's first output: something to wait on (see
    `OutOfCore._dispatched`)."""
    return jax.tree.leaves(tree)[0].reshape(-1)[:1]


def _check_arguments(graph, model, policy, num_parts, partitioner, partitioned, split,
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


class OutOfCore:
    """An `Executor` (see `jgrind.train`) that runs the model partition by partition.

    Args:
      graph, model, optimizer: as for `train` (no optimizer: for `predict` and `embed`
        only).
      policy: a fate for every block (`jgrind.plan.policies`); default: `grinnder` over the
        budgets. A policy with an ``io`` attribute (`jgrind.plan.protocols.IOStrategy`, e.g.
        `naive`) also changes how inputs move: snapshots instead of regathering, row reads.
      num_parts: number of partitions (ignored if ``partitioned`` is given).
      partitioner: ``(graph, k, seed=) -> assignment``; default label propagation.
      partitioned: a ready `PartitionedGraph` of the *normalised* graph.
      store: directory for the SSD tier (a private subdirectory is made and removed).
      device_budget, host_budget: bytes; None = unlimited. Without a host budget, the host
        cache in front of the SSD tier holds at most half the host RAM free when the engine
        starts (`jgrind.host_memory`: within a container's or job's memory limit), not every
        SSD block regardless of the RAM there is.
      remat_policy: ``jax.checkpoint`` policy for intermediates inside a layer step.
      prefetch: overlap gathers and writes with compute on background threads.
      max_shapes: at most this many padded block shapes (compilations per layer step).
      loss: the per-node loss (`jgrind.loss.weighted_loss`); None: cross entropy.
    """

    def __init__(self, graph: Graph, model: GNN,
                 optimizer: Optional[optax.GradientTransformation] = None, *,
                 policy: Optional[Policy] = None, num_parts: int = 4,
                 partitioner: Callable = label_propagation,
                 partitioned: Optional[PartitionedGraph] = None, split: int = 0,
                 store: Optional[str] = None, device_budget: Optional[int] = None,
                 host_budget: Optional[int] = None, remat_policy=None, prefetch: bool = True,
                 max_shapes: int = 3, seed: int = 0, loss: Optional[Callable] = None):
        _check_arguments(graph, model, policy, num_parts, partitioner, partitioned, split,
                         max_shapes, seed, store)
        device_budget = check_budget(device_budget, "device_budget")
        host_budget = check_budget(host_budget, "host_budget")
        # the layers as run: narrowing GCN layers split into transform + propagation
        self.given_model = model  # as the user built it (embed counts its layers)
        model, self.executed = as_executed(model)
        self.model, self.optimizer = model, optimizer
        self.device_budget = UNLIMITED if device_budget is None else int(device_budget)
        self.host_budget = UNLIMITED if host_budget is None else int(host_budget)
        if partitioned is None:
            normalized = model.normalize(graph)
            assignment = partitioner(normalized, num_parts, seed=seed)
            partitioned = partition_graph(normalized, assignment, num_parts=num_parts)
        self.pg = pg = partitioned
        self.num_layers = len(model.layers)
        self.widths = layer_widths(model, graph.num_features)
        weights = node_weights(graph.train_mask[split])
        shapes = shape_groups(pg.partitions, max_shapes)
        self.parts = [pad_partition(p, shapes[p.index], labels=graph.labels, weights=weights,
                                    needs_edges=model.needs_edges,
                                    needs_adjacency=model.needs_adjacency)
                      for p in pg.partitions if p.num_owned > 0]
        # Partitions run grouped by padded shape (in index order within a shape): a step's
        # stored output is then reused by a step after it (`Spares`) instead of waiting
        # while steps of another shape run, or being dropped.
        self.parts.sort(key=lambda part: (part.num_out, part.num_in))
        # -- plan: a fate per block, checked against the budgets before any work ---------------
        self.inventory = build_inventory(model, pg)
        # output masks (ReLU layers' backward without recomputing the output) when they fit
        self.workload = fit_masks(Workload.build(pg, model, max_shapes), device_budget)
        if policy is None:
            policy = grinnder(self.device_budget, self.host_budget, store,
                              device_reserve=self.workload.working_set())
        context = BindContext(self.workload, device_budget, host_budget,
                              None if store is None else str(store))
        self.policy = bind(policy, self.inventory, context)
        self.io = io_strategy(self.policy)
        self.fates = {(i.name, i.layer, i.partition): check_fate(i, self.policy(i))
                      for i in self.inventory}
        for name in (ACTIVATION, GRADIENT):
            for l in range(self.num_layers):
                self._fates(name, l)  # RECOMPUTE is all blocks of a layer or none
        # layers whose aggregation is kept (all blocks, or none: then the layer regathers)
        kept = {l: self._fates(AGGREGATION, l) for l in aggregation_widths(model)}
        self.kept = {l: fates for l, fates in kept.items() if Fate.RECOMPUTE not in fates}
        # node-wise layers read own blocks (the naive scheme snapshots those)
        self.local = [not getattr(layer, "aggregates", True) for layer in model.layers]
        self.memory = self._memory_plan()
        self._check_budgets()
        self.schedule: Schedule = epoch_schedule(
            self.num_layers, recomputed=[l for l in range(1, self.num_layers)
                                         if Fate.RECOMPUTE in self._fates(ACTIVATION, l)],
            kept=self.kept, masked=[l for l in range(self.num_layers)
                                    if self.workload.masked(l)],
            snapshots=self.io.snapshots, prefetch=prefetch)
        self._backward_variants = {sweep.layer: sweep.variant for sweep in self.schedule.sweeps
                                   if sweep.kind == BACKWARD}
        # layer l+1's backward steps hand layer l's backward the mask of l's output
        rules = [derivative_from_output(layer) if self.workload.masked(l) else None
                 for l, layer in enumerate(model.layers)]
        top = len(model.layers) - 1  # the loss is fused with the top layer's steps only
        self.steps: list[LayerSteps] = [
            _steps(layer, remat_policy, rules[l - 1] if l >= 1 else None,
                   loss if l == top else None)
            for l, layer in enumerate(model.layers)]
        host_cache = max(self.host_budget - self.memory.host, 0) \
            if self.host_budget < UNLIMITED else \
            min(sum(i.nbytes for i in self.inventory), host_memory.available() // 2)
        if not self.io.cache:
            host_cache = 0
        self.store = Store(pg.offsets[1:] - pg.offsets[:-1],
                           store if store is not None else store_directory(self.policy),
                           host_cache_bytes=host_cache, ssd_bytes_needed=self.memory.ssd_needed,
                           row_reads=self.io.row_reads,
                           # freed tables' arrays are kept within the plan's peak
                           host_tables_bytes=self.memory.stored_peaks[1],
                           input_buffer_bytes=self._input_buffer_bytes())
        self._snapshots: dict[int, Snapshot] = {}
        self._layer_keys: tuple = (None, ())  # (a step's key, its layers' keys): `_key`
        # Gathers and scatter-adds leave the rows held on the device there (`Table.gather`,
        # `Table.accumulate`) unless the device is host RAM: on the CPU backend a gather's
        # merge would copy the whole input once more, and the scatter-add was slower.
        self.keep_device_rows = jax.default_backend() != "cpu"
        # How a step output the store reads on the host gets there (`_for_the_store`). JAX's
        # copy into pageable memory ran at 1.1 GB/s on an H200 (np.asarray of 128 MiB: 121 ms,
        # of which copy_to_host_async held its caller 87 ms), a copy to its page-locked
        # ``pinned_host`` memory at 42 GB/s, read in place (tools/bench_transfers.py). On the
        # CPU backend the output's host view is its buffer: no copy at all.
        self.pinned_host = transfers.host_copies()
        self.early_host_copies = True
        # Row ranges a large step input is sent to the device in, at once (`_put`): 1 until a
        # GPU measures whether more pay (tools/trace_epoch.py --variants default,pieces-8)
        self.staging_pieces = 1
        self.pool = self.writer = None
        # From here the run has files in its store folder: an error or a signal (Ctrl-C,
        # SIGTERM) before the engine is returned must remove them, as `close` does later.
        try:
            self.activations = [self.store.table(ACTIVATION, l, self.widths[l],
                                                 self._fates(ACTIVATION, l))
                                for l in range(self.num_layers)]
            widths = aggregation_widths(model)
            self.aggregations = {l: self.store.table(AGGREGATION, l, widths[l], fates)
                                 for l, fates in self.kept.items()}
            features = self.activations[0]
            for part in pg.partitions:
                if part.num_owned:
                    features.write(part.index, graph.features[part.owned])
            self.num_nodes = graph.num_nodes
            # The blocks' structure is the same every epoch: keep device copies when they fit
            # next to the plan, instead of transferring every block again in each of the 2L
            # sweeps.
            structure = sum(part.nbytes() for part in self.parts)
            self._blocks = ({part.index: jax.device_put(part.block) for part in self.parts}
                            if self.memory.device + structure <= self.device_budget else {})
            self._local_blocks = {part.index: jax.device_put(_local_block(part))
                                  for part in self.parts} if any(self.local) else {}
            # named threads: profilers (tools/profile_ops.py --overlapped, py-spy) tell them
            # apart
            if prefetch:
                self.pool = cf.ThreadPoolExecutor(max_workers=2,
                                                  thread_name_prefix="jgrind-loader")
                self.writer = cf.ThreadPoolExecutor(max_workers=1,
                                                    thread_name_prefix="jgrind-writer")
            self._in_flight: collections.deque = collections.deque()  # see `_loaded`
            # Stored step outputs, donated to the next step of the same shape (no fresh pages).
            # A kept one lives from its write to that step's end, where without it the step's
            # own buffer would live from the step's start: one more output alive, which the
            # device budget must hold beside the plan (the 1M-node benchmark: +0.16-0.25 GiB
            # of peak RSS, docs/results-history.md section 4).
            self.spares = Spares(enabled=self.memory.device + self._largest_output()
                                 <= self.device_budget)
            self._update = jax.jit(self._apply_update, donate_argnums=(0, 1))
        except BaseException:
            self.close()
            raise

    # -- planning helpers ---------------------------------------------------------------------
    def _fates(self, name: str, layer: int) -> list[Fate]:
        fates = [self.fates.get((name, layer, p.index), Fate.HOST)
                 for p in self.pg.partitions]
        if Fate.RECOMPUTE in fates and any(f is not Fate.RECOMPUTE for f in fates):
            why = ("its backward either regathers the layer's input or reads the kept "
                   "aggregation, for all partitions" if name == AGGREGATION else
                   "recomputing a block needs its whole previous layer")
            raise ValueError(f"{name} of layer {layer}: RECOMPUTE must be chosen for all "
                             f"partitions of a layer or none ({why})")
        return fates

    def _memory_plan(self) -> Memory:
        """Peak bytes per tier by the store's accounting (`jgrind.plan.cost.memory`, the same
        function the planner predicts with)."""
        snapshot = 0
        if self.io.snapshots:  # step inputs of layers 0..L-2, forward to backward
            snapshot = 4 * sum(int(self._snapshot_rows(l).sum()) * self.widths[l]
                               for l in range(self.num_layers - 1))
        assignment = Assignment.from_fates(self.fates, self.num_layers, self.pg.num_parts)
        return memory(self.workload, assignment, snapshot_bytes=snapshot)

    def _check_budgets(self) -> None:
        m = self.memory
        # The minimum stated is one that runs: a budget-aware policy's own (`Budgeted` finds
        # the device budget its packing fits, beside the working set), else this plan's blocks
        # beside the working set the engine uses at that budget (masks on once they fit).
        least_device, least_host = least_budgets(self.policy)
        least = least_device or least_device_budget(self.workload, m.device_tables)
        if m.device_working_set > self.device_budget:
            raise BudgetError(
                f"the device budget {format_bytes(self.device_budget)} is below one partition's "
                f"working set ({format_bytes(m.device_working_set)} at least); use more partitions "
                f"(now {self.pg.num_parts}) or a device budget of at least "
                f"{format_minimum(least)}")
        if m.device > self.device_budget:
            raise BudgetError(
                f"the plan keeps {format_bytes(m.device)} on the device (blocks "
                f"{format_bytes(m.device_tables)} + working set "
                f"{format_bytes(m.device_working_set)}) but the device budget is "
                f"{format_bytes(self.device_budget)}; raise it to at least "
                f"{format_minimum(least)} or choose a policy that offloads more")
        if least_device is not None:
            # the policy fits the device and host budgets but has blocks left for an SSD tier
            # this run has no directory for
            host = least_host
            raise BudgetError(
                f"the blocks do not fit in the device budget {format_bytes(self.device_budget)} "
                f"(beside one partition's working set of {format_bytes(m.device_working_set)}) "
                f"and the host budget {format_bytes(self.host_budget)}, and there is no store "
                f"directory for the rest; raise the device budget to at least "
                f"{format_minimum(least)}"
                + (f" or the host budget to at least {format_minimum(host)}" if host else "")
                + ", or give a store directory on a fast disk (CLI: --store DIR)")
        if m.host > self.host_budget:
            raise BudgetError(
                f"the plan keeps {format_bytes(m.host)} in host RAM but the host budget is "
                f"{format_bytes(self.host_budget)}; raise it to at least {format_minimum(m.host)} "
                "or send more blocks to the SSD tier (e.g. the ssd_offload or grinnder policy "
                "with a store directory; CLI: --policy ssd --store DIR)")

    # -- the epoch ----------------------------------------------------------------------------
    def step(self, params, opt_state, key):
        if self.optimizer is None:
            raise ValueError("this engine was made without an optimizer, for predictions "
                             "only; pass one (e.g. optax.adam(0.01)) to train with it")
        grads, loss = self.loss_and_grad(params, key)
        params, opt_state = self._update(params, opt_state, grads, loss)
        return params, opt_state, loss

    def _apply_update(self, params, opt_state, grads, loss):
        # value=: the epoch's loss, for transformations that take it (reduce_on_plateau)
        updates, opt_state = optax.with_extra_args_support(self.optimizer).update(
            grads, opt_state, params, value=loss)
        return optax.apply_updates(params, updates), opt_state

    def loss_and_grad(self, params, key):
        """``(grads, loss)`` of the full-graph loss, computed partition by partition."""
        grads, loss = self._executed_loss_and_grad(self.executed.split_params(params), key)
        return self.executed.merge_params(grads), loss

    def _key(self, key, l: int):
        """Executed layer l's dropout key: its model layer's; for a layer that runs its
        consumer's dropout on its output (`DropsOutput`), that and the consumer's."""
        origin = self.executed.origin
        if key is None:
            return step_key(self.model.layers[l], None, None)
        if self._layer_keys[0] is not key:  # one program folds every layer's key, once a step:
            # a fold_in per step with a Python int would copy the int to the device each time
            self._layer_keys = (key, _fold_layer_keys(key, max(origin) + 1))
        keys = self._layer_keys[1]
        consumer = keys[origin[l + 1]] if l + 1 < len(origin) else None
        return step_key(self.model.layers[l], keys[origin[l]], consumer)

    def _executed_loss_and_grad(self, params, key):
        """Run `schedule`'s sweeps in order: the tables each sweep makes before it, its steps,
        and the tables it frees after it."""
        grads, loss = _zero_grads_and_loss(params)
        grads = list(grads)
        gradients: dict[int, Table] = {}  # G_l while it lives
        masks: Optional[dict] = None  # output masks of layer l, made by layer l+1's backward
        for sweep in self.schedule.sweeps:
            for table in sweep.makes:
                if table.name == GRADIENTS:
                    gradients[table.layer] = self._gradient_table(table.layer)
                else:
                    self._make(table)
            l = sweep.layer
            if sweep.kind == BACKWARD:
                loss, grads[l], masks = self._backward_layer(
                    params, l, key, gradients.get(l + 1), gradients.get(l), loss, grads[l],
                    masks)
            else:
                self._forward_layer(params, l, key, sweep.variant)
            for table in sweep.frees:
                if table.name == GRADIENTS:  # an all-SSD gradient file is kept for next epoch
                    self.store.drop(gradients.pop(table.layer), keep=True)
                else:
                    self._free(table)
        return tuple(grads), loss

    def _make(self, table) -> None:
        """Bring a schedule's activation or snapshot table into being before the sweep that
        writes it first."""
        if table.name == ACTIVATIONS:  # a recomputed layer's transient
            self.activations[table.layer].materialize()
        elif table.name == SNAPSHOTS:  # the naive scheme's, filled by this forward sweep
            self._snapshots[table.layer] = self.store.snapshot(
                table.layer, self.widths[table.layer], self._snapshot_rows(table.layer))

    def _free(self, table) -> None:
        """Release a schedule's activation or snapshot table after the sweep that reads it
        last."""
        if table.name == ACTIVATIONS:
            self.activations[table.layer].release()
        elif table.name == SNAPSHOTS:
            self.store.drop(self._snapshots.pop(table.layer))

    def _snapshot_rows(self, l: int) -> np.ndarray:
        """Rows of each partition's snapshot of layer l's step input (the naive scheme): its
        own and halo rows, or its own rows only for a node-wise layer."""
        parts = self.pg.partitions
        return np.array([p.num_owned if self.local[l] else p.num_inputs for p in parts],
                        np.int64)

    def _gradient_table(self, layer: int) -> Table:
        """``G_layer``, made at the start of backward sweep ``layer`` and freed after sweep
        ``layer - 1``. Made while it lives: ``G_{layer-1}`` and recomputed layers' transients,
        the ``reserve`` that lets it take a larger freed host array (`HostArrays`)."""
        reserve = self._host_bytes(GRADIENT, layer - 1) if layer >= 2 else 0
        reserve += sum(self._host_bytes(ACTIVATION, l, Fate.RECOMPUTE)
                       for l in range(self.num_layers))
        return self.store.table(GRADIENT, layer, self.widths[layer],
                                self._fates(GRADIENT, layer), reserve=reserve)

    def _host_bytes(self, name: str, layer: int, fate: Fate = Fate.HOST) -> int:
        """Bytes of layer ``layer``'s blocks of ``name`` that ``fate`` puts in host RAM."""
        rows = sum(p.num_owned for p in self.pg.partitions
                   if self.fates.get((name, layer, p.index), Fate.HOST) is fate)
        return 4 * rows * self.widths[layer]

    def _forward_layer(self, params, l: int, key, variant: Variant = Variant.FORWARD) -> None:
        """``H_{l+1}`` from ``H_l``, and ``Z_l`` too for `Variant.FORWARD_SAVING`. If an
        unfilled snapshot of layer l exists (the naive scheme), every partition's step input is
        also written to it."""
        src, dst = self.activations[l], self.activations[l + 1]
        dst.materialize()  # a recomputed layer's transient, outside an epoch (`predict`)
        steps, p_l, k_l = self.steps[l], params[l], self._key(key, l)
        kept = self.aggregations[l] if variant is Variant.FORWARD_SAVING else None
        snap = self._snapshots.get(l)
        snap = snap if snap is not None and not snap.filled else None
        pending: collections.deque = collections.deque()
        self.spares.plan([shape for p in self.parts for shape in
                          [(p.num_out, dst.width)] + ([(p.num_out, kept.width)]
                                                      if kept is not None else [])],
                         per_step=1 if kept is None else 2)
        # the naive scheme's snapshot is written from the loaded host rows: left unstaged,
        # they are not copied to the device and back (on a GPU)
        for part, h_in in self._inputs(l, src, stage=snap is None):
            if snap is not None:
                self._write(pending, snap.write, part.index, h_in)
            spare = self.spares.take((part.num_out, dst.width))
            if kept is not None:
                out, z = steps.forward_saving(p_l, self._device_block(part), h_in, k_l,
                                              (spare, self.spares.take((part.num_out,
                                                                        kept.width))))
                self._write(pending, self._stored, z, kept.write, part.index,
                            self._for_the_store(z, kept, part.index))
            else:
                out = steps.forward(p_l, self._step_block(part, l), h_in, k_l, spare)
            self._dispatched(out)
            self._write(pending, self._stored, out, dst.write, part.index,
                        self._for_the_store(out, dst, part.index))
        self._wait(pending)
        if snap is not None:
            snap.filled = True

    def _backward_layer(self, params, l, key, upper, lower, loss, acc, masks):
        """Layer l's backward sweep, running the step variant the schedule names for it.
        ``masks``: its output masks per partition (from layer l+1's sweep) for a masked
        variant. Returns the masks of layer l-1's output when this layer's steps make them,
        else None."""
        variant = self._backward_variants[l]
        if variant in _FROM_KEPT:
            return loss, self._backward_from_kept(params, l, key, variant, upper, lower, acc,
                                                  masks), None
        steps, p_l, k_l = self.steps[l], params[l], self._key(key, l)
        run = _BACKWARD_STEPS[variant]
        top, masked = variant is Variant.TOP, variant in _MASKED
        made = {} if steps.emits_mask else None
        pending: collections.deque = collections.deque()
        snap = self._snapshots.get(l)
        snap = snap if snap is not None and snap.filled else None
        store_input_gradient = self._store_input_gradient(l, lower)
        # the input gradients' buffers (the top step makes one even for a one-layer model)
        spared = variant not in _PARAMS_ONLY
        self.spares.plan([self._input_shape(p, l) for p in self.parts] if spared else [])
        load_input = self._input_loader(l, self.activations[l], snap)
        # the output gradient is read with the input, off the main thread (`_loaded`)
        # the top layer's labels and loss weights load with its input, as device arrays
        load = (lambda part: (load_input(part), (part.labels, part.weights))) if top else \
            (lambda part: (load_input(part), upper.read(part.index, part.num_out)))
        for part, (h_in, g_out) in self._loaded(load):
            spare = self.spares.take(self._input_shape(part, l)) if spared else None
            mask = masks.pop(part.index) if masked else None
            out = run(steps, p_l, self._step_block(part, l), h_in, k_l, mask, g_out, acc, spare)
            if top:
                loss = loss + out[0]
                out = out[1:]
            acc = out[0]
            self._dispatched(acc)
            if not spared:  # the bottom layer: no input gradient
                continue
            d_h = out[1]
            if made is not None:
                made[part.index] = out[2]
            if lower is not None:
                self._write(pending, self._stored, d_h, store_input_gradient, part,
                            self._for_the_store(d_h, lower, part.index,
                                                None if self.local[l] else part.halo_owner))
            else:  # a one-layer model's input gradient: nothing stores it
                self.spares.give(d_h)
        self._wait(pending)
        return loss, acc, made

    def _backward_from_kept(self, params, l, key, variant, upper, lower, acc, masks):
        """Layer l's backward sweep from its kept aggregation: no regather, no recompute of
        the sparse product. Makes no masks for layer l-1 (it does not see ``H_l``), so that
        layer recomputes its pre-activation (from its own kept ``Z``) or its output."""
        steps, p_l, k_l = self.steps[l], params[l], self._key(key, l)
        kept = self.aggregations[l]
        params_only = variant is Variant.SAVED_BACKWARD_PARAMS
        pending: collections.deque = collections.deque()
        self.spares.plan([(p.num_in, self.widths[l]) for p in self.parts]
                         if not params_only else [])
        for part, (z, g_out) in self._loaded(lambda part: (kept.read(part.index, part.num_out),
                                                            upper.read(part.index,
                                                                       part.num_out))):
            block = self._device_block(part)
            mask = masks.pop(part.index) if masks is not None else None
            if params_only:
                acc = steps.saved_backward_params(p_l, block, z, k_l, mask, g_out, acc)
                self._dispatched(acc)
                continue
            acc, d_h = steps.saved_backward(p_l, block, z, k_l, mask, g_out, acc,
                                            self.spares.take((part.num_in, self.widths[l])))
            self._dispatched(acc)
            self._write(pending, self._stored, d_h,
                        functools.partial(lower.accumulate,
                                          keep_device_rows=self.keep_device_rows),
                        part.index, part.halo_owner, part.halo_row,
                        self._for_the_store(d_h, lower, part.index, part.halo_owner))
        self._wait(pending)
        return acc

    def _input_buffer_bytes(self) -> int:
        """Host RAM the store may keep for step inputs' buffers between uses: `INPUT_BUFFERS`
        of the largest step input, when the budget that holds step inputs has room for them
        beside the plan, else none. On the CPU backend the plan counts step inputs in the
        device's working set (its memory is host RAM), beside which a kept step output
        (`spares`) may also live; elsewhere they are host RAM staged for the transfer."""
        largest = 4 * max([math.prod(self._input_shape(p, l))
                           for p in self.parts for l in range(self.num_layers)], default=0)
        want = INPUT_BUFFERS * largest
        if jax.default_backend() == "cpu":
            fits = self.memory.device + self._largest_output() + want <= self.device_budget
        else:
            fits = self.memory.host + want <= self.host_budget
        return want if fits else 0

    def _largest_output(self) -> int:
        """Bytes of the largest step output `spares` may keep: a layer's output rows, or an
        input gradient (shaped like the step's input)."""
        return 4 * max([p.num_out * self.widths[l + 1] for p in self.parts
                        for l in range(self.num_layers)]
                       + [p.num_in * self.widths[l] for p in self.parts
                          for l in range(self.num_layers)], default=0)

    def _input_shape(self, part: PaddedPartition, l: int) -> tuple:
        """The shape of layer l's step input for ``part`` (and of its input gradient)."""
        return (part.num_out if self.local[l] else part.num_in, self.widths[l])

    def _for_the_store(self, output: jax.Array, table: Table, block: int,
                       halo_owner: Optional[np.ndarray] = None):
        """What the writer thread stores of a dispatched step's output into ``table``: where
        the store reads it in host memory only (`Table.held_on_host`) and `pinned_host` is
        set, a copy in page-locked host memory, started now (the GPU's copy engine writes it
        as soon as the step ends, and the store reads it in place); else the output itself,
        with its host copy started when the store reads it on the host and
        `early_host_copies` is on. Outputs kept on the device are not copied."""
        if not table.stored_on_host(block, halo_owner):
            return output
        self.store.count(to_host=output.nbytes)
        if self.pinned_host is not None and table.held_on_host(block, halo_owner):
            return transfers.to_host(output, self.pinned_host)
        if self.early_host_copies:
            output.copy_to_host_async()
        return output

    def _stored(self, output: jax.Array, store: Callable, *args) -> None:
        """``store(*args)``, whose last argument is ``output`` or its host copy, then hand
        ``output`` to `spares` for a later step: it is read no more."""
        store(*args)
        self.spares.give(output)

    def _store_input_gradient(self, l: int, lower: Optional[Table]) -> Callable:
        """How layer l's backward stores a partition's input gradient into ``G_l``: its own
        block written whole for a node-wise layer, else own and halo rows scatter-added."""
        if lower is not None and self.local[l]:
            return lambda part, d_h: lower.write(part.index, d_h)
        return lambda part, d_h: lower.accumulate(part.index, part.halo_owner, part.halo_row,
                                                  d_h, keep_device_rows=self.keep_device_rows)

    # -- overlapped I/O -----------------------------------------------------------------------
    def _inputs(self, l: int, table: Table, snapshot: Optional[Snapshot] = None,
                stage: bool = True):
        """Yield ``(part, layer l's step input)`` while the next partition's loads in the
        background (see `_input_loader`; ``stage``: see `_loaded`)."""
        return self._loaded(self._input_loader(l, table, snapshot, stage), stage)

    def _input_loader(self, l: int, table: Table, snapshot: Optional[Snapshot] = None,
                      stage: bool = True) -> Callable:
        """``part -> layer l's step input``: the partition's own block of ``table`` for a
        node-wise layer, else its own and halo rows gathered; read back from ``snapshot``
        instead when one is given (the naive scheme's backward). A gather to ``stage`` leaves
        the rows that are on the device there, where the device is not host RAM
        (`jgrind.engine.store.DeviceRows`, put together by `_staged`)."""
        if snapshot is not None:
            rows = (lambda part: part.num_out) if self.local[l] else (lambda part: part.num_in)
            return lambda part: snapshot.read(part.index, rows(part))
        if self.local[l]:
            return lambda part: table.read(part.index, part.num_out)
        keep = stage and self.keep_device_rows
        return lambda part: table.gather(part.index, part.halo_owner, part.halo_row,
                                         part.num_in, keep_device_rows=keep)

    def _loaded(self, load: Callable, stage: bool = True):
        """Yield ``(part, load(part))`` while the next partition's loads in the background.

        The consumer dispatches each partition's step (asynchronously) and registers it with
        `_dispatched`. Before the next load starts, the step before the one just dispatched must
        have finished: so at most two partitions' inputs are alive, the running step's and the
        queued or loading one's, as the working-set bound assumes. Without that wait a loader
        faster than the compute lets the main thread queue step after step, each holding its
        input (seen: peak RSS 2 GiB over the bound on the 3M-node memory wall once the SSD
        tier's span loops went native).

        What ``load`` returns as NumPy arrays is handed to the device in the loading thread
        (`_staged`): on a GPU the host-to-device copy of the next partition's inputs then
        overlaps the running step, instead of running on the main thread when the step is
        dispatched. ``stage=False`` leaves them as they are, for a consumer that also
        reads them on the host."""
        if stage:
            load = _staged(load, self.store.count, self.staging_pieces)
        in_flight: collections.deque = collections.deque()
        future = self.pool.submit(load, self.parts[0]) if self.pool and self.parts else None
        for i, part in enumerate(self.parts):
            h_in = load(part) if self.pool is None else future.result()
            self._in_flight = in_flight  # set each time: another sweep may have run between
            interrupts.check()  # a SIGTERM whose exception was lost stops the run here
            if self.pool is not None and i + 1 < len(self.parts):
                # load i+1 is queued before step i is dispatched, and waits on the loader
                # thread for step i-1 (the last one registered): it then overlaps step i's
                # dispatch and the host copies and writes that follow it on this thread,
                # instead of starting after them
                future = self.pool.submit(_after, in_flight[-1] if in_flight else None,
                                          load, self.parts[i + 1])
            yield part, h_in
            while len(in_flight) > 1:  # without a loader: step i-1 ends before load i+1
                done = in_flight.popleft()
                if self.pool is None:
                    jax.block_until_ready(done)

    def _dispatched(self, step_output) -> None:
        """Register a dispatched step (any of its outputs) with the running `_loaded`. What is
        kept is a one-element slice of it, ready when the step is: the output itself may be
        donated to the next step (the weight-gradient accumulator is) and then cannot be
        waited on."""
        self._in_flight.append(_first_element(step_output))

    def _device_block(self, part: PaddedPartition):
        cached = self._blocks.get(part.index)
        if cached is not None:
            return cached
        self.store.count(to_device=part.nbytes())
        return jax.device_put(part.block)

    def _step_block(self, part: PaddedPartition, l: int):
        """The block layer l's steps run on: without halo rows for a node-wise layer."""
        return self._local_blocks[part.index] if self.local[l] else self._device_block(part)

    def _write(self, pending: collections.deque, fn, *args) -> None:
        """Run ``fn(*args)`` on the writer thread. At most `MAX_PENDING_WRITES` writes wait in
        its queue: each holds a partition's output, so an unbounded queue (a writer slower than
        the compute, e.g. scatter-adds to SSD) would hold every partition's output at once."""
        if self.writer is None:
            fn(*args)
            return
        pending.append(self.writer.submit(fn, *args))
        while len(pending) > MAX_PENDING_WRITES:
            pending.popleft().result()

    @staticmethod
    def _wait(pending) -> None:
        for f in pending:
            if f is not None:
                f.result()  # re-raises a writer's error here, on the main thread

    # -- evaluation ---------------------------------------------------------------------------
    def predict(self, params) -> np.ndarray:
        """Logits ``[N, C]`` in the graph's node order, dropout off, partition by partition."""
        L = self.num_layers
        params = self.executed.split_params(params)
        for l in range(L - 1):
            self._forward_layer(params, l, None)
        logits = np.zeros((self.num_nodes, self.widths[-1]), np.float32)
        steps, p_top = self.steps[-1], params[-1]
        for part, h_in in self._inputs(L - 1, self.activations[L - 1]):
            out = steps.forward(p_top, self._step_block(part, L - 1), h_in, None,
                                self.spares.take((part.num_out, self.widths[-1])))
            self._dispatched(out)
            logits[part.owned] = jax.device_get(out)[: part.num_owned]
        for l in range(1, L):
            if self.activations[l].recomputed:
                self.activations[l].release()
        return logits

    def embed(self, params, layer: int) -> np.ndarray:
        """``[N, width]`` in the graph's node order, dropout off: the output of the model's
        first ``layer`` layers (0: the features; all of them: the logits), computed partition
        by partition and read back from wherever the policy stored it."""
        if self.given_model.check_layer(layer) == len(self.given_model.layers):
            return self.predict(params)
        e = self.executed.origin.index(layer)  # the executed layer whose input that is
        params = self.executed.split_params(params)
        for l in range(e):
            self._forward_layer(params, l, None)
        table = self.activations[e]
        out = np.empty((self.num_nodes, self.widths[e]), np.float32)
        for part in self.parts:
            out[part.owned] = transfers.host_view(table.read(part.index, part.num_owned))
        for l in range(1, e + 1):
            if self.activations[l].recomputed:
                self.activations[l].release()
        return out

    def close(self) -> None:
        for pool in (self.pool, self.writer):
            if pool is not None:
                pool.shutdown(wait=True)
        self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# The step function each backward variant names, called alike: ``(steps, params, block, input,
# key, mask, output gradient or (labels, weights), accumulator, spare buffer)``. Returns the
# step's outputs: (loss term,) accumulator, input gradient, mask made; the bottom layer's
# variants only the accumulator.
_BACKWARD_STEPS = {
    Variant.TOP: lambda s, p, b, h, k, m, g, acc, spare: s.top(p, b, h, k, *g, acc, spare),
    Variant.BACKWARD: lambda s, p, b, h, k, m, g, acc, spare: s.backward(p, b, h, k, g, acc,
                                                                         spare),
    Variant.MASKED_BACKWARD: lambda s, p, b, h, k, m, g, acc, spare: s.masked_backward(
        p, b, h, k, m, g, acc, spare),
    Variant.BACKWARD_PARAMS: lambda s, p, b, h, k, m, g, acc, spare: (s.backward_params(
        p, b, h, k, g, acc),),
    Variant.MASKED_BACKWARD_PARAMS: lambda s, p, b, h, k, m, g, acc, spare: (
        s.masked_backward_params(p, b, h, k, m, g, acc),),
}
_FROM_KEPT = frozenset({Variant.SAVED_BACKWARD, Variant.SAVED_BACKWARD_PARAMS})
_MASKED = frozenset({Variant.MASKED_BACKWARD, Variant.MASKED_BACKWARD_PARAMS})
_PARAMS_ONLY = frozenset({Variant.BACKWARD_PARAMS, Variant.MASKED_BACKWARD_PARAMS})


def _steps(layer, remat_policy, input_mask, node_loss) -> LayerSteps:
    """`layer_steps`, shared through its cache when its arguments hash; a loss that does not
    (a plain, unfrozen dataclass) gets steps of its own."""
    try:
        hash((layer, remat_policy, input_mask, node_loss))
    except TypeError:
        return layer_steps.__wrapped__(layer, remat_policy, input_mask, node_loss)
    return layer_steps(layer, remat_policy, input_mask, node_loss)


@jax.jit
def _zero_grads_and_loss(params):
    """Zeros shaped like ``params``, and a zero loss, made on the device (op by op, a Python
    zero would be copied there)."""
    return jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32)


@functools.partial(jax.jit, static_argnums=1)
def _fold_layer_keys(key: jax.Array, count: int) -> tuple:
    """``layer_key(key, i)`` for the model's layers ``0 .. count-1``, in one program."""
    return tuple(layer_key(key, i) for i in range(count))


def _after(step: Optional[jax.Array], load: Callable, part):
    """``load(part)`` once ``step`` (a registered step's marker, or None) has finished."""
    if step is not None:
        jax.block_until_ready(step)
    return load(part)


def _staged(load: Callable, count: Callable, pieces: int = 1) -> Callable:
    """``load`` followed by `jax.device_put` of each NumPy array in its result, and a gather
    whose device rows stayed on the device (`DeviceRows`) put together there; ``count``
    (`Store.count`) adds the bytes sent (``to_device``). On the CPU backend the put adopts an
    aligned buffer without a copy (`jgrind.buffers`), as the step's dispatch would; elsewhere
    it is the transfer, made where `_loaded` calls ``load`` and waited for there: a step
    dispatched on an input whose host-side staging is still running holds the dispatching
    thread until it ends (seen on an H200: 17-19 ms a step). ``pieces`` > 1 sends a large
    array in that many row ranges at once (`_put`)."""
    def staged(part):
        loaded = load(part)
        count(to_device=sum(_host_bytes(leaf) for leaf in jax.tree.leaves(loaded)))
        return jax.block_until_ready(
            jax.tree.map(functools.partial(_to_device, pieces=pieces), loaded))
    return staged


def _host_bytes(leaf) -> int:
    """Bytes `_to_device` sends of ``leaf``."""
    if isinstance(leaf, DeviceRows):
        return leaf.host.nbytes
    return leaf.nbytes if isinstance(leaf, np.ndarray) else 0


def _to_device(leaf, pieces: int = 1):
    if isinstance(leaf, DeviceRows):
        return leaf.to_device()
    return _put(leaf, pieces) if isinstance(leaf, np.ndarray) else leaf


# Below this many bytes a piece, one transfer carries the whole array
MIN_PIECE_BYTES = 4 << 20


def _put(host: np.ndarray, pieces: int) -> jax.Array:
    """`jax.device_put` of ``host``, in up to ``pieces`` row ranges put at once and joined on
    the device. From pageable memory a transfer first copies its bytes into a page-locked
    staging buffer on one of the runtime's threads (on an H200, 18-22 ms for a 109 MB step
    input, about 5.5 GB/s, against 2 ms over the link); ranges put at once are staged on
    several."""
    k = min(pieces, host.nbytes // MIN_PIECE_BYTES) if host.ndim else 1
    if k < 2:
        return jax.device_put(host)
    bounds = [host.shape[0] * i // k for i in range(k + 1)]
    return _join_rows(*[jax.device_put(host[a:b]) for a, b in zip(bounds[:-1], bounds[1:])])


_join_rows = jax.jit(lambda *parts: jnp.concatenate(parts, axis=0))


def _local_block(part: PaddedPartition) -> Block:
    """``part``'s block for a node-wise layer: its padded output rows are its inputs (their
    global ids key the dropout masks), with no halo and no edges."""
    return Block(adj=None, edge_src=None, edge_dst=None,
                 node_ids=np.asarray(part.block.node_ids)[: part.num_out], num_out=part.num_out)
