"""Run a `RunConfig` for several seeds and write its artefacts (what ``jgrind train`` does).

Artefacts in ``out``: ``config.json``, ``metrics-seed{S}.jsonl`` (one JSON object per epoch),
``training.png`` (loss and metric curves), ``summary.json`` (per-seed and mean +- std),
``memory.png`` (bytes per tier over the first seed's run) for an out-of-core run, and
``checkpoints/seed{S}/`` when checkpointing is on.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import jax

from jgrind.config import (RunConfig, build_model, build_optimizer, build_policy, load_graph,
                           split_for)
from jgrind.plan.cost import format_bytes
from jgrind.plots import plot_memory, plot_training
from jgrind.train import run_trials, train


def run_config(cfg: RunConfig, out: pathlib.Path, progress: bool = True) -> dict:
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    t0 = time.perf_counter()
    graph = load_graph(cfg)
    model = build_model(cfg, graph)
    optimizer = build_optimizer(cfg)
    engine_args = build_policy(cfg)
    load_seconds = time.perf_counter() - t0
    seeds = [cfg.seed + i for i in range(cfg.seeds)]

    def run(seed: int):
        trial = seed - cfg.seed
        ckpt_dir = (out / "checkpoints" / f"seed{seed}") if cfg.checkpoint_every else None
        return train(jax.random.key(seed), graph, model, optimizer, epochs=cfg.epochs,
                     split=split_for(cfg, graph, trial), eval_every=cfg.eval_every,
                     patience=cfg.patience or None, log_path=out / f"metrics-seed{seed}.jsonl",
                     checkpoint_dir=ckpt_dir, checkpoint_every=cfg.checkpoint_every or 1,
                     progress=progress, **engine_args)

    trials = run_trials(run, seeds)
    plot_training([r.history for r in trials.results], out / "training.png",
                  metric=trials.metric, labels=[f"seed {s}" for s in seeds],
                  title=f"{cfg.model} on {graph.name}")
    memory = trials.results[0].memory
    if memory is not None:
        plot_memory(memory["timeline"], out / "memory.png",
                    budgets={"device": engine_args["device_budget"],
                             "host": engine_args["host_budget"]},
                    title=f"memory per tier, {cfg.model} on {graph.name} (seed {cfg.seed})")
    epoch_times = sorted(rec["seconds"] for r in trials.results for rec in r.history)
    summary = {
        "dataset": graph.name, "model": cfg.model, "metric": trials.metric,
        "graph": {"nodes": graph.num_nodes, "edges": graph.num_edges,
                  "features": graph.num_features, "classes": graph.num_classes},
        "seeds": list(trials.seeds),
        "test": [r.test for r in trials.results], "val": [r.val for r in trials.results],
        "best_epoch": [r.best_epoch for r in trials.results],
        "test_mean": trials.mean, "test_std": trials.std,
        "median_epoch_seconds": epoch_times[len(epoch_times) // 2] if epoch_times else None,
        "load_seconds": load_seconds,
        "memory": None if memory is None else {k: v for k, v in memory.items()
                                               if k != "timeline"},
        "line": f"{cfg.model} on {graph.name}: {trials.summary()}",
        "store_line": None if memory is None else store_line(
            memory, len(trials.results[0].history), cfg.seed),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def store_line(memory: dict, epochs: int, seed: int) -> str:
    """One line on an out-of-core run's store (`jgrind.engine.store.Accounts`): peak bytes per
    tier, and the bytes moved over the run, evaluation sweeps included. SSD bytes are the rows
    used, then what the read and write calls passed (coalesced gap rows included)."""
    f = format_bytes
    return (f"store, seed {seed}: peak device {f(memory['peak_device'])}, host "
            f"{f(memory['peak_host'])}, SSD {f(memory['peak_ssd'])}; moved in {epochs} epochs "
            f"and their evaluations: host read {f(memory['host_read'])}, written "
            f"{f(memory['host_written'])}; SSD read {f(memory['ssd_read'])}, written "
            f"{f(memory['ssd_written'])} (file calls: {memory['ssd_read_ops']:,} reads of "
            f"{f(memory['ssd_file_read'])}, {memory['ssd_write_ops']:,} writes of "
            f"{f(memory['ssd_file_written'])})")
