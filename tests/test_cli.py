import dataclasses
import json
import subprocess
import sys

from jgrind.cli import main
from jgrind.config import RunConfig, build_policy
from helpers import fails


def test_help_explains_every_setting(capsys):
    try:
        main(["train", "--help"])
    except SystemExit as e:
        assert e.code == 0
    out = capsys.readouterr().out
    for name in RunConfig.field_docs():
        assert name in out
    assert len(RunConfig.field_docs()) == len(RunConfig.__dataclass_fields__)


def _run(*args):
    return subprocess.run([sys.executable, "-m", "jgrind.cli", *args], capture_output=True,
                          text=True, timeout=240)


def test_user_mistakes_give_one_line_and_status_2(capsys):
    # a real process once (its exit status, no traceback; a new process costs seconds of
    # imports), then the other mistakes in this one (`fails`: status 2, one line)
    proc = _run("train", "--dataset", "nope", "--no-progress")
    assert proc.returncode == 2, proc.stderr
    assert "nope" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    for args, needle in [(["train", "--set", "hiden=3"], "unknown setting 'hiden'"),
                         (["train", "--set", "lr=fast"], "not a valid float")]:
        fails(capsys, [*args, "--no-progress"], needle)


def test_train_on_generated_graph_writes_artefacts(tmp_path):
    out = tmp_path / "run"
    code = main(["train", "--dataset", "csbm", "--epochs", "5", "--set", "num_nodes=500", "--out", str(out),
                 "--no-progress"])
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["graph"]["nodes"] == 500 and 0 <= summary["test_mean"] <= 1
    assert (out / "training.png").stat().st_size > 1000
    assert len((out / "metrics-seed0.jsonl").read_text().splitlines()) == 5


def test_partition_command_prints_quality(capsys):
    assert main(["partition", "--set", "num_nodes=2000", "--parts", "4"]) == 0
    out = capsys.readouterr().out
    assert "edge cut" in out and "halo / owned" in out and "4 partitions" in out


def test_sizes_and_out_of_core_settings(tmp_path):
    import pytest
    from jgrind.config import ConfigError, build_policy, parse_bytes
    from jgrind.plan.policies import Budgeted, Constant
    assert parse_bytes("2GiB") == 2 * 2**30 and parse_bytes("512 MiB") == 512 * 2**20
    assert parse_bytes("10GB") == 10**10 and parse_bytes("") is None
    with pytest.raises(ConfigError, match="as a size"):
        parse_bytes("2 parsecs")
    cfg = RunConfig().with_overrides(["policy=grinnder", "device_budget=1GiB",
                                      f"store={tmp_path}", "parts=8"])
    args = build_policy(cfg)
    assert isinstance(args["policy"], Budgeted) and args["num_parts"] == 8
    assert args["policy"].device_budget == 2**30
    with pytest.raises(ConfigError, match="needs a store directory"):
        build_policy(RunConfig().with_overrides(["policy=ssd"]))
    assert isinstance(build_policy(RunConfig().with_overrides(["policy=host"]))["policy"],
                      Constant)
    with pytest.raises(ConfigError, match="unknown policy"):
        build_policy(RunConfig().with_overrides(["policy=cloud"]))
    from jgrind.plan import Fate
    kept = build_policy(RunConfig().with_overrides(["policy=ssd", f"store={tmp_path}",
                                                    "keep_aggregations=host"]))["policy"]
    assert kept.aggregation_fate is Fate.HOST and kept.fate is Fate.SSD
    assert build_policy(RunConfig().with_overrides(["policy=host"]))[
        "policy"].aggregation_fate is Fate.RECOMPUTE
    with pytest.raises(ConfigError, match="applies to the in_memory, host and ssd"):
        build_policy(RunConfig().with_overrides(["policy=grinnder", "keep_aggregations=host"]))
    with pytest.raises(ConfigError, match="unknown tier 'gpu'"):
        build_policy(RunConfig().with_overrides(["policy=host", "keep_aggregations=gpu"]))


