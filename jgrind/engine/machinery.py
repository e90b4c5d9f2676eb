"""What the engine itself costs a partition step, measured by running it on a workload with
next to no data: part of the cost model's price of a sweep (`jgrind.plan.cost.Sweep`).

A partition step is more than its kernels and its bytes: the main thread dispatches the
step's programs and hands its inputs and outputs over; the loader routes, gathers and puts
them; the writer reads the output back and stores it; each table call goes through the
store's Python. On the CPU backend those threads also take turns on the interpreter. On the
planner benchmark's 256-partition configurations this came to 1.6-3.3 ms a step, against the
0.97 ms of the profile's trivial pipeline (`jgrind.plan.measure._sweep_step`), and narrow
sweeps took twice their price. Rather than model the pieces, this runs the engine: a
three-layer GCN over `PARTS` partitions of a few nodes each, once with every block in host
RAM and once with every block on the SSD store, their epochs taken in turns (the per-step
time of one engine varied by a third from epoch to epoch on the test machine, and drifts with
the machine's load: taking turns puts the drift into both), and reads each sweep's wall time.

The figures (`jgrind.plan.hardware.Profile`): seconds per step of a forward sweep, of the
top layer's fused step, of a backward step with an input gradient, and of the first layer's
(weight gradients only), with host blocks; the seconds each table call on an SSD block adds
to a step (the SSD run's excess over the host run, per SSD call); and the seconds a halo call
(a gather of a layer's input, a scatter-add of its input gradient) adds when its table has
some blocks on the device and the others in host RAM (a third run with every `MIX_EVERY`-th
partition's blocks on the device: its excess over the host run, per halo call), and the
seconds per step of the layers that keep their aggregation (a fourth run with every block in
host RAM and every aggregation kept there: its forward steps store two outputs and its
backward steps read the aggregation instead of regathering; on the test machine a kept
forward step took a quarter more than a plain one, 1.67 against 1.32 ms). Such a call
reads the device's rows back beside the host ones, waiting for the device's queue each time:
on the test machine 0.6-1.0 ms a step (tables 1 in 64 to half on the device,
tools/bench_split_tables.py), where tables all on the device cost what tables all in host RAM
do. Last, the loader's and the writer's own seconds per step in the host run (the time they
spent in the store's read and write calls with next to nothing to move: routes, table calls,
the hand-over; on the test machine 0.2-0.4 ms each, against 1.1-2.0 ms a step): an I/O
thread's time in a sweep is that and its bytes (`jgrind.plan.cost.Sweep.reader_own`).
"""

from __future__ import annotations

import os
import tempfile
from typing import Optional

import jax
import numpy as np
import optax

from jgrind.engine.engine import OutOfCore
from jgrind.generators import csbm
from jgrind.models.model import gcn
from jgrind.plan import policies
from jgrind.plan.fates import AGGREGATION, Fate
from jgrind.plan.schedule import ACTIVATIONS, BACKWARD, GRADIENTS, LABELS

__all__ = ["EPOCHS", "PARTS", "measure"]

PARTS = 64        # partitions: enough steps per sweep for a stable per-step figure (64,
#                   128 and 256 gave the same figures within their noise)
ROWS = 32         # nodes per partition: kernels and bytes next to nothing
WIDTH = 8         # features, hidden and classes
LAYERS = 3
EPOCHS = 7        # timed epochs of each engine, after one that compiles; medians are kept
MIX_EVERY = 8     # the mixed run's blocks on the device: every 8th partition's, so that
#                   nearly every step's halo reads some of them, and most own blocks are not


def measure(directory: Optional[str | os.PathLike] = None, *, parts: int = PARTS,
            epochs: int = EPOCHS) -> dict:
    """``{"forward", "top", "backward", "params", "ssd_call", "device_mix", "kept_forward",
    "kept_backward", "kept_params", "loader", "writer"}``: seconds per partition step of each
    kind of sweep with host blocks, per table call on an SSD block beyond a host one, per halo
    call on a table split between the device and host RAM beyond an all-host one, per step of
    each kind of sweep of a layer that keeps its aggregation (the top layer never does), and
    the loader's and the writer's own seconds per step with host blocks. ``directory``:
    where the SSD run's store goes (the disk the profile measures; default the system's
    temporary folder)."""
    graph = csbm(parts * ROWS, num_classes=WIDTH, num_features=WIDTH, avg_degree=10.0,
                 seed=0)
    model = gcn(WIDTH, WIDTH, WIDTH, num_layers=LAYERS, dropout=0.5)
    store = str(directory) if directory is not None else tempfile.gettempdir()
    with OutOfCore(graph, model, optax.sgd(0.0), policy=policies.host_offload(),
                   num_parts=parts) as host, \
            OutOfCore(graph, model, optax.sgd(0.0), policy=policies.ssd_offload(store),
                      num_parts=parts, store=store) as ssd, \
            OutOfCore(graph, model, optax.sgd(0.0), policy=_device_and_host,
                      num_parts=parts) as mixed, \
            OutOfCore(graph, model, optax.sgd(0.0), policy=_kept_on_host,
                      num_parts=parts) as kept:
        runs = [_Timed(host, model), _Timed(ssd, model), _Timed(mixed, model),
                _Timed(kept, model)]
        for epoch in range(epochs + 1):  # the first compiles
            for run in runs:
                run.epoch(timed=epoch > 0)
        on_host, on_ssd, on_both, keeping = (run.per_step() for run in runs)
    figures = {kind: float(np.median(steps)) for kind, steps in _by_kind(on_host).items()}
    excess = sum(on_ssd[label][0] - seconds for label, (seconds, *_) in on_host.items())
    calls = sum(n for _, n, _ in on_host.values())
    figures["ssd_call"] = max(0.0, excess / calls)
    excess = sum(on_both[label][0] - seconds for label, (seconds, _, _) in on_host.items())
    calls = sum(n for _, _, n in on_host.values())
    figures["device_mix"] = max(0.0, excess / calls)
    for kind, steps in _by_kind(keeping).items():
        if kind != "top":
            figures[f"kept_{kind}"] = float(np.median(steps))
    figures.update(runs[0].threads_per_step())
    return figures


