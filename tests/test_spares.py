"""Step outputs reused by later steps (`jgrind.engine.spares`): XLA writes into the donated
buffer, nothing that is still read is overwritten, and the engine stays exact."""

from __future__ import annotations

import jax
import numpy as np
import optax

from jgrind import generators, models
from jgrind.engine import OutOfCore
from jgrind.engine.spares import Spares, placeholder
from jgrind.engine.steps import layer_steps, pad_partition
from jgrind.partition import contiguous, partition_graph, shape_groups
from jgrind.plan import Fate, policies

from helpers import csbm_graph, reference
from test_engine import assert_same_gradients


def _partition(graph, model, parts=3):
    normalized = model.normalize(graph)
    pg = partition_graph(normalized, contiguous(normalized, parts), num_parts=parts)
    shapes = shape_groups(pg.partitions, 1)
    weights = np.ones(graph.num_nodes, np.float32)
    return [pad_partition(p, shapes[p.index], labels=graph.labels, weights=weights,
                          needs_edges=model.needs_edges, needs_adjacency=model.needs_adjacency)
            for p in pg.partitions]


def _pointer(array) -> int:
    return array.unsafe_buffer_pointer()


def test_a_step_writes_its_output_into_the_donated_spare():
    graph = generators.csbm(num_nodes=300, num_features=8, avg_degree=5, seed=0)
    model = models.gcn(8, 16, graph.num_classes, num_layers=2)
    layer = model.layers[0]
    steps = layer_steps(layer)
    part = _partition(graph, model)[0]
    params = model.init(jax.random.key(0))[0]
    block = jax.device_put(part.block)
    h = np.random.default_rng(0).standard_normal((part.num_in, 8)).astype(np.float32)
    first = steps.forward(params, block, h, None, placeholder((part.num_out, 16)))
    where = _pointer(first)
    expected = np.asarray(first).copy()
    second = steps.forward(params, block, h, None, first)
    assert first.is_deleted()
    assert _pointer(second) == where  # written in place: no new buffer
    np.testing.assert_array_equal(np.asarray(second), expected)

    # backward: the input gradient (shaped like the input) goes into the spare
    acc = jax.tree.map(np.zeros_like, params)
    g_out = np.ones((part.num_out, 16), np.float32)
    acc, d_h = steps.backward(params, block, h, None, g_out, acc, placeholder(h.shape))
    where, expected = _pointer(d_h), np.asarray(d_h).copy()
    acc, again = steps.backward(params, block, h, None, g_out, acc, d_h)
    assert _pointer(again) == where
    np.testing.assert_array_equal(np.asarray(again), expected)


def test_an_output_still_viewed_is_not_overwritten():
    # the store copies rows out of a step's output through NumPy views; should one outlive the
    # store's write, reusing the buffer must not change what the view reads (JAX then leaves
    # the donated buffer alone and allocates)
    graph = generators.csbm(num_nodes=300, num_features=8, avg_degree=5, seed=0)
    model = models.gcn(8, 16, graph.num_classes, num_layers=2)
    steps = layer_steps(model.layers[0])
    part = _partition(graph, model)[0]
    params = model.init(jax.random.key(0))[0]
    block = jax.device_put(part.block)
    h = np.ones((part.num_in, 8), np.float32)
    first = steps.forward(params, block, h, None, placeholder((part.num_out, 16)))
    view = np.asarray(first)
    before = view.copy()
    second = steps.forward(params, block, 2 * h, None, first)
    np.testing.assert_array_equal(view, before)
    assert not np.array_equal(np.asarray(second), before)


