"""Narrowing GCN layers run as transform + propagation, node-wise layers read own blocks."""

import collections

import jax
import numpy as np
import optax
import pytest

from jgrind import models
from jgrind.engine import OutOfCore
from jgrind.executed.moved_dropout import DropsOutput, unwrap
from jgrind.executed.split import as_executed
from jgrind.partition import contiguous
from jgrind.plan import policies
from jgrind.plan.cost import Workload

from helpers import csbm_graph, reference
from test_engine import assert_same_gradients


def test_narrowing_gcn_layers_split_and_parameters_map_back():
    net = models.gcn(8, 16, 3, num_layers=3, dropout=0.5)   # 8 -> 16 -> 16 -> 3
    executed, how = as_executed(net)
    kinds = [type(unwrap(layer)).__name__ for layer in executed.layers]
    assert kinds == ["GCNConv", "GCNConv", "Linear", "Propagate"]
    assert how.origin == (0, 1, 2, 2)
    transform, propagate = executed.layers[2:]
    # the transform's input dropout runs in the layer below (jgrind.executed.moved_dropout)
    assert transform.options.dropout == 0.0 and not transform.bias
    assert isinstance(executed.layers[1], DropsOutput) and executed.layers[1].rate == 0.5
    assert propagate.options.activation is None and propagate.options.dropout == 0.0
    params = net.init(jax.random.key(0))
    split = how.split_params(params)
    assert set(split[2]) == {"weight"} and set(split[3]) == {"bias"}
    merged = how.merge_params(split)
    assert jax.tree.structure(merged) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(params)):
        assert a is b
    # the same function (dropout off: the executed model's own layer keys differ)
    graph = csbm_graph()
    block = net.block(net.normalize(graph))
    np.testing.assert_allclose(executed.apply(split, block, graph.features),
                               net.apply(params, block, graph.features), rtol=1e-5, atol=1e-6)
    assert as_executed(executed)[0] is executed  # idempotent


def test_layers_that_must_stay_whole_are_not_split():
    # (dropout off: a dropout that moves to the layer below changes the layers too)
    widening = models.gcn(8, 16, 32, num_layers=2, dropout=0.0)  # 8 -> 16 -> 32: aggregates first
    assert as_executed(widening)[0] is widening
    # layer 0 (32 -> 16) splits; layer 1 (16 -> 3) has a LayerNorm, which reads its input
    normed = models.gcn(32, 16, 3, num_layers=2, layer_norm=True)
    kinds = [type(unwrap(layer)).__name__ for layer in as_executed(normed)[0].layers]
    assert kinds == ["Linear", "Propagate", "GCNConv"]
    sage = models.sage(32, 16, 3, num_layers=2, dropout=0.0)
    assert as_executed(sage)[0] is sage


def _count_moves(ex):
    """Count gathers and whole-block reads of every activation table, and scatter-adds and
    whole-block writes of every gradient table, by (kind, layer)."""
    calls = collections.Counter()

    def wrap(table, method, label):
        real = getattr(table, method)

        def counted(*args, **kwargs):
            calls[(label, table.key[1])] += 1
            return real(*args, **kwargs)
        setattr(table, method, counted)

    for table in ex.activations:
        wrap(table, "gather", "gather")
        wrap(table, "read", "read")
    real_table = ex.runner.gradient_table

    def gradient_table(layer):
        table = real_table(layer)
        wrap(table, "accumulate", "accumulate")
        wrap(table, "write", "write")
        return table
    ex.runner.gradient_table = gradient_table
    return calls


