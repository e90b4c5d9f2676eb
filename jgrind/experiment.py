"""Run a `RunConfig` for several seeds and write its artefacts (what ``jgrind train`` does).

Artefacts in ``out``: ``config.json``, ``metrics-seed{S}.jsonl`` (one JSON object per epoch),
``training.png`` (loss and metric curves), ``summary.json`` (per-seed and mean +- std),
``memory.png`` (bytes per tier over the first seed's run) for an out-of-core run,
``plan.txt`` (the planner's plan, `jgrind.plan.report.format_plan`) and its charts
(``plan-schedule.png``, ``plan-memory.png``) for ``policy=auto``,
``params/seed{S}/`` (the last and the best parameters, orbax; `predict_run` and
``jgrind predict`` read them), and ``checkpoints/seed{S}/`` when checkpointing is on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pathlib
import shutil
import socket
import tempfile
import time
from typing import Iterator, Optional, Sequence

import jax
import numpy as np

from jgrind import checkpoint as ckpt
from jgrind.hostio import disk_space, host_memory
from jgrind.config import (ConfigError, RunConfig, build_loss, build_model, build_optimizer,
                           build_policy, load_graph, split_for)
from jgrind.datasets import split_per_seed
from jgrind.plan.check import run_check
from jgrind.plan.budgets import UNLIMITED
from jgrind.plan.cost import format_bytes
from jgrind.plan.report import format_plan, plan_line, plot_plan
from jgrind.plan.sharded import device_peak_lines, process_share_lines
from jgrind.plots import plot_memory, plot_training
from jgrind.inference import load_checkpoint, predict
from jgrind.metrics import check_metric, default_metric, evaluate, roc_auc_per_task
from jgrind.train import run_trials, train


# What a run's checkpoints depend on: resuming one under another value of these would load
# parameters of another shape, or continue another experiment and report it as this one.
# (The metric is checked by `train` against the checkpoint, once '' is resolved by the task.)
# (Epochs, seeds, evaluation and every out-of-core setting may change: the engine computes the
# same function whatever the policy, budgets or partitions.)
CHECKPOINTED = ("dataset", "model", "hidden", "layers", "heads", "dropout", "residual",
                "layer_norm", "activation", "lr", "weight_decay", "seed", "split",
                "row_normalize", "num_nodes", "avg_degree", "dataset_options", "num_classes",
                "select",
                "min_delta", "label_smoothing", "multilabel_loss", "pos_weight", "output_heads",
                "attention_dropout", "optimizer", "lr_schedule", "warmup_epochs", "num_bases",
                "num_blocks",
                # a lossy storage dtype changes the numbers a run computes
                "store_dtype", "store_dtype_activations", "store_dtype_aggregations",
                "store_dtype_gradients")
# the files `run_config` writes (and a later run in the same folder replaces)
RUN_FILES = ("config.json", "summary.json", "training.png", "memory.png", "plan.txt",
             "plan-schedule.png", "plan-memory.png")
PARAMS = "params"  # the folder of every seed's final parameters
OWNER = ".jgrind-owner.json"  # the run that holds the folder (`hold_output_folder`)
# what `predict_run` may change: where and how the run computes, not what (a dataset moved to
# another path must be the same graph; the parameters' shapes catch only some mistakes)
PREDICT_SETTINGS = ("dataset", "store", "policy", "parts", "partitioner", "device_budget",
                    "host_budget", "profile", "keep_aggregations")


def check_output_folder(out: str | pathlib.Path, flag: str = "--out") -> pathlib.Path:
    """``out`` as a path, if a command can make it or write into it: ConfigError for an empty
    name (which would mean the current folder) or a path that is, or runs through, a file.
    ``flag``: the option that named it, which the message tells the user to change."""
    if not str(out).strip():
        raise ConfigError(f"the output folder ({flag}) is empty; name a folder")
    path = pathlib.Path(out)
    for parent in (path, *path.parents):
        if parent.exists():
            if not parent.is_dir():
                what = "is a file" if parent == path else f"cannot be made: {parent} is a file"
                raise ConfigError(f"the output folder {path} {what}; name another folder "
                                  f"({flag})")
            _check_writable(path, parent, flag)
            break
    return path


def _check_writable(path: pathlib.Path, existing: pathlib.Path, flag: str = "--out") -> None:
    """ConfigError unless a folder can be made in ``existing`` (``path`` or its nearest
    existing parent). A probe, made and removed at once, because permission bits do not tell:
    root passes every access() check, and /proc or a read-only mount refuse even root."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".jgrind-probe-", dir=existing))
    except OSError as err:
        where = "" if existing == path else f" (in {existing})"
        raise ConfigError(f"cannot write the output folder {path}{where}: "
                          f"{err.strerror or err}; name a folder you can write ({flag})") from None


