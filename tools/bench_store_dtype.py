"""Bytes moved per epoch and epoch times by storage dtype (issue 41; docs/guide.md, "Lossy storage").

    python tools/bench_store_dtype.py --rmat 200000 2000000 --parts 8 --runs host,ssd
    python tools/bench_store_dtype.py --rmat 1000000 10000000 --parts 8 --dtypes float32,int8

For every run (``host``: every block in host RAM; ``ssd``: every block on SSD with host budget 0,
so the host cache is off, as in ``tools/bench_out_of_core.py``) and every storage dtype of
``--dtypes`` (activations, aggregations and gradients all in it), the store's bytes read and
written per epoch on the host and SSD tiers, their ratio to float32's, the bytes that crossed
between host and device (``to_device``, ``to_host``: counted on the CPU backend too, where
nothing is copied), and the median epoch time after a warm-up epoch. Runs are interleaved (every dtype once per repetition) on one graph
partitioned once: an R-MAT graph with the 3-layer GCN of the other out-of-core benchmarks
(hidden 256, dropout 0.5), label propagation, seed 0.

Target 3 (the memory wall, ``--wall NODES EDGES``):

    python tools/bench_store_dtype.py --wall 3000000 30000000 --parts 32 \
        --device-budget 2GiB --host-budget 2GiB --epochs 1

trains float32 on the R-MAT graph of ``NODES`` and ``EDGES`` (the float32 memory-wall run of
docs/results.md, section 5, at its size) and int8 on one with ``--wall-scale`` (3) times the
nodes, edges and partitions (so partitions keep their size and the device's working set its
bytes), both under the same budgets with the default policy (`grinnder`, blocks past the
budgets on SSD under ``--store``), each in its own process. It reports the stored bytes by tier
(the store's peaks against the budgets), the bytes of every block in float32 and as stored,
the peak resident memory, the epoch and the loss. The target is met when the int8 run trains
(a finite loss) with its host peak within the host budget and stores no more bytes than the
float32 run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import harness

MOVED = ("host_read", "host_written", "ssd_read", "ssd_written")
# what crosses between host and device (on the CPU backend counted, not copied): reported beside
# the tiers' bytes, not in their ratio
LINK = ("to_device", "to_host")


def measure(ex, model, optimizer, epochs: int) -> tuple[list, dict]:
    """``(epoch seconds, bytes moved per epoch)`` over ``epochs`` timed epochs after one warm-up
    (which compiles)."""
    import jax
    training = harness.Training(ex, model, optimizer)
    training.epoch(jax.random.key(0))
    before = {k: getattr(ex.store.accounts, k) for k in MOVED + LINK}
    times = [training.epoch(jax.random.key(1 + e))[0] for e in range(epochs)]
    moved = {k: (getattr(ex.store.accounts, k) - before[k]) / epochs for k in MOVED + LINK}
    return times, moved


def wall_child(cfg: dict) -> dict:
    """One memory-wall run (`main`'s ``--wall``), in a process of its own."""
    import jax
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.hostio import codecs
    from jgrind.plan import policies

    codec = codecs.by_name(cfg["dtype"])
    graph = harness.rmat_graph(cfg["nodes"], cfg["edges"])
    model = harness.gcn()
    pg = harness.partition(graph, model, cfg["parts"])
    policy = policies.with_storage(
        policies.grinnder(cfg["device_budget"], cfg["host_budget"], cfg["store"]),
        codec, codec, codec)
    optimizer = optax.adam(1e-3)
    with OutOfCore(graph, model, optimizer, policy=policy, partitioned=pg, store=cfg["store"],
                   device_budget=cfg["device_budget"], host_budget=cfg["host_budget"]) as ex:
        training = harness.Training(ex, model, optimizer)
        times, loss = [], None
        for epoch in range(cfg["epochs"]):
            seconds, loss = training.epoch(jax.random.key(epoch))
            times.append(seconds)
        acc = ex.store.accounts
        float32 = sum(i.nbytes for i in ex.inventory if i.name != "aggregation")
        stored = sum(codec.encoded_nbytes(*i.shape) for i in ex.inventory
                     if i.name != "aggregation")
        return {**cfg, "epoch_seconds": times, "loss": float(loss),
                "peaks": {"device": acc.peak_device, "host": acc.peak_host,
                          "ssd": acc.peak_ssd},
                "blocks_float32": float32, "blocks_stored": stored,
                "graph_bytes": graph.nbytes(), "peak_rss": harness.peak_rss()}


def wall(args) -> list:
    """Target 3: float32 at ``--wall``'s size, int8 at ``--wall-scale`` times it."""
    import json
    import sys

    runs = []
    with tempfile.TemporaryDirectory(dir=args.store) as store:
        for dtype, scale in (("float32", 1), ("int8", args.wall_scale)):
            cfg = {"dtype": dtype, "nodes": args.wall[0] * scale, "edges": args.wall[1] * scale,
                   "parts": args.parts * scale, "device_budget": args.device_budget,
                   "host_budget": args.host_budget, "store": store, "epochs": args.epochs}
            print(f"running {dtype} at {cfg['nodes']:,} nodes ...", file=sys.stderr, flush=True)
            runs.append(harness.run_child([sys.executable, __file__, "--wall-child",
                                           json.dumps(cfg)], f"the {dtype} run"))
    gib = 2**30
    for r in runs:
        p = r["peaks"]
        print(f"{r['dtype']:<8} {r['nodes']:>10,} nodes {r['edges']:>11,} edges {r['parts']:>3} "
              f"parts: blocks {r['blocks_float32'] / gib:6.2f} GiB in float32, "
              f"{r['blocks_stored'] / gib:6.2f} GiB stored; peaks device {p['device'] / gib:.2f}"
              f", host {p['host'] / gib:.2f} (budget {r['host_budget'] / gib:.2f}), SSD "
              f"{p['ssd'] / gib:.2f} GiB; peak RSS {r['peak_rss'] / gib:.2f} GiB (graph "
              f"{r['graph_bytes'] / gib:.2f}); epoch {r['epoch_seconds'][-1]:.1f} s, loss "
              f"{r['loss']:.4f}", flush=True)
    base, small = runs
    met = (small["loss"] == small["loss"] and small["peaks"]["host"] <= small["host_budget"]
           and small["blocks_stored"] <= base["blocks_stored"])
    ratio = small["blocks_stored"] / base["blocks_stored"]
    print(f"target 3 (int8 at {args.wall_scale}x the nodes, same budgets): "
          f"{'met' if met else 'not met'}; int8 stores {ratio:.3f}x float32's bytes "
          f"({harness.machine()})")
    return runs


def main() -> None:
    import json
    import sys
    if len(sys.argv) == 3 and sys.argv[1] == "--wall-child":
        print(json.dumps(wall_child(json.loads(sys.argv[2]))))
        return
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
    parser.add_argument("--wall", nargs=2, type=int, metavar=("NODES", "EDGES"),
                        help="target 3 instead: float32 at this size, int8 at --wall-scale "
                             "times it, under the same budgets")
    parser.add_argument("--wall-scale", type=int, default=3)
    harness.add_budgets(parser, defaults=(2 * 2**30, 2 * 2**30))
    args = parser.parse_args()
    if args.wall:
        harness.write_json(args.json, wall(args))
        return

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
                total = sum(moved[k] for k in MOVED)
                ratio = total / max(sum(base[k] for k in MOVED), 1)
                epoch = statistics.median(rows[name]["times"])
                results.append({"run": run, "dtype": name, "epoch_seconds": epoch,
                                "moved_per_epoch": moved, "ratio_to_first": ratio})
                print(f"{run:<4} {name:<16} epoch {epoch:7.2f} s  "
                      + "  ".join(f"{k} {moved[k] / 2**20:9.1f} MiB" for k in MOVED)
                      + f"  moved {ratio:.3f}x of {dtypes[0]}  (link: "
                      + ", ".join(f"{k} {moved[k] / 2**20:.1f} MiB" for k in LINK) + ")",
                      flush=True)
    print(f"({harness.machine()}; {graph.num_nodes:,} nodes, {graph.num_edges:,} edges, "
          f"{args.parts} parts, median of {args.epochs * args.reps} epochs)")
    harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