def test_out_of_core_training_from_the_command_line(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--dataset", "csbm", "--epochs", "3", "--set", "num_nodes=600", "--policy", "ssd",
                 "--store", str(tmp_path), "--parts", "3", "--out", str(out), "--no-progress"])
    assert code == 0 and (out / "summary.json").exists()
    printed = capsys.readouterr().out
    assert "store, seed 0: peak stored blocks: device" in printed and "SSD read" in printed
    assert "moved in 3 epochs and" in printed and "memory.png" in printed
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # the store's run dir is gone
    summary = json.loads((out / "summary.json").read_text())
    assert summary["memory"]["peak_ssd"] > 0 and summary["memory"]["ssd_written"] > 0
    assert (out / "memory.png").stat().st_size > 1000
    # resumed: the line counts the epochs this process ran, which its bytes are
    run = ["train", "--dataset", "csbm", "--set", "num_nodes=600", "--policy", "ssd", "--store", str(tmp_path),
           "--parts", "3", "--out", str(tmp_path / "ck"), "--no-progress", "--set",
           "checkpoint_every=1"]
    assert main([*run, "--epochs", "3"]) == 0
    written = json.loads((tmp_path / "ck" / "summary.json").read_text())["memory"]
    capsys.readouterr()
    assert main([*run, "--epochs", "4"]) == 0
    assert "moved in 1 epoch (epoch 3, after a resume)" in capsys.readouterr().out
    resumed = json.loads((tmp_path / "ck" / "summary.json").read_text())["memory"]
    assert resumed["ssd_written"] < written["ssd_written"]


