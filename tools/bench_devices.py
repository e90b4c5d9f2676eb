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

    python tools/bench_devices.py --processes 2 --rmat 200000 2000000

With ``--processes P`` it measures memory instead (issue 38, target 3): the graph saved as a
folder (`jgrind.datasets.save_graph`) with its ``--parts`` label-propagation partitions (the
assignment saved too, as ``jgrind partition --out`` saves it), trained by P local processes
of one device each (`jgrind.devices.processes.launch`), each reading only its own rows of the
folder (`Sharded.from_saved`), beside one process that loads the saved graph and trains it
alone in memory (`jgrind.train.InMemory`). Each prints its
peak resident memory (``ru_maxrss``, `harness.peak_rss`) and epoch time.

    python tools/bench_devices.py --processes 2 --out-of-core

does the same out of core: the processes run `jgrind.devices.ShardedOutOfCore` (each its own
host tier, the halo rows crossing by the collective), the one alone `jgrind.engine.OutOfCore`,
both with the policy a run over several devices takes when none is named (`host_offload`,
aggregations kept on the host: `jgrind.devices.out_of_core.through_host_policy`) and the same
saved partitions, so that the host tiers, not only the graph and the work, are split.
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


def _out_of_core(assignment: str) -> dict:
    """The out-of-core arguments of ``--out-of-core``'s runs (see the module docstring)."""
    from jgrind.datasets.saved_arrays import saved_assignment
    from jgrind.devices.out_of_core import through_host_policy
    return {"policy": through_host_policy(), "store": tempfile.mkdtemp(prefix="bench-devices-"),
            "partitioner": saved_assignment(assignment)}


def run_alone(folder: str, assignment: str, epochs: int, hidden: int,
              out_of_core: bool = False) -> dict:
    """One process: the saved graph loaded whole, trained in memory on one device (out of
    core with ``out_of_core``, on ``assignment``'s partitions)."""
    import jax
    import optax

    from jgrind.datasets.stored import load_saved
    from jgrind.train import InMemory, make_executor
    graph = load_saved(folder)
    model = harness.gcn(graph.num_features, graph.num_classes, hidden)
    optimizer = optax.adam(0.01)
    executor = make_executor(graph, model, optimizer, **_out_of_core(assignment)) \
        if out_of_core else InMemory(graph, model, optimizer)
    training = harness.Training(executor, model, optimizer)
    built = harness.peak_rss()
    times = [training.epoch(jax.random.key(e))[0] for e in range(epochs + 1)]
    out = {"epoch_seconds": min(times[1:]), "compile_epoch": times[0],
           "peak_rss_gib": harness.peak_rss() / 2**30, "built_rss_gib": built / 2**30,
           "loss": float(training.epoch(jax.random.key(epochs + 1))[1])}
    if out_of_core:
        out["peak_host_gib"] = executor.store.accounts.peak_host / 2**30
    return out


def run_local(folder: str, assignment: str, epochs: int, hidden: int, coordinator: str,
              processes: int, process_id: int, out_of_core: bool = False) -> dict:
    """One of ``processes``: its own rows of the saved graph, one device (out of core with
    ``out_of_core``: its own host tier)."""
    from jgrind.devices import processes as joined
    joined.start(coordinator, processes, process_id)
    import jax
    import optax

    from jgrind.datasets.saved_arrays import SavedGraph, saved_assignment
    from jgrind.devices import Sharded
    from jgrind.train import make_executor
    optimizer = optax.adam(0.01)
    meta = json.loads(open(os.path.join(folder, "graph.json")).read())
    model = harness.gcn(meta["num_features"], meta["num_classes"], hidden)
    if out_of_core:
        saved = SavedGraph.open(folder)
        executor = make_executor(saved, model, optimizer, devices=processes,
                                 **_out_of_core(assignment))
    else:
        executor = Sharded.from_saved(folder, model, optimizer, devices=processes,
                                      partitioner=saved_assignment(assignment))
    training = harness.Training(executor, model, optimizer)
    built = harness.peak_rss()
    times = [training.epoch(jax.random.key(e))[0] for e in range(epochs + 1)]
    out = {"process": jax.process_index(), "epoch_seconds": min(times[1:]),
           "compile_epoch": times[0], "peak_rss_gib": harness.peak_rss() / 2**30,
           "built_rss_gib": built / 2**30, "loss": float(training.epoch(
               jax.random.key(epochs + 1))[1])}
    if out_of_core:
        return {**out, "peak_host_gib": executor.store.accounts.peak_host / 2**30,
                "read": dict(saved.saved.read)}
    mine = [d for d, dev in enumerate(executor.devices)
            if dev.process_index == jax.process_index()]
    return {**out, "slot_rows": executor.exchange.slot_rows,
            "rows": int(sum(executor.exchange.rows[d].size for d in mine)),
            "read": executor.graph.saved.read}