@pytest.mark.parametrize("policy", ["in_memory", "host", "ssd", "recompute"])
def test_split_layers_are_exact_and_move_narrow_rows(policy, tmp_path):
    """The transform reads each partition's own rows of H_2 (16 wide) and writes G_2 as
    blocks; only the 3-wide U = H_2 W is gathered with its halo and scatter-added. Loss and
    gradients equal the in-memory computation of the unsplit model."""
    graph = csbm_graph()
    net = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=3, dropout=0.5)
    params, key = net.init(jax.random.key(0)), jax.random.key(42)
    ref_loss, ref_grads = reference(graph, net).loss_and_grad(params, key)
    chosen = {"in_memory": policies.in_memory(), "host": policies.host_offload(),
              "ssd": policies.ssd_offload(tmp_path),
              "recompute": policies.recompute_activations()}[policy]
    parts = 4
    with OutOfCore(graph, net, optax.sgd(0.1), policy=chosen, num_parts=parts,
                   store=tmp_path, partitioner=contiguous) as ex:
        assert ex.num_layers == 4 and ex.widths == [graph.num_features, 16, 16,
                                                    graph.num_classes, graph.num_classes]
        calls = _count_moves(ex)
        loss, grads = ex.loss_and_grad(params, key)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
        assert_same_gradients(grads, ref_grads)
    recomputed = 1 if policy == "recompute" else 0  # H_2 is rebuilt before layer 2's backward
    assert calls[("gather", 2)] == 0
    assert calls[("read", 2)] == 2 * parts            # the transform: forward and backward
    assert calls[("gather", 1)] == (2 + recomputed) * parts
    assert calls[("gather", 3)] == parts              # the top: forward, loss and backward
    assert calls[("accumulate", 3)] == parts          # dU: narrow rows with their halo
    assert calls[("write", 2)] == parts and calls[("accumulate", 2)] == 0
    assert list(tmp_path.iterdir()) == []


def test_node_wise_layers_of_residual_models_read_own_blocks(tmp_path):
    """The input and output projections of a residual model read no halo, in forward or
    backward, and are exact."""
    graph = csbm_graph()
    net = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=2, dropout=0.3,
                     residual=True, layer_norm=True)   # Linear, GCN, GCN, Linear
    params, key = net.init(jax.random.key(0)), jax.random.key(7)
    ref_loss, ref_grads = reference(graph, net).loss_and_grad(params, key)
    with OutOfCore(graph, net, optax.sgd(0.1), policy=policies.host_offload(), num_parts=3,
                   partitioner=contiguous) as ex:
        assert ex.local == [True, False, False, True]
        calls = _count_moves(ex)
        loss, grads = ex.loss_and_grad(params, key)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
        assert_same_gradients(grads, ref_grads)
    assert calls[("gather", 0)] == calls[("gather", 3)] == 0
    assert calls[("read", 0)] == 2 * 3 and calls[("read", 3)] == 3  # forward + backward; top
    assert calls[("write", 3)] == 3 and calls[("accumulate", 3)] == 0


def test_the_cost_model_sees_the_executed_layers():
    """The planner prices what the engine runs: four layers for the split GCN, and the
    transform's steps over own rows only."""
    from jgrind.partition import partition_graph
    graph = csbm_graph()
    net = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=3)
    normalized = net.normalize(graph)
    pg = partition_graph(normalized, contiguous(normalized, 4), num_parts=4)
    w = Workload.build(pg, net)
    assert w.num_layers == 4 and [w.local(l) for l in range(4)] == [False, False, True, False]
    assert np.array_equal(w.step_inputs(2), w.pad_out)
    assert np.all(w.step_inputs(3) >= w.pad_out) and np.any(w.step_inputs(3) > w.pad_out)


def test_gradient_blocks_written_whole_are_priced_with_their_checksum():
    """A node-wise layer writes its input gradient as whole SSD blocks, which carry a CRC32
    that the layer below checks on read; scatter-added gradient blocks carry none."""
    from jgrind.partition import partition_graph
    from jgrind.plan.cost import S
    from jgrind.plan.planner import _Coefficients
    from test_planner import fixed_profile
    graph = csbm_graph()
    net = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=3)
    normalized = net.normalize(graph)
    pg = partition_graph(normalized, contiguous(normalized, 4), num_parts=4)
    w = Workload.build(pg, net)
    slow = _Coefficients(w, fixed_profile(checksum_bw=1e8))
    fast = _Coefficients(w, fixed_profile(checksum_bw=1e12))
    assert slow("read", 2, S) > fast("read", 2, S)   # G_2: written whole by the transform
    assert slow("read", 1, S) == fast("read", 1, S)  # G_1: scatter-added by layer 1