def test_datasets_command_lists_generated_and_real(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name in ("cora", "tolokers", "csbm", "rmat"):
        assert name in out


def test_predict_from_a_trained_run(tmp_path, capsys):
    """`jgrind train` keeps every seed's parameters; `jgrind predict` computes logits or
    embeddings from them, the way the run trained, and its logits score what the run did."""
    import numpy as np
    import jgrind
    from jgrind.config import build_model, load_graph
    out = tmp_path / "run"
    settings = ["--dataset", "csbm", "--set", "num_nodes=400", "--epochs", "6", "--no-progress"]
    assert main(["train", *settings, "--seeds", "2", "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    capsys.readouterr()
    logits = tmp_path / "logits.npy"
    assert main(["predict", "--run", str(out), "--seed", "1", "--save", str(logits)]) == 0
    printed = capsys.readouterr().out
    assert f"val {summary['val'][1]:.4f}, test {summary['test'][1]:.4f}" in printed
    graph = load_graph(RunConfig(num_nodes=400))
    model = build_model(RunConfig(), graph)
    params, best, meta = jgrind.load_checkpoint(out / "params" / "seed1", model)
    assert meta["best"]["epoch"] == summary["best_epoch"][1]
    np.testing.assert_array_equal(np.load(logits), jgrind.predict(graph, model, best))
    hidden = tmp_path / "new" / "hidden.npy"  # into a folder that does not exist yet
    assert main(["predict", "--run", str(out), "--layer", "1", "--last", "--save",
                 str(hidden)]) == 0
    params0, _, _ = jgrind.load_checkpoint(out / "params" / "seed0", model)
    np.testing.assert_array_equal(np.load(hidden), jgrind.predict(graph, model, params0,
                                                                  layer=1))
    # out of core: predicted through the run's own policy and partitions
    store = tmp_path / "store"
    store.mkdir()
    ooc = tmp_path / "ooc"
    assert main(["train", *settings, "--policy", "ssd", "--store", str(store), "--parts", "3",
                 "--out", str(ooc)]) == 0
    assert main(["predict", "--run", str(ooc), "--save", str(tmp_path / "ooc.npy")]) == 0
    assert list(store.iterdir()) == []
    # mistakes: one line each, nothing written
    capsys.readouterr()
    for args, needle in [(["--save", str(logits)], "exists; pass --overwrite"),
                         (["--save", str(tmp_path / "a.txt")], "name a .npy file"),
                         (["--seed", "7", "--save", str(tmp_path / "b.npy")],
                          "no parameters of seed 7; it has seed(s) 0, 1"),
                         (["--layer", "3", "--save", str(tmp_path / "c.npy")],
                          "layer 3 does not exist")]:
        assert main(["predict", "--run", str(out), *args]) == 2
        assert needle in capsys.readouterr().err
    assert main(["predict", "--run", str(tmp_path), "--save", str(tmp_path / "d.npy")]) == 2
    assert "not a jgrind train run folder" in capsys.readouterr().err
    assert not any((tmp_path / f).exists() for f in ("a.txt", "b.npy", "c.npy", "d.npy"))


def test_gat_heads_and_attention_dropout_settings():
    from jgrind.config import build_model
    from jgrind.generators import csbm
    graph = csbm(num_nodes=200)
    model = build_model(RunConfig(model="gat", output_heads=3, attention_dropout=0.1,
                                  dropout=0.4), graph)
    hidden, top = model.layers[0], model.layers[-1]
    hidden, top = (getattr(hidden, "inner", hidden), getattr(top, "inner", top))
    assert (top.heads, top.attention_dropout) == (3, 0.1)
    assert hidden.attention_dropout == 0.1
    default = build_model(RunConfig(model="gat", dropout=0.4), graph).layers[-1]
    assert getattr(default, "inner", default).attention_dropout == 0.4  # -1: as dropout


def test_a_run_records_absolute_paths_and_predicts_from_anywhere(tmp_path, monkeypatch,
                                                                 capsys):
    """Relative --store and npy: paths are recorded as absolute ones, so `jgrind predict`
    works from another directory; a store moved since is named with --set store=."""
    work = tmp_path / "work"
    (work / "store").mkdir(parents=True)
    monkeypatch.chdir(work)
    assert main(["convert", "--dataset", "csbm", "--set", "num_nodes=400", "--out", "g"]) == 0
    assert main(["train", "--dataset", "npy:g", "--epochs", "2", "--policy", "ssd", "--store",
                 "store", "--parts", "2", "--no-progress", "--out", "run"]) == 0
    saved = json.loads((work / "run" / "config.json").read_text())
    assert saved["dataset"] == f"npy:{work / 'g'}" and saved["store"] == str(work / "store")
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    assert main(["predict", "--run", "work/run", "--save", "a.npy"]) == 0
    (work / "store").rename(work / "moved")
    assert main(["predict", "--run", "work/run", "--save", "b.npy"]) == 2
    assert "--set store=DIR" in capsys.readouterr().err
    assert main(["predict", "--run", "work/run", "--save", "b.npy", "--set",
                 f"store={work / 'moved'}"]) == 0
    for setting in ("hidden=3", "lr=5"):  # the model's, or meaningless for a prediction
        assert main(["predict", "--run", "work/run", "--save", "c.npy", "--set", setting]) == 2
        assert "the saved parameters are of the run's model" in capsys.readouterr().err


def test_auto_says_what_it_planned_and_saves_the_plan(tmp_path, capsys, monkeypatch):
    """`--policy auto` prints the plan in one line before training and keeps the whole plan
    in plan.txt; the store's peaks then match the plan's blocks."""
    from jgrind.plan import profile
    from test_planner import fixed_profile
    store = tmp_path / "store"
    store.mkdir()
    # measured for this store (else it is measured again, 10-30 s)
    path = profile.save(fixed_profile(directory=str(store.resolve())),
                        tmp_path / "profile.json")
    out = tmp_path / "run"
    # budgets that plan 4 partitions, one SSD block among them (300KiB for the device cut
    # a 2000-node graph in 64: 16 times the steps for the same lines)
    assert main(["train", "--dataset", "csbm", "--set", "num_nodes=1000", "--epochs", "2", "--policy", "auto",
                 "--store", str(store), "--device-budget", "1MiB", "--host-budget", "500KiB",
                 "--set", f"profile={path}", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(text for text in printed.splitlines() if text.startswith("jgrind: auto plan:"))
    assert "partitions" in line and "predicted" in line and "plan.txt" in printed
    plan = (out / "plan.txt").read_text()
    assert plan.startswith("plan: ") and "predicted epoch time" in plan
    # a later run into the folder without auto leaves no stale plan behind
    assert main(["train", "--dataset", "csbm", "--set", "num_nodes=1000", "--epochs", "1", "--no-progress",
                 "--out", str(out)]) == 0
    assert not (out / "plan.txt").exists()


def test_partitioner_flag_reaches_plan_and_train(tmp_path, monkeypatch):
    """`--partitioner` (or --set partitioner=) is what plan and train cut with; plan used to
    ignore it and cut by label propagation whatever it was told."""
    from jgrind import partition
    from jgrind.plan import profile
    from test_planner import fixed_profile
    calls = []
    real = partition.PARTITIONERS["contiguous"]
    monkeypatch.setitem(partition.PARTITIONERS, "contiguous",
                        lambda graph, k, **kw: calls.append(k) or real(graph, k, **kw))
    path = profile.save(fixed_profile(), tmp_path / "profile.json")
    assert main(["plan", "--set", "num_nodes=500", "--parts", "4", "--partitioner",
                 "contiguous", "--device-budget", "1MiB", "--profile", str(path), "--out",
                 str(tmp_path / "plan")]) == 0
    assert calls == [4]
    assert main(["train", "--dataset", "csbm", "--set", "num_nodes=500", "--epochs", "1", "--policy", "host",
                 "--parts", "3", "--partitioner", "contiguous", "--no-progress", "--out",
                 str(tmp_path / "run")]) == 0
    assert calls == [4, 3]


def test_partitioner_options_reach_the_partitioner(data_root, capsys):
    """`--set partitioner_options=edge_imbalance:100` lifts label propagation's edge bound:
    tolokers in 8 parts then keeps 1.80x the mean edge load on one partition (and cuts 45 %
    of the edges), against 1.10x (58.5 %) under the default bound."""
    import re
    loads = []
    for options in ([], ["--set", "partitioner_options=edge_imbalance:100"]):
        assert main(["partition", "--dataset", "tolokers", "--parts", "8", *options]) == 0
        out = capsys.readouterr().out
        loads.append(float(re.search(r"local edges .*\(imbalance ([0-9.]+)\)", out).group(1)))
    assert loads[0] <= 1.1 < 1.5 < loads[1]


def test_partitioner_options_are_checked_before_the_graph_loads(capsys):
    """A misspelt option names the partitioner's options; a value out of range gets the
    partitioner's own message; both before any graph is loaded (the dataset does not
    exist), in one line with status 2 (`fails`; a real process's exit status is
    `test_user_mistakes_give_one_line_and_status_2`'s)."""
    for options, needle in [("edge_imbalence:2", "its options: iterations, imbalance"),
                            ("imbalance:0.5", "must be finite numbers >= 1.0"),
                            ("edge_imbalance:abc", "edge_imbalance must be a number; got 'abc'"),
                            ("iterations:2.5",
                             "iterations must be a whole number, at least 0; got 2.5"),
                            ("seed:3", "seed is a setting of its own"),
                            ("imbalance", "expected key:value pairs")]:
        err = fails(capsys, ["partition", "--dataset", "no-such-dataset", "--set",
                             f"partitioner_options={options}"], needle)
        assert "no-such-dataset" not in err


def test_the_python_policy_names_are_accepted_as_aliases(tmp_path):
    from jgrind.plan import policies
    for alias, name in (("host_offload", "host"), ("ssd_offload", "ssd"),
                        ("ssd-offload", "ssd"), ("recompute_activations", "recompute")):
        cfg = RunConfig().with_overrides([f"policy={alias}", f"store={tmp_path}"])
        assert cfg.policy == name
        assert build_policy(cfg)["policy"] == build_policy(
            dataclasses.replace(cfg, policy=name))["policy"]
    assert build_policy(RunConfig(policy="host_offload"))["policy"] == policies.host_offload()
