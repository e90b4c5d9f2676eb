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
  of a GCN layer split by `jgrind.executed.split.as_executed`) read no neighbours, so their
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
and a writer thread stores p-1's outputs (`jgrind.engine.pipeline`). JAX dispatch is
asynchronous, so the main thread only blocks where a value is needed.

The engine has two parts, and `OutOfCore` is a thin front over them:

* building (`jgrind.engine.build.build`): validation, partitioning, binding the policy, the
  budget checks, the schedule, the store and its tables, the features copied in, device copies
  of the blocks' structure, the threads and the jitted steps; a `Built` record of all that;
* running (`jgrind.engine.runner.Runner`): the schedule's sweeps in order
  (`jgrind.engine.sweeps.Sweeps`), each through the loader and writer `Pipeline`.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
import optax

from jgrind.engine.build import Built, build
from jgrind.engine.compile_effort import QUICK, CompileEffort
from jgrind.engine.runner import Runner
from jgrind.graph import Graph
from jgrind.models.model import GNN
from jgrind.partition import PartitionedGraph
from jgrind.partition.partitioners import label_propagation
from jgrind.plan.protocols import Policy


class _Built:
    """An attribute of the engine's `Built` record (``path``: a field, or a field's field),
    read through `OutOfCore`."""

    def __init__(self, *path: str):
        self.path = path

    def __set_name__(self, owner, name: str) -> None:
        self.path = self.path or (name,)

    def __get__(self, engine, owner=None):
        if engine is None:
            return self
        value = engine.built
        for name in self.path:
            value = getattr(value, name)
        return value


class _Planned(_Built):
    """A field of the built record's plan (`jgrind.engine.build.BoundPlan`), read through
    `OutOfCore`."""

    def __set_name__(self, owner, name: str) -> None:
        self.path = ("plan", name)


