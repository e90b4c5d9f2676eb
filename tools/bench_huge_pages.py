"""Epoch times with and without glibc huge pages, interleaved (README, "Huge pages").

    python tools/bench_huge_pages.py --rmat 1000000 10000000 --parts 8 --runs in-memory,host
    python tools/bench_huge_pages.py --config host-tight --parts 128 --runs ssd

Every run is a fresh interpreter (glibc reads its tunables at start): with
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` and without, alternating, ``--reps`` times, so that a
slow patch of a noisy machine hits both sides alike. Each child builds the graph, partitions it
by label propagation (seed 0), times ``--epochs`` epochs after a warm-up and prints them.

``--rmat``: an R-MAT graph with a 3-layer GCN (hidden 256, dropout 0.5) and no budgets;
``--config``: a `tools/bench_planner.py` configuration with its budgets (give ``--parts``: the
planner benchmark's tables say how many partitions it chose).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

RUNS = ("in-memory", "device", "host", "ssd")


def child(spec: dict) -> dict:
    import jax
    import optax

    from jgrind import hugepages, models
    from jgrind.engine import OutOfCore
    from jgrind.partition import partition_graph
    from jgrind.partition.partitioners import label_propagation
    from jgrind.plan import policies
    from jgrind.train import InMemory

    device_budget = host_budget = None
    if spec["config"]:
        import bench_planner
        cfg = next(c for c in bench_planner.CONFIGS if c.name == spec["config"])
        graph, model = bench_planner.build(cfg)
        device_budget, host_budget = cfg.device_budget, cfg.host_budget
    else:
        from jgrind.generators import rmat
        graph = rmat(num_nodes=spec["rmat"][0], num_edges=spec["rmat"][1], num_features=128,
                     num_classes=47, seed=0)
        model = models.gcn(128, 256, 47, num_layers=3, dropout=0.5)
    optimizer = optax.adam(1e-3)
    run = spec["run"]
    if run == "in-memory":
        ex = InMemory(graph, model, optimizer)
    else:
        normalized = model.normalize(graph)
        pg = partition_graph(normalized, label_propagation(normalized, spec["parts"], seed=0),
                             num_parts=spec["parts"])
        policy = {"device": policies.in_memory(), "host": policies.host_offload(),
                  "ssd": policies.ssd_offload(spec["store"])}[run]
        ex = OutOfCore(graph, model, optimizer, policy=policy, partitioned=pg,
                       store=spec["store"], device_budget=device_budget,
                       host_budget=host_budget)
    params = model.init(jax.random.key(0))
    state = optimizer.init(params)
    times = []
    for epoch in range(1 + spec["epochs"]):  # the first compiles
        start = time.perf_counter()
        params, state, loss = ex.step(params, state, jax.random.key(epoch))
        jax.block_until_ready(loss)
        times.append(time.perf_counter() - start)
    if hasattr(ex, "close"):
        ex.close()
    return {"huge_pages": hugepages.active(), "epochs": times[1:]}


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "_child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--rmat", nargs=2, type=int, metavar=("NODES", "EDGES"))
    src.add_argument("--config", help="a tools/bench_planner.py configuration name")
    p.add_argument("--parts", type=int, default=8,
                   help="partitions (the planner benchmark's tables say how many it chose)")
    p.add_argument("--runs", default="in-memory,host", help=f"comma-separated, from {RUNS}")
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--store", default="/tmp")
    args = p.parse_args()

    if args.config:
        import bench_planner
        names = [c.name for c in bench_planner.CONFIGS]
        if args.config not in names:
            p.error(f"unknown configuration {args.config!r}; choose from {names}")
    unknown = set(args.runs.split(",")) - set(RUNS)
    if unknown:
        p.error(f"unknown runs {sorted(unknown)}; choose from {list(RUNS)}")

    from jgrind import hugepages
    if not hugepages.can_help():
        p.error(f"huge pages cannot help here (THP mode {hugepages.kernel_mode()!r}, glibc "
                f"{hugepages.glibc_version()}): nothing to compare")
    parts = args.parts

    base = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES",
                                                             hugepages.OPT_IN)}
    results: dict = {}
    for rep in range(args.reps):
        for run in args.runs.split(","):
            for huge in (False, True):
                env = hugepages.with_huge_pages(base) if huge else dict(base)
                spec = {"run": run, "config": args.config, "rmat": args.rmat, "parts": parts,
                        "epochs": args.epochs, "store": args.store}
                proc = subprocess.run([sys.executable, os.path.abspath(__file__), "_child",
                                       json.dumps(spec)], env=env, capture_output=True,
                                      text=True)
                if proc.returncode != 0:
                    sys.exit(f"{run} (huge pages {huge}) failed:\n{proc.stderr[-2000:]}")
                got = json.loads(proc.stdout.strip().splitlines()[-1])
                assert got["huge_pages"] == huge, "the child did not get the setting"
                results.setdefault((run, huge), []).extend(got["epochs"])
                print(f"rep {rep + 1}: {run:<9} huge pages {'on ' if huge else 'off'} "
                      f"epochs {', '.join(f'{t:.3f}' for t in got['epochs'])} s", flush=True)
    source = (f"--config {args.config}" if args.config
              else f"R-MAT {args.rmat[0]:,} nodes, {args.rmat[1]:,} edges")
    print(f"\n{source}, {parts} partitions; median epoch over {args.reps} x {args.epochs}")
    print(f"{'run':<10} {'off s':>8} {'on s':>8} {'off / on':>9}")
    for run in args.runs.split(","):
        off = statistics.median(results[(run, False)])
        on = statistics.median(results[(run, True)])
        print(f"{run:<10} {off:8.3f} {on:8.3f} {off / on:9.2f}")


if __name__ == "__main__":
    main()
