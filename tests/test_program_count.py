"""How many programs an out-of-core run compiles, that a later epoch compiles none, and that
an evaluation compiles only the last layer's forward (it runs training's forward programs).

On a GPU each program costs a fraction of a second to compile (about 0.24 s on an H200 without
autotuning), so the first epoch's time is mostly its program count (issue 39, target 5). The
counts here are of a small run on the CPU backend, listed by `jgrind.engine.program_log`; a
count that grows means a shape bucket or a merged program was lost (the assertion prints the
programs by name).
"""

import types

import jax
import numpy as np
import optax
import pytest

from jgrind import generators, models
from jgrind.engine import OutOfCore, build, pipeline, spares
from jgrind.engine.build import shape_count
from jgrind.engine.program_log import ProgramLog, report
from jgrind.engine.steps import layer_steps
from jgrind.hostio import transfers
from jgrind.partition import random as random_partition, shape_groups
from jgrind.plan import Fate, policies
from jgrind.plan.cost import Workload
from jgrind.plan.fates import AGGREGATION
from jgrind.plan.schedule import Variant
from jgrind.train import initial_state

from helpers import reference
from test_engine import assert_same_gradients


def _spread(info):
    """Blocks on the device, in host RAM and on SSD, by partition."""
    return (Fate.DEVICE, Fate.HOST, Fate.SSD)[info.partition % 3]


def _epochs(ex, model, count: int) -> list:
    """The programs each of ``count`` training epochs compiled (the parameters' init and the
    optimizer's state before them are not counted)."""
    params = model.init(jax.random.key(0))
    optimizer = optax.adam(0.01)
    opt_state = optimizer.init(params)
    compiled = []
    with ProgramLog() as log:
        for epoch in range(count):
            log.mark(f"epoch {epoch}")
            params, opt_state, loss = ex.step(params, opt_state, jax.random.key(epoch))
            jax.block_until_ready((params, loss))
            compiled.append(log.phase(f"epoch {epoch}"))
    return compiled


def _graph_and_model():
    graph = generators.csbm(num_nodes=600, num_features=8, avg_degree=6, seed=3)
    return graph, models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5)


# The first epoch's programs on the CPU backend for the run below (3-layer GCN, 6 partitions
# in 2 padded shapes, blocks on the device, in host RAM and on SSD): 12 partition steps, 19
# table operations of the device tier (takes, sets and adds, per table and index length),
# and one each for the epoch's zeros and dropout keys, the loss's sum and the optimizer's
# update. The steps' waits cost none (`jgrind.engine.pipeline._marker`: their accumulators
# and, this small, their outputs are copied): 42 while every wait was a one-element slice,
# a program per shape; 37 while a device block read to the host was a slice outside jit,
# a program per table and block size (`jgrind.engine.tiers.device.DeviceTier.read_block`).
FIRST_EPOCH = 34


def test_a_small_out_of_core_run_compiles_a_known_number_of_programs(tmp_path):
    graph, model = _graph_and_model()
    with OutOfCore(graph, model, optax.adam(0.01), policy=_spread, num_parts=6,
                   store=tmp_path, partitioner=random_partition) as ex:
        first, second = _epochs(ex, model, 2)
    assert len(first) <= FIRST_EPOCH, report(first, shapes=True)
    assert not second, report(second, shapes=True)