def _device_and_host(info) -> Fate:
    """The mixed run's policy: every `MIX_EVERY`-th partition's activation and gradient
    blocks on the device, the others' in host RAM; no aggregation kept."""
    if info.name == AGGREGATION:
        return Fate.RECOMPUTE
    return Fate.DEVICE if info.partition % MIX_EVERY == 0 else Fate.HOST


def _kept_on_host(info) -> Fate:
    """The keeping run's policy: every block in host RAM, every aggregation kept there."""
    return Fate.HOST


class _Timed:
    """One engine's epochs, each sweep's seconds kept."""

    def __init__(self, engine: OutOfCore, model):
        self.engine = engine
        self.params = model.init(jax.random.key(0))
        self.opt_state = engine.optimizer.init(self.params)
        self.seconds: dict = {}
        self.threads: dict = {"loader": [], "writer": []}  # per sweep: seconds per step
        self.epochs = 0

    def epoch(self, timed: bool) -> None:
        self.params, self.opt_state, loss = self.engine.step(
            self.params, self.opt_state, jax.random.key(self.epochs))
        jax.block_until_ready(loss)
        self.epochs += 1
        if timed:
            for label, seconds in self.engine.sweep_seconds:
                self.seconds.setdefault(label, []).append(seconds)
            steps = self._steps()
            for parts in self.engine.runner.sweep_parts:
                self.threads["loader"].append(sum(parts["reads"].values()) / steps)
                if parts["writes"]:  # the first layer's backward stores nothing
                    self.threads["writer"].append(sum(parts["writes"].values()) / steps)

    def _steps(self) -> int:
        return sum(1 for p in self.engine.parts if p.num_out > 0) or 1

    def threads_per_step(self) -> dict:
        """``{"loader", "writer"}``: the median over the timed sweeps of each I/O thread's
        seconds in the store's calls per step (`jgrind.engine.timing.SweepTiming`)."""
        return {name: float(np.median(per_step)) if per_step else 0.0
                for name, per_step in self.threads.items()}

    def per_step(self) -> dict:
        """``{sweep label: (median seconds per step, stored-table calls per step, halo calls
        per step)}``."""
        calls = {f"{s.kind} {s.layer}": (_calls(s), _halo_calls(s))
                 for s in self.engine.built.plan.schedule.sweeps}
        steps = self._steps()
        return {label: (float(np.median(seconds)) / steps, *calls[label])
                for label, seconds in self.seconds.items()}


def _calls(sweep) -> int:
    """Stored tables a step of ``sweep`` reads or writes (the labels are not a table)."""
    return sum(1 for t in sweep.reads + sweep.writes if t.name != LABELS)


def _halo_calls(sweep) -> int:
    """Halo calls of a step of ``sweep`` (the GCN's layers all aggregate): its input's gather,
    and in backward its input gradient's scatter-add."""
    return sum(1 for t in sweep.reads if t.name == ACTIVATIONS) + \
        (sweep.kind == BACKWARD) * sum(1 for t in sweep.writes if t.name == GRADIENTS)


def _by_kind(measured: dict) -> dict:
    """Per-step seconds of the sweeps by the cost model's kind of step
    (`jgrind.plan.cost.machinery_kind`)."""
    kinds: dict = {"forward": [], "top": [], "backward": [], "params": []}
    for label, (seconds, *_) in measured.items():
        kind, layer = label.split()
        if kind != BACKWARD:
            kinds["forward"].append(seconds)
        elif int(layer) == LAYERS - 1:
            kinds["top"].append(seconds)
        else:
            kinds["backward" if int(layer) >= 1 else "params"].append(seconds)
    return kinds