def measure_processes(args) -> None:
    """``--processes P``: peak RSS of P processes reading their own rows, beside one alone."""
    import subprocess

    import numpy as np

    from jgrind.datasets import save_graph
    graph = harness.rmat_graph(*args.rmat)
    results = {"nodes": graph.num_nodes, "edges": graph.num_edges, "processes": args.processes,
               "hidden": args.hidden, "parts": args.parts}
    assignment = harness.partition(graph, harness.gcn(graph.num_features, graph.num_classes,
                                                      args.hidden), args.parts).assignment
    common = ["--epochs", str(args.epochs), "--hidden", str(args.hidden)]
    if args.out_of_core:
        common.append("--out-of-core")
        results["out_of_core"] = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(save_graph(graph, os.path.join(tmp, "graph")))
        parts = os.path.join(tmp, "parts.npy")
        np.save(parts, np.asarray(assignment, np.int32))
        del graph, assignment
        env = dict(os.environ)
        env.pop("XLA_FLAGS", None)
        alone = harness.run_child([sys.executable, __file__, "--alone", folder, parts, *common],
                                  "one process alone", env)
        results["alone"] = alone
        how = "out of core" if args.out_of_core else "in memory"
        print(f"{'one process, ' + how:>26}: peak RSS {alone['peak_rss_gib']:.2f} GiB "
              f"({alone['built_rss_gib']:.2f} GiB before the first epoch), epoch "
              f"{alone['epoch_seconds']:.2f} s", flush=True)
        # `jgrind launch`'s library function, in a child whose output (each line prefixed
        # "[I] " by the launcher) is read here
        launched = subprocess.run(
            [sys.executable, __file__, "--launch", folder, parts, str(args.processes), *common],
            capture_output=True, text=True, env=env)
        if launched.returncode != 0:
            raise SystemExit(f"{args.processes} processes failed:\n{launched.stderr[-3000:]}"
                             f"\n{launched.stdout[-3000:]}")
        runs = sorted((json.loads(line.split("] ", 1)[1])
                       for line in launched.stdout.splitlines()
                       if line.startswith("[") and "] {" in line),
                      key=lambda r: r["process"])
        results["local"] = runs
        for r in runs:
            ratio = r["peak_rss_gib"] / alone["peak_rss_gib"]
            print(f"{'process %d of %d, own rows' % (r['process'], args.processes):>26}: peak "
                  f"RSS {r['peak_rss_gib']:.2f} GiB ({ratio:.2f}x one alone; "
                  f"{r['built_rss_gib']:.2f} GiB before the first epoch), epoch "
                  f"{r['epoch_seconds']:.2f} s; "
                  + (f"{r['rows']:,} rows, " if "rows" in r else
                     f"host tier peak {r['peak_host_gib']:.2f} GiB (alone "
                     f"{alone['peak_host_gib']:.2f}), loss {r['loss']:.6f} (alone "
                     f"{alone['loss']:.6f}), ")
                  + f"read {r['read'].get('indices', 0):,} edges and "
                  f"{r['read'].get('features', 0):,} feature rows", flush=True)
    harness.write_json(args.json, results)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_source(p, rmat=(1_000_000, 10_000_000))
    harness.add_parts(p, default=8)
    harness.add_hidden(p)
    harness.add_epochs(p, default=3, help="timed epochs per run, after the compiling one")
    p.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    harness.add_json(p)
    p.add_argument("--processes", type=int, metavar="P",
                   help="measure the peak RSS of P processes each reading its own rows of the "
                   "saved graph, beside one process training it alone")
    p.add_argument("--child", nargs=2, help=argparse.SUPPRESS)  # PATH DEVICES
    p.add_argument("--out-of-core", action="store_true",
                   help="with --processes: train out of core (host tiers split too)")
    p.add_argument("--alone", nargs=2, help=argparse.SUPPRESS)  # FOLDER PARTS
    p.add_argument("--launch", nargs=3, help=argparse.SUPPRESS)  # FOLDER PARTS PROCESSES
    p.add_argument("--local", nargs=2, help=argparse.SUPPRESS)  # FOLDER PARTS
    p.add_argument("--coordinator", help=argparse.SUPPRESS)
    p.add_argument("--num-processes", type=int, help=argparse.SUPPRESS)
    p.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.alone:
        print(json.dumps(run_alone(*args.alone, args.epochs, args.hidden, args.out_of_core)))
        return
    if args.local:
        print(json.dumps(run_local(*args.local, args.epochs, args.hidden, args.coordinator,
                                   args.num_processes, args.process_id, args.out_of_core)),
              flush=True)
        return
    if args.launch:
        from jgrind.devices import processes
        folder, parts, count = args.launch
        raise SystemExit(processes.launch(
            ["--local", folder, parts, "--epochs", str(args.epochs), "--hidden", str(args.hidden)]
            + (["--out-of-core"] if args.out_of_core else []),
            int(count), program=(sys.executable, __file__)))
    if args.processes:
        print(f"# {harness.command()}\n# {harness.machine()}")
        measure_processes(args)
        return
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