def check_out(out: str | pathlib.Path, cfg: RunConfig) -> pathlib.Path:
    """``out`` as a path, if it can take a run of ``cfg``: ConfigError for a path that is a
    file (`check_output_folder`), a folder of other files, or checkpoints of another
    experiment. Changes nothing."""
    out = check_output_folder(out)
    if not out.is_dir() or not any(p.name != OWNER for p in out.iterdir()):
        return out
    earlier = saved_config(out)
    if earlier is None:
        raise ConfigError(f"the output folder {out} holds files that are not a jgrind run's "
                          "(no readable config.json); name a new or empty folder (--out)")
    if cfg.checkpoint_every and (out / "checkpoints").is_dir():
        # a schedule is laid over the run's epochs: another count is another schedule
        fixed = CHECKPOINTED + (("epochs",) if cfg.lr_schedule != "constant" else ())
        differ = [f"{k} {getattr(earlier, k)!r} -> {getattr(cfg, k)!r}" for k in fixed
                  if getattr(earlier, k) != getattr(cfg, k)
                  and not (k == "dataset" and _moved(earlier.dataset, cfg.dataset))]
        if differ:
            raise ConfigError(f"{out}/checkpoints hold another experiment ({', '.join(differ)}), "
                              "which this run would resume; name another folder (--out), or "
                              "remove the checkpoints to start afresh")
        saved = [int(step.name) for step in (out / "checkpoints").glob("seed*/*")
                 if step.name.isdigit()]
        if saved and max(saved) >= cfg.epochs:
            raise ConfigError(f"{out}/checkpoints reach epoch {max(saved)}, past this run's "
                              f"{cfg.epochs} epochs; train for at least {max(saved) + 1} "
                              "epochs (--epochs) to resume them, or name another folder")
    return out


def _moved(before: str, now: str) -> bool:
    """Whether two dataset settings name files of one kind at different paths (``npy:/a``,
    ``npy:/b``): a dataset moved to another disk may resume its checkpoints, which hold a
    fingerprint of the graph they were trained on (`jgrind.Graph.fingerprint`), checked once
    it is loaded."""
    kind, sep, _ = before.partition(":")
    return bool(sep) and kind.lower() in ("ogb", "npz", "edgelist", "npy") \
        and now.partition(":")[0].lower() == kind.lower() and ":" in now


def saved_config(out: pathlib.Path) -> Optional[RunConfig]:
    """The `RunConfig` a run folder's config.json records, or None if there is none readable.
    A setting newer than the file has its default, and the paths of a file written before run
    folders recorded them absolute are taken from the current directory."""
    try:
        saved = json.loads((out / "config.json").read_text())
        return RunConfig(**{k: v for k, v in saved.items()
                            if k in RunConfig.__dataclass_fields__}).with_absolute_paths()
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def start_out(out: pathlib.Path, cfg: RunConfig) -> None:
    """Clear an earlier run's results from ``out`` (not its checkpoints, which ``cfg``
    resumes) and write ``cfg`` there: called once the run is checked and about to start."""
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    for log in out.glob("metrics-seed*.jsonl"):
        log.unlink()
    shutil.rmtree(out / PARAMS, ignore_errors=True)
    (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2))
    (out / OWNER).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                         "machine": disk_space.machine_id(),
                                         "ticks": disk_space.process_start(os.getpid()),
                                         "started": time.strftime("%Y-%m-%d %H:%M:%S")}))