@pytest.mark.parametrize("saving", [False, True], ids=["forward", "forward-saving"])
def test_evaluation_runs_the_training_forward_programs(saving, tmp_path):
    """After the epochs, an evaluation compiles none of the forward steps training ran: its
    forward sweeps pass training's key types with dropout switched off by a traced switch
    (`jgrind.models.dropout.SwitchedKey`), where a None key traced every forward step again
    (a program per layer and padded shape: 5 more here, in a prediction 7 against 2), and a
    sweep that keeps its aggregation (``saving``) runs training's saving step. A prediction
    adds the last layer's forward, one per padded shape (training fuses that layer with
    the loss); the embeddings below it add nothing. Dropout off: the embeddings are the
    in-memory ones."""
    # the steps are cached across engines (`layer_steps`): steps that another test ran with a
    # None key would hide a forward compiled for evaluation here
    layer_steps.cache_clear()
    graph, model = _graph_and_model()
    policy = _spread if saving else (
        lambda info: Fate.RECOMPUTE if info.name == AGGREGATION else _spread(info))
    with OutOfCore(graph, model, optax.adam(0.01), policy=policy, num_parts=6,
                   store=tmp_path, partitioner=random_partition) as ex:
        variants = {s.variant for s in ex.built.plan.schedule.sweeps}
        assert (Variant.FORWARD_SAVING in variants) == saving
        _epochs(ex, model, 2)
        params = model.init(jax.random.key(1))
        with ProgramLog() as log:
            log.mark("embed")
            embedded = [ex.embed(params, layer) for layer in range(1, len(model.layers))]
            log.mark("predict")
            logits = ex.predict(params)
        assert not log.phase("embed"), report(log.phase("embed"), shapes=True)
        predicted = log.phase("predict")
        top_shapes = {(p.num_out, p.num_in) for p in ex.built.parts}
        assert {p.name for p in predicted} <= {"jit(forward)"}, report(predicted)
        assert len(predicted) <= len(top_shapes), report(predicted, shapes=True)
    block = model.block(model.normalize(graph))
    x = jax.numpy.asarray(graph.features)
    for layer, got in enumerate(embedded, start=1):
        want = model.apply(params, block, x, None, num_layers=layer)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits, model.apply(params, block, x, None), rtol=1e-5,
                               atol=1e-5)


def test_the_initial_state_is_one_program_with_the_values_op_by_op():
    """`jgrind.train.initial_state`: parameters and optimizer state in one compiled program
    (op by op, a 3-layer GCN and adam compile 16 before the first epoch), equal bit
    for bit to ``model.init`` and ``optimizer.init`` run op by op: the parameters of plain,
    residual and LayerNorm, attention and relational layers, and two optimizers' states."""
    key = jax.random.key(11)
    cases = [models.gcn(8, 16, 5, num_layers=3),
             models.gcn(8, 16, 5, num_layers=2, residual=True, layer_norm=True),
             models.gat(8, 4, 5, heads=2, layer_norm=True),
             models.rgcn(8, 16, 5, num_relations=3, num_bases=2)]
    optimizers = [lambda: optax.adam(0.01),
                  lambda: optax.chain(optax.add_decayed_weights(5e-4), optax.sgd(0.1, 0.9))]
    for i, model in enumerate(cases):  # (each pair is a compile: seconds on a busy CPU)
        optimizer = optimizers[i % 2]()  # a new one: its program is not cached yet
        with ProgramLog() as log:
            params, opt_state = initial_state(key, model, optimizer)
            jax.block_until_ready((params, opt_state))
        assert len(log.programs) == 1, report(log.programs)
        want = model.init(key)
        want_state = optimizer.init(want)
        assert jax.tree.structure(params) == jax.tree.structure(want)
        assert jax.tree.structure(opt_state) == jax.tree.structure(want_state)
        for got, expected in zip(jax.tree.leaves((params, opt_state)),
                                 jax.tree.leaves((want, want_state))):
            assert got.dtype == expected.dtype
            np.testing.assert_array_equal(got, expected)


def _gpu_paths(ex) -> None:
    """The transfer paths the engine takes off the CPU backend, forced on it: device rows
    kept on the device, outputs stored through ``pinned_host`` memory, large inputs sent in
    row ranges joined on the device (and, set by the test, spare buffers made on the device)."""
    ex.keep_device_rows = True
    ex.pinned_host = transfers.pinned_host()
    ex.staging_pieces = 4


