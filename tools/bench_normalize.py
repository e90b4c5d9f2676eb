"""Time and memory of a model's whole-graph normalisation (``model.normalize``: GCN's self loops
and symmetric weights, SAGE's mean weights) on a saved graph, each model in a fresh process.

    python tools/bench_normalize.py --folder /data/papers-like [--models gcn,sage]

``--folder`` is an ``npy:`` folder (`jgrind convert`), loaded memory-mapped. Each line gives
the seconds ``normalize`` took, the process's peak RSS (``VmHWM``, which counts the mapped
files' pages it touched) and its anonymous memory at the end (``RssAnon``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import harness


def status_gib(field: str) -> float:
    return harness.resident(field) / 2**30


def measure(folder: str, model: str) -> dict:
    import jgrind
    graph = jgrind.datasets.load("npy:" + folder)
    loaded = status_gib("VmHWM")
    make = {"gcn": jgrind.models.gcn, "sage": jgrind.models.sage}[model]
    net = make(graph.num_features, 256, graph.num_classes, num_layers=3)
    t0 = time.perf_counter()
    out = net.normalize(graph)
    return {"seconds": time.perf_counter() - t0, "loaded_peak": loaded,
            "peak": status_gib("VmHWM"), "anon": status_gib("RssAnon"),
            "edges": out.num_edges, "graph": str(graph)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--folder", required=True)
    p.add_argument("--models", default="gcn,sage")
    p.add_argument("--_measure", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args._measure:
        print("RESULT " + json.dumps(measure(args.folder, args._measure)))
        return
    for model in args.models.split(","):
        done = subprocess.run([sys.executable, __file__, "--folder", args.folder,
                               "--_measure", model], capture_output=True, text=True)
        lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        if done.returncode or not lines:
            print(f"{model}: failed (exit {done.returncode}): {done.stderr.strip()[-300:]}")
            continue
        r = json.loads(lines[0][len("RESULT "):])
        print(f"{model:5s} {r['seconds']:7.1f} s  peak RSS {r['peak']:6.2f} GiB (after loading "
              f"{r['loaded_peak']:.2f})  anonymous at the end {r['anon']:5.2f} GiB  "
              f"{r['edges']:,} edges  {r['graph']}", flush=True)


if __name__ == "__main__":
    main()
