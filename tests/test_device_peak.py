"""The device budget is a bound: what an epoch holds on the device never exceeds the plan.

On the CPU backend the device's arrays are `jax.live_arrays()`. At every partition step the test
adds up those alive (its inputs and the next partition's, its outputs and the previous one's,
the blocks, masks, parameters and stored tables) and the step's XLA temporaries
(`memory_analysis`), and checks the sum against the plan's device bytes (`Memory.device`).
Arrays alive before the engine is built are not counted. The worst case is forced: each step is measured once the next partition's input has loaded,
and a step's output is written only when the engine waits for that write (a writer slower than
the compute, as a GPU's copies to the host can be).
"""

from __future__ import annotations

import dataclasses
import gc
import threading

import jax
import optax
import pytest

from jgrind import generators, models
from jgrind.engine import OutOfCore
from jgrind.engine.store import BudgetError
from jgrind.partition import partition_graph
from jgrind.partition.partitioners import label_propagation
from jgrind.plan.cost import format_bytes


def device_bytes(host_owned: frozenset = frozenset()) -> int:
    """Bytes of the live device arrays, each buffer once (`jax.device_get` on the CPU makes a
    second array over the same buffer). Buffers at the addresses ``host_owned`` are host
    arrays the device uses in place (the CPU backend adopts aligned arrays): they hold no
    device memory of their own."""
    seen, total = set(host_owned), 0
    for array in jax.live_arrays():
        if array.is_deleted():
            continue
        pointer = array.unsafe_buffer_pointer()
        if pointer not in seen:
            seen.add(pointer)
            total += array.nbytes
    return total


class _WaitedFuture:
    """A writer's future whose task starts only when someone waits for it."""

    def __init__(self, future, start: threading.Event):
        self._future, self._start = future, start

    def result(self, timeout=None):
        self._start.set()
        return self._future.result(timeout)

    def __getattr__(self, name):
        return getattr(self._future, name)


def watch_device_peak(engine) -> list:
    """Wrap ``engine``'s steps and I/O threads; returns the list each step appends its
    ``(step name, bytes)`` to."""
    peaks, last_load, memory = [], [None], {}
    submit_load, submit_write = engine.pool.submit, engine.writer.submit
    # the blocks' host structure, which the engine puts once where the device adopts it
    # (`jgrind.engine.sweeps.Sweeps.device_block`)
    structure = frozenset(leaf.ctypes.data for part in engine.parts
                          for leaf in jax.tree.leaves(part.block))

    def load(fn, *args):
        last_load[0] = submit_load(fn, *args)
        return last_load[0]

    def write(fn, *args):
        start = threading.Event()

        def waits(*args):
            start.wait()
            return fn(*args)
        return _WaitedFuture(submit_write(waits, *args), start)

    engine.pool.submit, engine.writer.submit = load, write

    def watched(name, step):
        def run(*args):
            if last_load[0] is not None:
                last_load[0].result()  # the next partition's input is on the device
            shapes = tuple((a.shape, a.dtype) for a in jax.tree.leaves(args)
                           if hasattr(a, "shape"))
            if (name, shapes) not in memory:
                memory[name, shapes] = step.lower(*args).compile().memory_analysis()
            out = step(*args)
            peaks.append((name, device_bytes(structure)
                          + memory[name, shapes].temp_size_in_bytes))
            return out
        return run

    for l, steps in enumerate(engine.steps):
        fields = {f.name: getattr(steps, f.name) for f in dataclasses.fields(steps)}
        engine.steps[l] = type(steps)(**{
            k: watched(f"{k}[{l}]", v) if callable(v) else v for k, v in fields.items()})
    return peaks


def least_device_budget(graph, model, pg, store) -> int:
    """The device budget the engine states as its minimum for this plan."""
    with pytest.raises(BudgetError) as error:
        OutOfCore(graph, model, optax.adam(0.01), partitioned=pg, store=store,
                  device_budget=1, host_budget=1 << 20)
    figure = str(error.value).rsplit("at least ", 1)[1].split()
    return int(float(figure[0]) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[figure[1]]) + 1


GRAPH = dict(num_nodes=20_000, num_edges=200_000, num_features=32, num_classes=10, seed=0)
MODELS = {
    "gcn": lambda f, c: models.gcn(f, 64, c, num_layers=3, dropout=0.5),
    "sage": lambda f, c: models.sage(f, 64, c, num_layers=3, dropout=0.5),
    "gat": lambda f, c: models.gat(f, 8, c, num_layers=2, heads=4),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("extra", [0, 4 << 20], ids=["least", "more"])
def test_an_epoch_stays_within_the_planned_device_bytes(name, extra, tmp_path):
    graph = generators.rmat(**GRAPH)
    model = MODELS[name](graph.num_features, graph.num_classes)
    normalized = model.normalize(graph)
    pg = partition_graph(normalized, label_propagation(normalized, 8, seed=0), num_parts=8)
    budget = least_device_budget(graph, model, pg, tmp_path) + extra
    optimizer = optax.adam(0.01)
    gc.collect()  # earlier tests' engines, and their device arrays, wait in reference cycles
    before = device_bytes()
    with OutOfCore(graph, model, optimizer, partitioned=pg, store=tmp_path,
                   device_budget=budget, host_budget=1 << 20) as engine:
        peaks = watch_device_peak(engine)
        params = model.init(jax.random.key(0))
        params, state, loss = engine.step(params, optimizer.init(params), jax.random.key(1))
        jax.block_until_ready(params)
        planned = engine.memory.device
    step, peak = max(peaks, key=lambda item: item[1])
    peak -= before
    assert peak <= planned <= budget, (
        f"{name}: {format_bytes(peak)} on the device at {step}, the plan says "
        f"{format_bytes(planned)}")
