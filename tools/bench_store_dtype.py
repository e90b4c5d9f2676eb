"""Bytes moved per epoch and epoch times by storage dtype (issue 41; docs/guide.md, "Lossy storage").

    python tools/bench_store_dtype.py --rmat 200000 2000000 --parts 8 --runs host,ssd
    python tools/bench_store_dtype.py --rmat 1000000 10000000 --parts 8 --dtypes float32,int8

For every run (``host``: every block in host RAM; ``ssd``: every block on SSD with host budget 0,
so the host cache is off, as in ``tools/bench_out_of_core.py``) and every storage dtype of
``--dtypes`` (activations, aggregations and gradients all in it), the store's bytes read and
written per epoch on the host and SSD tiers, their ratio to float32's, and the median epoch
time after a warm-up epoch. Runs are interleaved (every dtype once per repetition) on one graph
partitioned once: an R-MAT graph with the 3-layer GCN of the other out-of-core benchmarks
(hidden 256, dropout 0.5), label propagation, seed 0.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import harness

MOVED = ("host_read", "host_written", "ssd_read", "ssd_written")


def measure(ex, model, optimizer, epochs: int) -> tuple[list, dict]:
    """``(epoch seconds, bytes moved per epoch)`` over ``epochs`` timed epochs after one warm-up
    (which compiles)."""
    import jax
    training = harness.Training(ex, model, optimizer)
    training.epoch(jax.random.key(0))
    before = {k: getattr(ex.store.accounts, k) for k in MOVED}
    times = [training.epoch(jax.random.key(1 + e))[0] for e in range(epochs)]
    moved = {k: (getattr(ex.store.accounts, k) - before[k]) / epochs for k in MOVED}
    return times, moved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    harness.add_source(parser, rmat=(200_000, 2_000_000))
    harness.add_parts(parser, 8)
    harness.add_epochs(parser, 2)
    harness.add_store(parser)
    harness.add_json(parser)
    parser.add_argument("--runs", default="host,ssd", help="host | ssd, comma separated")
    parser.add_argument("--dtypes", default="float32,bfloat16,int8",
                        help="storage dtypes, comma separated (jgrind.hostio.codecs.NAMES)")
    parser.add_argument("--reps", type=int, default=1, help="interleaved repetitions")
    args = parser.parse_args()

    import optax

    from jgrind.engine import OutOfCore
    from jgrind.hostio import codecs
    from jgrind.plan import policies

    graph, model, _ = harness.graph_and_model(None, args.rmat)
    pg = harness.partition(graph, model, args.parts)
    optimizer = optax.adam(1e-3)
    dtypes = args.dtypes.split(",")
    results = []
    with tempfile.TemporaryDirectory(dir=args.store) as store:
        for run in args.runs.split(","):
            rows = {d: {"times": [], "moved": None} for d in dtypes}
            for _ in range(args.reps):
                for name in dtypes:
                    codec = codecs.by_name(name)
                    policy = policies.with_storage(harness.policy(run, store), codec, codec,
                                                   codec)
                    with OutOfCore(graph, model, optimizer, policy=policy, partitioned=pg,
                                   store=store,
                                   host_budget=0 if run == "ssd" else None) as ex:
                        times, moved = measure(ex, model, optimizer, args.epochs)
                    rows[name]["times"] += times
                    rows[name]["moved"] = moved
            base = rows[dtypes[0]]["moved"]
            for name in dtypes:
                moved = rows[name]["moved"]
                total = sum(moved.values())
                ratio = total / max(sum(base.values()), 1)
                epoch = statistics.median(rows[name]["times"])
                results.append({"run": run, "dtype": name, "epoch_seconds": epoch,
                                "moved_per_epoch": moved, "ratio_to_first": ratio})
                print(f"{run:<4} {name:<16} epoch {epoch:7.2f} s  "
                      + "  ".join(f"{k} {v / 2**20:9.1f} MiB" for k, v in moved.items())
                      + f"  moved {ratio:.3f}x of {dtypes[0]}", flush=True)
    print(f"({harness.machine()}; {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{args.parts} parts, median of {args.epochs * args.reps} epochs)")
    harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
