"""`tools/harness.py`, what the benchmarks in tools/ share: arguments as the docs' command lines
give them, the graph and model built from them, and an epoch loop that trains as the scripts'
own loops did."""

import argparse
import os
import sys

import jax
import numpy as np
import optax
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))

import harness  # noqa: E402


def _parser(**source):
    p = argparse.ArgumentParser()
    harness.add_source(p, **source)
    harness.add_policy(p, harness.POLICIES + ("grinnder",), default="host")
    harness.add_parts(p, default=8)
    harness.add_budgets(p)
    harness.add_store(p, default="/tmp/store")
    return p


def test_arguments_as_the_documented_command_lines_give_them():
    args = _parser(rmat=(1_000_000, 10_000_000)).parse_args(
        "--rmat 200000 5200000 --policy grinnder --parts 16 --device-budget 419430400".split())
    assert args.rmat == [200_000, 5_200_000] and args.policy == "grinnder"
    assert args.parts == 16 and args.device_budget == 419_430_400 and args.host_budget is None
    assert args.store == "/tmp/store"
    defaults = _parser(rmat=(1_000_000, 10_000_000)).parse_args([])
    assert defaults.rmat == (1_000_000, 10_000_000) and defaults.policy == "host"
    # a budget in units, as bench_out_of_core's lines give them
    assert _parser(rmat=(1, 1)).parse_args(["--host-budget", "2GiB"]).host_budget == 2 << 30


@pytest.mark.parametrize("argv", [[], ["--config", "fits", "--rmat", "10", "20"],
                                  ["--config", "nothing-by-this-name"],
                                  ["--device-budget", "lots"]])
def test_arguments_refused(argv):
    with pytest.raises(SystemExit) as stop:
        _parser(config=True).parse_args(argv)
    assert stop.value.code == 2


def test_a_planner_configuration_by_name():
    args = _parser(config=True).parse_args(["--config", "host-tight"])
    assert harness.planner_config(args.config).host_budget == 160 * harness.MiB
    assert harness.planner_config("nothing-by-this-name") is None


def test_the_rmat_graph_and_model():
    graph, model, config = harness.graph_and_model(rmat=(300, 3000), features=16, hidden=8)
    assert config is None
    assert graph.num_nodes == 300 and graph.num_features == 16 and graph.num_classes == 47
    pg = harness.partition(graph, model, 3)
    assert pg.num_parts == 3


def test_an_epoch_trains_as_a_hand_written_loop():
    from jgrind.train import InMemory
    graph, model, _ = harness.graph_and_model(rmat=(300, 3000), features=16, hidden=8)
    optimizer = optax.adam(1e-3)
    training = harness.Training(InMemory(graph, model, optimizer), model, optimizer)
    losses = [float(training.epoch(jax.random.key(e))[1]) for e in range(2)]

    executor = InMemory(graph, model, optimizer)
    params = model.init(jax.random.key(0))
    state = optimizer.init(params)
    expected = []
    for e in range(2):
        params, state, loss = executor.step(params, state, jax.random.key(e))
        expected.append(float(loss))
    assert losses == expected


def test_a_graph_saved_for_a_child_comes_back(tmp_path):
    graph = harness.rmat_graph(200, 1000, features=4, classes=5)
    harness.save_npz(graph, str(tmp_path / "g.npz"))
    back = harness.load_npz(str(tmp_path / "g.npz"))
    assert np.array_equal(back.indptr, graph.indptr)
    assert np.array_equal(back.features, graph.features) and back.num_classes == 5


def test_a_child_answers_in_json_or_stops_the_run():
    assert harness.run_child([sys.executable, "-c", "print('log'); print('{\"a\": 1}')"],
                             "echo") == {"a": 1}
    with pytest.raises(SystemExit, match="broken failed"):
        harness.run_child([sys.executable, "-c", "raise SystemExit(3)"], "broken")
