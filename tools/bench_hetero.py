"""Heterogeneous-graph benchmarks: R-GCN on the ogbn-mag-sized generated graph.

    python tools/bench_hetero.py memory-wall                  # scale 1, 2 GiB + 2 GiB budgets
    python tools/bench_hetero.py memory-wall --scale 0.02 --parts 8 \\
        --device-budget 64MiB --host-budget 32MiB --compare-scale 0.02   # quick

``memory-wall`` (issue 40, target 2; ``--in-memory`` also trains the same graph in memory and
prints the epochs side by side): `mag-like:SCALE` (`jgrind.datasets.generated_hetero`,
inverse relations added: 8 relations), R-GCN with 2 layers and hidden 64 (a weight per
relation, per-relation mean, self-connection, dropout 0.5, Adam 0.01), trained out of core with
the default budgeted policy (``grinnder``) under the device and host budgets. It prints the
stored activations and gradients against the budgets, each epoch's time, loss and peak RSS,
and the constant ``peak RSS - budgets - graph``. With ``--compare-scale S`` it also trains
`mag-like:S` out of core under the same budgets and in memory, with the same seed and dropout
keys, and prints both runs' losses epoch by epoch: out-of-core training is exact, so they
agree to float32 rounding. Every run is its own subprocess, so each reports its own peak RSS.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_out_of_core as ooc  # noqa: E402  (tools/ is not a package)
import harness  # noqa: E402

HIDDEN, LAYERS, LR = 64, 2, 0.01


def model_for(graph):
    import jgrind
    return jgrind.models.rgcn(graph.num_features, HIDDEN, graph.num_classes,
                              graph.num_relations, num_layers=LAYERS)


def load(scale: float):
    import jgrind
    return jgrind.datasets.load(f"mag-like:{scale:g}")


def graph_summary(graph) -> dict:
    return {"nodes": graph.num_nodes, "edges": graph.num_edges, "features": graph.num_features,
            "classes": graph.num_classes, "relations": list(graph.relations),
            "node_types": [list(t) for t in graph.node_types]}


# -- children ------------------------------------------------------------------------------
def out_of_core_child(cfg: dict) -> dict:
    import jax
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.partition import PARTITIONERS, partition_graph

    stages = {}
    t0 = time.perf_counter()
    graph = load(cfg["scale"])
    load_seconds = time.perf_counter() - t0
    stages["graph loaded"] = ooc.memory_now()
    model = model_for(graph)
    normalized = model.normalize(graph)
    t0 = time.perf_counter()
    assignment = ooc.partition(PARTITIONERS, cfg["partitioner"], normalized, cfg["parts"])
    part_seconds = time.perf_counter() - t0
    pg = partition_graph(normalized, assignment, num_parts=cfg["parts"])
    stages["partitioned"] = ooc.memory_now()
    optimizer = optax.adam(LR)
    ex = OutOfCore(graph, model, optimizer, partitioned=pg, store=cfg["store"],
                   device_budget=cfg["device_budget"], host_budget=cfg["host_budget"])
    stages["engine built"] = ooc.memory_now()
    ooc.window_peak_rss()
    training = harness.Training(ex, model, optimizer)
    times, losses, epoch_peaks = [], [], []
    for epoch in range(cfg["epochs"]):
        seconds, loss = training.epoch(jax.random.key(epoch))
        times.append(seconds)
        losses.append(float(loss))
        epoch_peaks.append(ooc.window_peak_rss())
        stages[f"after epoch {epoch}"] = (harness.resident(), epoch_peaks[-1],
                                          harness.resident("RssAnon"))
        print(f"epoch {epoch}: {seconds:.1f} s, loss {losses[-1]:.6f}, peak RSS "
              f"{ooc.fmt(epoch_peaks[-1])}", file=sys.stderr, flush=True)
    a, inv = ex.store.accounts, ex.inventory
    partitions = sum(ooc.structure_bytes(p.owned, p.halo, p.halo_owner, p.halo_row, p.indptr,
                                         p.indices, p.weight, getattr(p, "edge_type", None))
                     for p in pg.partitions)
    padded = sum(p.nbytes() + ooc.structure_bytes(p.labels, p.weights, p.owned, p.halo_owner,
                                                  p.halo_row) for p in ex.parts)
    result = {
        "graph": graph_summary(graph), "load_seconds": load_seconds,
        "epoch_times": times, "losses": losses, "loss": losses[-1], "stages": stages,
        # resetting VmHWM also resets ru_maxrss, so the run's peak is the largest window's
        "peak_rss": max([harness.peak_rss(), *epoch_peaks, *(v[1] for v in stages.values())]),
        "epoch_peak_rss": epoch_peaks, "partition_seconds": part_seconds,
        "graph_bytes": {"raw graph": graph.nbytes(),
                        "normalised structure": ooc.structure_bytes(
                            normalized.indptr, normalized.indices, normalized.edge_weight,
                            normalized.edge_type),
                        "partitions": partitions, "padded blocks": padded},
        "inventory": {"activations": sum(i.nbytes for i in inv if i.name == "activation"),
                      "gradients": sum(i.nbytes for i in inv if i.name == "gradient")},
        "fates": ooc.fate_counts(ex),
        "plan": dataclasses.asdict(ex.memory),
        "peaks": {"device": a.peak_device, "host": a.peak_host, "ssd": a.peak_ssd},
        "moved_total": {k: getattr(a, k) for k in ooc.MOVED},
        "routes_bytes": ex.store.routes.nbytes,
        "accelerator": {**ooc.accelerator(), "epoch_device_in_use": []},
    }
    ex.close()
    return result


def in_memory_child(cfg: dict) -> dict:
    import jax
    import optax

    from jgrind.train import InMemory

    graph = load(cfg["scale"])
    model = model_for(graph)
    optimizer = optax.adam(LR)
    training = harness.Training(InMemory(graph, model, optimizer), model, optimizer)
    times, losses = [], []
    for epoch in range(cfg["epochs"]):
        seconds, loss = training.epoch(jax.random.key(epoch))
        times.append(seconds)
        losses.append(float(loss))
    return {"graph": graph_summary(graph), "epoch_times": times, "losses": losses,
            "peak_rss": harness.peak_rss()}


CHILDREN = {"out-of-core": out_of_core_child, "in-memory": in_memory_child}


def child(mode: str, cfg: dict) -> dict:
    """``mode`` in a fresh interpreter; its last stdout line is the JSON result."""
    cmd = [sys.executable, os.path.abspath(__file__), "_child", mode, json.dumps(cfg)]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        return {"failed": True, "returncode": proc.returncode}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- memory wall ---------------------------------------------------------------------------
def memory_wall(args) -> dict:
    os.makedirs(args.store, exist_ok=True)
    base = {"parts": args.parts, "partitioner": args.partitioner, "store": args.store,
            "device_budget": args.device_budget, "host_budget": args.host_budget,
            "epochs": args.epochs}
    print(f"running out of core at scale {args.scale:g} ...", file=sys.stderr, flush=True)
    results = {"config": {**base, "scale": args.scale, "hidden": HIDDEN, "layers": LAYERS},
               "jgrind": child("out-of-core", {**base, "scale": args.scale})}
    if args.in_memory:
        print(f"running scale {args.scale:g} in memory ...", file=sys.stderr, flush=True)
        results["in_memory"] = child("in-memory", {**base, "scale": args.scale})
    if args.compare_scale:
        cfg = {**base, "scale": args.compare_scale, "parts": args.compare_parts}
        print(f"running scale {args.compare_scale:g} out of core and in memory ...",
              file=sys.stderr, flush=True)
        results["compare"] = {"scale": args.compare_scale, "parts": args.compare_parts,
                              "out_of_core": child("out-of-core", cfg),
                              "in_memory": child("in-memory", cfg)}
    report(results, args)
    return results


def report(r: dict, args) -> None:
    cfg, j = r["config"], r["jgrind"]
    dev, host = cfg["device_budget"], cfg["host_budget"]
    print(f"machine: {harness.machine()}")
    print(f"command: {harness.command()}")
    print(f"model: R-GCN, {LAYERS} layers, hidden {HIDDEN}, a weight per relation, dropout 0.5, "
          f"Adam {LR}; {cfg['parts']} partitions ({cfg['partitioner']}); budgets: device "
          f"{ooc.fmt(dev)} (on a CPU: host RAM owned by JAX), host {ooc.fmt(host)}; policy: "
          "grinnder (the default)")
    if j.get("failed"):
        print(f"out of core at scale {cfg['scale']:g}: failed (rc {j['returncode']})")
    else:
        g = j["graph"]
        print(f"graph: mag-like:{cfg['scale']:g}, {g['nodes']:,} nodes of "
              f"{len(g['node_types'])} types, {g['edges']:,} edges in {len(g['relations'])} "
              f"relations, {g['features']} features, {g['classes']} classes; loaded in "
              f"{j['load_seconds']:.1f} s, partitioned in {j['partition_seconds']:.1f} s")
        ooc.report_wall_jgrind(j, dev, host)
        print("  losses by epoch: " + ", ".join(f"{v:.6f}" for v in j["losses"]))
    m = r.get("in_memory")
    if m and not j.get("failed"):
        if m.get("failed"):
            why = " (SIGKILL: out of memory, most likely)" if m["returncode"] == -9 else ""
            print(f"in memory at scale {cfg['scale']:g}: failed (rc {m['returncode']}){why}")
        else:
            # the first epoch compiles in both runs; the ratio is of the later epochs' median
            ooc_epoch, mem_epoch = (sorted(t[1:] or t)[len(t[1:] or t) // 2]
                                    for t in (j["epoch_times"], m["epoch_times"]))
            print(f"in memory at scale {cfg['scale']:g}: epochs "
                  + ", ".join(f"{t:.1f} s" for t in m["epoch_times"])
                  + f", peak RSS {ooc.fmt(m['peak_rss'])}; losses "
                  + ", ".join(f"{v:.6f}" for v in m["losses"])
                  + f"; out of core / in memory (epochs after the first): "
                  f"{ooc_epoch:.1f} / {mem_epoch:.1f} s = {ooc_epoch / mem_epoch:.2f}x")
    c = r.get("compare")
    if c:
        o, m = c["out_of_core"], c["in_memory"]
        print(f"\nscale {c['scale']:g} ({c['parts']} partitions, the same budgets):")
        if o.get("failed") or m.get("failed"):
            print(f"  a run failed: out of core {o.get('returncode', 0)}, in memory "
                  f"{m.get('returncode', 0)}")
            return
        worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(o["losses"], m["losses"]))
        for e, (a, b) in enumerate(zip(o["losses"], m["losses"])):
            print(f"  epoch {e}: loss out of core {a:.6f}, in memory {b:.6f}; epoch "
                  f"{o['epoch_times'][e]:.1f} s against {m['epoch_times'][e]:.1f} s")
        print(f"  largest relative loss difference {worst:.1e}; peak RSS out of core "
              f"{ooc.fmt(o['peak_rss'])}, in memory {ooc.fmt(m['peak_rss'])}")
        c["largest_relative_loss_difference"] = worst


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "_child":
        print(json.dumps(CHILDREN[sys.argv[2]](json.loads(sys.argv[3]))))
        return
    from jgrind.config import parse_bytes

    default_store = os.environ.get("JGRIND_STORE", os.path.join(tempfile.gettempdir(),
                                                                "jgrind-bench-store"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("memory-wall", help="R-GCN on mag-like out of core: peak RSS against "
                                           "budgets, and the loss against in-memory training")
    w.add_argument("--scale", type=float, default=1.0,
                   help="mag-like's size as a fraction of ogbn-mag's (at most 1) [1]")
    harness.add_parts(w, default=64)
    w.add_argument("--partitioner", default="label_propagation")
    harness.add_epochs(w, 2)
    harness.add_budgets(w, defaults=("2GiB", "2GiB"))
    harness.add_store(w, default_store, help="SSD tier directory (default $JGRIND_STORE or a "
                                             "directory in /tmp)")
    w.add_argument("--compare-scale", type=float, default=0.0,
                   help="also train mag-like at this scale out of core and in memory and "
                        "compare their losses (0: skip) [0]")
    w.add_argument("--in-memory", action="store_true",
                   help="also train the same graph in memory (same seed and dropout keys) and "
                        "print the out-of-core epoch beside the in-memory one")
    w.add_argument("--compare-parts", type=int, default=16,
                   help="partitions of the comparison's out-of-core run [16]")
    harness.add_json(w)
    args = p.parse_args()
    for k in ("device_budget", "host_budget"):
        if isinstance(getattr(args, k), str):
            setattr(args, k, parse_bytes(getattr(args, k)))
    results = memory_wall(args)
    results["command"] = harness.command()
    results["machine"] = harness.machine()
    harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
