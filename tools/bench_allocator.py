"""Epoch times under each allocator setting, interleaved (docs/guide.md, "Allocator settings").

    python tools/bench_allocator.py --rmat 1000000 10000000 --parts 8 --runs in-memory,host
    python tools/bench_allocator.py --rmat 1000000 10000000 --settings off,huge --epochs 2
    python tools/bench_allocator.py --config host-tight --parts 128 --runs ssd

Every run is a fresh interpreter (glibc reads its tunables at start), once per setting of
``--settings`` in turn (``off``; ``huge``: `jgrind.hostio.allocator.HUGE_PAGES`; ``reuse``:
`HEAP_REUSE`; ``huge+reuse``), ``--reps`` times, so that a slow patch of a noisy machine hits
every setting alike. Each child builds the graph, partitions it by label propagation (seed 0),
times ``--epochs`` epochs after a warm-up and reports them with their page faults and the
child's peak resident memory. The heap-reuse setting pays only once the heap has grown to what
an epoch needs (the second or third epoch), so give it ``--epochs 4`` or more.

``--against COMMIT`` also runs every child on that commit's code (``git archive`` into a temporary
directory, put first on the child's ``PYTHONPATH``), alternating with the working tree's in
each repetition: an interleaved A/B of a change, as in docs/results-history.md, section 4,
"Host tables hand their memory on". The harness (this file's child) is the working tree's for
both, so the commit must have the engine API it calls::

    python tools/bench_allocator.py --rmat 1000000 10000000 --runs host --settings off \
        --against 113da89 --reps 2 --epochs 4

``--rmat``: an R-MAT graph with a 3-layer GCN (hidden 256, dropout 0.5) and no budgets (``ssd``:
host budget 0, so the host cache is off, as in ``tools/bench_out_of_core.py``);
``--config``: a `tools/bench_planner.py` configuration with its budgets (give ``--parts``: the
planner benchmark's tables say how many partitions it chose).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile

import harness

RUNS = ("in-memory", "device", "host", "ssd")


def child(spec: dict) -> dict:
    import jax
    import optax

    from jgrind.hostio import allocator
    from jgrind.engine import OutOfCore
    from jgrind.train import InMemory

    graph, model, cfg = harness.graph_and_model(spec["config"], spec["rmat"])
    device_budget, host_budget = (cfg.device_budget, cfg.host_budget) if cfg else (None, None)
    optimizer = optax.adam(1e-3)
    run = spec["run"]
    if run == "in-memory":
        ex = InMemory(graph, model, optimizer)
    else:
        pg = harness.partition(graph, model, spec["parts"])
        if run == "ssd" and not cfg:
            host_budget = 0  # every block through the SSD tier, as bench_out_of_core's "ssd"
        ex = OutOfCore(graph, model, optimizer, policy=harness.policy(run, spec["store"]),
                       partitioned=pg, store=spec["store"], device_budget=device_budget,
                       host_budget=host_budget)
    training = harness.Training(ex, model, optimizer)
    times, faults = [], []
    for epoch in range(1 + spec["epochs"]):  # the first compiles
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        times.append(training.epoch(jax.random.key(epoch))[0])
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    if hasattr(ex, "close"):
        ex.close()
    spares = getattr(ex, "spares", None)  # out-of-core runs: step outputs reused, or made
    inputs = getattr(getattr(ex, "store", None), "buffers", None)  # and step inputs' buffers
    return {"active": [s.name for s in allocator.SETTINGS if s.active()],
            "epochs": times[1:], "faults": faults[1:],
            "spares": None if spares is None else [spares.reused, spares.made],
            "inputs": None if inputs is None else [inputs.reused, inputs.made],
            "peak_rss": harness.peak_rss()}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "_child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_source(p, config=True)
    harness.add_parts(p, default=8,
                      help="partitions (the planner benchmark's tables say how many it chose)")
    p.add_argument("--runs", default="in-memory,host", help=f"comma-separated, from {RUNS}")
    p.add_argument("--settings", default="off,reuse",
                   help="comma-separated, from off, huge, reuse, huge+reuse")
    p.add_argument("--reps", type=int, default=2)
    harness.add_epochs(p, 4, help="timed epochs per child, after a warm-up (heap reuse "
                                  "settles by the third)")
    harness.add_store(p, default="/tmp")
    p.add_argument("--against", metavar="COMMIT",
                   help="also run every child on this commit's code, alternating with the "
                        "working tree's")
    args = p.parse_args()

    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        p.error(f"unknown runs {sorted(unknown)}; choose from {list(RUNS)}")

    from jgrind.hostio import allocator
    choices = {"off": (), "huge": (allocator.HUGE_PAGES,), "reuse": (allocator.HEAP_REUSE,),
               "huge+reuse": (allocator.HUGE_PAGES, allocator.HEAP_REUSE)}
    settings = args.settings.split(",")
    unknown = set(settings) - set(choices)
    if unknown:
        p.error(f"unknown settings {sorted(unknown)}; choose from {list(choices)}")
    for name in settings:
        useless = [s.name for s in choices[name] if not s.can_help()]
        if useless:
            p.error(f"{', '.join(useless)} cannot help here (THP mode "
                    f"{allocator.kernel_mode()!r}, glibc {allocator.glibc_version()}): "
                    f"nothing to compare for {name!r}")

    ours = {"GLIBC_TUNABLES"} | {s.opt_in for s in allocator.SETTINGS}
    base = {k: v for k, v in os.environ.items() if k not in ours}
    trees = {"": None}  # version label -> the jgrind tree its children import (None: ours)
    if args.against:
        trees = {"tree": None, args.against: _archive(args.against)}
    try:
        results = _run_all(args, settings, choices, base, trees)
    finally:
        for tree in trees.values():
            if tree is not None:
                shutil.rmtree(tree, ignore_errors=True)
    _report(args, settings, trees, results)


def _run_all(args, settings, choices, base, trees) -> dict:
    """Every child, in the interleaved order; results by (run, setting, version)."""
    from jgrind.hostio import allocator
    results: dict = {}
    for rep in range(args.reps):
        for run in args.runs.split(","):
            for name, version in _alternating(settings, list(trees), rep):
                env = allocator.with_settings(choices[name], base)
                if trees[version] is not None:
                    env["PYTHONPATH"] = os.pathsep.join(
                        [trees[version]] + [x for x in [env.get("PYTHONPATH")] if x])
                spec = {"run": run, "config": args.config, "rmat": args.rmat,
                        "parts": args.parts,
                        "epochs": args.epochs, "store": args.store}
                got = harness.run_child([sys.executable, os.path.abspath(__file__), "_child",
                                         json.dumps(spec)], f"{run} ({name} {version})", env)
                assert got["active"] == [s.name for s in choices[name]], \
                    f"the child did not get the setting {name!r}: {got['active']}"
                r = results.setdefault((run, name, version),
                                       {"epochs": [], "faults": [], "rss": []})
                r["epochs"].extend(got["epochs"])
                r["faults"].extend(got["faults"])
                r["rss"].append(got["peak_rss"])
                print(f"rep {rep + 1}: {run:<9} {name:<10} {version:<8} epochs "
                      f"{', '.join(f'{t:.3f}' for t in got['epochs'])} s; page faults "
                      f"{', '.join(f'{f:,}' for f in got['faults'])}; peak RSS "
                      f"{got['peak_rss'] / 2**30:.2f} GiB"
                      + (f"; step outputs reused {got['spares'][0]}, made {got['spares'][1]}"
                         if got.get("spares") else "")
                      + (f"; input buffers reused {got['inputs'][0]}, made {got['inputs'][1]}"
                         if got.get("inputs") else ""), flush=True)
    return results


def _report(args, settings, trees, results) -> None:
    source = (f"--config {args.config}" if args.config
              else f"R-MAT {args.rmat[0]:,} nodes, {args.rmat[1]:,} edges")
    print(f"\n{source}, {args.parts} partitions; median epoch over {args.reps} x {args.epochs} "
          f"epochs after a warm-up; {os.cpu_count()} cores")
    runs = args.runs.split(",")
    head = f"{'run':<10} {'setting':<11} {'code':<8} {'epoch s':>8} {'x off':>6} "
    head += f"{'x in-memory':>12} " if "in-memory" in runs else ""
    print(head + f"{'faults/epoch':>13} {'peak RSS GiB':>13}")
    for run in runs:
        for name in settings:
            for version in trees:
                r = results[(run, name, version)]
                t = statistics.median(r["epochs"])
                first = results[(run, settings[0], version)]
                line = f"{run:<10} {name:<11} {version:<8} {t:8.3f} "
                line += f"{statistics.median(first['epochs']) / t:6.2f} "
                if "in-memory" in runs:
                    mem = results[("in-memory", name, version)]
                    line += f"{t / statistics.median(mem['epochs']):12.2f} "
                print(line + f"{statistics.median(r['faults']):13,.0f} "
                             f"{max(r['rss']) / 2**30:13.2f}")
    print("x off: the first setting's median epoch over this one's; x in-memory: this run's "
          "median epoch over the in-memory run's under the same setting"
          + ("; code: the working tree, or the commit of --against" if args.against else ""))


def _alternating(settings: list, versions: list, rep: int) -> list:
    """Every (setting, version) pair; versions in turn, their order swapped in every other
    repetition, so that neither always runs first after the other."""
    order = versions if rep % 2 == 0 else versions[::-1]
    return [(name, version) for name in settings for version in order]


def _archive(commit: str) -> str:
    """``commit``'s tree, extracted by ``git archive`` into a temporary directory (removed
    when the runs are done)."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    if root.returncode != 0:
        sys.exit("--against needs the jgrind git repository (run from a clone)")
    proc = subprocess.run(["git", "archive", commit], capture_output=True,
                          cwd=root.stdout.strip())
    if proc.returncode != 0:
        sys.exit(f"--against {commit}: {proc.stderr.decode().strip()} (give a commit, branch "
                 "or tag of this repository)")
    out = tempfile.mkdtemp(prefix="jgrind-" + re.sub(r"[^A-Za-z0-9._-]", "_", commit) + "-")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


if __name__ == "__main__":
    main()
