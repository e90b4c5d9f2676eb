"""Dropout moved from a layer's input to the output of the layer below (as the engine runs it)."""

import jax
import numpy as np
import optax
import pytest

from jgrind import models
from jgrind.engine import OutOfCore
from jgrind.models.dropout import dropout as hashed_dropout
from jgrind.models.model import layer_key
from jgrind.executed.moved_dropout import DropsOutput, drops_input, unwrap
from jgrind.executed.split import as_executed
from jgrind.partition import contiguous, partition_graph, random as random_partition
from jgrind.plan import Fate, policies
from jgrind.plan.cost import INPUT_PASSES, UNDROPPED_INPUT_PASSES, Workload, input_passes

from helpers import csbm_graph, reference
from test_engine import assert_same_gradients


def test_dropouts_move_where_the_consumer_drops_its_raw_input():
    net = models.gcn(8, 16, 16, num_layers=3, dropout=0.3)   # 8 -> 16 -> 16 -> 16, no split
    layers = as_executed(net)[0].layers
    assert [type(layer).__name__ for layer in layers] == ["DropsOutput", "DropsOutput", "GCNConv"]
    assert [layer.rate for layer in layers[:2]] == [0.3, 0.3]
    # the first layer drops the features itself; the others drop nothing
    assert [unwrap(layer).options.dropout for layer in layers] == [0.3, 0.0, 0.0]
    assert [drops_input(layer) for layer in layers] == [True, False, False]
    assert as_executed(as_executed(net)[0])[0].layers == layers   # idempotent
    # a norm or a residual reads the undropped input: nothing moves
    for kept in (models.gcn(8, 16, 16, num_layers=3, dropout=0.3, layer_norm=True),
                 models.sage(8, 16, 16, num_layers=3, dropout=0.3, residual=True)):
        assert not any(isinstance(layer, DropsOutput) for layer in as_executed(kept)[0].layers)
    # GAT drops its raw input too
    gat = as_executed(models.gat(8, 4, 3, heads=2, num_layers=2, dropout=0.3))[0]
    assert isinstance(gat.layers[0], DropsOutput) and unwrap(gat.layers[1]).options.dropout == 0
    # the wrapper is its layer for everything but the call: widths, parameters, flags
    wrapped = layers[0]
    assert (wrapped.in_channels, wrapped.out_channels) == (8, 16)
    assert wrapped.aggregates and wrapped.options is unwrap(wrapped).options
    leaves = jax.tree.leaves(wrapped.init(jax.random.key(0)))
    assert all(np.array_equal(a, b) for a, b in
               zip(leaves, jax.tree.leaves(unwrap(wrapped).init(jax.random.key(0)))))


def test_the_store_holds_each_hidden_layer_output_already_dropped():
    """What the move is for: the producer stores ``dropout(H)`` with the consumer's key, so
    the consumer reads the rows as they are. Checked against the in-memory model's own
    values, row by row of the partition-major table."""
    graph = csbm_graph()
    net = models.gcn(8, 16, 16, num_layers=3, dropout=0.3)
    params = net.init(jax.random.key(0))
    key = jax.random.key(7)
    block = net.block(net.normalize(graph))
    h1 = net.layers[0](params[0], block, graph.features, layer_key(key, 0))
    ids = np.arange(graph.num_nodes)
    expected = np.asarray(hashed_dropout(h1, 0.3, layer_key(key, 1), ids))
    with OutOfCore(graph, net, optax.sgd(0.1), policy=policies.host_offload(), num_parts=3,
                   partitioner=random_partition) as ex:
        ex.loss_and_grad(params, key)
        stored = ex.activations[1].host
        order = np.concatenate([p.owned for p in ex.pg.partitions])
    np.testing.assert_allclose(stored, expected[order], rtol=1e-5, atol=1e-6)
    dropped = (expected == 0) & (np.asarray(h1) != 0)
    assert 0.2 < dropped.sum() / max((np.asarray(h1) != 0).sum(), 1) < 0.4


@pytest.mark.parametrize("policy", ["host", "kept", "recompute", "no-masks", "no-key"])
def test_gradients_equal_in_memory_at_a_rate_whose_scale_matters(policy, tmp_path):
    """Rate 0.3: the kept entries' gradient is scaled by 1/0.7 through the output mask
    (`masked_cotangent`), the kept aggregation's update (`saved_backward`) and the full
    recompute (no masks: a device budget with no room for them); and not at all without a
    key (nothing dropped)."""
    graph = csbm_graph()
    net = models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.3)
    chosen = {"host": policies.host_offload(),
              "kept": policies.host_offload(aggregations=Fate.HOST),
              "recompute": policies.recompute_activations(),
              "no-masks": policies.host_offload(), "no-key": policies.host_offload()}[policy]
    pg = partition_graph(net.normalize(graph), contiguous(net.normalize(graph), 5),
                         num_parts=5)
    budget = None
    if policy == "no-masks":  # room for the working set without masks only
        w = Workload.build(pg, net)
        budget = w.without_masks().working_set() + w.mask_bytes() // 2
    params = net.init(jax.random.key(0))
    key = None if policy == "no-key" else jax.random.key(3)
    ref_loss, ref_grads = reference(graph, net).loss_and_grad(params, key)
    with OutOfCore(graph, net, optax.sgd(0.1), policy=chosen, partitioned=pg,
                   store=tmp_path, device_budget=budget) as ex:
        loss, grads = ex.loss_and_grad(params, key)
        masked = [s.emits_mask for s in ex.steps]
        assert sorted(ex.aggregations) == ([0, 1] if policy == "kept" else [])
    assert any(masked) == (policy != "no-masks")
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)


def test_the_cost_model_prices_undropped_inputs_with_fewer_passes():
    layers = as_executed(models.gcn(8, 16, 16, num_layers=3, dropout=0.3))[0].layers
    assert [input_passes(layer) for layer in layers] == [
        INPUT_PASSES, UNDROPPED_INPUT_PASSES, UNDROPPED_INPUT_PASSES]
