"""An epoch's schedule (`jgrind.plan.schedule`): built from shapes and fates without JAX,
compared with schedules written out by hand, and run as it is by the engine."""

import importlib.util
import pathlib
import subprocess
import sys

import jax
import optax
import pytest

from jgrind import Fate, models, policies
from jgrind.engine import OutOfCore
from jgrind.plan.schedule import (BACKWARD, FORWARD, RECOMPUTE, Sweep, Table, Variant,
                                  epoch_schedule)
from jgrind.train import InMemory
from helpers import community_graph
from test_engine import assert_same_gradients

V = Variant
H = lambda l: Table("H", l)  # noqa: E731
G = lambda l: Table("G", l)  # noqa: E731
Z = lambda l: Table("Z", l)  # noqa: E731
LABELS = Table("labels", 0)


def test_the_schedule_module_needs_no_jax():
    """Plain data: the module imports nothing beyond the standard library."""
    path = pathlib.Path(__file__).resolve().parents[1] / "jgrind" / "plan" / "schedule.py"
    code = (f"import importlib.util, sys\n"
            f"spec = importlib.util.spec_from_file_location('schedule', {str(path)!r})\n"
            "module = importlib.util.module_from_spec(spec); sys.modules['schedule'] = module\n"
            "spec.loader.exec_module(module)\n"
            "module.epoch_schedule(3, recomputed=[2], kept=[1], masked=[0, 1])\n"
            "assert not [m for m in sys.modules if m.split('.')[0] in ('jax', 'numpy')]\n")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    assert importlib.util.find_spec("jgrind.plan.schedule") is not None


def test_two_layers_regathered():
    """GriNNder's scheme: forward 0 writes H_1; the top layer's steps are its forward, the
    loss and its backward; layer 0's backward has no input gradient to store."""
    assert epoch_schedule(2).sweeps == (
        Sweep(FORWARD, 0, V.FORWARD, reads=(H(0),), writes=(H(1),)),
        Sweep(BACKWARD, 1, V.TOP, reads=(H(1), LABELS), writes=(G(1),), makes=(G(1),)),
        Sweep(BACKWARD, 0, V.BACKWARD_PARAMS, reads=(H(0), G(1)), frees=(G(1),)),
    )


def test_three_layers_recomputed_with_masks():
    """H_1 and H_2 recomputed: H_2 lives from the last forward sweep to its backward; H_1 is
    freed after forward 1 and rebuilt by a recompute sweep before backward 1. Layer 2's steps
    make layer 1's output masks, so layer 1 runs the masked variant."""
    assert epoch_schedule(3, recomputed=[1, 2], masked=[1]).sweeps == (
        Sweep(FORWARD, 0, V.FORWARD, reads=(H(0),), writes=(H(1),), makes=(H(1),)),
        Sweep(FORWARD, 1, V.FORWARD, reads=(H(1),), writes=(H(2),), makes=(H(2),),
              frees=(H(1),)),
        Sweep(BACKWARD, 2, V.TOP, reads=(H(2), LABELS), writes=(G(2),), makes=(G(2),),
              frees=(H(2),)),
        Sweep(RECOMPUTE, 0, V.FORWARD, reads=(H(0),), writes=(H(1),), makes=(H(1),)),
        Sweep(BACKWARD, 1, V.MASKED_BACKWARD, reads=(H(1), G(2)), writes=(G(1),),
              makes=(G(1),), frees=(G(2), H(1))),
        Sweep(BACKWARD, 0, V.BACKWARD_PARAMS, reads=(H(0), G(1)), frees=(G(1),)),
    )


def test_a_kept_aggregation_replaces_the_regather_and_the_recompute():
    """Z_1 kept: forward 1 saves it, backward 1 reads it instead of H_1 and recomputes
    nothing; layer 1's backward makes no masks, so layer 0's runs unmasked."""
    assert epoch_schedule(3, recomputed=[1], kept=[1], masked=[0, 1]).sweeps == (
        Sweep(FORWARD, 0, V.FORWARD, reads=(H(0),), writes=(H(1),), makes=(H(1),)),
        Sweep(FORWARD, 1, V.FORWARD_SAVING, reads=(H(1),), writes=(H(2), Z(1)),
              frees=(H(1),)),
        Sweep(BACKWARD, 2, V.TOP, reads=(H(2), LABELS), writes=(G(2),), makes=(G(2),)),
        Sweep(BACKWARD, 1, V.SAVED_BACKWARD, reads=(Z(1), G(2)), writes=(G(1),),
              makes=(G(1),), frees=(G(2),)),
        Sweep(BACKWARD, 0, V.BACKWARD_PARAMS, reads=(H(0), G(1)), frees=(G(1),)),
    )