def test_spares_kept_for_the_next_steps_only():
    spares = Spares(lookahead=2)
    a, b, c = (jax.numpy.zeros((4, 3)) + i for i in range(3))
    other = jax.numpy.zeros((5, 3))
    spares.give(a)  # no sweep planned: nothing is kept
    assert spares.take((4, 3)) is not a and spares.made == 1
    spares.plan([(4, 3), (4, 3), (5, 3), (4, 3), (5, 3), (5, 3)])
    spares.give(a, b, c, other)  # the next two takes: two of (4, 3), none of (5, 3)
    got = [spares.take((4, 3)), spares.take((4, 3))]
    assert {id(x) for x in got} == {id(a), id(b)} and spares.reused == 2
    spares.give(other)  # now kept: the next take is (5, 3)
    assert spares.take((5, 3)) is other
    spares.give(c)  # kept for the take after the next
    assert spares.take((4, 3)) is c
    spares.give(a)  # no (4, 3) in the rest of the sweep: dropped
    assert spares.take((5, 3)) is not a
    spares.give(other)
    spares.plan([(4, 3)])  # the next sweep starts with another shape: dropped
    assert spares.take((4, 3)) is not other
    deleted = jax.numpy.zeros((4, 3))
    deleted.delete()
    spares.plan([(4, 3)])
    spares.give(deleted)  # an output donated elsewhere already
    assert spares.take((4, 3)) is not deleted


def test_engine_reuses_most_outputs_and_stays_exact(tmp_path):
    graph = csbm_graph()
    for model, policy in [
            (models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5),
             policies.host_offload()),
            (models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5),
             policies.host_offload(aggregations=Fate.HOST)),
            (models.sage(8, 16, graph.num_classes, num_layers=2, dropout=0.5, residual=True,
                         layer_norm=True), policies.ssd_offload(tmp_path))]:
        params = model.init(jax.random.key(0))
        in_memory = reference(graph, model)
        # one padded shape: every step but the first two of a sweep finds the output of the
        # step before the one before, however the writer thread is timed
        with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=8,
                       store=tmp_path, partitioner=contiguous, max_shapes=1) as ex:
            for epoch in range(2):  # the second epoch runs on reused buffers
                key = jax.random.key(epoch)
                loss, grads = ex.loss_and_grad(params, key)
                ref_loss, ref_grads = in_memory.loss_and_grad(params, key)
                assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
                assert_same_gradients(grads, ref_grads)
            taken = ex.spares.reused + ex.spares.made
            assert ex.spares.reused >= taken / 2, (ex.spares.reused, ex.spares.made)


def test_spares_only_where_the_device_budget_holds_one_more_output():
    graph = csbm_graph()
    model = models.gcn(8, 16, graph.num_classes, num_layers=2)
    kwargs = dict(policy=policies.host_offload(), num_parts=4, partitioner=contiguous)
    with OutOfCore(graph, model, optax.sgd(0.1), **kwargs) as ex:
        assert ex.spares.enabled  # no budget
        plan, spare = ex.memory.device, ex.built.largest_output
    with OutOfCore(graph, model, optax.sgd(0.1), device_budget=plan, **kwargs) as ex:
        assert not ex.spares.enabled
        params = model.init(jax.random.key(0))
        ex.loss_and_grad(params, jax.random.key(0))
        assert ex.spares.reused == 0
    with OutOfCore(graph, model, optax.sgd(0.1), device_budget=plan + spare, **kwargs) as ex:
        assert ex.spares.enabled


def test_partitions_run_grouped_by_padded_shape():
    # small and large partitions alternate by index: run in index order, no step would find
    # a stored output of its shape from the step before the one before
    graph = csbm_graph()
    model = models.gcn(8, 16, graph.num_classes, num_layers=2)
    sizes = [20, 113, 20, 114, 20, 113]

    def alternating(g, k, seed=0):
        return np.repeat(np.arange(k), sizes).astype(np.int32)

    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(),
                   num_parts=len(sizes), partitioner=alternating) as ex:
        shapes = [(p.num_out, p.num_in) for p in ex.parts]
        runs = [s for i, s in enumerate(shapes) if i == 0 or s != shapes[i - 1]]
        assert len(set(shapes)) >= 2
        assert len(runs) == len(set(shapes)), shapes
        ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(0))
        assert ex.spares.reused > 0