@contextlib.contextmanager
def hold_output_folder(out: pathlib.Path) -> Iterator[pathlib.Path]:
    """Hold the run folder ``out`` (made if missing) for one run: an exclusive ``flock`` on
    the folder itself, which the kernel drops however the process ends. A second run on the
    same folder then fails at once, ConfigError naming the first (`OWNER`), and changes
    nothing, instead of writing into the first's checkpoints. If the run fails before it
    writes its config.json, a folder made here is removed again."""
    made = next((p for p in (out, *out.parents) if p.parent.exists()), None) \
        if not out.exists() else None  # the topmost folder this call makes
    try:
        out.mkdir(parents=True, exist_ok=True)
        fd = os.open(out, os.O_RDONLY)
    except OSError as err:
        raise ConfigError(f"cannot make the output folder {out}: {err.strerror or err}; name "
                          "a folder you can write (--out)") from None
    try:
        try:
            import fcntl
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"the output folder {out} is in use by another jgrind run "
                              f"({_holder(out)}); wait for it or choose another --out") from None
        except (ImportError, OSError):
            pass  # no locks here (not POSIX, or a file system without them): unguarded
        try:
            yield out
        except BaseException:
            if made is not None and not (out / "config.json").exists():
                shutil.rmtree(made, ignore_errors=True)  # nothing of the run's in it yet
            raise
    finally:
        os.close(fd)  # drops the lock


