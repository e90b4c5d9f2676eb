"""One model on several devices: epoch time and the bytes the halo exchange moves.

    python tools/bench_devices.py                         # 1M nodes, 10M edges, 8 partitions
    python tools/bench_devices.py --rmat 20000 200000 --epochs 2   # quick

The benchmarks' R-MAT graph and 3-layer GCN (`harness`), cut into ``--parts`` partitions by
label propagation, trained by `jgrind.devices.Sharded` on 1, 2 and 4 CPU devices
(``--devices``), each count in its own process started with
``XLA_FLAGS=--xla_force_host_platform_device_count=K``, beside one device's in-memory epoch
(`jgrind.train.InMemory`, also in its own process). Per device count it prints the epoch time
(the fastest of ``--epochs`` after the compiling one), the bytes the exchange moves between
devices per epoch (forward all_to_alls and their transposes, padding included), the minimum
(distinct halo rows per reading device, times the width, both ways) and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import harness


def run_child(path: str, devices: int, parts: int, epochs: int, hidden: int) -> dict:
    import jax
    import optax

    graph = harness.load_npz(path)
    model = harness.gcn(graph.num_features, graph.num_classes, hidden)
    optimizer = optax.adam(0.01)
    if devices == 0:
        from jgrind.train import InMemory
        executor = InMemory(graph, model, optimizer)
    else:
        from jgrind.devices import Sharded
        executor = Sharded(graph, model, optimizer, devices=devices,
                           partitioned=harness.partition(graph, model, parts))
    training = harness.Training(executor, model, optimizer)
    times = [training.epoch(jax.random.key(e))[0] for e in range(epochs + 1)]
    out = {"devices": devices, "epoch_seconds": min(times[1:]), "compile_epoch": times[0],
           "peak_rss_gib": harness.peak_rss() / 2**30}
    if devices:
        out.update(bytes=executor.exchange_bytes_per_epoch,
                   minimum=executor.exchange_minimum_per_epoch,
                   device_partitions=[executor.placement.partitions_of(d)
                                      for d in range(devices)],
                   device_rows=[int(r.size) for r in executor.exchange.rows])
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_source(p, rmat=(1_000_000, 10_000_000))
    harness.add_parts(p, default=8)
    harness.add_hidden(p)
    harness.add_epochs(p, default=3, help="timed epochs per run, after the compiling one")
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    harness.add_json(p)
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # PATH DEVICES
    args = p.parse_args()
    if args.child:
        print(json.dumps(run_child(args.child[0], int(args.child[1]), args.parts, args.epochs,
                                   args.hidden)))
        return

    print(f"# {harness.command()}\n# {harness.machine()}")
    graph = harness.rmat_graph(*args.rmat)
    results = {"nodes": graph.num_nodes, "edges": graph.num_edges, "parts": args.parts,
               "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "graph.npz")
        harness.save_npz(graph, path)
        del graph
        for devices in [0, *args.devices]:
            env = dict(os.environ)
            env["XLA_FLAGS"] = (f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_"
                                f"device_count={max(devices, 1)}").strip()
            cmd = [sys.executable, __file__, "--child", path, str(devices), "--parts",
                   str(args.parts), "--epochs", str(args.epochs), "--hidden", str(args.hidden)]
            what = "in-memory, one device" if devices == 0 else f"{devices} devices"
            got = harness.run_child(cmd, what, env)
            results["runs"].append(got)
            line = f"{what:>22}: epoch {got['epoch_seconds']:.3f} s " \
                   f"(compiling epoch {got['compile_epoch']:.1f} s), peak RSS " \
                   f"{got['peak_rss_gib']:.2f} GiB"
            if devices:
                ratio = got["bytes"] / got["minimum"] if got["minimum"] else 1.0
                line += (f"; exchanged {got['bytes'] / 2**20:.1f} MiB per epoch, minimum "
                         f"{got['minimum'] / 2**20:.1f} MiB ({ratio:.2f}x); rows per device "
                         f"{got['device_rows']}")
            print(line, flush=True)
    harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
