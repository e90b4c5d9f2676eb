"""The ``jgrind`` command line. ``jgrind --help`` and ``jgrind COMMAND --help`` explain everything.

User mistakes (a missing file, an unknown dataset or setting) print one line starting with
``jgrind: error:`` and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import sys
import textwrap
import warnings

from jgrind import interrupts
from jgrind.config import ConfigError, RunConfig
from jgrind.interrupts import Terminated
from jgrind.graph import GraphError

DESCRIPTION = "jgrind: exact full-graph GNN training in JAX."
EPILOG = "Run `jgrind COMMAND --help` for a command's options and examples."


def _train_epilog() -> str:
    docs = RunConfig.field_docs()
    defaults = dataclasses.asdict(RunConfig())
    lines = ["settings for --set key=value (default in brackets):"]
    for name, doc in docs.items():
        lines.append(f"  {name:<17} {doc} [{defaults[name]}]")
    lines += ["", "examples:",
              "  jgrind train                                   # the main job (above)",
              "  jgrind train --dataset cora --set hidden=16 --set row_normalize=true --seeds 10",
              "  jgrind train --dataset tolokers --model gcn --set residual=true "
              "--set layer_norm=true",
              "  jgrind train --dataset ogb:/data/ogbn-arxiv --epochs 500 --out runs/arxiv",
              "  jgrind train --dataset rmat --set num_nodes=1000000 --policy grinnder "
              "--parts 16 \\",
              "               --device-budget 2GiB --host-budget 4GiB --store /mnt/nvme"]
    return "\n".join(lines)


def _main_job_text() -> str:
    from jgrind.config import MAIN_JOB_BUDGETS, MAIN_JOB_EPOCHS, MAIN_JOB_NODES
    return (f"Without --dataset it runs the main job: a generated graph (csbm, "
            f"num_nodes={MAIN_JOB_NODES}, {MAIN_JOB_EPOCHS} epochs) trained under budgets it "
            f"does not fit in (--device-budget {MAIN_JOB_BUDGETS[0]} --host-budget "
            f"{MAIN_JOB_BUDGETS[1]}), the planner choosing the plan (--policy auto), the SSD "
            "tier in the system's temporary folder (--store), and the first seed trained "
            "again in memory to compare (check_in_memory=true); a flag or --set changes any "
            "of these, and --dataset csbm is the plain in-memory run.")


_MAIN_JOB = _main_job_text()


def build_parser() -> argparse.ArgumentParser:
    from jgrind.config import MAIN_JOB_EPOCHS
    parser = argparse.ArgumentParser(prog="jgrind", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")

    train = sub.add_parser(
        "train", help="train GCN / GraphSAGE / GAT on the full graph",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
                    "Train a GNN on the full graph (no sampling): one optimizer step per "
                    "epoch, model selection on the validation set, test metric at the best "
                    "validation epoch. " + _MAIN_JOB + " Writes config.json, metrics-seed*.jsonl (one JSON object "
                    "per epoch), training.png, summary.json and params/ (every seed's last and "
                    "best parameters, for `jgrind predict`) to --out.", 92, break_on_hyphens=False),
        epilog=_train_epilog())
    train.add_argument("--dataset", help="dataset name (see `jgrind datasets`) [the main "
                       "job's generated graph]")
    train.add_argument("--model", choices=["gcn", "sage", "gat", "rgcn", "rgat"],
                       help="architecture [gcn]")
    train.add_argument("--epochs", type=int, help="training epochs [200; the main job: "
                       f"{MAIN_JOB_EPOCHS}]")
    train.add_argument("--seeds", type=int, help="number of seeds; mean +- std is reported [1]")
    train.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a setting (repeatable; see below)")
    train.add_argument("--policy", help="out-of-core offload policy: in_memory, host "
                       "(or host_offload), ssd (or ssd_offload), "
                       "recompute, grinnder (see docs/engine.md), or auto: the planner "
                       "chooses (docs/planner.md)")
    train.add_argument("--keep-aggregations", metavar="TIER",
                       help="with --policy in_memory/host/ssd: keep every layer's aggregated "
                       "input in this tier (device, host, ssd) instead of regathering in "
                       "backward: more bytes stored, less work [regather]")
    train.add_argument("--parts", type=int, help="number of partitions for out-of-core runs")
    train.add_argument("--partitioner", help="label_propagation | contiguous | random | metis "
                       "| FILE.npy, an assignment saved by `jgrind partition --out` "
                       "[label_propagation]")
    train.add_argument("--device-budget", help="memory budget of each device, e.g. 2GiB "
                       "(with --devices K, every one of the K has this much)")
    train.add_argument("--host-budget", help="host RAM budget for offloaded blocks, e.g. 4GiB")
    train.add_argument("--store", help="directory for the SSD tier")
    train.add_argument("--out", default="runs/latest",
                       help="output directory for logs, plots and checkpoints [runs/latest]")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar "
                       "(shown only when stderr is a terminal)")
    _device_flags(train)
    train.add_argument("--no-compile-cache", action="store_true",
                       help="compile everything afresh instead of reusing the compiled "
                       "programs of earlier runs (kept under $JGRIND_CACHE/xla, else "
                       "${XDG_CACHE_HOME:-~/.cache}/jgrind/xla, or in "
                       "$JAX_COMPILATION_CACHE_DIR when set)")

    part = sub.add_parser(
        "partition", help="partition a graph and report its quality",
        description="Partition a dataset and print the edge cut, balance, halo/owned ratios, "
                    "the partitioner's time and peak memory.")
    part.add_argument("--dataset", help="dataset name [csbm]")
    part.add_argument("--parts", type=int, help="number of partitions [8]")
    part.add_argument("--partitioner",
                      help="label_propagation | contiguous | random | metis "
                           "[label_propagation]")
    part.add_argument("--seed", type=int, help="the partitioner's seed [0]")
    part.add_argument("--out", metavar="FILE.npy", help="save the assignment (every node's "
                      "partition) there, for `jgrind train --partitioner FILE.npy`")
    part.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="a setting, as for `jgrind train` (dataset "
                      "settings, e.g. num_nodes=100000; parts, partitioner, "
                      "partitioner_options, seed)")

    ds = sub.add_parser("datasets", help="list the datasets and where they are read from",
                        description="List built-in datasets, whether their files are present, "
                                    "and the folder they are read from ($JGRIND_DATA or "
                                    "../shared/datasets).")
    ds.add_argument("--json", action="store_true", help="print machine-readable JSON")

    conv = sub.add_parser(
        "convert", help="save a dataset as .npy files, read back memory-mapped",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Load a dataset (any name or prefix `jgrind train --dataset` takes, with "
                    "its --set settings applied) and save it to --out as one .npy file per "
                    "array plus graph.json. `--dataset npy:FOLDER` then maps the files instead "
                    "of parsing them or reading them into memory; the out-of-core engine "
                    "copies the features into its store partition by partition.",
        epilog="examples:\n"
               "  jgrind convert --dataset ogb:/data/ogbn-products --out /data/products\n"
               "  jgrind convert --dataset rmat --set num_nodes=3000000 --out /data/rmat3m\n"
               "  jgrind train --dataset npy:/data/products --policy auto --store /mnt/nvme")
    conv.add_argument("--dataset", required=True, help="dataset name or prefix:path")
    conv.add_argument("--out", required=True, help="folder to write (must not exist, or be "
                      "empty, unless --overwrite)")
    conv.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="dataset settings, as for `jgrind train`")
    conv.add_argument("--overwrite", action="store_true",
                      help="replace --out if it holds a saved graph")

    prof = sub.add_parser(
        "profile", help="measure compute, memory and disk speeds for the planner",
        description="Measure dense and sparse compute rates, host memory, host <-> device and "
                    "SSD bandwidths, and how much transfer time compute hides, and save them "
                    "as the hardware profile the planner predicts epoch times from "
                    "($JGRIND_PROFILE, else $JGRIND_CACHE/profile.json, else "
                    "${XDG_CACHE_HOME:-~/.cache}/jgrind/profile.json). Takes 10-30 s.")
    prof.add_argument("--out", help="where to save the profile [the default path above; with "
                      "--store, a file of that directory's own beside it, which plan and "
                      "--policy auto with the same --store read]")
    prof.add_argument("--store", help="directory on the disk the SSD tier will use; the SSD "
                      "figures are measured there [the system temporary directory]")
    prof.add_argument("--quick", action="store_true",
                      help="small sizes, about 2 s; figures are rough (for tests)")
    prof.add_argument("--show", action="store_true",
                      help="print the saved profile (and whether it is stale); measure nothing")
    plan = sub.add_parser(
        "plan", help="plan an out-of-core run: a fate per tensor, memory, time",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Choose, for every stored tensor block, whether it stays on the device, goes "
                    "to host RAM or the SSD store, or is recomputed, minimising the predicted "
                    "epoch time within the budgets (the `auto` policy; docs/planner.md). Prints "
                    "the plan as a table (tensor, bytes, fate, why), the predicted peak memory "
                    "per tier and epoch time per sweep, and writes plan-schedule.png (a Gantt "
                    "chart) and plan-memory.png (memory per tier over the epoch) to --out.",
        epilog="example:\n  jgrind plan --dataset rmat --set num_nodes=1000000 --set hidden=256 "
               "\\\n      --device-budget 2GiB --host-budget 4GiB --store /mnt/nvme")
    plan.add_argument("--dataset", help="dataset name (see `jgrind datasets`) [csbm]")
    plan.add_argument("--model", choices=["gcn", "sage", "gat", "rgcn", "rgat"],
                      help="architecture [gcn]")
    plan.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="a setting, as for `jgrind train`")
    plan.add_argument("--parts", type=int, help="fix the number of partitions [the planner "
                      "chooses]")
    plan.add_argument("--partitioner", help="label_propagation | contiguous | random | metis "
                      "[label_propagation]")
    plan.add_argument("--device-budget", help="device memory budget, e.g. 2GiB [profile's free]")
    plan.add_argument("--host-budget", help="host RAM budget, e.g. 4GiB [half the free RAM]")
    plan.add_argument("--store", help="SSD store directory (without one nothing goes to SSD)")
    plan.add_argument("--profile", help="hardware profile file [the default; measured if "
                      "missing or stale]")
    plan.add_argument("--remeasure", action="store_true", help="measure the profile again")
    plan.add_argument("--run", metavar="DIR", help="show a finished `jgrind train` run's "
                      "plan with each sweep's measured seconds beside the predicted ones, and "
                      "write run-against-plan.png to --out (nothing is planned)")
    plan.add_argument("--devices", type=int, metavar="K", help="place the partitions on K "
                      "devices (in each device's memory, as `jgrind train --devices K`): "
                      "print the placement and the halo exchange's bytes per epoch")
    plan.add_argument("--num-processes", type=int, metavar="P", help="with --devices K: the "
                      "K devices driven by P processes, K/P each (as `jgrind launch -n P "
                      "--devices-per-process K/P` starts them): plan the host budget per "
                      "process and print each process's partitions, devices and predicted "
                      "host share [1]")
    plan.add_argument("--out", default="runs/plan", help="where to write the charts "
                      "[runs/plan]")

    launch = sub.add_parser(
        "launch", help="run a command as several local processes (one model, JAX distributed)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Start P processes on this machine, each running `jgrind COMMAND ...` with "
            "--coordinator 127.0.0.1:PORT (a free port), --num-processes P and its own "
            "--process-id filled in, and D devices each (the CPU: JAX_NUM_CPU_DEVICES=D; "
            "GPUs: JAX_LOCAL_DEVICE_IDS, the I-th group of D). Their output is prefixed with "
            "[I]. Ctrl-C and SIGTERM are passed on to every process. When one fails, the "
            "others are stopped and launch exits with status 2, naming it.", 92),
        epilog="example:\n  jgrind launch -n 2 --devices-per-process 2 -- train --dataset cora "
               "--out runs/cora2")
    launch.add_argument("-n", "--num-processes", dest="launch_processes", type=int,
                        required=True, metavar="P", help="number of processes")
    launch.add_argument("--devices-per-process", type=int, default=1, metavar="D",
                        help="devices each process drives [1]")
    launch.add_argument("arguments", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                        help="the jgrind command each process runs, after --")

    pred = sub.add_parser(
        "predict", help="logits or node embeddings from a trained run, as .npy",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Compute every node's logits (or, with --layer, its embedding: the output "
                    "of the model's first K layers) from the parameters a `jgrind train` run "
                    "saved in its folder, the way the run trained (in memory, or out of core "
                    "with its policy, budgets and store), and save them as a [nodes, width] "
                    "float32 .npy array in the graph's node order. Prints the logits' metrics "
                    "on the run's split as a check.",
        epilog="examples:\n"
               "  jgrind train --dataset cora --out runs/cora\n"
               "  jgrind predict --run runs/cora --save runs/cora/logits.npy\n"
               "  jgrind predict --run runs/cora --layer 1 --save runs/cora/hidden.npy")
    pred.add_argument("--run", required=True, help="the --out folder of a `jgrind train` run")
    pred.add_argument("--save", required=True, help="the .npy file to write")
    pred.add_argument("--layer", type=int, help="embeddings after this many of the model's "
                      "layers (0: the features; with residual=true the input projection is "
                      "layer 1 and the message-passing layers follow) instead of the logits")
    pred.add_argument("--seed", type=int, help="which seed's parameters [the run's first]")
    pred.add_argument("--last", action="store_true", help="the last epoch's parameters "
                      "[the best validation epoch's]")
    pred.add_argument("--overwrite", action="store_true", help="replace --save if it exists")
    pred.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="run it elsewhere or otherwise (repeatable): "
                      "store, policy, parts, partitioner, device_budget, host_budget, profile, "
                      "keep_aggregations, or dataset for the same graph at a new path")
    return parser


def _device_flags(parser) -> None:
    """``--devices`` and the flags that join this process to others (`jgrind.devices.processes`;
    its defaults, written out here so that `--help` does not import JAX)."""
    parser.add_argument("--devices", type=int, metavar="K", help="train on K devices, the "
                        "partitions spread over them [1; with several processes, all of "
                        "theirs]")
    group = parser.add_argument_group("several processes", textwrap.fill(
        "One model trained by P processes through JAX's distributed runtime (`jgrind launch` "
        "fills these in on one machine). What is not given comes from the environment JAX "
        "reads (JAX_COORDINATOR_ADDRESS, a Slurm or Open MPI job).", 92))
    group.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address and a "
                       "free port there, the same for every process")
    group.add_argument("--num-processes", type=int, metavar="P", help="how many processes")
    group.add_argument("--process-id", type=int, metavar="I", help="this process's number, "
                       "0 to P-1 (process 0 runs the coordinator and writes --out)")
    group.add_argument("--connect-timeout", type=float, metavar="S",
                       help="seconds to wait for the coordinator and every process; then "
                       "exit with status 2 [60]")
    group.add_argument("--heartbeat-timeout", type=float, metavar="S",
                       help="a process silent this long (killed, crashed, hung) makes the "
                       "others exit with status 2, naming it [30]")


def _join_processes(args):
    """The processes this run joins (`jgrind.devices.processes.start`), or None when no flag
    asks for several."""
    if args.coordinator is None and args.num_processes is None and args.process_id is None:
        return None
    from jgrind.devices import processes
    if args.coordinator is None and "JAX_COORDINATOR_ADDRESS" not in os.environ \
            and (args.num_processes is None or args.process_id is None):
        raise ConfigError("several processes need --coordinator HOST:PORT, --num-processes P "
                          "and --process-id I (or the environment JAX reads: "
                          "JAX_COORDINATOR_ADDRESS, a Slurm or Open MPI job)")
    timeouts = {name: value for name, value in (("timeout_s", args.connect_timeout),
                                                 ("heartbeat_timeout_s", args.heartbeat_timeout))
                if value is not None}
    return processes.start(args.coordinator, args.num_processes, args.process_id, **timeouts)


def _check_devices(count: int, joined) -> None:
    """``--devices count``, if that many exist (in every process together)."""
    if count <= 1 and joined is None:
        return
    import jax
    available = jax.devices()
    if count <= len(available):
        return
    kind = available[0].platform
    if joined is not None:
        hint = (f" ({joined.local_devices} in each of the {joined.num_processes} processes); "
                "give each more with `jgrind launch --devices-per-process`")
    elif kind == "cpu":
        hint = (f"; on the CPU, set JAX_NUM_CPU_DEVICES={count} (or XLA_FLAGS="
                f"--xla_force_host_platform_device_count={count}) before jgrind starts")
    else:
        hint = ""
    one = len(available) == 1
    raise ConfigError(f"--devices {count}: {len(available)} {kind} device{'' if one else 's'} "
                      f"exist{'s' if one else ''}{hint}")


def settings_fingerprint(cfg: RunConfig) -> str:
    """What every process of a run must agree on: the settings, less the paths of files that
    may lie elsewhere on each machine (the store, the profile, a dataset's folder)."""
    kept = dataclasses.asdict(cfg)
    for name in ("store", "profile"):
        kept.pop(name)
    prefix, sep, _ = cfg.dataset.partition(":")
    if sep and prefix.lower() in ("ogb", "npz", "edgelist", "npy"):
        kept["dataset"] = prefix.lower() + ":"
    return json.dumps(kept, sort_keys=True)


def cmd_launch(args) -> int:
    from jgrind.devices import processes
    arguments = list(args.arguments)
    if arguments[:1] == ["--"]:
        arguments = arguments[1:]
    if not arguments:
        raise ConfigError("jgrind launch: name the command after --, e.g. "
                          "`jgrind launch -n 2 -- train --dataset cora`")
    if arguments[0] != "train":
        raise ConfigError(f"jgrind launch runs train; {arguments[0]!r} runs in one process")
    return processes.launch(arguments, args.launch_processes, args.devices_per_process)


def cmd_predict(args) -> int:
    import numpy as np
    from jgrind.engine.store import StoreError
    from jgrind.experiment import check_output_folder, predict_run
    save = pathlib.Path(args.save)
    if save.suffix != ".npy":
        raise ConfigError(f"--save {save}: name a .npy file (the array is saved with "
                          "numpy.save)")
    if save.exists() and not args.overwrite:
        raise ConfigError(f"--save {save} exists; pass --overwrite to replace it, or name "
                          "another file")
    check_output_folder(save.parent if str(save.parent) else ".", flag="--save")
    try:
        array, info = predict_run(args.run, seed=args.seed, layer=args.layer, last=args.last,
                                  overrides=args.overrides)
    except StoreError as err:  # the run's store directory, gone since: say how to move it
        raise StoreError(f"{err} (for jgrind predict: --set store=DIR)") from None
    except ValueError as err:  # a --layer the model does not have
        raise ConfigError(str(err)) from None
    save.parent.mkdir(parents=True, exist_ok=True)
    np.save(save, array)
    what = "logits" if args.layer is None else f"embeddings after layer {args.layer}"
    print(f"wrote {save}: {array.shape[0]:,} x {array.shape[1]} float32 {what} of "
          f"{info['model']} on {info['graph']} (seed {info['seed']}, {info['which']} epoch "
          f"{info['epoch']})")
    if "metric" in info:
        print(f"{info['metric']} of these logits: train {info['train']:.4f}, val "
              f"{info['val']:.4f}, test {info['test']:.4f}")
    if "test_per_task" in info:
        print(_per_task_line(np.asarray(info["test_per_task"])))
    return 0


def _per_task_line(auc) -> str:
    """The spread of per-task test ROC-AUC in one line: the weakest and strongest tasks and
    the median, and how many tasks have one class only among the test nodes."""
    import numpy as np
    scored = np.flatnonzero(~np.isnan(auc))
    if scored.size == 0:
        return "test roc_auc per task: no task has both classes among the test nodes"
    low, high = scored[np.argmin(auc[scored])], scored[np.argmax(auc[scored])]
    line = (f"test roc_auc per task ({scored.size} of {auc.size} tasks): lowest "
            f"{auc[low]:.4f} (task {low}), median {np.median(auc[scored]):.4f}, highest "
            f"{auc[high]:.4f} (task {high})")
    if scored.size < auc.size:
        line += f"; {auc.size - scored.size} with one class only, left out"
    return line


def cmd_plan(args) -> int:
    from jgrind.config import build_model, build_partitioner, load_graph, parse_bytes
    from jgrind.experiment import check_output_folder
    from jgrind.plan import profile as hw
    from jgrind.plan.planner import check_num_parts, plan_run
    from jgrind.plan.report import plot_plan, print_plan
    if args.run is not None:
        return _plan_of_run(pathlib.Path(args.run), args.out)
    flags = {k: getattr(args, k) for k in ("dataset", "model", "parts", "partitioner",
                                           "device_budget", "host_budget", "store", "profile")
             if getattr(args, k) is not None}
    cfg = dataclasses.replace(RunConfig(), **flags).with_overrides(args.overrides)
    _parts_flag(args.parts)
    _processes_flag(args.num_processes, args.devices)
    check_output_folder(args.out)
    partitioner = build_partitioner(cfg)  # as train cuts
    device, host = parse_bytes(cfg.device_budget), parse_bytes(cfg.host_budget)
    graph = load_graph(cfg)
    model = build_model(cfg, graph)
    check_num_parts(cfg.parts or None, graph.num_nodes)  # before a profile is measured
    store = cfg.store or None
    profile = hw.load_or_measure(cfg.profile or None, store, remeasure=args.remeasure,
                                 log=lambda msg: print(f"jgrind: {msg}"))
    device = device if device is not None else profile.device_free
    host = host if host is not None else profile.host_free // 2
    print(graph)
    if args.devices is not None:
        return _plan_devices(graph, model, cfg, partitioner, profile, args.devices,
                             budgets=(device, host), num_processes=args.num_processes or 1)
    from jgrind.plan import policies  # the store_dtype settings, as auto plans with them
    storages = policies.with_storage_named(
        policies.auto(), cfg.store_dtype, cfg.store_dtype_activations,
        cfg.store_dtype_aggregations, cfg.store_dtype_gradients).storages()
    the_plan = plan_run(graph, model, profile, device_budget=device, host_budget=host,
                        directory=store, num_parts=cfg.parts or None,
                        partitioner=partitioner, progress=lambda msg: print(f"  {msg}"),
                        storages=storages)
    print_plan(the_plan)
    charts = plot_plan(the_plan, args.out)
    if charts:
        print(f"wrote {charts[0]} and {charts[1]}")
    return 0


def _plan_of_run(run: pathlib.Path, out: str) -> int:
    """`jgrind plan --run DIR`: the plan a finished run saved (plan.txt) and its first seed's
    sweeps, measured (the median over the epochs the run checked) beside predicted."""
    from jgrind.plan.check import (format_parts_table, format_sweep_table, parts_table,
                                   run_check, sweep_table)
    from jgrind.plan.report import plot_run_against_plan
    log = run / "metrics-seed0.jsonl"
    logs = sorted(run.glob("metrics-seed*.jsonl"))
    if not logs:
        raise ConfigError(f"--run {run}: no metrics log (metrics-seed*.jsonl) there; name the "
                          "folder a `jgrind train --out` wrote")
    log = log if log.exists() else logs[0]
    try:
        history = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    except (OSError, ValueError) as err:
        raise ConfigError(f"--run {run}: cannot read {log.name}: {err}") from None
    rows = sweep_table(history)
    if not rows:
        raise ConfigError(f"--run {run}: the run was not held against a plan (it ran in "
                          "memory, on several devices, with a fixed policy and no current "
                          "hardware profile (`jgrind profile`), or for one epoch only); train "
                          "out of core for two epochs or more")
    if (run / "plan.txt").exists():
        print((run / "plan.txt").read_text().rstrip())
    print(f"sweeps of {log.name}, measured (median of the checked epochs) against predicted:")
    print(format_sweep_table(rows))
    if parts_table(history):
        print("each sweep's parts, predicted/measured seconds, and the waits on reads/writes:")
        print(format_parts_table(parts_table(history)))
    print(run_check(history)["line"])
    print(f"wrote {plot_run_against_plan(rows, out, title=f'{run.name} against its plan')}")
    return 0


def _processes_flag(num_processes, devices) -> None:
    """``jgrind plan --num-processes P``: with --devices K, 1 <= P <= K and P dividing K (each
    process drives K/P devices, as `jgrind launch` starts them)."""
    if num_processes is None:
        return
    if devices is None:
        raise ConfigError(f"--num-processes {num_processes}: give --devices K too (the "
                          "devices of every process together)")
    if num_processes < 1 or devices < num_processes or devices % num_processes:
        raise ConfigError(f"--num-processes {num_processes} with --devices {devices}: each "
                          "process drives the same number of devices, at least one; give a "
                          "process count that divides the device count")


def _plan_devices(graph, model, cfg, partitioner, profile, devices: int,
                  budgets=(None, None), num_processes: int = 1) -> int:
    """`jgrind plan --devices K`: the partitions (``--parts``, else one per device) placed on
    K devices by the profile's predicted step times, the bytes the halo exchange moves per
    epoch beside the minimum, and the predicted epoch over each link the machine may use
    (`jgrind.plan.sharded`). Nothing runs, so K may exceed the devices this machine has.
    With ``num_processes`` P, the out-of-core plan is for K devices in P processes: the
    host budget per process, each process's share printed beside it."""
    from jgrind.partition import partition_graph
    from jgrind.plan.exchange import epoch_exchange_bytes, exchange_plan
    from jgrind.plan.placement import Rates, place
    if devices < 1:
        raise ConfigError(f"--devices {devices}: place the partitions on 1 device or more")
    parts = cfg.parts or devices
    normalized = model.normalize(graph)
    pg = partition_graph(normalized, partitioner(normalized, parts, seed=cfg.seed),
                         num_parts=parts)
    placement = place(pg, model, graph.num_features, devices, Rates.of(profile))
    exchange = exchange_plan(normalized.indptr, normalized.indices,
                             placement.device_of[pg.assignment], devices)
    moved, minimum = epoch_exchange_bytes(exchange, model, graph.num_features)
    print(f"{parts} partitions on {devices} devices, placed by the profile's predicted "
          "forward seconds (ties within 5 % by bytes):")
    print(placement.format())
    slowest = float(placement.device_seconds.max())
    print(f"slowest device: {slowest * 1e3:.2f} ms forward, "
          f"{slowest / max(float(placement.seconds.sum()), 1e-30):.2f} of the whole")
    ratio = moved / minimum if minimum else 1.0
    print(f"halo exchange per epoch: {moved / 2**20:.2f} MiB moved between devices, minimum "
          f"{minimum / 2**20:.2f} MiB ({ratio:.2f}x)")
    from jgrind.plan.cost import parameter_count
    from jgrind.config import parse_bytes
    from jgrind.plan.sharded import choose_exchanges, predictions
    for prediction in predictions(exchange, normalized.indptr, model, graph.num_features,
                                  profile, parameter_count(model)):
        print(prediction.line())
    routes = choose_exchanges(exchange, normalized.indptr, model, graph.num_features, profile,
                              parse_bytes(cfg.device_budget))
    print("exchange per layer: " + "; ".join(f"layer {l} {route}"
                                             for l, route in enumerate(routes) if route))
    from jgrind.plan import policies  # out of core, as `--policy auto` plans it
    from jgrind.plan.sharded import print_devices_plan
    print_devices_plan(graph, model, profile, devices, *budgets, directory=cfg.store or None,
                       num_parts=cfg.parts or None, partitioner=partitioner, seed=cfg.seed,
                       num_processes=num_processes,
                       storages=policies.with_storage_named(
                           policies.auto(), cfg.store_dtype, cfg.store_dtype_activations,
                           cfg.store_dtype_aggregations, cfg.store_dtype_gradients).storages())
    return 0


def _parts_flag(parts) -> None:
    """``--parts`` given as 0 or less (in a RunConfig, 0 means the default)."""
    if parts is not None and parts < 1:
        raise ConfigError(f"--parts {parts}: a graph is cut into at least 1 partition")


def train_config(args) -> RunConfig:
    """The run ``jgrind train`` was asked for: the main job (`jgrind.config.main_job`) when no
    dataset is named, else the plain defaults; flags and ``--set`` over either."""
    from jgrind.config import main_job
    names_a_dataset = args.dataset is not None or any(
        item.split("=", 1)[0].strip() == "dataset" for item in args.overrides)
    cfg = RunConfig() if names_a_dataset else main_job()
    flags = {k: getattr(args, k) for k in ("dataset", "model", "epochs", "seeds", "policy",
                                           "keep_aggregations", "parts", "partitioner",
                                           "devices", "device_budget", "host_budget", "store")
             if getattr(args, k) is not None}
    if not names_a_dataset and flags.get("devices"):
        # several devices hold their partitions in memory: the main job's out-of-core
        # settings give way (those given as flags stay, and are refused by `build_policy`)
        cfg = dataclasses.replace(cfg, policy="", device_budget="", host_budget="", store="")
    return dataclasses.replace(cfg, **flags).with_overrides(args.overrides)


def cmd_train(args) -> int:
    from jgrind import experiment
    cfg = train_config(args)
    joined = _join_processes(args)
    out = args.out
    if joined is not None:
        from jgrind.devices import processes
        processes.agree(settings_fingerprint(cfg), "settings")
        if not cfg.devices:  # several processes train one model: on all their devices
            cfg = dataclasses.replace(cfg, devices=joined.devices)
        # process 0 writes the run folder and the checkpoints (a resumed run sends the others
        # its state, `jgrind.checkpoint`); the others' files are dropped
        if joined.process_id:
            from jgrind.devices.scratch import scratch_folder
            out = scratch_folder(joined.process_id)
    _check_devices(cfg.devices, joined)
    try:
        return _train(cfg, args, out, experiment)
    finally:
        if out != args.out:
            import shutil
            shutil.rmtree(out, ignore_errors=True)


def _train(cfg: RunConfig, args, out: str, experiment) -> int:
    if cfg.policy == "ssd" and not cfg.host_budget:
        print("jgrind: note: without --host-budget the SSD tier keeps a host cache of up to "
              "half the free RAM in front of its files; --host-budget bounds the RAM the run "
              "holds", flush=True)
    from jgrind.compile_cache import compilation_cache
    with compilation_cache() if not args.no_compile_cache else contextlib.nullcontext():
        # a bar redrawn in a log file or a CI transcript is noise: shown on a terminal only
        summary = experiment.run_config(cfg, out=out,
                                        progress=not args.no_progress and sys.stderr.isatty())
    print(summary["line"])
    for line in ("devices_line", "store_line", "rss_line"):
        if summary.get(line):
            print(summary[line])
    check = summary["in_memory_check"]
    if check:
        print(check["line"])
    if summary.get("plan_check"):
        print(summary["plan_check"]["line"])
    if out == args.out:  # (another process than 0 keeps no files)
        plots = "training.png, memory.png" if summary["store_line"] else "training.png"
        if (pathlib.Path(args.out) / "plan.txt").exists():
            plots += ", plan.txt"
            if (pathlib.Path(args.out) / "plan-schedule.png").exists():
                plots += ", plan-schedule.png, plan-memory.png"
        print(f"wrote {args.out}/ (summary.json, metrics-seed*.jsonl, {plots}, params/: "
              f"`jgrind predict --run {args.out}`)")
    if check and not check["equal"]:
        print("jgrind: error: the out-of-core loss differs from the in-memory one: a bug in "
              "jgrind; please report it with this run's config.json", file=sys.stderr)
        return 1
    return 0


def cmd_partition(args) -> int:
    from jgrind.config import build_partitioner, load_graph
    from jgrind.partition import measure, partition_graph, quality
    flags = {"dataset": args.dataset, "parts": args.parts, "partitioner": args.partitioner,
             "seed": args.seed}
    cfg = dataclasses.replace(RunConfig(), **{k: v for k, v in flags.items() if v is not None})
    cfg = cfg.with_overrides(args.overrides)
    partitioner = build_partitioner(cfg)  # checked before the graph is loaded
    _parts_flag(args.parts)
    if args.out and not args.out.endswith(".npy"):
        raise ConfigError(f"--out {args.out}: the assignment is saved as a .npy file; name it "
                          "FILE.npy")
    parts = cfg.parts or 8
    graph = load_graph(cfg)
    m = measure(partitioner, graph, parts, seed=cfg.seed)
    pg = partition_graph(graph, m.assignment, num_parts=parts)
    print(graph)
    print(quality(pg, m).format())
    if args.out:
        import numpy as np
        np.save(args.out, np.asarray(m.assignment, np.int32), allow_pickle=False)
        print(f"wrote {args.out}: the partition of each of the {graph.num_nodes} nodes "
              f"(`jgrind train --partitioner {args.out}`)")
    return 0


def cmd_convert(args) -> int:
    import shutil
    import uuid
    from jgrind.config import load_graph
    from jgrind.datasets import DatasetError, save_graph
    from jgrind.datasets.stored import (check_target, hidden_name, mark_owner, recover,
                                        sweep_abandoned)
    cfg = dataclasses.replace(RunConfig(), dataset=args.dataset).with_overrides(args.overrides)
    out = pathlib.Path(args.out).expanduser().absolute()
    if out.parent.is_dir():
        recover(out)  # what a killed save left, before the target is checked
    check_target(out, args.overwrite)  # before a large graph is loaded for nothing
    extra, scratch, owner = {}, None, None
    if cfg.dataset.lower().startswith("ogb:") and "scratch" not in cfg.loader_options():
        # OGB's binary layout decompresses its features into a file here, not into memory
        for old in sweep_abandoned(out, "scratch"):
            print(f"removed {old}: left by a convert that did not finish")
        scratch = out.parent / hidden_name(out.name, "scratch", uuid.uuid4().hex[:8])
        try:
            scratch.mkdir()
            owner = mark_owner(scratch)  # locked until the scratch folder is removed
        except OSError as e:
            shutil.rmtree(scratch, ignore_errors=True)
            raise DatasetError(f"cannot write beside {out} ({e.strerror or e}); choose an "
                               "--out on a disk you can write to") from e
        extra["scratch"] = scratch
    try:
        graph = load_graph(cfg, **extra)
        print(graph)
        folder = save_graph(graph, out, overwrite=args.overwrite,
                            adopt=() if scratch is None else (scratch,))
    finally:
        if owner is not None:
            owner.close()
        if scratch is not None:
            try:
                shutil.rmtree(scratch)
            except OSError as e:
                warnings.warn(f"could not remove the scratch folder {scratch} ({e}); remove "
                              "it by hand")
    print(f"saved {graph.nbytes() / 2**20:,.1f} MiB to {folder}; load it with "
          f"--dataset npy:{folder}")
    return 0


def cmd_datasets(args) -> int:
    from jgrind import datasets
    from jgrind.datasets import generated  # noqa: F401 - registers csbm and rmat
    records = datasets.available()
    if args.json:
        print(json.dumps([dict(r) if isinstance(r, dict) else dataclasses.asdict(r)
                          for r in records], indent=2, default=str))
        return 0
    root = datasets.data_root()
    print(f"data folder: {root if root else 'not found (set JGRIND_DATA)'}")
    for r in records:
        r = r if isinstance(r, dict) else dataclasses.asdict(r)
        state = "present" if r["present"] else "missing"
        where = r.get("path") or ""
        print(f"  {r['name']:<13} {r['format']:<15} {state:<8} {where}")
        if r.get("description"):
            print(textwrap.indent(r["description"], " " * 16))
    print("also by path: ogb:FOLDER (an OGB download), npz:FILE (a gnn-benchmark .npz, with a "
          "random split per seed, or any heterophilous-graphs .npz, with its fixed splits: "
          "told by its keys), edgelist:FILE (features.npy and labels.npy beside it), "
          "npy:FOLDER (saved by `jgrind convert`), hgsl:FOLDER (an HGSL/GTN heterogeneous "
          "dataset's pickles), mag-like:SCALE (the generated ogbn-mag-sized graph, scaled)")
    print("any of them: --set dataset_options=largest_component:true keeps the largest "
          "connected component")
    return 0


def cmd_profile(args) -> int:
    from jgrind.plan import profile
    # a store's own default file (`profile.default_path`), which `plan` and `auto` then read
    path = pathlib.Path(args.out) if args.out else profile.default_path(args.store)
    if args.show:
        if not path.exists():
            raise FileNotFoundError(f"no hardware profile at {path}; run `jgrind profile` to "
                                    "measure one")
        saved = profile.load(path)
        print(saved.format())
        print(f"profile: {path}")
        stale = saved.stale_reason()
        if stale:
            print(f"stale: {stale}; run `jgrind profile` to re-measure")
        return 0
    _check_profile_target(path)  # before measuring, not after
    measured = profile.measure(args.store, quick=args.quick, progress=True)
    profile.save(measured, path)
    print(measured.format())
    print(f"saved to {path}")
    return 0


def _check_profile_target(path: pathlib.Path) -> None:
    """Where `jgrind profile` may save: a new file, or a profile it replaces; never another
    file, which it would overwrite."""
    from jgrind.experiment import check_output_folder
    from jgrind.plan import profile
    check_output_folder(path.parent)
    if path.exists():
        try:
            profile.load(path)
        except profile.OlderProfileError:
            pass  # a profile of an older format: replaced
        except profile.ProfileError:
            raise profile.ProfileError(f"{path} exists and is not a jgrind hardware profile; "
                                       "pass another path (--out), or remove it") from None


def _process_errors() -> tuple:
    """`jgrind.devices.processes.ProcessError` once that module is loaded (it imports JAX,
    which commands of one process need not wait for)."""
    processes = sys.modules.get("jgrind.devices.processes")
    return (processes.ProcessError,) if processes is not None else ()


def _engine_errors() -> tuple:
    """User-facing engine errors (bad budgets, a store directory that is unusable, fills up or
    is changed behind the run's back, policy, profile, a checkpoint of another run), imported
    lazily."""
    from jgrind.checkpoint import CheckpointError, CheckpointMismatch
    from jgrind.engine import BudgetError, StoreCorruptedError, StoreError, StoreFullError
    from jgrind.plan import PolicyError
    from jgrind.plan.planner import PlanError
    from jgrind.partition.partitioners import MissingExtraError
    from jgrind.plan.profile import ProfileError
    return (BudgetError, StoreError, StoreFullError, StoreCorruptedError, PolicyError,
            ProfileError, PlanError, MissingExtraError, CheckpointMismatch, CheckpointError)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if argv is None:  # the real command line (not a call from Python): see jgrind.hostio.allocator
        from jgrind.hostio.allocator import relaunch_if_wanted
        relaunch_if_wanted()
        _command_line_signals_and_warnings()
    status = _run(args)
    processes = sys.modules.get("jgrind.devices.processes")
    if status and processes is not None and processes.current() is not None:
        # the others may be waiting for this one in a collective, and JAX's shutdown at exit
        # would wait for them: leave now, so that they see it gone (`processes.fail`)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run(args) -> int:
    """Run the command ``args`` names; its exit status (2 and one line for the user's
    mistakes)."""
    handlers = {"train": cmd_train, "datasets": cmd_datasets, "partition": cmd_partition,
                "profile": cmd_profile, "plan": cmd_plan, "convert": cmd_convert,
                "predict": cmd_predict, "launch": cmd_launch}
    try:
        return handlers[args.command](args)
    except (ConfigError, GraphError, FileNotFoundError, NotADirectoryError, PermissionError,
            IsADirectoryError, FileExistsError, *_process_errors(), *_engine_errors()) as err:
        print(f"jgrind: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a full disk: where the command writes, not a bug
        from jgrind.checkpoint import disk_full
        full = disk_full(err)
        if full is None:
            raise
        where = f" {err.filename}" if err.filename else " a file"
        print(f"jgrind: error: cannot write{where}: the disk is full ({full}); free space "
              "there, or choose a folder on another disk", file=sys.stderr)
        return 2
    except Exception as err:
        joined = sys.modules.get("jgrind.devices.processes")
        joined = joined.current() if joined is not None else None
        if joined is None or type(err).__name__ != "JaxRuntimeError":
            raise
        # a collective whose peer is gone (gloo: "Connection closed by peer"): not a bug here
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        print(f"jgrind: error: process {joined.process_id}: a collective with the other "
              f"processes failed ({first}); another process has probably stopped: see its "
              "output", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jgrind: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("jgrind: terminated (SIGTERM)", file=sys.stderr)
        return 128 + signal.SIGTERM


def _command_line_signals_and_warnings() -> None:
    interrupts.install()
    # one line, like the errors: "jgrind: warning: ...", not a source path and line
    warnings.formatwarning = lambda message, *args, **kwargs: \
        f"jgrind: warning: {str(message).removeprefix('jgrind: ')}\n"


if __name__ == "__main__":
    sys.exit(main())