class _Setting(_Built):
    """A transfer setting (`jgrind.engine.pipeline.TransferSettings`), read and set through
    `OutOfCore` (tools/trace_epoch.py compares them; tests force a GPU's on the CPU)."""

    def __set_name__(self, owner, name: str) -> None:
        self.path = ("transfers", name)

    def __set__(self, engine, value) -> None:
        setattr(engine.built.transfers, self.path[-1], value)


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
        starts (`jgrind.hostio.host_memory`: within a container's or job's memory limit), not every
        SSD block regardless of the RAM there is.
      remat_policy: ``jax.checkpoint`` policy for intermediates inside a layer step.
      prefetch: overlap gathers and writes with compute on background threads.
      max_shapes: at most this many padded block shapes (compilations per layer step).
      loss: the per-node loss (`jgrind.loss.weighted_loss`); None: cross entropy.
      prediction: the planner's predicted epoch for this run (`jgrind.plan.cost.Prediction`),
        which `train` holds each epoch's measured sweeps against (`sweep_seconds`); None: no
        plan predicted it.
      compile_effort: how hard XLA works on each partition step
        (`jgrind.engine.compile_effort`): `QUICK` (the default) skips a GPU's autotuning,
        which took most of a first epoch's compile time there; `FULL` is XLA's default.
      tiers: classes that serve some fates instead of the store's (`jgrind.engine.store.Store`'s
        ``tiers``): e.g. device blocks spread over several devices
        (`jgrind.devices.placed_tier`).
      device_of: ``[P]`` the device (an index) of every partition when its steps run on
        several devices (`jgrind.devices.ShardedOutOfCore`): the device budget then holds
        each device's own blocks and working set; None: one device.
      own_parts, feature_rows: the partitions built here and where their features are read
        from, for one process of several (`jgrind.engine.build.build`); None: all of them,
        from ``graph.features``.

    Attributes: ``built`` (the `jgrind.engine.build.Built` record; some of its fields and its
    plan's are readable here too: ``store``, ``parts``, ``fates``, ``memory``...; the schedule
    is ``built.plan.schedule``) and ``runner`` (`jgrind.engine.runner.Runner`, whose
    ``sweeps`` run the schedule's sweeps). The transfer settings ``keep_device_rows``,
    ``pinned_host``, ``early_host_copies``, ``staging_pieces`` and ``pinned_inputs`` can be set
    between epochs.
    """

    def __init__(self, graph: Graph, model: GNN,
                 optimizer: Optional[optax.GradientTransformation] = None, *,
                 policy: Optional[Policy] = None, num_parts: int = 4,
                 partitioner: Callable = label_propagation,
                 partitioned: Optional[PartitionedGraph] = None, split: int = 0,
                 store: Optional[str] = None, device_budget: Optional[int] = None,
                 host_budget: Optional[int] = None, remat_policy=None, prefetch: bool = True,
                 max_shapes: int = 3, seed: int = 0, loss: Optional[Callable] = None,
                 prediction=None, tiers: Optional[dict] = None,
                 compile_effort: CompileEffort = QUICK, device_of=None, own_parts=None,
                 feature_rows=None):
        self.built: Built = build(
            graph, model, optimizer, policy=policy, num_parts=num_parts,
            partitioner=partitioner, partitioned=partitioned, split=split, store=store,
            device_budget=device_budget, host_budget=host_budget, remat_policy=remat_policy,
            prefetch=prefetch, max_shapes=max_shapes, seed=seed, loss=loss, tiers=tiers,
            compile_effort=compile_effort, device_of=device_of, own_parts=own_parts,
            feature_rows=feature_rows)
        self.compile_effort = compile_effort
        try:
            self.runner = Runner(self.built)
        except BaseException:  # a signal before the caller holds the engine: no files left
            self.built.close()
            raise
        self.prediction = prediction

    @property
    def sweep_seconds(self) -> list[tuple[str, float]]:
        """The last epoch's measured seconds per sweep (`Runner.sweep_seconds`)."""
        return self.runner.sweep_seconds

    # -- what was built -----------------------------------------------------------------------
    model, optimizer, device_budget, host_budget = _Built(), _Built(), _Built(), _Built()
    pg, parts, steps, store = _Built(), _Built(), _Built(), _Built()
    activations, aggregations, spares = _Built(), _Built(), _Built()
    num_layers, widths, inventory, workload = _Planned(), _Planned(), _Planned(), _Planned()
    fates, local, memory = _Planned(), _Planned(), _Planned()
    pool, writer = _Built("pipeline", "loader"), _Built("pipeline", "writer")  # the threads
    keep_device_rows, pinned_host = _Setting(), _Setting()
    early_host_copies, staging_pieces, pinned_inputs = _Setting(), _Setting(), _Setting()

    # -- running ------------------------------------------------------------------------------
    def step(self, params, opt_state, key):
        if self.optimizer is None:
            raise ValueError("this engine was made without an optimizer, for predictions "
                             "only; pass one (e.g. optax.adam(0.01)) to train with it")
        loss, grads = self.loss_and_grad(params, key)
        params, opt_state = self.built.update(params, opt_state, grads, loss)
        return params, opt_state, loss

    def loss_and_grad(self, params, key):
        """``(loss, grads)`` of the full-graph loss, computed partition by partition (the
        order of `jax.value_and_grad`, as `jgrind.train.InMemory` returns them)."""
        executed = self.built.executed
        loss, grads = self.runner.loss_and_grad(executed.split_params(params), key)
        return loss, executed.merge_params(grads)

    def predict(self, params) -> np.ndarray:
        """Logits ``[N, C]`` in the graph's node order, dropout off, partition by partition."""
        return self.runner.predict(self.built.executed.split_params(params))

    def embed(self, params, layer: int) -> np.ndarray:
        """``[N, width]`` in the graph's node order, dropout off: the output of the model's
        first ``layer`` layers (0: the features; all of them: the logits), computed partition
        by partition and read back from wherever the policy stored it."""
        given, executed = self.built.given_model, self.built.executed
        if given.check_layer(layer) == len(given.layers):
            return self.predict(params)
        # the executed layer whose input that is
        return self.runner.embed(executed.split_params(params), executed.origin.index(layer))

    def close(self) -> None:
        self.built.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
