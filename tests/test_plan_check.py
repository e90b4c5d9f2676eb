"""Every planned run holds its epochs against the plan (`jgrind.plan.check`): the engine times
the sweeps of the schedule it runs, labelled as the cost model labels the sweeps it priced."""

import contextlib
import io
import json

import jax
import optax
import pytest

from helpers import community_graph
from jgrind import models
from jgrind.cli import main
from jgrind.plan import policies
from jgrind.plan.check import PLAN_MARGIN, check_epoch, run_check
from jgrind.train import train
from test_planner import fixed_profile


class _Sweep:
    def __init__(self, label, seconds):
        self.label, self.secs = label, seconds


class _Prediction:
    """What `check_epoch` reads of a `jgrind.plan.cost.Prediction`."""

    def __init__(self, sweeps, update=0.0):
        self.sweeps = [_Sweep(label, s) for label, s in sweeps]
        self.epoch_seconds = sum(s for _, s in sweeps) + update

    def sweep_seconds(self, sweep):
        return sweep.secs


def test_an_epoch_is_off_when_it_misses_by_more_than_the_margin():
    predicted = _Prediction([("forward 0", 1.0), ("backward 1", 2.0), ("backward 0", 1.0)])
    within = check_epoch(predicted, [("forward 0", 1.1), ("backward 1", 2.2),
                                     ("backward 0", 1.0)], 4.3, epoch=2)
    assert within.deviation == pytest.approx(0.075) and not within.off()
    slow = check_epoch(predicted, [("forward 0", 1.0), ("backward 1", 5.0),
                                   ("backward 0", 1.0)], 7.0, epoch=3)
    assert slow.off() and slow.deviation == pytest.approx(0.75)
    assert slow.furthest() == ("backward 1", 2.0, 5.0)
    assert slow.line() == ("epoch 3 took 7 s, the plan predicted 4 s (+75%); furthest off: "
                           "backward 1, 5 s against 2 s")
    fast = check_epoch(predicted, [("forward 0", 0.5), ("backward 1", 1.0),
                                   ("backward 0", 0.5)], 2.0, epoch=4)
    assert fast.off() and fast.deviation == pytest.approx(-0.5)
    assert not fast.off(margin=0.6) and PLAN_MARGIN == 0.25


def test_a_check_of_another_schedule_is_refused():
    predicted = _Prediction([("forward 0", 1.0), ("backward 0", 1.0)])
    with pytest.raises(ValueError, match="not the predicted ones"):
        check_epoch(predicted, [("backward 0", 1.0), ("forward 0", 1.0)], 2.0, epoch=1)


def test_the_run_check_summarises_the_epochs_checked():
    predicted = _Prediction([("forward 0", 1.0), ("backward 0", 1.0)])
    history = [{"epoch": 0, "seconds": 9.0}]  # compiling: not checked
    for epoch, (f, b) in enumerate([(1.0, 1.1), (1.0, 3.0), (1.1, 3.2)], start=1):
        check = check_epoch(predicted, [("forward 0", f), ("backward 0", b)], f + b, epoch)
        history.append({"epoch": epoch, "seconds": f + b, **check.as_record()})
    summary = run_check(history)
    assert summary["epochs"] == 3 and summary["off"] == 2
    assert summary["median_seconds"] == pytest.approx(4.0)
    assert summary["furthest"] == "backward 0"
    assert run_check([{"epoch": 0, "seconds": 1.0}]) is None
    # a run that re-planned and went back says so
    history[1]["replan"] = {"epoch": 1, "replanned": True}
    history[2]["replan"] = {"epoch": 2, "replanned": True, "stepped_back": True}
    line = run_check(history)["line"]
    assert "re-planned 2x (after epoch 1, 2; after epoch 2 back to the plan before" in line