def test_a_chain_of_recomputed_layers_is_rebuilt_from_the_nearest_stored_one():
    schedule = epoch_schedule(4, recomputed=[1, 2, 3])
    assert schedule.order() == [
        (FORWARD, 0), (FORWARD, 1), (FORWARD, 2), (BACKWARD, 3),
        (RECOMPUTE, 0), (RECOMPUTE, 1), (BACKWARD, 2), (BACKWARD, 1), (BACKWARD, 0)]
    # H_1, made by the first recompute, lives until its own backward
    assert H(1) in schedule.backward(1).frees and schedule.backward(1).makes == (G(1),)


def test_the_naive_scheme_reads_snapshots_in_backward():
    snap = Table("snapshot", 0)
    assert epoch_schedule(2, snapshots=True).sweeps == (
        Sweep(FORWARD, 0, V.FORWARD, reads=(H(0),), writes=(H(1), snap), makes=(snap,)),
        Sweep(BACKWARD, 1, V.TOP, reads=(H(1), LABELS), writes=(G(1),), makes=(G(1),)),
        Sweep(BACKWARD, 0, V.BACKWARD_PARAMS, reads=(snap, G(1)), frees=(G(1), snap)),
    )


def test_steps_name_each_partitions_tiers():
    """Per partition, the tiers its step reads and writes: a regathered input and a
    scatter-added gradient touch the halo owners' tiers too."""
    schedule = epoch_schedule(2)
    tiers = {("H", 0): ["host", "ssd"], ("H", 1): ["device", "host"], ("G", 1): ["ssd", "ssd"]}
    steps = schedule.steps([1, 0], tiers, halo_sources={1: [0]})
    assert [(s.sweep, s.partition) for s in steps] == [(0, 1), (0, 0), (1, 1), (1, 0),
                                                       (2, 1), (2, 0)]
    forward_1 = steps[0]
    assert forward_1.reads == ((H(0), ("host", "ssd")),)  # its own block on SSD, a halo on host
    assert forward_1.writes == ((H(1), ("host",)),)
    assert steps[1].reads == ((H(0), ("host",)),)


def test_layer_0_cannot_be_recomputed():
    with pytest.raises(ValueError, match="features"):
        epoch_schedule(2, recomputed=[0])


def _policy(kind):
    if kind == "recompute":
        return policies.recompute_activations()
    if kind == "recompute-keep-z1":
        def policy(info):
            if info.name == "aggregation":
                return Fate.HOST if info.layer == 1 else Fate.RECOMPUTE
            return Fate.RECOMPUTE if info.recomputable else Fate.HOST
        return policy
    return policies.host_offload(aggregations=Fate.HOST if kind == "kept" else Fate.RECOMPUTE)


@pytest.mark.parametrize("kind", ["host", "kept", "recompute", "recompute-keep-z1"])
def test_the_engine_runs_its_schedule(kind):
    """The sweeps the engine runs, with their variants, are its schedule's, in order."""
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=4)
    with OutOfCore(graph, model, optax.sgd(0.1), num_parts=3, policy=_policy(kind)) as ex:
        ran, sweeps = [], ex.runner.sweeps
        forward, backward = sweeps.forward, sweeps.backward

        def forward_sweep(params, l, key, variant=Variant.FORWARD):
            ran.append((l, variant))
            return forward(params, l, key, variant)

        def backward_sweep(params, l, variant, *args):
            ran.append((l, variant))
            return backward(params, l, variant, *args)
        sweeps.forward, sweeps.backward = forward_sweep, backward_sweep
        ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(1))
        schedule = ex.built.plan.schedule
    assert ran == [(s.layer, s.variant) for s in schedule.sweeps]
    variants = {s.variant for s in schedule.sweeps}
    assert (V.SAVED_BACKWARD in variants) == (kind in ("kept", "recompute-keep-z1"))
    assert any(s.kind == RECOMPUTE for s in schedule.sweeps) == kind.startswith("recompute")


def test_kept_aggregations_are_saved_without_a_dropout_key():
    """The forward sweep saves a kept aggregation because the schedule names the saving
    variant, also when ``loss_and_grad`` gets no key (no dropout): it used to save only with a
    key, and the backward sweep then read an unwritten Z (gradients off by 0.15)."""
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3, dropout=0.0)
    params = model.init(jax.random.key(0))
    loss, grads = InMemory(graph, model, optax.sgd(0.1)).loss_and_grad(params, None)
    with OutOfCore(graph, model, optax.sgd(0.1), num_parts=4,
                   policy=policies.host_offload(aggregations=Fate.HOST)) as ex:
        assert ex.built.plan.kept
        out_loss, out_grads = ex.loss_and_grad(params, None)
    assert float(out_loss) == pytest.approx(float(loss), rel=1e-5)
    assert_same_gradients(out_grads, grads)
