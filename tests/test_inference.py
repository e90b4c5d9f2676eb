"""Predictions and embeddings of trained parameters, in memory and partition by partition, and
parameters read back from a checkpoint without the optimizer."""

import os

import jax
import numpy as np
import optax
import pytest

import jgrind
from jgrind import models, policies

from helpers import community_graph

RTOL = 1e-5  # of the largest entry: the partitioned sums add the same terms in another order


def _close(a, b):
    assert a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=0, atol=RTOL * max(float(np.abs(a).max()), 1e-6))


@pytest.fixture(scope="module")
def trained():
    graph = community_graph(num_nodes=300)
    # 3 layers narrowing 16 -> 12: the engine splits the narrowing GCN layer in two, so model
    # layer 2's input is not executed layer 2's
    model = models.gcn(graph.num_features, [16, 12], graph.num_classes, num_layers=3)
    result = jgrind.train(jax.random.key(0), graph, model, optax.adam(0.02), epochs=5,
                          progress=False)
    return graph, model, result.best_params


def test_in_memory_logits_and_embeddings_are_the_models_layers(trained):
    graph, model, params = trained
    block = model.block(model.normalize(graph))
    h = graph.features
    for layer in range(len(model.layers) + 1):
        got = jgrind.predict(graph, model, params, layer=layer)
        _close(got, np.asarray(h))
        if layer < len(model.layers):
            h = model.layers[layer](params[layer], block, h, None)
    _close(jgrind.predict(graph, model, params), np.asarray(h))


@pytest.mark.parametrize("policy", ["host", "ssd", "recompute"])
def test_out_of_core_embeddings_equal_the_in_memory_ones(trained, tmp_path, policy):
    graph, model, params = trained
    make = {"host": policies.host_offload, "ssd": lambda: policies.ssd_offload(tmp_path),
            "recompute": policies.recompute_activations}[policy]
    for layer in (0, 1, 2, 3, None):
        want = jgrind.predict(graph, model, params, layer=layer)
        got = jgrind.predict(graph, model, params, layer=layer, policy=make(), num_parts=4)
        _close(got, want)
    assert os.listdir(tmp_path) == []  # the store made for the prediction is removed


def test_gat_embeddings_out_of_core(tmp_path):
    graph = community_graph(num_nodes=200)
    model = models.gat(graph.num_features, 4, graph.num_classes, heads=2, residual=True,
                       layer_norm=True)
    params = model.init(jax.random.key(1))
    for layer in range(len(model.layers) + 1):
        _close(jgrind.predict(graph, model, params, layer=layer, num_parts=3,
                              policy=policies.ssd_offload(tmp_path)),
               jgrind.predict(graph, model, params, layer=layer))


def test_an_executor_of_the_caller_is_used_and_left_open(trained):
    from jgrind.engine import OutOfCore
    graph, model, params = trained
    with OutOfCore(graph, model, optax.adam(0.01), policy=policies.host_offload(),
                   num_parts=2) as engine:
        a = jgrind.predict(graph, model, params, layer=1, executor=engine)
        b = jgrind.predict(graph, model, params, executor=engine)  # still open
    _close(a, jgrind.predict(graph, model, params, layer=1))
    _close(b, jgrind.predict(graph, model, params))


def test_bad_layers_and_foreign_parameters_are_named(trained):
    graph, model, params = trained
    with pytest.raises(ValueError, match="layer 4 does not exist: the gcn model has 3 layers"):
        jgrind.predict(graph, model, params, layer=4)
    with pytest.raises(ValueError, match="layer must be a whole number, at least 0"):
        jgrind.predict(graph, model, params, layer=-1)
    other = models.gcn(graph.num_features, 8, graph.num_classes)
    with pytest.raises(ValueError, match="do not fit the gcn model"):
        jgrind.predict(graph, other, params)


def test_load_checkpoint_without_the_optimizer(tmp_path):
    graph = community_graph(num_nodes=300)
    model = models.sage(graph.num_features, 16, graph.num_classes)
    result = jgrind.train(jax.random.key(3), graph, model, optax.adamw(0.02), epochs=6,
                          progress=False, checkpoint_dir=tmp_path / "ck", checkpoint_every=2)
    params, best, meta = jgrind.load_checkpoint(tmp_path / "ck", model)
    assert meta["epoch"] == 5 and meta["best"]["epoch"] == result.best_epoch
    assert len(meta["history"]) == 6
    for a, b in zip(jax.tree.leaves((params, best)),
                    jax.tree.leaves((result.params, result.best_params))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the restored parameters are the model's pytree: they predict as the run's do
    _close(jgrind.predict(graph, model, best), jgrind.predict(graph, model, result.best_params))
    with pytest.raises(ValueError, match="saved for another model"):
        jgrind.load_checkpoint(tmp_path / "ck", models.sage(graph.num_features, 8,
                                                            graph.num_classes))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        jgrind.load_checkpoint(tmp_path / "empty", model)
    with pytest.raises(FileNotFoundError, match="no checkpoint folder"):
        jgrind.load_checkpoint(tmp_path / "none", model)


def test_executors_for_predictions_need_no_optimizer(trained):
    from jgrind.engine import OutOfCore
    from jgrind.train import InMemory
    graph, model, params = trained
    memory = InMemory(graph, model)
    with OutOfCore(graph, model, policy=policies.host_offload(), num_parts=2) as engine:
        _close(engine.embed(params, 1), memory.embed(params, 1))
        with pytest.raises(ValueError, match="without an optimizer, for predictions only"):
            engine.step(params, None, jax.random.key(0))
    with pytest.raises(ValueError, match="without an optimizer, for predictions only"):
        memory.step(params, None, jax.random.key(0))
