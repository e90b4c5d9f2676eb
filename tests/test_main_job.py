"""The main job: what ``jgrind train`` runs without ``--dataset`` (issue 43). It trains a
generated graph under budgets it does not fit in, with the planner choosing the plan and the SSD
tier in use, and then trains the first seed again in memory to show the loss is the same."""

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from jgrind import cli, experiment
from jgrind.config import (MAIN_JOB_BUDGETS, MAIN_JOB_EPOCHS, MAIN_JOB_NODES, RunConfig,
                           main_job, parse_bytes)
from jgrind.plan.profile import save
from test_planner import fixed_profile


def _train_args(*argv) -> argparse.Namespace:
    return cli.build_parser().parse_args(["train", *argv])


def test_train_without_a_dataset_is_the_main_job(tmp_path, monkeypatch):
    """No ``--dataset``: the main job's settings, each one a default a flag changes; a named
    dataset (by flag or ``--set``) is the plain in-memory run."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    cfg = cli.train_config(_train_args())
    assert (cfg.dataset, cfg.num_nodes, cfg.epochs, cfg.policy, cfg.check_in_memory) == \
        ("csbm", MAIN_JOB_NODES, MAIN_JOB_EPOCHS, "auto", True)
    assert (cfg.device_budget, cfg.host_budget) == MAIN_JOB_BUDGETS
    assert cfg.store == str(tmp_path)  # the engine makes its private folder there
    changed = cli.train_config(_train_args("--epochs", "3", "--device-budget", "1MiB",
                                           "--store", "/elsewhere"))
    assert (changed.epochs, changed.device_budget, changed.store, changed.policy) == \
        (3, "1MiB", "/elsewhere", "auto")
    for named in (("--dataset", "csbm"), ("--set", "dataset=csbm")):
        assert cli.train_config(_train_args(*named)) == RunConfig()


def test_the_main_job_at_its_own_size_needs_every_tier():
    """The main job's own graph and budgets: training in memory would need several times the
    budgets, and the plan sends blocks to the host and to the SSD store (the point of the
    first command). Planned with a fixed profile, at full size, without training."""
    from jgrind.config import build_model, load_graph
    from jgrind.plan.planner import plan_run
    cfg = main_job()
    graph = load_graph(cfg)
    model = build_model(cfg, graph)
    device, host = (parse_bytes(b) for b in MAIN_JOB_BUDGETS)
    plan = plan_run(graph, model, fixed_profile(), device_budget=device, host_budget=host,
                    directory=cfg.store)
    assert not plan.in_memory and plan.in_memory_bytes > 3 * (device + host)
    fates = {tier for row in plan.groups() for tier, count in row["blocks"].items() if count}
    assert {"host", "ssd"} <= fates, plan.groups()


def test_the_main_job_prints_its_point_and_leaves_no_store(tmp_path):
    """The main job at a small size in its own process (so the resident memory is its own;
    3000 nodes in budgets under a fifth of their in-memory bytes still use every tier):
    the plan line names the fates, the SSD tier moves bytes, the peak resident memory is
    within the budgets + graph + the runtime's stated bytes, the in-memory check prints the
    same loss, the charts are written, and the temporary store is gone afterwards."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    profile = save(fixed_profile(directory=str(tmp.resolve())), tmp_path / "profile.json")
    out = tmp_path / "run"
    env = dict(os.environ, TMPDIR=str(tmp), JGRIND_PROFILE=str(profile))
    child = subprocess.run(
        [sys.executable, "-m", "jgrind.cli", "train", "--no-progress", "--no-compile-cache",
         "--set", "num_nodes=3000", "--epochs", "4", "--device-budget", "512KiB",
         "--host-budget", "256KiB", "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=300)
    assert child.returncode == 0, child.stderr
    printed = child.stdout
    plan = next(line for line in printed.splitlines() if line.startswith("jgrind: auto plan:"))
    assert "fates:" in plan and "ssd" in plan and "(in memory: " in plan
    ssd_read = re.search(r"SSD read ([\d.]+) (\w+)", printed)
    assert ssd_read and float(ssd_read.group(1)) > 0
    assert re.search(r"peak resident memory while training: .*, within the budgets", printed)
    check = re.search(r"in-memory check, seed 0: final training loss (\S+) out of core, "
                      r"(\S+) in memory: equal to 6 digits", printed)
    assert check and check.group(1) == check.group(2), printed
    for name in ("training.png", "memory.png", "plan.txt", "plan-schedule.png",
                 "plan-memory.png"):
        assert (out / name).stat().st_size > 0, name
    summary = json.loads((out / "summary.json").read_text())
    assert summary["in_memory_check"]["equal"]
    assert summary["memory"]["ssd_read"] > 0
    assert summary["peak_resident"] <= 512 * 2**10 + 256 * 2**10 + summary["graph_bytes"] \
        + experiment.RUNTIME_BYTES
    assert os.listdir(tmp) == [], "the store's temporary folder was left behind"


def test_loss_check_is_equal_only_to_the_printed_digits():
    same = experiment.loss_check(0.16327812, 0.16327809, seed=3)
    assert same["equal"] and "equal to 6 digits" in same["line"] and "seed 3" in same["line"]
    apart = experiment.loss_check(0.1632781, 0.1632901, seed=0)
    assert not apart["equal"] and "DIFFERENT" in apart["line"]
    assert apart["relative_difference"] == pytest.approx(1.2e-5 / 0.1632901, rel=1e-3)


def test_a_loss_that_differs_from_in_memory_fails_the_command(tmp_path, monkeypatch, capsys):
    """The check is a check: a different in-memory loss is exit status 1 and a line on stderr,
    not a line a reader may miss."""
    different = experiment.loss_check(0.5, 0.6, seed=0)
    summary = {"line": "gcn on g: ...", "store_line": "store ...", "rss_line": "peak ...",
               "in_memory_check": different}
    monkeypatch.setattr(experiment, "run_config", lambda cfg, out, progress: summary)
    assert cli.main(["train", "--no-compile-cache", "--out", str(tmp_path / "r")]) == 1
    captured = capsys.readouterr()
    assert "DIFFERENT" in captured.out and "differs from the in-memory one" in captured.err


def test_rss_line_states_its_bound_and_says_when_it_is_over():
    within = experiment.rss_line(100 << 20, 16 << 20, 8 << 20, 10 << 20)
    assert "within" in within and "768.00 MiB for the runtime" in within
    over = experiment.rss_line(900 << 20, 16 << 20, 8 << 20, 10 << 20)
    assert "OVER" in over
    assert "no bound" in experiment.rss_line(100 << 20, None, 8 << 20, 10 << 20)
    # a GPU's memory is not resident: its budget bounds nothing here
    gpu = experiment.rss_line(800 << 20, 16 << 30, 8 << 20, 10 << 20, device_in_ram=False)
    assert "OVER" in gpu and "host 8.00 MiB" in gpu and "16.00 GiB" not in gpu


def test_no_progress_bar_off_a_terminal(tmp_path, capsys):
    """The bar is for a person at a terminal; redrawn into a log or CI transcript it is noise
    (`.ci/run` runs `jgrind train` exactly as the README writes it)."""
    assert cli.main(["train", "--dataset", "csbm", "--set", "num_nodes=300", "--epochs", "3",
                     "--no-compile-cache", "--out", str(tmp_path / "r")]) == 0
    err = capsys.readouterr().err
    assert "it/s" not in err and "%|" not in err, err
