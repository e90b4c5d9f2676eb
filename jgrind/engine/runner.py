"""Running a built engine: a schedule's sweeps in order, the tables they make and free.

`Runner.loss_and_grad` executes the training epoch's `jgrind.plan.schedule.Schedule` (the
`Built` record's); `Runner.predict` and `Runner.embed` execute its forward sweeps only
(`forward_sweeps`), with dropout off and no aggregation kept. Each sweep is one of
`jgrind.engine.sweeps.Sweeps`.
"""

from __future__ import annotations

import time
from typing import Optional

import jax
import numpy as np

from jgrind.hostio import transfers
from jgrind.engine.build import Built
from jgrind.engine.store import Table
from jgrind.engine.sweeps import Sweeps
from jgrind.engine.timing import SweepTiming
from jgrind.plan.fates import ACTIVATION, GRADIENT, Fate
from jgrind.plan.schedule import (ACTIVATIONS, BACKWARD, FORWARD, GRADIENTS, SNAPSHOTS,
                                  Schedule, Sweep)


def forward_sweeps(schedule: Schedule, layers: Optional[int] = None) -> list[Sweep]:
    """The forward sweeps of ``schedule``'s epoch (its first computations, not its
    recomputations), of layers below ``layers`` (None: all): what a prediction runs, in the
    same order and with the same makes and frees of recomputed layers."""
    return [s for s in schedule.sweeps if s.kind == FORWARD
            and (layers is None or s.layer < layers)]


def sweep_label(sweep: Sweep) -> str:
    """A sweep's name as the cost model's prediction labels it (``"forward 0"``)."""
    return f"{sweep.kind} {sweep.layer}"


