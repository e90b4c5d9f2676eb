"""A run with a fixed policy is held against the cost model's price of its fates, as an `auto`
run is against its plan (issue 42): `jgrind.plan.check.engine_prediction`, from the saved
hardware profile, never a measured one."""

import contextlib
import io

import jax
import optax
import pytest

from helpers import community_graph
from jgrind import models
from jgrind.engine import OutOfCore
from jgrind.plan import policies, profile as hw
from jgrind.plan.check import engine_prediction
from jgrind.plan.inventory import layer_widths
from jgrind.plan.planner import dense_parameter_count, plan_run
from jgrind.train import train
from test_plan_check import plan_of_run
from test_planner import fixed_profile


def _small():
    graph = community_graph(num_nodes=240, num_features=8)
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=3)
    return graph, model


@pytest.mark.parametrize("policy", ["host", "ssd"])
def test_a_fixed_policy_is_held_against_its_prediction(tmp_path, monkeypatch, policy):
    """Every epoch after the compiling one records each sweep's predicted and measured
    seconds, the prediction being the saved profile's price of the engine's fates; `jgrind
    plan --run` then shows them."""
    monkeypatch.setenv("JGRIND_PROFILE", str(hw.save(fixed_profile(), tmp_path / "p.json")))
    graph, model = _small()
    store = tmp_path / "store"
    store.mkdir()
    chosen = policies.host_offload() if policy == "host" else policies.ssd_offload(str(store))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = train(jax.random.key(0), graph, model, optax.adam(1e-2), epochs=3,
                       policy=chosen, num_parts=3, store=str(store), progress=False)
    first, *checked = result.history
    assert "predicted_seconds" not in first  # it compiles
    assert len(checked) == 2 and all("sweep_parts" in r for r in checked)
    assert not any("replan" in r or "plan_review" in r for r in result.history)

    ex = OutOfCore(graph, model, optax.adam(1e-2), policy=chosen, num_parts=3,
                   store=str(store))
    try:
        # the saved profile with today's free memory, which decides the SSD's page cache
        params = dense_parameter_count(layer_widths(model, graph.num_features))
        expected = engine_prediction(ex, params, hw.load_current())
    finally:
        ex.close()
    assert checked[0]["predicted_seconds"] == pytest.approx(expected.epoch_seconds)
    reads = {t for s in checked[0]["sweep_parts"] for t in s["measured"]["reads"]}
    assert ("ssd" in reads) == (policy == "ssd")

    assert "each sweep's parts" in plan_of_run(result.history, tmp_path)


def test_without_a_current_profile_a_fixed_policy_runs_unchecked(tmp_path, monkeypatch):
    """Nothing is measured for a fixed policy: with no current profile it trains unchecked."""
    stale = fixed_profile(version=hw.PROFILE_VERSION - 1)
    monkeypatch.setenv("JGRIND_PROFILE", str(hw.save(stale, tmp_path / "old.json")))
    monkeypatch.setattr(hw, "measure", lambda *a, **k: pytest.fail("measured a profile"))
    assert hw.load_current() is None
    graph, model = _small()
    result = train(jax.random.key(0), graph, model, optax.adam(1e-2), epochs=2,
                   policy=policies.host_offload(), num_parts=3, progress=False)
    assert all("predicted_seconds" not in r for r in result.history)


def test_the_engines_prediction_of_a_plan_is_the_plans():
    """`engine_prediction` prices an engine as the planner priced its plan: for an `auto`
    plan's engine it gives the plan's own prediction."""
    graph, model = _small()
    profile = fixed_profile()
    the_plan = plan_run(graph, model, profile, device_budget=1 << 30, host_budget=1 << 30,
                        num_parts=4)
    ex = OutOfCore(graph, model, optax.adam(1e-2), policy=the_plan.policy(),
                   partitioned=the_plan.partitioned, device_budget=1 << 30,
                   host_budget=1 << 30)
    try:
        params = dense_parameter_count(layer_widths(model, graph.num_features))
        mine = engine_prediction(ex, params, profile)
    finally:
        ex.close()
    assert mine.epoch_seconds == pytest.approx(the_plan.prediction.epoch_seconds)
    assert mine.memory == the_plan.prediction.memory
