"""Relational models (R-GCN, RGAT) out of core against the in-memory full-graph computation,
on a generated heterogeneous graph and on DBLP: loss and every gradient, under every policy
and 1, 2, 7 and 16 partitions; parameters after 20 epochs. Tolerances as in test_engine."""

import functools

import jax
import numpy as np
import optax
import pytest

from jgrind import datasets, models
from jgrind.engine import OutOfCore
from jgrind.partition import random as random_partition
from jgrind.plan import policies
from jgrind.train import make_executor, train

from helpers import reference
from test_engine import assert_same_gradients
from test_rgcn import hetero_graph

GRAPH = hetero_graph()  # one object: `reference` compiles once per graph and model


def _models(f, c, r):
    return {
        "rgcn": models.rgcn(f, 16, c, r, num_layers=2, dropout=0.5),
        "rgcn-bases-res-ln": models.rgcn(f, 16, c, r, num_layers=2, dropout=0.3,
                                         residual=True, layer_norm=True, num_bases=2),
        "rgat": models.rgat(f, 4, c, r, heads=2, num_layers=2, dropout=0.5),
    }


def _policy(name, tmp_path, budgets=(2**20, 2**20)):
    from test_planner import fixed_profile
    return {"in_memory": lambda: policies.in_memory(),
            "host_offload": lambda: policies.host_offload(),
            "ssd_offload": lambda: policies.ssd_offload(tmp_path),
            "recompute_activations": lambda: policies.recompute_activations(),
            "grinnder": lambda: policies.grinnder(*budgets, tmp_path),
            "auto": lambda: policies.auto(profile=fixed_profile(), directory=tmp_path)}[name]()


def _check(graph, model, policy_name, parts, tmp_path, budgets=(2**20, 2**20)):
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)  # dropout on: masks must not depend on the partitioning
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    policy = _policy(policy_name, tmp_path, budgets)
    if policy_name == "auto":  # the planner picks the partitions; the budgets (set for the
        # generated graph) keep it out of core, with blocks on every tier
        ex = make_executor(graph, model, optax.sgd(0.1), policy=policy,
                           device_budget=96 << 10, host_budget=16 << 10, store=tmp_path)
    else:  # (one padded shape: a third of the compilations of the default three)
        ex = OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=parts,
                       store=tmp_path, partitioner=random_partition, max_shapes=1)
    with ex:
        assert isinstance(ex, OutOfCore)
        loss, grads = ex.loss_and_grad(params, key)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
        assert_same_gradients(grads, ref_grads)


MODELS = ["rgcn", "rgat"]
POLICIES = ["in_memory", "host_offload", "ssd_offload", "recompute_activations", "grinnder",
            "auto"]
PARTS = [1, 2, 7, 16]
# every model under every policy, partition counts rotating so that each model meets each
# count: all pairs, not the product (each configuration compiles its own steps); the residual
# R-GCN with LayerNorm and bases (no output-mask backward, no moved dropout) under two
CASES = [(m, p, PARTS[(i + j) % len(PARTS)]) for i, m in enumerate(MODELS)
         for j, p in enumerate(POLICIES)] + [("rgcn-bases-res-ln", "ssd_offload", 7)]


@pytest.mark.parametrize("model, policy, parts", CASES)
def test_generated_heterogeneous_graph(model, policy, parts, tmp_path):
    _check(GRAPH, _models(GRAPH.num_features, GRAPH.num_classes, GRAPH.num_relations)[model],
           policy, parts, tmp_path)


def test_every_model_meets_every_partition_count():
    for model in MODELS:
        assert {parts for m, p, parts in CASES if m == model and p != "auto"} == set(PARTS)


def test_parameters_agree_after_20_epochs(tmp_path):
    model = models.rgcn(GRAPH.num_features, 16, GRAPH.num_classes, GRAPH.num_relations,
                        num_layers=2, dropout=0.5, num_bases=2)
    opt = optax.adam(0.01)
    ref = train(jax.random.key(3), GRAPH, model, opt, epochs=20, progress=False)
    with OutOfCore(GRAPH, model, opt, policy=policies.ssd_offload(tmp_path), num_parts=7,
                   store=tmp_path, max_shapes=1) as ex:
        ooc = train(jax.random.key(3), GRAPH, model, opt, epochs=20, progress=False,
                    executor=ex)
    for a, b in zip(jax.tree.leaves(ooc.params), jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
    assert ooc.best_epoch == ref.best_epoch and ooc.test == pytest.approx(ref.test)


# -- DBLP (HGSL's pickles: authors, papers, conferences, 4 relations) ---------------------------

@functools.cache
def _dblp():
    return datasets.load("dblp")


@pytest.mark.parametrize("model, policy, parts", [("rgcn", "grinnder", 16),
                                                  ("rgat", "host_offload", 2)])
def test_dblp(model, policy, parts, tmp_path, data_file):
    data_file("hgsl/dblp/edges.pkl", "hgsl/dblp/node_features.pkl", "hgsl/dblp/labels.pkl")
    graph = _dblp()
    assert graph.num_relations >= 4
    built = _models(graph.num_features, graph.num_classes, graph.num_relations)[model]
    # grinnder's budgets put blocks on each of its three tiers
    _check(graph, built, policy, parts, tmp_path, budgets=(16 << 20, 2 << 20))


# Both models on two devices against the in-memory computation: tests/test_devices.py
# (`test_relational_models_on_two_devices_are_exact`), in its one subprocess of several devices.
