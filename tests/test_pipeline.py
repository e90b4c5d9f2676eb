"""The sweep pipeline's contract (`jgrind.engine.pipeline`): one registered step per input,
in order, writes waited for at the end; a sweep that breaks it fails with a clear error
instead of letting inputs pile up. And the engine's two parts: what `build` makes and the
forward-only schedule predictions run."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jgrind import models, policies
from jgrind.engine import OutOfCore
from jgrind.engine.build import GPU_STAGING_PIECES, Built
from jgrind.engine.pipeline import Pipeline, PipelineError, TransferSettings
from jgrind.engine.runner import forward_sweeps
from jgrind.plan.schedule import FORWARD, Variant, epoch_schedule

from helpers import community_graph


@dataclasses.dataclass(frozen=True)
class _Part:
    index: int


def _pipeline(prefetch: bool) -> Pipeline:
    return Pipeline(prefetch, lambda **counts: None, TransferSettings(False, None))


PARTS = [_Part(i) for i in range(4)]


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "serial"])
def test_a_sweep_that_keeps_the_contract_runs_every_partition(prefetch):
    pipeline = _pipeline(prefetch)
    written = []
    try:
        with pipeline.sweep(PARTS, lambda part: part.index, stage=False) as io:
            for part, loaded in io:
                assert loaded == part.index
                io.dispatched(jnp.full(2, float(part.index)))
                io.write(written.append, part.index)
    finally:
        pipeline.close()
    assert written == [0, 1, 2, 3]


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "serial"])
def test_an_input_without_its_step_registered_is_an_error(prefetch):
    """A consumer that asks for the next input without registering the step it dispatched
    would let the loader run ahead of the compute: the pipeline says so."""
    pipeline = _pipeline(prefetch)
    try:
        with pytest.raises(PipelineError, match="partition 1's step was not registered"):
            with pipeline.sweep(PARTS, lambda part: part.index, stage=False) as io:
                for part, _ in io:
                    if part.index != 1:
                        io.dispatched(jnp.zeros(1))
    finally:
        pipeline.close()


def test_the_last_input_needs_its_step_registered_too():
    pipeline = _pipeline(False)
    io = pipeline.sweep(PARTS, lambda part: part.index, stage=False)
    with pytest.raises(PipelineError, match="partition 3's step was not registered"):
        for part, _ in io:
            if part.index < 3:
                io.dispatched(jnp.zeros(1))


def test_a_step_registered_twice_or_a_sweep_iterated_twice_is_an_error():
    pipeline = _pipeline(False)
    io = pipeline.sweep(PARTS, lambda part: part.index, stage=False)
    with pytest.raises(PipelineError, match="before the first"):
        io.dispatched(jnp.zeros(1))
    inputs = iter(io)
    next(inputs)
    io.dispatched(jnp.zeros(1))
    with pytest.raises(PipelineError, match="twice for one input"):
        io.dispatched(jnp.zeros(1))
    with pytest.raises(PipelineError, match="iterated once"):
        iter(io)


def test_a_step_with_two_outputs_does_not_wait_for_its_own_stores():
    """A step that keeps its aggregation queues two stores (one before it is registered, as
    the engine's saving forward does). Each store here finishes only once the next step's
    input has been yielded: the bound counts steps, so the main thread moves on to the next
    step instead of waiting for its own first store (which would wait 5 s and be seen); and
    when a step's stores are queued, those of the step before last are done."""
    import threading
    pipeline = _pipeline(True)
    yielded = {i: threading.Event() for i in range(len(PARTS) + 1)}
    finished, waited, seen = set(), [], []

    def store(step, output):
        if not yielded[step + 1].wait(5.0):
            waited.append(step)
        finished.add((step, output))
    try:
        with pipeline.sweep(PARTS, lambda part: part.index, stage=False) as io:
            for part, _ in io:
                i = part.index
                yielded[i].set()
                io.write(store, i, "aggregation")
                io.dispatched(jnp.full(2, float(i)))
                io.write(store, i, "rows")
                seen.append({s for s in range(i - 1) for o in ("aggregation", "rows")
                             if (s, o) not in finished})
            yielded[len(PARTS)].set()
    finally:
        pipeline.close()
    assert waited == [] and len(finished) == 2 * len(PARTS)
    assert seen == [set()] * len(PARTS)


def test_a_writers_error_is_raised_on_the_main_thread_when_the_sweep_ends():
    pipeline = _pipeline(True)

    def failing(index):
        raise OSError(f"disk gone at {index}")
    try:
        with pytest.raises(OSError, match="disk gone"):
            with pipeline.sweep(PARTS[:1], lambda part: part.index, stage=False) as io:
                for part, _ in io:
                    io.dispatched(jnp.zeros(1))
                    io.write(failing, part.index)
    finally:
        pipeline.close()


def test_the_engine_is_a_built_record_and_a_runner():
    """`OutOfCore`'s attributes are its built record's; the transfer settings it exposes are
    the pipeline's; inputs go to the device in one piece on the CPU backend."""
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    with OutOfCore(graph, model, optax.sgd(0.1), num_parts=3,
                   policy=policies.host_offload()) as ex:
        assert isinstance(ex.built, Built)
        assert ex.store is ex.built.store and ex.fates is ex.built.plan.fates
        assert ex.memory is ex.built.plan.memory and ex.parts is ex.built.parts
        expected = 1 if jax.default_backend() == "cpu" else GPU_STAGING_PIECES
        assert ex.staging_pieces == expected
        ex.staging_pieces = 3
        assert ex.built.transfers.staging_pieces == 3
        assert ex.built.pipeline.transfers is ex.built.transfers


def test_predictions_run_the_epochs_forward_sweeps():
    """A prediction runs the training schedule's forward sweeps (not its recomputations), in
    order, each as a plain forward step (no dropout key, no aggregation saved), and frees a
    recomputed layer after its last read."""
    schedule = epoch_schedule(4, recomputed=[1, 2], kept=[0])
    sweeps = forward_sweeps(schedule)
    assert [(s.kind, s.layer) for s in sweeps] == [(FORWARD, 0), (FORWARD, 1), (FORWARD, 2)]
    assert [s.layer for s in forward_sweeps(schedule, 2)] == [0, 1]
    assert [str(t) for t in sweeps[2].frees] == ["H_2"]

    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    params = model.init(jax.random.key(0))
    logits = {}
    for name, policy in (("host", policies.host_offload()),
                         ("recompute", policies.recompute_activations())):
        with OutOfCore(graph, model, None, num_parts=3, policy=policy) as ex:
            ran = []
            forward = ex.runner.sweeps.forward

            def watched(params, l, key, variant, evaluation=False, _ran=ran, _forward=forward):
                _ran.append((l, key, variant, evaluation))
                return _forward(params, l, key, variant, evaluation)
            ex.runner.sweeps.forward = watched
            logits[name] = ex.predict(params)
            assert [l for l, _, _, _ in ran] == [
                s.layer for s in forward_sweeps(ex.built.plan.schedule)]
            assert all(key is None and v is Variant.FORWARD and evaluation
                       for _, key, v, evaluation in ran)
    np.testing.assert_allclose(logits["recompute"], logits["host"], rtol=1e-5, atol=1e-6)