def _holder(out: pathlib.Path) -> str:
    """The run that holds ``out``, in words, from the record it wrote there when it started
    (an earlier run's record if the holder has not started yet)."""
    try:
        owner = json.loads((out / OWNER).read_text())
        pid = int(owner["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return "one that is still starting"
    # its pid tells only where pids are this process's (`disk_space.machine_id`)
    here = owner.get("machine") is not None and owner.get("machine") == disk_space.machine_id()
    if here and (not disk_space.alive(pid)
                 or disk_space.process_start(pid) != owner.get("ticks")):
        return "one that is still starting"
    return f"pid {pid}{'' if here else ' on ' + str(owner.get('host'))}, started " \
           f"{owner.get('started')}"


def run_config(cfg: RunConfig, out: str | pathlib.Path, progress: bool = True) -> dict:
    """Train ``cfg`` for its seeds and write the run's files into ``out``. Everything that can
    be checked (settings, the folder, the dataset, the model, the policy, then the engine's
    budgets and store) is checked before anything is written. ``out`` is held meanwhile
    (`hold_output_folder`): a second run on it fails at once."""
    cfg = cfg.with_absolute_paths()  # config.json must name the same files from anywhere
    with hold_output_folder(check_output_folder(out)) as out:
        return _run_holding(cfg, out, progress)


def _run_holding(cfg: RunConfig, out: pathlib.Path, progress: bool) -> dict:
    """`run_config`, once it holds ``out``."""
    out = check_out(out, cfg)  # before a large graph is loaded for nothing
    t0 = time.perf_counter()
    graph = load_graph(cfg)
    model = build_model(cfg, graph)
    optimizer = build_optimizer(cfg)
    build_loss(cfg, graph)  # a setting the task cannot take: said before anything is written
    if cfg.metric:
        try:
            check_metric(cfg.metric, graph.num_classes, graph.multilabel)
        except ValueError as err:  # a setting: one line, before anything is written
            raise ConfigError(f"setting metric={cfg.metric}: {err}") from None
    plans: list = []  # the auto policy's plan, one per seed (the same for each)

    def planned(plan) -> None:
        if not plans:
            print(f"jgrind: {plan_line(plan)}", flush=True)
            for line in plan_lines(plan, jax.process_index()):  # over several devices
                print(f"jgrind: {line}", flush=True)
            # the peak resident memory counts from here: what training holds, not what
            # measuring the hardware profile or planning held before
            host_memory.reset_peak_resident()
        plans.append(plan)

    engine_args = build_policy(cfg, on_plan=planned)
    load_seconds = time.perf_counter() - t0
    seeds = [cfg.seed + i for i in range(cfg.seeds)]
    splits = [split_for(cfg, graph, trial) for trial in range(cfg.seeds)]
    per_seed = cfg.split < 0 and split_per_seed(cfg.dataset, cfg.loader_options())

    def task(trial: int) -> dict:
        """What a seed's run trains, wherever it runs: `train`'s arguments."""
        return dict(epochs=cfg.epochs, split=splits[trial], eval_every=cfg.eval_every,
                    patience=cfg.patience or None, select=cfg.select,
                    loss=build_loss(cfg, graph, splits[trial]), metric=cfg.metric or None,
                    min_delta=cfg.min_delta, progress=progress)

    def run(seed: int):
        trial = seed - cfg.seed
        ckpt_dir = (out / "checkpoints" / f"seed{seed}") if cfg.checkpoint_every else None
        result = train(jax.random.key(seed), graph, model, optimizer, **task(trial),
                       log_path=out / f"metrics-seed{seed}.jsonl", checkpoint_dir=ckpt_dir,
                       checkpoint_every=cfg.checkpoint_every or 1,
                       ready=(lambda: start_out(out, cfg)) if trial == 0 else None,
                       **engine_args)
        best = {"epoch": result.best_epoch, "val": result.val, "test": result.test}
        ckpt.save_params(out / PARAMS / f"seed{seed}", len(result.history) - 1, result.params,
                         result.best_params, {"best": best, "split": splits[trial]})
        return result

    host_memory.reset_peak_resident()  # again by the plan's callback, once planned
    trials = run_trials(run, seeds)
    peak_resident = host_memory.peak_resident()
    memory = trials.results[0].memory
    devices = trials.results[0].devices
    check = None
    if cfg.check_in_memory and (memory is not None or devices is not None):
        if progress:
            print(f"jgrind: training seed {cfg.seed} again in memory, to compare", flush=True)
        again = train(jax.random.key(cfg.seed), graph, model, optimizer, **task(0))
        check = loss_check(trials.results[0].history[-1]["loss"],
                           again.history[-1]["loss"], cfg.seed,
                           how=f"on {cfg.devices} devices" if devices is not None else
                           "out of core")
    if jax.process_index() == 0:  # (another process's run folder is dropped, `jgrind.cli`)
        with _whole(out / "training.png") as path:
            plot_training([r.history for r in trials.results], path,
                          metric=trials.metric + (f" ({graph.num_classes} tasks)"
                                                  if graph.multilabel else ""),
                          labels=[f"seed {s}" for s in seeds],
                          best_epochs=[r.best_epoch for r in trials.results],
                          title=f"{cfg.model} on {graph.name}")
    if memory is not None:
        with _whole(out / "memory.png") as path:
            plot_memory(memory["timeline"], path,
                        budgets={"device": engine_args["device_budget"],
                                 "host": engine_args["host_budget"]},
                        title=f"memory per tier, {cfg.model} on {graph.name} (seed {cfg.seed})")
    epoch_times = sorted(rec["seconds"] for r in trials.results for rec in r.history)
    summary = {
        "dataset": graph.name, "model": cfg.model, "metric": trials.metric,
        "graph": {"nodes": graph.num_nodes, "edges": graph.num_edges,
                  "features": graph.num_features, "classes": graph.num_classes,
                  "multilabel": graph.multilabel},
        "seeds": list(trials.seeds), "splits": splits,
        "test": [r.test for r in trials.results], "val": [r.val for r in trials.results],
        "best_epoch": [r.best_epoch for r in trials.results],
        "test_mean": trials.mean, "test_std": trials.std,
        "val_mean": trials.val_mean, "val_std": trials.val_std,
        "median_epoch_seconds": epoch_times[len(epoch_times) // 2] if epoch_times else None,
        "load_seconds": load_seconds,
        "memory": None if memory is None else {k: v for k, v in memory.items()
                                               if k != "timeline"},
        "peak_resident": peak_resident, "graph_bytes": graph.nbytes(),
        "rss_line": None if memory is None else rss_line(
            peak_resident, engine_args["device_budget"], engine_args["host_budget"],
            graph.nbytes(), device_in_ram=jax.default_backend() == "cpu"),
        "in_memory_check": check,
        "plan_check": run_check(trials.results[0].history),
        "devices_line": None if devices is None else devices_line(devices),
        "device_peaks": None if devices is None or "device_peaks" not in devices else {
            k: devices[k] for k in ("device_peaks", "predicted_device_peaks",
                                    "device_working_sets", "device_budget")},
        "line": f"{cfg.model} on {graph.name}"
                + (" (a random split per seed)" if per_seed else "") + f": {trials.summary()}",
        # one line per seed: each seed's run has its own store
        "store_line": None if memory is None else "\n".join(
            store_line(r.memory, len(r.history) - r.first_epoch, seed, r.first_epoch,
                       total=cfg.epochs)
            for seed, r in zip(trials.seeds, trials.results) if r.memory is not None),
    }
    if plans:
        with _whole(out / "plan.txt") as path:
            path.write_text("\n".join([format_plan(plans[0]),
                                       *plan_lines(plans[0])]) + "\n")
        plot_plan(plans[0], out)
    with _whole(out / "summary.json") as path:
        path.write_text(json.dumps(summary, indent=2))
    return summary


def plan_lines(plan, process: Optional[int] = None) -> list[str]:
    """What a run prints and writes (plan.txt) of its auto plan beside `plan_line`: over
    several devices each device's predicted peak (`device_peak_lines`), and over several
    processes each process's devices, partitions and predicted host share beside the host
    budget per process, as `jgrind plan --devices K --num-processes P` prints them
    (`process_share_lines`): only process ``process``'s where given (each process prints its
    own), every process's where None."""
    shares = process_share_lines(plan)
    if process is not None and shares:
        shares = shares[process:process + 1]
    return device_peak_lines(plan) + shares


@contextlib.contextmanager
def _whole(path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A temporary name beside ``path`` to write, renamed to ``path`` once written: a write
    that fails (a full disk) leaves no half-written file."""
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        yield partial
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)


# What a run holds beside its budgets and its graph: the Python interpreter, JAX and XLA's
# runtime, the compiled programs, thread stacks and allocator slack: the main job's whole peak
# was 533 MiB on CPU-2 (docs/results.md, "The first command"), so this bound has a margin.
RUNTIME_BYTES = 768 << 20


def rss_line(peak: int, device_budget: Optional[int], host_budget: Optional[int],
             graph_bytes: int, device_in_ram: bool = True) -> str:
    """The peak resident memory of an out-of-core run against what it may hold: its host
    budget, its device budget where the device's memory is the host's (``device_in_ram``: the
    CPU backend; a GPU's is not resident memory), its graph and `RUNTIME_BYTES`. An unlimited
    budget bounds nothing: the line says so."""
    f = format_bytes
    budgets = [host_budget] + ([device_budget] if device_in_ram else [])
    if None in budgets:
        return (f"peak resident memory while training: {f(peak)} (graph {f(graph_bytes)}; "
                "no bound: a budget is unlimited)")
    bound = sum(budgets) + graph_bytes + RUNTIME_BYTES
    verdict = "within" if peak <= bound else "OVER"
    named = (f"{f(device_budget)} + {f(host_budget)}" if device_in_ram else
             f"host {f(host_budget)}")
    return (f"peak resident memory while training: {f(peak)}, {verdict} the budgets "
            f"{named} + the graph {f(graph_bytes)} + {f(RUNTIME_BYTES)} for the runtime = "
            f"{f(bound)}")


def devices_line(devices: dict) -> str:
    """The placement of partitions on devices and the halo exchange's bytes per epoch beside
    the least any exchange could move (`TrainResult.devices`)."""
    ratio = devices["moved"] / devices["minimum"] if devices["minimum"] else 1.0
    routes = devices.get("by_route") or {}
    split = "" if sum(1 for n in routes.values() if n) < 2 else " (" + ", ".join(
        f"{route} {n / 2**20:.2f} MiB" for route, n in routes.items()) + ")"
    line = (f"{devices['placement']}\nhalo exchange per epoch: "
            f"{devices['moved'] / 2**20:.2f} MiB moved between devices{split}, minimum "
            f"{devices['minimum'] / 2**20:.2f} MiB ({ratio:.2f}x)")
    crossed = devices.get("between_processes")
    if crossed is not None:  # out of core over several processes: this one's share
        ratio = crossed["sent"] / crossed["minimum"] if crossed["minimum"] else 1.0
        line += (f"\nhalo exchange between processes per epoch: {crossed['sent'] / 2**20:.2f} "
                 f"MiB sent by this process, minimum {crossed['minimum'] / 2**20:.2f} MiB "
                 f"({ratio:.2f}x)")
    share = devices.get("host_share")
    if share is not None:  # out of core over several processes: this one's host blocks
        f = format_bytes
        budget = "no host budget" if share["budget"] >= UNLIMITED else \
            f"of the host budget per process {f(share['budget'])}"
        line += (f"\nprocess {share['process']}'s host share (its blocks and the halo rows it "
                 f"keeps of the others'), measured peak / predicted: {f(share['measured'])} / "
                 f"{f(share['predicted'])}, {budget}")
    if devices.get("device_peaks") is not None:  # out of core: each device's blocks
        line += "\ndevice blocks at their peak, measured / predicted: " + ", ".join(
            f"device {d} {measured / 2**20:.2f} / {predicted / 2**20:.2f} MiB"
            for d, (measured, predicted) in enumerate(zip(devices["device_peaks"],
                                                          devices["predicted_device_peaks"])))
    return line


def loss_check(out_of_core: float, in_memory: float, seed: int, digits: int = 6,
               how: str = "out of core") -> dict:
    """The final training losses of one seed trained out of core and in memory, compared:
    equal when they print the same to ``digits`` significant digits."""
    shown = f"{out_of_core:.{digits}g}", f"{in_memory:.{digits}g}"
    equal = shown[0] == shown[1]
    difference = abs(out_of_core - in_memory) / max(abs(in_memory), 1e-30)
    line = (f"in-memory check, seed {seed}: final training loss {shown[0]} {how}, "
            f"{shown[1]} in memory: " + ("equal" if equal else "DIFFERENT")
            + f" to {digits} digits (relative difference {difference:.1e})")
    return {"out_of_core": out_of_core, "in_memory": in_memory, "equal": equal,
            "relative_difference": difference, "line": line}


def store_line(memory: dict, epochs: int, seed: int, first_epoch: int = 0,
               total: Optional[int] = None) -> str:
    """One line on an out-of-core run's store (`jgrind.engine.store.Accounts`): peak bytes per
    tier, and the bytes moved over the ``epochs`` this process ran (from ``first_epoch``, after
    a resume; ``total``: the epochs the run was to train), evaluation sweeps included. Device
    and host peaks are the blocks the store holds (host: its tables and its cache), not the
    steps' working set. SSD bytes are the rows used, then what the read and write calls
    passed (coalesced gap rows included)."""
    f = format_bytes
    count = f"{epochs} epoch" + ("" if epochs == 1 else "s")
    if first_epoch and not epochs:
        finished = total is not None and first_epoch >= total
        count += f" (the resumed run had {'already finished' if finished else 'stopped early'})"
    elif first_epoch:
        span = f"epoch {first_epoch}" if epochs == 1 else \
            f"epochs {first_epoch}-{first_epoch + epochs - 1}"
        count += f" ({span}, after a resume)"
    return (f"store, seed {seed}: peak stored blocks: device {f(memory['peak_device'])}, host "
            f"{f(memory['peak_host'])} (tables and cache), SSD {f(memory['peak_ssd'])}; moved "
            f"in {count} "
            f"and their evaluations: host read {f(memory['host_read'])}, written "
            f"{f(memory['host_written'])}; SSD read {f(memory['ssd_read'])}, written "
            f"{f(memory['ssd_written'])} (file calls: {memory['ssd_read_ops']:,} reads of "
            f"{f(memory['ssd_file_read'])}, {memory['ssd_write_ops']:,} writes of "
            f"{f(memory['ssd_file_written'])})"
            # blocks in host RAM and on SSD kept in a smaller dtype (`jgrind.hostio.codecs`)
            + (f"; stored as {memory['storage']}"
               if memory.get("storage", "float32") != "float32" else ""))


def predict_run(out: str | pathlib.Path, seed: Optional[int] = None, layer: Optional[int] = None,
                last: bool = False, overrides: Sequence[str] = ()) -> tuple[np.ndarray, dict]:
    """Logits (or, with ``layer``, node embeddings: `jgrind.predict`) of every node from the
    parameters a ``jgrind train`` run saved in ``out``: the best validation epoch's, or the
    last epoch's with ``last``; of its first seed unless ``seed`` is given. Computed the way
    the run trained (its dataset and model, and its policy, budgets and store when it ran
    out of core); ``overrides`` (``key=value``, as ``--set``) may change where and how it runs
    (`PREDICT_SETTINGS`: the dataset's path, the policy, budgets, store, parts), nothing else.
    Returns ``(array, info)``; ``info`` names the run, the seed and the epoch."""
    out = pathlib.Path(out)
    cfg = saved_config(out)
    if cfg is None:
        raise ConfigError(f"{out} is not a jgrind train run folder (no readable config.json); "
                          "name the --out folder of a finished `jgrind train`")
    refused = sorted({item.split("=", 1)[0].strip().replace("-", "_") for item in overrides}
                     - set(PREDICT_SETTINGS))
    if refused:
        raise ConfigError(f"--set {', '.join(refused)}: the saved parameters are of the run's "
                          "model and data; only where and how it runs may change "
                          f"({', '.join(PREDICT_SETTINGS)})")
    cfg = cfg.with_overrides(list(overrides))  # e.g. another store directory
    seeds = sorted(int(p.name[4:]) for p in (out / PARAMS).glob("seed*")
                   if p.name[4:].isdigit())
    if not seeds:
        raise ConfigError(f"{out} holds no saved parameters ({PARAMS}/seed*): the run did not "
                          "finish, or a jgrind older than `jgrind predict` ran it; train again")
    seed = seeds[0] if seed is None else seed
    if seed not in seeds:
        raise ConfigError(f"{out} has no parameters of seed {seed}; it has seed(s) "
                          f"{', '.join(map(str, seeds))}")
    graph = load_graph(cfg)
    model = build_model(cfg, graph)
    params, best_params, meta = load_checkpoint(out / PARAMS / f"seed{seed}", model)
    # a run trained on several devices predicts on this one, in memory (`--set` may choose a
    # policy instead): what it computes does not depend on where
    array = predict(graph, model, params if last else best_params, layer=layer,
                    **build_policy(dataclasses.replace(cfg, devices=0)))
    info = {"graph": graph.name, "model": cfg.model, "seed": seed,
            "epoch": meta["epoch"] if last else meta["best"]["epoch"],
            "which": "last" if last else "best"}
    if layer is None:  # the logits' scores on the run's split: a check that they are its
        metric = cfg.metric or default_metric(graph.num_classes, graph.multilabel,
                                              graph.name)
        split = meta["split"]
        info["metric"] = metric
        info.update({name: evaluate(array, graph.labels, mask[split], metric)
                     for name, mask in (("train", graph.train_mask), ("val", graph.val_mask),
                                        ("test", graph.test_mask))})
        if graph.multilabel and metric == "roc_auc":
            info["test_per_task"] = roc_auc_per_task(array, graph.labels,
                                                     graph.test_mask[split]).tolist()
    return array, info