class Runner:
    """Runs epochs and predictions on a `Built` engine. ``sweeps``: its `Sweeps`.

    ``sweep_seconds``: the last epoch's wall time per sweep, ``[(label, seconds)]`` in the
    schedule's order, labelled as the cost model's prediction labels its sweeps. A sweep's
    time runs until its stores are queued and written; device work it dispatched but nothing
    waited for is counted in a later sweep, so the sum is the epoch's time to its last sweep
    and single sweeps can shift a little.

    ``sweep_parts``: the last epoch's parts of every sweep's time, in the same order, as
    `jgrind.engine.timing.SweepTiming.parts` gives them (compute, reads and writes per tier,
    the main thread's waits on them); [] with ``time_parts`` off."""

    def __init__(self, built: Built, time_parts: bool = True):
        self.built = built
        self.sweeps = Sweeps(built)
        self.time_parts = time_parts
        self.sweep_seconds: list[tuple[str, float]] = []
        self.sweep_parts: list[dict] = []

    def loss_and_grad(self, params, key):
        """``(loss, grads)`` of the full-graph loss for the executed model's ``params``:
        `Built.plan.schedule`'s sweeps in order, the tables each sweep makes before it, its
        steps, and the tables it frees after it."""
        grads, loss = self.sweeps.epoch_start(params, key)
        grads = list(grads)
        gradients: dict[int, Table] = {}  # G_l while it lives
        masks: Optional[dict] = None  # output masks of layer l, made by layer l+1's backward
        timed, parts = [], []
        for sweep in self.built.plan.schedule.sweeps:
            start = time.perf_counter()
            self.sweeps.timing = SweepTiming() if self.time_parts else None
            for table in sweep.makes:
                if table.name == GRADIENTS:
                    gradients[table.layer] = self.gradient_table(table.layer)
                else:
                    self.make(table)
            l = sweep.layer
            if sweep.kind == BACKWARD:
                loss, grads[l], masks = self.sweeps.backward(
                    params, l, sweep.variant, key, gradients.get(l + 1), gradients.get(l),
                    loss, grads[l], masks)
            else:
                self.sweeps.forward(params, l, key, sweep.variant)
            for table in sweep.frees:
                if table.name == GRADIENTS:  # an all-SSD gradient file is kept for next epoch
                    self.built.store.drop(gradients.pop(table.layer), keep=True)
                else:
                    self.free(table)
            timed.append((sweep_label(sweep), time.perf_counter() - start))
            if self.sweeps.timing is not None:
                parts.append(self.sweeps.timing.parts(timed[-1][1]))
        self.sweeps.timing = None
        self.sweep_seconds, self.sweep_parts = timed, parts
        return loss, tuple(grads)

    def make(self, table) -> None:
        """Bring a schedule's activation or snapshot table into being before the sweep that
        writes it first."""
        if table.name == ACTIVATIONS:  # a recomputed layer's transient
            self.built.activations[table.layer].materialize()
        elif table.name == SNAPSHOTS:  # the naive scheme's, filled by this forward sweep
            plan = self.built.plan
            self.sweeps.snapshots[table.layer] = self.built.store.snapshot(
                table.layer, plan.widths[table.layer], plan.snapshot_rows(table.layer))

    def free(self, table) -> None:
        """Release a schedule's activation or snapshot table after the sweep that reads it
        last."""
        if table.name == ACTIVATIONS:
            self.built.activations[table.layer].release()
        elif table.name == SNAPSHOTS:
            self.built.store.drop(self.sweeps.snapshots.pop(table.layer))

    def gradient_table(self, layer: int) -> Table:
        """``G_layer``, made at the start of backward sweep ``layer`` and freed after sweep
        ``layer - 1``. Made while it lives: ``G_{layer-1}`` and recomputed layers' transients,
        the ``reserve`` that lets it take a larger freed host array (`HostArrays`)."""
        plan = self.built.plan
        reserve = plan.host_bytes(GRADIENT, layer - 1) if layer >= 2 else 0
        reserve += sum(plan.host_bytes(ACTIVATION, l, Fate.RECOMPUTE)
                       for l in range(plan.num_layers))
        return self.built.store.table(GRADIENT, layer, plan.widths[layer],
                                      plan.layer_fates(GRADIENT, layer), reserve=reserve)

    # -- evaluation ---------------------------------------------------------------------------
    def _forward(self, params, layers: int) -> None:
        """The forward sweeps below ``layers``, dropout off, with the recomputed layers'
        makes and frees of the epoch's forward sweeps (snapshots are the epoch's only), each
        in its epoch's variant: the epoch's compiled steps (a saving sweep's aggregations are
        not kept)."""
        for sweep in forward_sweeps(self.built.plan.schedule, layers):
            for table in sweep.makes:
                if table.name == ACTIVATIONS:
                    self.make(table)
            self.sweeps.forward(params, sweep.layer, None, sweep.variant, evaluation=True)
            for table in sweep.frees:
                if table.name == ACTIVATIONS:
                    self.free(table)

    def _release_recomputed(self, layers: int) -> None:
        for table in self.built.activations[1:layers + 1]:
            if table.recomputed:
                table.release()

    def predict(self, params) -> np.ndarray:
        """Logits ``[N, C]`` in the graph's node order for the executed model's ``params``,
        dropout off, partition by partition."""
        b, sweeps = self.built, self.sweeps
        L = b.plan.num_layers
        self._forward(params, L - 1)
        logits = np.zeros((b.num_nodes, b.plan.widths[-1]), np.float32)
        steps, p_top = b.steps[-1], params[-1]
        with b.pipeline.sweep(b.parts, sweeps.input_loader(L - 1, b.activations[L - 1])) as io:
            for part, h_in in io:
                out = steps.forward(p_top, sweeps.step_block(part, L - 1), h_in, None,
                                    b.spares.take((part.num_out, b.plan.widths[-1])))
                io.dispatched(out)
                logits[part.owned] = jax.device_get(out)[: part.num_owned]
        self._release_recomputed(L - 1)
        return logits

    def embed(self, params, layer: int) -> np.ndarray:
        """``[N, width]`` in the graph's node order, dropout off: the input of executed layer
        ``layer`` (0: the features), computed partition by partition and read back from
        wherever the policy stored it."""
        b = self.built
        self._forward(params, layer)
        table = b.activations[layer]
        out = np.empty((b.num_nodes, b.plan.widths[layer]), np.float32)
        for part in b.parts:
            # read padded to the partition's output rows, as the steps read it: a device
            # block's take then compiles per padded shape, not per partition's row count
            rows = transfers.host_view(table.read(part.index, part.num_out))
            out[part.owned] = rows[: part.num_owned]
        self._release_recomputed(layer)
        return out
