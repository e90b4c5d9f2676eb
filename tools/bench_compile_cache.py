"""What the persistent compilation cache (`jgrind.compile_cache.compilation_cache`) saves a new process.

Runs the same out-of-core training (R-MAT graph, 3-layer GCN, hidden 256, `host_offload`,
two epochs) in fresh processes, interleaved: without the cache, with an empty one (which it
fills), with the filled one, and so on. Each process reports XLA's backend compile time
(JAX's ``/jax/core/compile/backend_compile_duration`` events), the cache's retrieval time, the
`jgrind.train` call, the process and the epochs, and its losses (which must agree).

    python tools/bench_compile_cache.py --nodes 300000 --parts 16 --rounds 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import harness

_CHILD = r"""
import collections, contextlib, json, sys, time
t_start = time.perf_counter()
import jax, optax
from jax import monitoring
import jgrind
from jgrind.compile_cache import compilation_cache
from jgrind.generators import rmat

cache, nodes, parts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds, calls = collections.Counter(), collections.Counter()
def listen(event, duration, **kwargs):
    seconds[event] += duration
    calls[event] += 1
monitoring.register_event_duration_secs_listener(listen)
graph = rmat(num_nodes=nodes, num_edges=10 * nodes, num_features=128, num_classes=47, seed=0)
model = jgrind.models.gcn(128, 256, 47, num_layers=3, dropout=0.5)
with contextlib.nullcontext() if cache == "off" else compilation_cache(cache):
    start = time.perf_counter()
    result = jgrind.train(jax.random.key(0), graph, model, optax.adam(0.01), epochs=2,
                          policy=jgrind.policies.host_offload(), num_parts=parts,
                          progress=False)
    train_s = time.perf_counter() - start
print(json.dumps({
    "compile_s": seconds["/jax/core/compile/backend_compile_duration"],
    "compiles": calls["/jax/core/compile/backend_compile_duration"],
    "retrieval_s": seconds["/jax/compilation_cache/cache_retrieval_time_sec"],
    "train_s": train_s, "process_s": time.perf_counter() - t_start,
    "epochs_s": [h["seconds"] for h in result.history],
    "losses": [float(h["loss"]) for h in result.history]}))
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=300_000)
    p.add_argument("--parts", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        runs = ["off", "empty"] + ["filled", "off"] * args.rounds
        losses = set()
        print(f"R-MAT {args.nodes:,} nodes, {10 * args.nodes:,} edges, {args.parts} partitions, "
              "host_offload, 2 epochs; one fresh process per line")
        print("| cache | backend compile s (programs) | retrieval s | train call s | "
              "process s | epochs s |")
        print("|---|---|---|---|---|---|")
        for run in runs:
            r = harness.run_child([sys.executable, "-c", _CHILD, "off" if run == "off" else cache,
                                   str(args.nodes), str(args.parts)], f"cache {run}")
            losses.add(tuple(r["losses"]))
            print(f"| {run} | {r['compile_s']:.2f} ({r['compiles']}) | {r['retrieval_s']:.2f} | "
                  f"{r['train_s']:.2f} | {r['process_s']:.2f} | "
                  f"{', '.join(f'{s:.2f}' for s in r['epochs_s'])} |", flush=True)
        print("losses agree in every process" if len(losses) == 1
              else f"LOSSES DIFFER: {sorted(losses)}")


if __name__ == "__main__":
    main()
