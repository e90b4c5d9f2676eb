"""A graph saved as a ``.npy`` folder (`jgrind.datasets.save_graph`): how long loading it
memory-mapped and preparing it for a GCN take, beside generating it, each in a fresh process.

    python tools/bench_saved_graph.py --nodes 1000000 --edges 10000000 --features 512 \\
        --folder /tmp/rmat-1m-512 [--cold] [--rounds 2]

The folder is written once (kept for later runs). ``--cold`` drops the OS page cache before
each load (needs root), so the load reads the files from the disk.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import harness


def measure(folder: str, cold: bool) -> dict:
    """In this (fresh) process: load ``npy:folder``, then ``model.normalize`` it."""
    import jgrind
    if cold:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    t0 = time.perf_counter()
    graph = jgrind.datasets.load("npy:" + folder)
    t1 = time.perf_counter()
    model = jgrind.models.gcn(graph.num_features, 256, graph.num_classes, num_layers=3)
    model.normalize(graph)
    t2 = time.perf_counter()
    return {"load": t1 - t0, "normalize": t2 - t1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1_000_000)
    p.add_argument("--edges", type=int, default=10_000_000)
    p.add_argument("--features", type=int, default=512)
    p.add_argument("--folder", required=True)
    p.add_argument("--cold", action="store_true")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--_measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._measure:
        print(json.dumps(measure(args.folder, args.cold)))
        return
    if not os.path.exists(args.folder):
        from jgrind.datasets import save_graph
        t0 = time.perf_counter()
        graph = harness.rmat_graph(args.nodes, args.edges, args.features)
        t1 = time.perf_counter()
        save_graph(graph, args.folder)
        print(f"generated in {t1 - t0:.2f} s, saved in {time.perf_counter() - t1:.2f} s: "
              f"{graph}")
    cmd = [sys.executable, __file__, "--folder", args.folder, "--_measure"] + \
        (["--cold"] if args.cold else [])
    for _ in range(args.rounds):
        r = harness.run_child(cmd, "loading the saved graph")
        print(f"load {r['load']:.2f} s, normalize for GCN {r['normalize']:.2f} s"
              f"{' (page cache dropped first)' if args.cold else ''}")


if __name__ == "__main__":
    main()
