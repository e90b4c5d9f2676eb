"""The ``jgrind`` command line. ``jgrind --help`` and ``jgrind COMMAND --help`` explain everything.

User mistakes (a missing file, an unknown dataset or setting) print one line starting with
``jgrind: error:`` and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import textwrap

from jgrind.config import ConfigError, RunConfig
from jgrind.graph import GraphError

DESCRIPTION = """\
jgrind: exact full-graph GNN training in JAX.

Commands:
  train      train GCN / GraphSAGE / GAT on the full graph and report val/test metrics
  datasets   list the datasets jgrind knows and where it reads them from
  partition  partition a graph and print the partition quality report

Run `jgrind COMMAND --help` for a command's options."""


def _train_epilog() -> str:
    docs = RunConfig.field_docs()
    defaults = dataclasses.asdict(RunConfig())
    lines = ["settings for --set key=value (default in brackets):"]
    for name, doc in docs.items():
        lines.append(f"  {name:<17} {doc} [{defaults[name]}]")
    lines += ["", "examples:",
              "  jgrind train                                   # GCN on a generated CSBM graph",
              "  jgrind train --dataset cora --set hidden=16 --set row_normalize=true --seeds 10",
              "  jgrind train --dataset tolokers --model gcn --set residual=true "
              "--set layer_norm=true",
              "  jgrind train --dataset ogb:/data/ogbn-arxiv --epochs 500 --out runs/arxiv",
              "  jgrind train --dataset rmat --set num_nodes=1000000 --policy grinnder "
              "--parts 16 \\",
              "               --device-budget 2GiB --host-budget 4GiB --store /mnt/nvme"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jgrind", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser(
        "train", help="train a model on the full graph",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Train a GNN on the full graph (no sampling): one optimizer step per "
                    "epoch, model selection on the validation set, test metric at the best "
                    "validation epoch. Writes config.json, metrics-seed*.jsonl (one JSON object "
                    "per epoch), training.png and summary.json to --out.",
        epilog=_train_epilog())
    train.add_argument("--dataset", help="dataset name (see `jgrind datasets`) [csbm]")
    train.add_argument("--model", choices=["gcn", "sage", "gat"], help="architecture [gcn]")
    train.add_argument("--epochs", type=int, help="training epochs [200]")
    train.add_argument("--seeds", type=int, help="number of seeds; mean +- std is reported [1]")
    train.add_argument("--set", dest="overrides", action="append", default=[],
                       metavar="KEY=VALUE", help="override a setting (repeatable; see below)")
    train.add_argument("--policy", help="out-of-core offload policy: in_memory, host, ssd, "
                       "recompute, grinnder (see docs/engine.md)")
    train.add_argument("--parts", type=int, help="number of partitions for out-of-core runs")
    train.add_argument("--device-budget", help="device memory budget, e.g. 2GiB")
    train.add_argument("--host-budget", help="host RAM budget for offloaded blocks, e.g. 4GiB")
    train.add_argument("--store", help="directory for the SSD tier")
    train.add_argument("--out", default="runs/latest",
                       help="output directory for logs, plots and checkpoints [runs/latest]")
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    part = sub.add_parser(
        "partition", help="partition a graph and report its quality",
        description="Partition a dataset and print the edge cut, balance, halo/owned ratios, "
                    "the partitioner's time and peak memory.")
    part.add_argument("--dataset", default="csbm", help="dataset name [csbm]")
    part.add_argument("--parts", type=int, default=8, help="number of partitions [8]")
    part.add_argument("--partitioner", default="label_propagation",
                      help="label_propagation | contiguous | random | metis "
                           "[label_propagation]")
    part.add_argument("--seed", type=int, default=0)
    part.add_argument("--set", dest="overrides", action="append", default=[],
                      metavar="KEY=VALUE", help="dataset settings, e.g. num_nodes=100000")

    ds = sub.add_parser("datasets", help="list known datasets and where they are read from",
                        description="List built-in datasets, whether their files are present, "
                                    "and the folder they are read from ($JGRIND_DATA or "
                                    "../shared/datasets).")
    ds.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return parser


def cmd_train(args) -> int:
    from jgrind.experiment import run_config
    cfg = RunConfig()
    flags = {k: getattr(args, k) for k in ("dataset", "model", "epochs", "seeds", "policy",
                                           "parts", "device_budget", "host_budget", "store")
             if getattr(args, k) is not None}
    cfg = dataclasses.replace(cfg, **flags).with_overrides(args.overrides)
    summary = run_config(cfg, out=pathlib.Path(args.out), progress=not args.no_progress)
    print(summary["line"])
    print(f"wrote {args.out}/ (summary.json, metrics-seed*.jsonl, training.png)")
    return 0


def cmd_partition(args) -> int:
    from jgrind.config import load_graph
    from jgrind.partition import PARTITIONERS, measure, partition_graph, quality
    if args.partitioner not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {args.partitioner!r}; use one of "
                          f"{', '.join(PARTITIONERS)}")
    cfg = dataclasses.replace(RunConfig(), dataset=args.dataset).with_overrides(args.overrides)
    graph = load_graph(cfg)
    m = measure(args.partitioner, graph, args.parts, seed=args.seed)
    pg = partition_graph(graph, m.assignment, num_parts=args.parts)
    print(graph)
    print(quality(pg, m).format())
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
    return 0


def _engine_errors() -> tuple:
    """User-facing engine errors (bad budgets, store directory, policy), imported lazily."""
    from jgrind.engine import BudgetError, StoreError
    from jgrind.plan import PolicyError
    return (BudgetError, StoreError, PolicyError)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    handlers = {"train": cmd_train, "datasets": cmd_datasets, "partition": cmd_partition}
    try:
        return handlers[args.command](args)
    except (ConfigError, GraphError, FileNotFoundError, NotADirectoryError, PermissionError,
            *_engine_errors()) as err:
        print(f"jgrind: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jgrind: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