def test_a_planned_run_records_every_sweep_beside_its_prediction(tmp_path):
    """An `auto` run out of core (SSD forced by the budgets): from its second epoch on, each
    epoch's record lists the schedule's sweeps, in order, with predicted and measured
    seconds; the measured ones fit in the epoch; a plan that misses is said once, not every
    epoch (the profile here predicts a machine 1000x faster than this one; re-planning, which
    such a miss starts, is off: tests/test_replan.py)."""
    graph = community_graph(num_nodes=300, num_features=16)
    model = models.gcn(graph.num_features, 32, graph.num_classes, num_layers=3, dropout=0.5)
    # a device budget of a third of that cut the graph in 128 partitions of 2-3 nodes (each
    # epoch and prediction 128 steps a layer); this one: 8 partitions, SSD still forced
    stored = 4 * graph.num_nodes * (16 + 32 + 32) * 2
    fast = fixed_profile()
    fast = type(fast)(**{**vars(fast), "step_latency": 1e-9, "sweep_step": 1e-9,
                         "matmul_flops": 1e15,
                         "spmm_rate": 1e13, "gather_bw": 1e13, "scatter_add_bw": 1e13})
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = train(jax.random.key(0), graph, model, optax.adam(1e-2), epochs=4,
                       policy=policies.auto(profile=fast, directory=tmp_path, replan=False),
                       device_budget=3 * stored // 2, host_budget=stored // 4, progress=False)
    first, *checked = result.history
    assert "predicted_seconds" not in first  # it compiles
    assert len(checked) == 3
    for record in checked:
        labels = [label for label, _, _ in record["sweep_seconds"]]
        assert labels[0] == "forward 0" and labels[-1] == "backward 0"
        assert sum(m for _, _, m in record["sweep_seconds"]) <= record["seconds"]
        assert record["plan_off"]
    said = [line for line in printed.getvalue().splitlines() if "the plan predicted" in line]
    assert len(said) == 1 and said[0].startswith("jgrind: epoch 1 took ")
    assert run_check(result.history)["off"] == 3

    # `jgrind plan --run` reads the run's metrics log and shows each sweep both ways
    lines = plan_of_run(result.history, tmp_path).splitlines()
    parts_at = next(i for i, line in enumerate(lines) if line.startswith("each sweep's parts"))
    for shown_lines in (lines[:parts_at], lines[parts_at:]):  # the sweeps, then their parts
        table = [line.split()[:2] for line in shown_lines if line.startswith("  forward ")
                 or line.startswith("  backward ")]
        assert [" ".join(t) for t in table] == labels
    assert (tmp_path / "chart" / "run-against-plan.png").stat().st_size > 0


def test_plan_of_a_run_never_checked_is_one_line(tmp_path, capsys):
    (tmp_path / "metrics-seed0.jsonl").write_text('{"epoch": 0, "loss": 1.0, "seconds": 1.0}\n')
    assert main(["plan", "--run", str(tmp_path), "--out", str(tmp_path / "c")]) == 2
    assert "was not held against a plan" in capsys.readouterr().err


def plan_of_run(history: list, tmp_path) -> str:
    """What `jgrind plan --run` prints for a run whose metrics log holds ``history``."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics-seed0.jsonl").write_text(
        "".join(json.dumps(record) + "\n" for record in history))
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        assert main(["plan", "--run", str(run), "--out", str(tmp_path / "chart")]) == 0
    return shown.getvalue()


def test_a_run_without_a_plan_records_no_check(tmp_path, monkeypatch):
    """A fixed policy's run is checked against the saved profile's prediction when one is
    current (`tests/test_fixed_prediction.py`); with none at hand it trains unchecked."""
    monkeypatch.setenv("JGRIND_PROFILE", str(tmp_path / "no-profile-here.json"))
    graph = community_graph(num_nodes=200, num_features=8)
    model = models.gcn(graph.num_features, 16, graph.num_classes)
    result = train(jax.random.key(0), graph, model, optax.adam(1e-2), epochs=2,
                   policy=policies.host_offload(), num_parts=3, progress=False)
    assert all("predicted_seconds" not in r for r in result.history)


def test_a_plan_whose_sweeps_are_not_the_engines_is_said_and_training_goes_on(tmp_path,
                                                                           capsys):
    """The check is a diagnostic: a prediction of another schedule (here: its sweeps
    reversed) is said once, and the run trains on, unchecked."""
    from jgrind.engine import OutOfCore
    graph = community_graph(num_nodes=200, num_features=8)
    model = models.gcn(graph.num_features, 16, graph.num_classes)
    ex = OutOfCore(graph, model, optax.adam(1e-2), policy=policies.host_offload(), num_parts=3)
    labels = [f"{s.kind} {s.layer}" for s in ex.built.plan.schedule.sweeps]
    ex.prediction = _Prediction([(label, 1.0) for label in reversed(labels)])
    result = train(jax.random.key(0), graph, model, optax.adam(1e-2), epochs=3,
                   executor=ex, progress=False)
    assert len(result.history) == 3
    assert all("predicted_seconds" not in r for r in result.history)
    out = capsys.readouterr().out
    assert out.count("is not held against its plan: the measured sweeps") == 1