@pytest.mark.parametrize("pinned_inputs", [False, True], ids=["pageable", "pinned-inputs"])
def test_later_epochs_compile_nothing_on_the_gpu_paths(pinned_inputs, tmp_path, monkeypatch):
    """With inputs filled into page-locked buffers and put from there (``pinned_inputs``),
    an H200 compiled programs in three epochs running (47, 33, then 1): a put to an explicit
    memory commits its result, jit compiles a committed argument apart from an uncommitted
    one, and the step outputs made from it were committed in turn (parameters, spares,
    tables). The CPU backend has a ``pinned_host`` memory too, so the path runs here."""
    monkeypatch.setattr(pipeline, "MIN_PIECE_BYTES", 256)
    monkeypatch.setattr(spares, "DEVICE_PLACEHOLDERS_ON_CPU", True)
    monkeypatch.setattr(build, "_input_staging", lambda: transfers.pinned_staging(
        per_shape=build.INPUT_BUFFERS, enabled=False))
    graph, model = _graph_and_model()
    with OutOfCore(graph, model, optax.adam(0.01), policy=_spread, num_parts=6,
                   store=tmp_path, partitioner=random_partition) as ex:
        _gpu_paths(ex)
        ex.pinned_inputs = pinned_inputs
        compiled = _epochs(ex, model, 3)
        if pinned_inputs:
            staging = ex.built.store.input_staging
            assert staging.made and staging.reused  # inputs went through pinned buffers
    for later in compiled[1:]:
        assert not later, report(later, shapes=True)


def _partitions(sizes):
    """Stand-ins for partitions: ``(owned, inputs, edges)`` each, as `shape_groups` reads them."""
    return [types.SimpleNamespace(index=i, num_owned=o, num_inputs=n, num_edges=e)
            for i, (o, n, e) in enumerate(sizes)]


# The 16 label-propagation partitions of the R-MAT graph of 200k nodes and 5.2M edges
# (tools/trace_epoch.py --rmat 200000 5200000 --parts 16): owned rows, input rows, edges.
RMAT_200K = [(12187, 36784, 304022), (12501, 44815, 349026), (12394, 43693, 341954),
             (12415, 44821, 316237), (11922, 40105, 371213), (12726, 40484, 371249),
             (10462, 42087, 371235), (12857, 38732, 320213), (12791, 39344, 338847),
             (12209, 42002, 371247), (12718, 46963, 370003), (13125, 40156, 267940),
             (13125, 40157, 274918), (12689, 39805, 371234), (13091, 38310, 344497),
             (12788, 38798, 316165)]


def test_three_shapes_that_two_would_hold_become_two(monkeypatch):
    """Three input-row groups (40960, 45056, 49152) padded to two (40960, 49152) for 0.6 %
    more input rows; none where that would cost more padding than the tolerance, or where a
    partition's output rows would change (the memory plan sums them)."""
    parts = _partitions(RMAT_200K)
    assert len(set(shape_groups(parts, 3).values())) == 3
    assert shape_count(parts, 3) == 2
    assert sorted(s[1] for s in set(shape_groups(parts, 2).values())) == [40960, 49152]
    monkeypatch.setattr(build, "SHAPE_PADDING_TOLERANCE", 0.005)
    assert shape_count(parts, 3) == 3
    monkeypatch.undo()
    # merged into the group above, the middle group's partitions would pad more output rows
    # (the memory plan sums them): one of the largest with more owned rows
    more_owned = [(14000 if n == 46963 else o, n, e) for o, n, e in RMAT_200K]
    assert shape_count(_partitions(more_owned), 3) == 3
    # a shape larger than any of the three's in some dimension (more edges and more input rows
    # than any one group's) would need a larger step: a middle partition with more edges
    more_edges = [(o, n, 420000 if n == 42002 else e) for o, n, e in RMAT_200K]
    assert shape_count(_partitions(more_edges), 3) == 3


def test_fewer_shapes_keep_the_memory_plan_and_the_gradients(tmp_path):
    """An engine asked for at most 3 shapes runs 2 where its partitions allow (`shape_count`):
    the memory plan is the one 3 shapes give (a plan made for 3 fits the same budgets), and
    the loss and gradients are the in-memory ones."""
    graph = generators.rmat(num_nodes=1000, num_edges=8000, num_features=8, seed=0)
    model = models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5)
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(), num_parts=8,
                   store=tmp_path, partitioner=random_partition) as ex:
        pg = ex.built.pg
        assert len(set(shape_groups(pg.partitions, 3).values())) == 3
        assert len({tuple(a.shape for a in jax.tree.leaves(p.block))
                    for p in ex.built.parts}) == 2
        three, two = Workload.build(pg, model, 3), Workload.build(pg, model, 2)
        assert two.working_set() == three.working_set()
        assert ex.built.plan.workload.working_set() == three.working_set()
        loss, grads = ex.loss_and_grad(params, key)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)
