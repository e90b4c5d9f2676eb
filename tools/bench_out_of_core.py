"""Out-of-core benchmarks: what partitioning and offloading cost, and the memory wall.

    python tools/bench_out_of_core.py overhead        # 1M nodes, 10M edges, 4 partitions
    python tools/bench_out_of_core.py overhead --nodes 100000 --edges 1000000   # quick
    python tools/bench_out_of_core.py memory-wall     # 3M nodes, 2 GiB device + 2 GiB host
    python tools/bench_out_of_core.py memory-wall --nodes 200000 --edges 2000000 \\
        --host-budget 64MiB --device-budget 64MiB     # quick

Both train a 3-layer GCN (hidden 256, ReLU, dropout 0.5, Adam) on an R-MAT graph
(`jgrind.generators.rmat`), generated once and saved to a temporary .npz. Every run is its own
subprocess that loads it, so each reports its own peak resident memory (``ru_maxrss``).

``overhead``: median epoch time (after one warm-up epoch) of the in-memory path and of the
out-of-core engine under each built-in policy, all on the same partitioning (computed once), with
the bytes each epoch reads and writes per tier (from the store's accounts), the GriNNder
scheme's analytic minimum next to the SSD run, and the naive scheme (snapshots kept, inputs read
node by node: `jgrind.plan.policies.naive`) against it. Beside the store's accounts it prints the
kernel's I/O counts per epoch (``/proc/self/io``: file bytes passed to calls, and what reached
the storage device); ``--memory-limit`` runs the out-of-core runs in a memory cgroup whose page
cache cannot hold the store's files.

``memory-wall``: a graph whose stored activations and gradients are several times the host
budget, trained with the default budgeted policy; peak RSS against budgets + graph, and PyG
full-batch on the same graph (``--skip-pyg`` to leave it out).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from typing import Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (tools/ is not a package)
from bench_epoch import run_pyg  # noqa: E402
from memory_cgroup import drop_caches, joining, memory_cgroup  # noqa: E402

def partition(partitioners, name: str, graph, parts: int):
    """``name`` from `jgrind.partition.PARTITIONERS` (or ``label_propagation:START``, see
    `bench_partition.partitioner_spec`), seed 0."""
    from bench_partition import partitioner_spec
    partitioner, options = partitioner_spec(name)
    return partitioners[partitioner](graph, parts, seed=0, **options)


RUNS = ("in-memory", "device", "host", "ssd", "recompute", "naive")
# ssd-cache: ssd_offload with the host cache on (GriNNder's host caching). *-keep: the same
# policy keeping every layer's aggregation Z_l in the same tier instead of regathering H_l in
# backward (jgrind.plan.fates.AGGREGATION).
# budgeted: the default policy, grinnder(--device-budget, --host-budget, store), as
# `jgrind train` runs with budgets. pyg: PyG full-batch (GCNConv, cached), on the GPU where
# PyTorch sees one, as the peer in the same run.
OPTIONAL_RUNS = ("ssd-cache", "device-keep", "host-keep", "ssd-keep", "ssd-cache-keep",
                 "budgeted", "pyg")
POLICY_TEXT = {"in-memory": "InMemory (one jitted step)", "device": "in_memory()",
               "host": "host_offload()", "ssd": "ssd_offload(store), host_budget=0",
               "recompute": "recompute_activations()", "naive": "naive(store), host_budget=0",
               "ssd-cache": "ssd_offload(store), host cache on",
               "device-keep": "in_memory(aggregations=DEVICE)",
               "host-keep": "host_offload(aggregations=HOST)",
               "ssd-keep": "ssd_offload(store, aggregations=SSD), host_budget=0",
               "ssd-cache-keep": "ssd_offload(store, aggregations=SSD), host cache on",
               "budgeted": "grinnder(budgets, store) (the default)",
               "pyg": "PyG full-batch (peer)"}
# runs that `overhead --memory-limit` leaves uncapped: they keep the whole graph's activations
UNCAPPED_RUNS = ("in-memory", "pyg")
MOVED = ("ssd_read", "ssd_written", "host_read", "host_written", "ssd_read_ops",
         "ssd_write_ops", "ssd_file_read", "ssd_file_written", "to_device", "to_host")


# -- small helpers -------------------------------------------------------------------------
def memory_now() -> tuple[int, int, int]:
    """Resident bytes now, the peak so far, and the anonymous bytes now."""
    return harness.resident(), harness.peak_rss(), harness.resident("RssAnon")


def window_peak_rss() -> int:
    """Peak RSS since the last call (VmHWM, then reset through /proc/self/clear_refs; Linux
    4.0+); ru_maxrss cannot be reset, so this is how a later epoch's own peak is seen."""
    from jgrind.hostio import host_memory  # called in a child, which has jgrind loaded already
    peak = host_memory.peak_resident()
    host_memory.reset_peak_resident()
    return peak


def fmt(n) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def machine() -> str:
    return f"{harness.machine()} (every run alike)"


def accelerator() -> dict:
    """The JAX device a child ran on and its allocator's peak bytes in use (None on a CPU,
    whose 'device' memory is the process's RAM, counted in the peak RSS)."""
    import jax
    dev = jax.devices()[0]
    stats = dev.memory_stats() if dev.platform != "cpu" else None
    return {"backend": dev.platform, "device_kind": dev.device_kind,
            "jax": jax.__version__,
            "peak_device_bytes": stats.get("peak_bytes_in_use") if stats else None}


def filesystem(path: str) -> str:
    """The device and filesystem type holding ``path`` (from /proc/mounts)."""
    path = os.path.realpath(path)
    best = ("?", "?", "")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, kind = line.split()[:3]
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) \
                        and len(mnt) >= len(best[2]):
                    best = (dev, kind, mnt)
    except OSError:
        pass
    return f"{best[0]} ({best[1]}, mounted at {best[2] or '?'})"


# /proc/self/io, summed over the process's threads: rchar / wchar are the bytes passed to read
# and write calls (a coalesced span's gap rows included), read_bytes / write_bytes what the
# kernel fetched from or sent to the storage device (page cache misses, whole pages; writes
# counted when a page is first dirtied).
KERNEL_IO = {"rchar": "file_read", "wchar": "file_written", "read_bytes": "device_read",
             "write_bytes": "device_written", "syscr": "read_calls"}


def kernel_io() -> dict:
    """This process's I/O counters as the kernel keeps them (`KERNEL_IO`); {} where there is
    no /proc/self/io."""
    try:
        with open("/proc/self/io") as f:
            fields = dict(line.split(":") for line in f if ":" in line)
    except OSError:
        return {}
    return {name: int(fields[k]) for k, name in KERNEL_IO.items() if k in fields}


def load_graph(path: str):
    if path.startswith("npy:"):  # saved by `mapped_copy`: every array a read-only memory map
        from jgrind.datasets import load as load_dataset
        return load_dataset(path)
    return harness.load_npz(path)


def gcn(graph, hidden: int):
    return harness.gcn(graph.num_features, graph.num_classes, hidden)


def save_graph(args, directory: str) -> tuple[str, float]:
    t0 = time.perf_counter()
    if args.graph == "geometric":
        g = geometric(args)
    else:
        g = harness.rmat_graph(args.nodes, args.edges, args.features, args.classes, args.tasks,
                               args.skew)
    seconds = time.perf_counter() - t0
    path = os.path.join(directory, "graph.npz")
    harness.save_npz(g, path)
    return path, seconds


def geometric(args):
    """`bench_partition.geometric_graph` (mesh-like locality, shuffled ids) with seeded
    Gaussian features and uniform random classes: only the epoch's cost is measured on it."""
    from bench_partition import geometric_graph
    if args.tasks:
        raise SystemExit("--graph geometric has single-label classes only (no --tasks)")
    g = geometric_graph(args.nodes, args.edges, 0)
    rng = np.random.default_rng(0)
    n = g.num_nodes
    return g.replace(features=rng.standard_normal((n, args.features), np.float32),
                     labels=rng.integers(0, args.classes, n).astype(np.int32),
                     train_mask=np.ones((1, n), bool), num_classes=args.classes)


def mapped_copy(npz_path: str, directory: str) -> str:
    """The graph at ``npz_path`` saved as a jgrind ``.npy`` folder; its ``npy:`` name."""
    from jgrind.datasets import save_graph
    return "npy:" + str(save_graph(load_graph(npz_path), os.path.join(directory, "graph")))


def child(mode: str, config: dict, rss_cap: int | None = None,
          memory_limit: int | None = None) -> dict:
    """Run ``mode`` in a fresh interpreter; its last stdout line is the JSON result.

    With ``rss_cap``, the child is killed as soon as its resident memory passes the cap: a peer
    that would need more RAM than the machine has must fail cleanly, not wake the OOM killer
    (which may pick another process). With ``memory_limit``, it runs in a memory cgroup of that
    size (`memory_cgroup`), as on a machine with that much RAM."""
    cmd = [sys.executable, os.path.abspath(__file__), "_child", mode, json.dumps(config)]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err, \
            memory_cgroup(memory_limit) as procs:
        # in the cgroup before Python starts (`joining`); the pid stays the child's
        proc = subprocess.Popen(joining(procs, cmd), stdout=out, stderr=err, text=True,
                                env=child_env())
        start, highest, capped = time.perf_counter(), 0, False
        while proc.poll() is None:
            try:
                with open(f"/proc/{proc.pid}/status") as f:
                    rss = next(int(line.split()[1]) * 1024 for line in f
                               if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                rss = 0
            highest = max(highest, rss)
            if rss_cap is not None and rss > rss_cap:
                proc.kill()
                proc.wait()
                capped = True
                break
            time.sleep(0.1)
        seconds = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if capped:
        return {"failed": True, "returncode": proc.returncode, "capped": rss_cap,
                "seconds_to_cap": seconds, "highest_rss_seen": highest,
                "stderr": stderr[-3000:]}
    if proc.returncode != 0:
        return {"failed": True, "returncode": proc.returncode, "stderr": stderr[-3000:],
                "highest_rss_seen": highest}
    return json.loads(stdout.strip().splitlines()[-1])


# The parent generates and partitions on the CPU: JAX's GPU backend, once started, reserves
# most of the card (XLA_PYTHON_CLIENT_PREALLOCATE), and the runs are its children.
_CHILD_PLATFORMS = "JGRIND_BENCH_CHILD_JAX_PLATFORMS"


def keep_parent_off_the_accelerator() -> None:
    os.environ.setdefault(_CHILD_PLATFORMS, os.environ.get("JAX_PLATFORMS", ""))
    os.environ["JAX_PLATFORMS"] = "cpu"


def child_env() -> dict:
    env = dict(os.environ)
    platforms = env.pop(_CHILD_PLATFORMS, None)
    if platforms is not None:
        if platforms:
            env["JAX_PLATFORMS"] = platforms
        else:
            env.pop("JAX_PLATFORMS", None)
    return env


def header(args, extra: str = "") -> list[str]:
    return [f"machine: {machine()}",
            f"command: {shlex.join([os.path.basename(sys.executable)] + sys.argv)}",
            f"graph: {'geometric' if args.graph == 'geometric' else 'R-MAT'}, "
            f"{args.nodes:,} nodes, {args.edges:,} directed edges (asked), "
            f"{args.features} features, "
            f"{f'{args.tasks} binary targets (BCE)' if args.tasks else f'{args.classes} classes'}"
            f"; model: 3-layer GCN, hidden {args.hidden}, dropout 0.5, Adam{extra}"]


# -- overhead ------------------------------------------------------------------------------
def overhead_child(cfg: dict) -> dict:
    import jax
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.partition import partition_graph
    from jgrind.plan import policies
    from jgrind.train import InMemory

    graph = load_graph(cfg["graph"])
    model = gcn(graph, cfg["hidden"])
    optimizer = optax.adam(0.01)
    run, store = cfg["run"], cfg["store"]
    t0 = time.perf_counter()
    info = {}
    if run == "in-memory":
        ex = InMemory(graph, model, optimizer)
    else:
        pg = partition_graph(model.normalize(graph), np.load(cfg["assignment"]),
                             num_parts=cfg["parts"])
        from jgrind.plan import Fate
        keep = {"aggregations": Fate.DEVICE if run == "device-keep" else
                Fate.HOST if run == "host-keep" else Fate.SSD} if run.endswith("-keep") else {}
        base = run.removesuffix("-keep")
        policy = {"device": lambda: policies.in_memory(**keep),
                  "host": lambda: policies.host_offload(**keep),
                  "ssd": lambda: policies.ssd_offload(store, **keep),
                  "ssd-cache": lambda: policies.ssd_offload(store, **keep),
                  "recompute": policies.recompute_activations,
                  "naive": lambda: policies.naive(store),
                  # None: the engine's default, grinnder(device_budget, host_budget, store)
                  "budgeted": lambda: None}[base]()
        host_budget = 0 if base in ("ssd", "naive") else None
        device_budget = None
        if base == "budgeted":
            device_budget, host_budget = cfg["device_budget"], cfg["host_budget"]
        ex = OutOfCore(graph, model, optimizer, policy=policy, partitioned=pg, store=store,
                       device_budget=device_budget, host_budget=host_budget)
        info = {"num_nodes": graph.num_nodes,
                "halo": int(sum(p.num_halo for p in pg.partitions)),
                "widths": ex.widths, "num_layers": ex.num_layers, "local": ex.local,
                "inputs": int(sum(p.num_inputs for p in pg.partitions))}
    prepare = time.perf_counter() - t0
    training = harness.Training(ex, model, optimizer)
    key = jax.random.key(1)
    times, moved, kernel, loss = [], [], [], None
    in_use = harness.DeviceInUse()
    in_use.window()  # from here: the epochs
    device_peaks = []
    for epoch in range(1 + cfg["epochs"]):  # epoch 0 compiles
        if epoch and cfg["drop_caches"]:
            drop_caches()
        before = dataclasses.replace(ex.store.accounts) if run != "in-memory" else None
        io_before = kernel_io()
        seconds, loss = training.epoch(jax.random.fold_in(key, epoch))
        times.append(seconds)
        loss = float(loss)
        io_after = kernel_io()
        kernel.append({k: io_after[k] - io_before[k] for k in io_after})
        if before is not None:
            after = ex.store.accounts
            moved.append({k: getattr(after, k) - getattr(before, k) for k in MOVED})
        device_peaks.append(in_use.window())
    in_use.close()
    result = {"run": run, "epoch_times": times[1:], "warmup_seconds": times[0],
              "prepare_seconds": prepare, "loss": loss, "peak_rss": harness.peak_rss(),
              "moved": moved[1:], "kernel_io": kernel[1:],
              "accelerator": {**accelerator(), "epoch_device_in_use": device_peaks},
              **info}
    if run == "budgeted":
        result["fates"] = fate_counts(ex)
    if run != "in-memory":
        a = ex.store.accounts
        result["peaks"] = {"device": a.peak_device, "host": a.peak_host, "ssd": a.peak_ssd}
        ex.close()
        from jgrind.plan.measure import link_rates
        # the link's rates on this process's device, for the epoch's floor (`report_floor`)
        result["link"] = dict(zip(("to_device", "to_host", "pageable_to_host"), link_rates()))
    return result


def fate_counts(ex) -> dict:
    """How many blocks of each stored tensor got each fate."""
    fates = {}
    for (name, _, _), fate in ex.fates.items():
        fates.setdefault(name, {}).setdefault(fate.value, 0)
        fates[name][fate.value] += 1
    return fates


def pyg_overhead_child(cfg: dict) -> dict:
    r = run_pyg(cfg["graph"], cfg["hidden"], cfg["epochs"])
    return {"run": "pyg", "epoch_times": r["epoch_times"], "warmup_seconds": r["first_epoch"],
            "loss": r["loss"], "peak_rss": r["peak_rss_gib"] * 2**30, "moved": [],
            "accelerator": {"backend": r["device"], "device_kind": r["device"],
                            "torch": r["torch"],
                            "peak_device_bytes": r["peak_device_bytes"]}}


def grinnder_minimum(n: int, halo: int, widths: list, num_layers: int,
                     local: Optional[list] = None) -> dict:
    """Bytes per epoch the regathering scheme needs with every block on SSD (4-byte floats),
    over the engine's executed layers (a narrowing GCN layer is a node-wise transform and a
    propagation, `jgrind.executed.split`).

    H_l (l >= 1) is written once; the forward sweep gathers H_0..H_{L-2} (own + halo rows); the
    backward sweep regathers H_0..H_{L-1} (H_{L-1} only here: the top layer is fused with the
    loss); G_l (l >= 1) receives every partition's own + halo rows once (scatter-add) and is
    read once, own rows, by the layer below. A node-wise layer (``local[l]``) reads only own
    rows of H_l, and writes G_l as blocks (no halo rows, no read-back).
    """
    L, w = num_layers, widths
    local = local or [False] * L
    rows = [n if local[l] else n + halo for l in range(L)]
    parts = {
        "forward gathers": sum(rows[l] * w[l] for l in range(L - 1)),
        "backward regathers": sum(rows[l] * w[l] for l in range(L)),
        "gradient reads": sum(n * w[l] for l in range(1, L)),
        "activation writes": sum(n * w[l] for l in range(1, L)),
        "gradient scatter-adds": sum(rows[l] * w[l] for l in range(1, L)),
    }
    readback = 4 * sum(rows[l] * w[l] for l in range(1, L) if not local[l])
    parts = {k: 4 * v for k, v in parts.items()}
    return {"parts": parts,
            "read": parts["forward gathers"] + parts["backward regathers"]
            + parts["gradient reads"],
            "written": parts["activation writes"] + parts["gradient scatter-adds"],
            # the SSD tier adds to G_l by read-modify-write, so the scatter-adds are read too
            "scatter_add_readback": readback,
            # what `naive` adds: one write of every step input of layers 0..L-2
            "snapshots": 4 * sum(rows[l] * w[l] for l in range(L - 1))}


def overhead(args) -> dict:
    from jgrind.partition import PARTITIONERS

    store = args.store
    os.makedirs(store, exist_ok=True)
    dropping = False
    if args.drop_caches:
        dropping = drop_caches()
        if not dropping:
            print("note: --drop-caches asked for, but /proc/sys/vm/drop_caches is not "
                  "writable here; running without it", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        path, gen_seconds = save_graph(args, tmp)
        graph = load_graph(path)
        normalized = gcn(graph, args.hidden).normalize(graph)
        t0 = time.perf_counter()
        assignment = partition(PARTITIONERS, args.partitioner, normalized, args.parts)
        part_seconds = time.perf_counter() - t0
        del graph, normalized
        apath = os.path.join(tmp, "assignment.npy")
        np.save(apath, assignment)
        results = {"graph": {"nodes": args.nodes, "edges": args.edges,
                             "features": args.features, "classes": args.classes,
                             "generate_seconds": gen_seconds},
                   "parts": args.parts, "partitioner": args.partitioner,
                   "partition_seconds": part_seconds, "epochs": args.epochs,
                   "store": store, "drop_caches": dropping, "runs": {}}
        results["memory_limit"] = args.memory_limit
        for run in args.runs:
            print(f"running {run} ...", file=sys.stderr, flush=True)
            # the whole-graph runs hold every activation by design: the cap is for the others
            limit = None if run in UNCAPPED_RUNS else args.memory_limit
            if limit:  # each run's cgroup is charged for the pages it caches
                drop_caches()
            results["runs"][run] = child("pyg-overhead" if run == "pyg" else "overhead", {
                "graph": path, "assignment": apath, "run": run, "parts": args.parts,
                "epochs": args.epochs, "hidden": args.hidden, "store": store,
                "drop_caches": dropping, "device_budget": args.device_budget,
                "host_budget": args.host_budget}, memory_limit=limit)
            print(f"  {run}: {run_summary(results['runs'][run])}", file=sys.stderr,
                  flush=True)
    if any("link" in v for v in results["runs"].values()):
        from jgrind.plan.measure import ssd_rates
        results["ssd_rates"] = dict(zip(("read", "write"), ssd_rates(store)))
    report_overhead(results, args)
    return results


def run_summary(v: dict) -> str:
    """One line per finished run, printed at once: a long benchmark that is stopped early
    still shows what it measured."""
    if v.get("failed"):
        return f"failed (rc {v['returncode']}): {v.get('stderr', '')[-300:]!r}"
    acc = v.get("accelerator") or {}
    return (f"epochs {' '.join(f'{t:.3f}' for t in v['epoch_times'])} s (warm-up "
            f"{v.get('warmup_seconds', 0):.1f} s), loss {v['loss']:.4f}, peak RSS "
            f"{fmt(v['peak_rss'])}, peak device {fmt(acc.get('peak_device_bytes'))}"
            + in_use_text(acc))


def in_use_text(acc: dict) -> str:
    """The most device memory in use within each epoch, where the allocator was sampled."""
    sampled = acc.get("epoch_device_in_use") or []
    if not any(s is not None for s in sampled):
        return ""
    return " (most in use per epoch, sampled: " + ", ".join(fmt(s) for s in sampled) + ")"


def last_kernel_io(v: dict) -> Optional[dict]:
    io = v.get("kernel_io")
    return io[-1] if io and io[-1] else None


def report_kernel_io(runs: dict) -> None:
    """Per run, the last timed epoch's I/O as the kernel counted it (`kernel_io`): what the
    store asked of its files, and what reached the storage device past the page cache; beside
    it the store's own count of its file bytes (rows used plus coalesced gaps)."""
    def store_file(v, k):
        m = v["moved"][-1] if v.get("moved") else None
        return fmt(m[k]) if m and k in m else "-"
    rows = [(name, store_file(v, "ssd_file_read"), store_file(v, "ssd_file_written"),
             fmt(io["file_read"]), fmt(io["file_written"]), f"{io['read_calls']:,}",
             fmt(io["device_read"]), fmt(io["device_written"]))
            for name, v in runs.items() if not v.get("failed")
            for io in [last_kernel_io(v)] if io]
    if not rows:
        return
    print()
    print("SSD file I/O per epoch: the store's count of the bytes its read / write calls passed "
          "(rows used plus the gap rows of coalesced spans), and the kernel's "
          "(/proc/self/io, all threads: file bytes passed to read / write calls, and bytes the "
          "storage device read / was sent)")
    cols = ("run", "store: file read", "file written", "kernel: file read", "file written",
            "read calls", "device read", "device written")
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    for row in (cols, *rows):
        print("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())


def floor_terms(v: dict, compute: Optional[float], ssd: dict) -> dict:
    """The seconds an out-of-core run's epoch cannot go under: its compute (the in-memory
    epoch of the same run), the bytes it sent over the link each way at the link's rate from
    and to page-locked memory (the two directions run at once), and its SSD file bytes at the
    disk's sequential rates (reads and writes share the disk)."""
    m, link = v["moved"][-1], v["link"]
    terms = {"compute": compute,
             "to device": m["to_device"] / link["to_device"],
             "to host": m["to_host"] / link["to_host"],
             "SSD": m["ssd_file_read"] / ssd["read"] + m["ssd_file_written"] / ssd["write"]}
    terms["floor"] = max(t for t in terms.values() if t is not None)
    return terms


def report_floor(r: dict, compute: Optional[float]) -> None:
    """Each out-of-core run's floor (`floor_terms`) and its median epoch over it."""
    runs = {k: v for k, v in r["runs"].items() if not v.get("failed") and v.get("link")}
    if not runs:
        return
    ssd = r["ssd_rates"]
    print()
    link = next(iter(runs.values()))["link"]
    print(f"floor: max(compute = the in-memory epoch, bytes to the device / "
          f"{link['to_device'] / 1e9:.2f} GB/s, bytes to the host / {link['to_host'] / 1e9:.2f} "
          f"GB/s (the link from and to pinned host memory), SSD file bytes at "
          f"{ssd['read'] / 1e9:.2f} GB/s read + {ssd['write'] / 1e9:.2f} GB/s written)"
          + ("" if compute else "; no in-memory run here, so no compute term"))
    cols = ("run", "epoch s", "floor s", "x floor", "compute s", "to device", "s", "to host",
            "s", "SSD s")
    rows = []
    for name, v in runs.items():
        t, m = float(np.median(v["epoch_times"])), v["moved"][-1]
        f = floor_terms(v, compute, ssd)
        rows.append((name, f"{t:.3f}", f"{f['floor']:.3f}", f"{t / f['floor']:.2f}",
                     f"{compute:.3f}" if compute else "-", fmt(m["to_device"]),
                     f"{f['to device']:.3f}", fmt(m["to_host"]), f"{f['to host']:.3f}",
                     f"{f['SSD']:.3f}"))
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    for row in (cols, *rows):
        print("  " + "  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
    print("  (the SSD term prices file bytes at the disk's rates: where the page cache serves "
          "them, without --drop-caches, an epoch can go under it"
          + ("" if any(v.get("accelerator", {}).get("peak_device_bytes") for v in runs.values())
             else "; with no accelerator there is no link, and its terms time host copies")
          + ")")


def report_overhead(r: dict, args) -> None:
    med = lambda xs: float(np.median(xs))  # noqa: E731
    runs = r["runs"]
    for line in header(args, f"; {r['parts']} partitions ({r['partitioner']}, "
                       f"{r['partition_seconds']:.1f} s, once for every run)"):
        print(line)
    print(f"store: {r['store']} on {filesystem(r['store'])}")
    ooc = next((v for v in runs.values() if "halo" in v), None)
    if ooc is not None:
        ratio = ooc["halo"] / ooc["num_nodes"]
        print(f"halo rows: {ooc['halo']:,} over all partitions ({ratio:.2f} x N); layer input "
              f"widths {ooc['widths'][:-1]}")
    print(f"median of {r['epochs']} epochs after one warm-up epoch; bytes are per epoch "
          "(store accounts, last timed epoch)")
    print()
    base_times = runs.get("in-memory", {}).get("epoch_times")
    base = med(base_times) if base_times else None
    # the in-memory run's fastest epoch: the hardest baseline. Under heap reuse
    # (JGRIND_REUSE_HEAP=1) the whole-graph step's heap can fragment and grow over several
    # epochs, faulting fresh pages again, so its median may not be a settled epoch.
    best = min(base_times) if base_times else None
    cols = ("run", "policy", "epoch s", "x in-mem", "x best in-mem", "epochs s", "SSD read",
            "SSD written", "host read", "host written", "SSD read calls", "peak RSS",
            "peak GPU")
    rows = []
    for name, v in runs.items():
        if v.get("failed"):
            oom = " OOM-killed" if r.get("memory_limit") and v["returncode"] == -9 else ""
            rows.append((name, POLICY_TEXT[name], f"failed (rc {v['returncode']}{oom})")
                        + ("",) * 10)
            continue
        t = med(v["epoch_times"])
        m = v["moved"][-1] if v.get("moved") else None
        get = lambda k: fmt(m[k]) if m else "-"  # noqa: E731
        rows.append((name, POLICY_TEXT[name], f"{t:.3f}",
                     f"{t / base:.2f}" if base else "-", f"{t / best:.2f}" if best else "-",
                     " ".join(f"{x:.2f}" for x in v["epoch_times"]),
                     get("ssd_read"), get("ssd_written"),
                     get("host_read"), get("host_written"),
                     f"{m['ssd_read_ops']:,}" if m else "-", fmt(v["peak_rss"]),
                     fmt(v.get("accelerator", {}).get("peak_device_bytes"))))
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows)]
    for row in (cols, *rows):
        print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
    on_gpu = any(v.get("accelerator", {}).get("peak_device_bytes") for v in runs.values())
    where = ("the device is the GPU; peak GPU: the allocator's peak bytes in use"
             if on_gpu else "on this machine the 'device' is host RAM owned by JAX")
    print(f"(the device tier's moves are not counted: {where}; x best in-mem: this run's "
          "median epoch over the in-memory run's fastest)")
    report_kernel_io(runs)
    report_floor(r, base)
    for name, v in runs.items():
        if v.get("fates"):
            print(f"{name} fates (blocks): {v['fates']}; budgets: device "
                  f"{fmt(args.device_budget)}, host {fmt(args.host_budget)}")
    for name, v in runs.items():
        if v.get("failed"):
            print(f"{name} failed:\n{v.get('stderr', '')[-1500:]}")

    ssd = runs.get("ssd")
    if ssd and not ssd.get("failed"):
        mn = grinnder_minimum(ssd["num_nodes"], ssd["halo"], ssd["widths"], ssd["num_layers"],
                              ssd.get("local"))
        m = ssd["moved"][-1]
        print()
        print("GriNNder scheme, minimum per epoch with every block on SSD (the top layer is "
              "fused with the loss, so H_{L-1} is gathered once; node-wise layers read and "
              "write own rows only):")
        p = mn["parts"]
        print(f"  read    {fmt(mn['read']):>10} = forward gathers {fmt(p['forward gathers'])} "
              f"+ backward regathers {fmt(p['backward regathers'])} + gradient reads "
              f"{fmt(p['gradient reads'])}")
        print(f"  written {fmt(mn['written']):>10} = activations {fmt(p['activation writes'])} "
              f"+ gradient scatter-adds and block writes {fmt(p['gradient scatter-adds'])}")
        print(f"  ssd measured: read {fmt(m['ssd_read'])}, written {fmt(m['ssd_written'])}; "
              f"measured - minimum: read {fmt(m['ssd_read'] - mn['read'])} (the scatter-adds "
              f"read back what G already holds: read-modify-write on SSD, at most "
              f"{fmt(mn['scatter_add_readback'])}), written "
              f"{fmt(m['ssd_written'] - mn['written'])}")
    naive = runs.get("naive")
    if ssd and naive and not ssd.get("failed") and not naive.get("failed"):
        a, b = ssd["moved"][-1], naive["moved"][-1]
        tot_a = a["ssd_read"] + a["ssd_written"]
        tot_b = b["ssd_read"] + b["ssd_written"]
        print()
        print(f"naive / ssd: bytes moved {fmt(tot_b)} / {fmt(tot_a)} = {tot_b / tot_a:.2f}x; "
              f"SSD read calls {b['ssd_read_ops']:,} / {a['ssd_read_ops']:,} = "
              f"{b['ssd_read_ops'] / max(a['ssd_read_ops'], 1):.1f}x; epoch time "
              f"{med(naive['epoch_times']):.3f} / {med(ssd['epoch_times']):.3f} s = "
              f"{med(naive['epoch_times']) / med(ssd['epoch_times']):.2f}x")
        print(f"  naive writes every step input of layers 0..L-2 once more (snapshots, "
              f"{fmt(mn['snapshots'])}); reading them back replaces the regather byte for "
              "byte, and its gathers read SSD rows one call per row")
        ka, kb = last_kernel_io(ssd), last_kernel_io(naive)
        if ka and kb:
            for what, (rd, wr) in (("file bytes read + written (read/write calls)",
                                    ("file_read", "file_written")),
                                   ("storage device bytes read + written",
                                    ("device_read", "device_written"))):
                tot_a, tot_b = ka[rd] + ka[wr], kb[rd] + kb[wr]
                ratio = f"{tot_b / tot_a:.2f}x" if tot_a else "-"
                print(f"  as the kernel counted them, {what}: {fmt(tot_b)} / {fmt(tot_a)} = "
                      f"{ratio} (read {fmt(kb[rd])} / {fmt(ka[rd])}, written "
                      f"{fmt(kb[wr])} / {fmt(ka[wr])})")
    cached = runs.get("ssd-cache")
    if cached and naive and not cached.get("failed") and not naive.get("failed"):
        a, b = cached["moved"][-1], naive["moved"][-1]
        tot_a, tot_b = a["ssd_read"] + a["ssd_written"], b["ssd_read"] + b["ssd_written"]
        print()
        print(f"naive / ssd-cache (regathers served by the host cache): SSD bytes moved "
              f"{fmt(tot_b)} / {fmt(tot_a)} = {tot_b / max(tot_a, 1):.2f}x; epoch time "
              f"{med(naive['epoch_times']) / med(cached['epoch_times']):.2f}x")
    print()
    print("notes:")
    if r.get("memory_limit"):
        capped = [name for name in runs if name not in UNCAPPED_RUNS]
        free = [name for name in runs if name in UNCAPPED_RUNS]
        print(f"  - {', '.join(capped)} ran in a memory cgroup of {fmt(r['memory_limit'])}, "
              "page cache included (the page cache was dropped before each run)"
              + (f"; {', '.join(free)} ran without it (a whole-graph run holds every "
                 "activation)" if free else ""))
    print("  - ssd and naive run with host_budget=0: the host cache in front of the SSD tier "
          "is off, so every read of an SSD block goes to the file")
    if r["drop_caches"]:
        print("  - the OS page cache was dropped (sync; echo 3 > /proc/sys/vm/drop_caches) "
              "before each timed epoch; data written during an epoch is still read back "
              "from the page cache within it")
    elif r.get("memory_limit"):
        print("  - the OS page cache serves file reads within what the cgroup leaves of it; "
              "the rest come from the storage device (the kernel's device counts)")
    else:
        print("  - the OS page cache still serves file reads (the files fit in RAM here); "
              "--drop-caches drops it before each timed epoch, --memory-limit caps it")


# -- memory wall ---------------------------------------------------------------------------
def structure_bytes(*arrays) -> int:
    return int(sum(np.asarray(a).nbytes for a in arrays if a is not None))


def wall_child(cfg: dict) -> dict:
    import jax
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.partition import PARTITIONERS, partition_graph

    stages = {}
    graph = load_graph(cfg["graph"])
    stages["graph loaded"] = memory_now()
    model = gcn(graph, cfg["hidden"])
    normalized = model.normalize(graph)
    t0 = time.perf_counter()
    assignment = partition(PARTITIONERS, cfg["partitioner"], normalized, cfg["parts"])
    part_seconds = time.perf_counter() - t0
    pg = partition_graph(normalized, assignment, num_parts=cfg["parts"])
    stages["partitioned"] = memory_now()
    optimizer = optax.adam(0.01)
    ex = OutOfCore(graph, model, optimizer, partitioned=pg, store=cfg["store"],
                   device_budget=cfg["device_budget"], host_budget=cfg["host_budget"])
    stages["engine built"] = memory_now()
    window_peak_rss()
    epoch_peaks = []
    training = harness.Training(ex, model, optimizer)
    times = []
    in_use = harness.DeviceInUse()
    in_use.window()  # from here: the epochs
    device_peaks = []
    for epoch in range(cfg["epochs"]):
        seconds, loss = training.epoch(jax.random.key(epoch))
        times.append(seconds)
        loss = float(loss)
        epoch_peaks.append(window_peak_rss())
        device_peaks.append(in_use.window())
        stages[f"after epoch {epoch}"] = (harness.resident(), epoch_peaks[-1],
                                          harness.resident("RssAnon"))
    a = ex.store.accounts
    inv = ex.inventory
    fates = fate_counts(ex)
    partitions = sum(structure_bytes(p.owned, p.halo, p.halo_owner, p.halo_row, p.indptr,
                                     p.indices, p.weight) for p in pg.partitions)
    padded = sum(p.nbytes() + structure_bytes(p.labels, p.weights, p.owned, p.halo_owner,
                                              p.halo_row) for p in ex.parts)
    result = {
        # resetting VmHWM also resets ru_maxrss, so the run's peak is the largest window's
        "epoch_times": times, "loss": loss, "stages": stages,
        "peak_rss": max([harness.peak_rss(), *epoch_peaks, *(v[1] for v in stages.values())]),
        "epoch_peak_rss": epoch_peaks,
        "partition_seconds": part_seconds,
        "graph_bytes": {"raw graph": graph.nbytes(),
                        "normalised structure": structure_bytes(
                            normalized.indptr, normalized.indices, normalized.edge_weight),
                        "partitions": partitions, "padded blocks": padded},
        "inventory": {"activations": sum(i.nbytes for i in inv if i.name == "activation"),
                      "gradients": sum(i.nbytes for i in inv if i.name == "gradient")},
        "fates": fates,
        "plan": dataclasses.asdict(ex.memory),
        "peaks": {"device": a.peak_device, "host": a.peak_host, "ssd": a.peak_ssd},
        "moved_total": {k: getattr(a, k) for k in MOVED},
        "routes_bytes": ex.store.routes.nbytes,
        "accelerator": {**accelerator(), "epoch_device_in_use": device_peaks},
    }
    in_use.close()
    ex.close()
    return result


def pyg_child(cfg: dict) -> dict:
    r = run_pyg(cfg["graph"], cfg["hidden"], 0)  # one epoch (it builds the cached norm)
    return {"epoch_seconds": r["first_epoch"], "peak_rss": r["peak_rss_gib"] * 2**30,
            "loss": r["loss"], "torch": r["torch"], "threads": r["threads"],
            "device": r["device"], "peak_device_bytes": r["peak_device_bytes"]}


def memory_wall(args) -> dict:
    os.makedirs(args.store, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path, gen_seconds = save_graph(args, tmp)
        cfg = {"graph": mapped_copy(path, tmp) if args.mapped else path,
               "hidden": args.hidden, "parts": args.parts, "partitioner": args.partitioner,
               "store": args.store, "device_budget": args.device_budget,
               "host_budget": args.host_budget, "epochs": args.epochs}
        if args.memory_limit:  # page cache is charged to whoever reads a page first: with
            # the graph's files still cached from writing them, the child's cgroup would not
            # be charged for the pages it maps (nor for the libraries the parent loaded)
            drop_caches()
        print("running jgrind ...", file=sys.stderr, flush=True)
        results = {"graph": {"nodes": args.nodes, "edges": args.edges,
                             "features": args.features, "classes": args.classes,
                             "generate_seconds": gen_seconds},
                   "config": cfg,
                   "jgrind": child("wall", cfg, memory_limit=args.memory_limit)}
        if not args.skip_pyg:
            print("running PyG ...", file=sys.stderr, flush=True)
            results["pyg"] = child("pyg", {"graph": path, "hidden": args.hidden},
                                   rss_cap=args.pyg_rss_cap)
    report_wall(results, args)
    return results


def report_wall(r: dict, args) -> None:
    cfg, j = r["config"], r["jgrind"]
    for line in header(args, f"; {cfg['parts']} partitions ({cfg['partitioner']})"):
        print(line)
    print(f"store: {cfg['store']} on {filesystem(cfg['store'])}")
    dev, host = cfg["device_budget"], cfg["host_budget"]
    acc = j.get("accelerator") or {}
    where = (f"the {acc['device_kind']}" if acc.get("peak_device_bytes") is not None else
             "on this machine the 'device' is host RAM owned by JAX")
    print(f"budgets: device {fmt(dev)} ({where}), host {fmt(host)}; policy: "
          "grinnder(device, host, store) (the default)")
    print("graph: " + ("memory-mapped from a saved .npy folder (--mapped)" if args.mapped
                       else "loaded into memory") + "; memory limit: "
          + (f"{fmt(args.memory_limit)} (a cgroup: page cache counted)" if args.memory_limit
             else "none"))
    if j.get("failed"):
        killed = " (SIGKILL: over --memory-limit, the OOM killer)" \
            if args.memory_limit and j["returncode"] == -9 else ""
        print(f"jgrind failed (rc {j['returncode']}){killed}; highest RSS seen "
              f"{fmt(j.get('highest_rss_seen'))}:\n{j['stderr']}")
    else:
        report_wall_jgrind(j, dev, host, mapped=args.mapped)
    q = r.get("pyg")
    if q is None:
        print("PyG full-batch: skipped (--skip-pyg)")
    elif q.get("capped"):
        print(f"PyG full-batch (1 epoch): resident memory passed the {fmt(q['capped'])} cap "
              f"after {q['seconds_to_cap']:.1f} s and was stopped, before finishing one epoch "
              f"(highest RSS seen {fmt(q['highest_rss_seen'])}; machine RAM "
              f"{fmt(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))})")
    elif q.get("failed"):
        why = "killed: out of memory?" if q["returncode"] in (-9, 137) else "failed"
        print(f"PyG full-batch (1 epoch): {why} (rc {q['returncode']})\n"
              f"{q['stderr'][-800:]}")
    else:
        ratio = "" if j.get("failed") else f" ({q['peak_rss'] / j['peak_rss']:.1f}x jgrind's)"
        gpu = (f", on {q['device']}, peak GPU memory {fmt(q['peak_device_bytes'])}"
               if q.get("peak_device_bytes") is not None else "")
        print(f"PyG {q['torch']} full-batch (1 epoch, {q['threads']} threads{gpu}): "
              f"{q['epoch_seconds']:.1f} s, peak RSS {fmt(q['peak_rss'])}{ratio}")
    print("note: the SSD tier uses pread/pwrite, not mmap, so its files' pages in the OS page "
          "cache are not part of the RSS")


def report_wall_jgrind(j: dict, dev: int, host: int, mapped: bool = False) -> None:
    inv = j["inventory"]
    total = inv["activations"] + inv["gradients"]
    print(f"stored tensors (inventory): activations {fmt(inv['activations'])} + gradients "
          f"{fmt(inv['gradients'])} = {fmt(total)} = {total / host:.1f}x the host budget, "
          f"{total / (host + dev):.1f}x both budgets")
    print(f"fates (blocks): {j['fates']}")
    p = j["plan"]
    print(f"plan: device tables {fmt(p['device_tables'])} + working set "
          f"{fmt(p['device_working_set'])}; host tables {fmt(p['host_tables'])} + transient "
          f"{fmt(p['host_transient'])}; SSD {fmt(p['ssd'])}")
    pk = j["peaks"]
    print(f"store peaks: device {fmt(pk['device'])}, host {fmt(pk['host'])} (tables + host "
          f"cache), SSD {fmt(pk['ssd'])}")
    gb = j["graph_bytes"]
    graph = sum(gb.values())
    where = ("(the raw graph memory-mapped: page cache, which the RSS counts once touched)"
             if mapped else "in RAM")
    print(f"graph {where}: {fmt(graph)} = "
          + " + ".join(f"{k} {fmt(v)}" for k, v in gb.items()))
    mv = j["moved_total"]
    print(f"moved over {len(j['epoch_times'])} epochs: SSD read {fmt(mv['ssd_read'])}, written "
          f"{fmt(mv['ssd_written'])}; host read {fmt(mv['host_read'])}, written "
          f"{fmt(mv['host_written'])}")
    print()
    times = ", ".join(f"{t:.1f}" for t in j["epoch_times"])
    print(f"jgrind: epochs {times} s (the first compiles), final loss {j['loss']:.4f}, "
          f"peak RSS {fmt(j['peak_rss'])}")
    acc = j.get("accelerator") or {}
    if acc.get("peak_device_bytes") is not None:
        print(f"  on {acc['device_kind']} (JAX {acc['jax']}): peak GPU memory in use "
              f"{fmt(acc['peak_device_bytes'])} against the device budget {fmt(dev)}")
        sampled = acc.get("epoch_device_in_use") or []
        if any(s is not None for s in sampled):
            print("  most GPU memory in use within each epoch (sampled every 2 ms): "
                  + ", ".join(fmt(s) for s in sampled) + " (the first includes compilation)")
    print("  RSS by stage: " + ", ".join(f"{k} {fmt(v[0])}" for k, v in j["stages"].items()))
    print("  of which anonymous (not file pages, which the kernel can drop): "
          + ", ".join(f"{k} {fmt(v[2])}" for k, v in j["stages"].items() if len(v) > 2))
    print("  peak RSS within each epoch: " + ", ".join(fmt(v) for v in j["epoch_peak_rss"])
          + " (the first includes compilation)")
    for what, rss in (("whole run", j["peak_rss"]), ("last epoch", j["epoch_peak_rss"][-1])):
        print(f"  constant ({what}): peak RSS - budgets - graph = {fmt(rss - dev - host - graph)}"
              f"; peak RSS - store peaks (device + host) - graph = "
              f"{fmt(rss - pk['device'] - pk['host'] - graph)}")
    print("  (the constant: JAX/XLA runtime and compiled steps, one partition's working set and "
          "the next one's prefetched inputs, I/O buffers, the store's routes: "
          f"{fmt(j.get('routes_bytes', 0))})")


# -- driver --------------------------------------------------------------------------------
def main():
    from jgrind.hostio.allocator import relaunch_if_wanted
    relaunch_if_wanted()  # JGRIND_HUGE_PAGES=1: with glibc huge pages, as the jgrind command
    if len(sys.argv) >= 2 and sys.argv[1] == "_child":
        fn = {"overhead": overhead_child, "wall": wall_child, "pyg": pyg_child,
              "pyg-overhead": pyg_overhead_child}[sys.argv[2]]
        print(json.dumps(fn(json.loads(sys.argv[3]))))
        return
    keep_parent_off_the_accelerator()
    from jgrind.config import parse_bytes

    default_store = os.environ.get("JGRIND_STORE", os.path.join(tempfile.gettempdir(),
                                                                "jgrind-bench-store"))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)

    def common(s, nodes, edges, parts, partitioner, epochs):
        harness.add_graph_size(s, nodes=nodes, edges=edges)
        s.add_argument("--graph", choices=["rmat", "geometric"], default="rmat",
                       help="R-MAT (power law, no locality), or a random geometric graph "
                            "(mesh-like locality; random features and classes)")
        harness.add_hidden(s)
        harness.add_parts(s, default=parts)
        s.add_argument("--partitioner", default=partitioner,
                       help="contiguous, random, label_propagation, metis; "
                       "label_propagation:START runs it with init=START (e.g. clusters, "
                       "the single-level start), label_propagation:edge_imbalance=2.5 with "
                       "that option")
        harness.add_epochs(s, epochs)
        harness.add_store(s, default_store, help="SSD tier directory (default $JGRIND_STORE or "
                                                 "a directory in /tmp)")
        harness.add_json(s)

    o = sub.add_parser("overhead", help="epoch time and bytes moved per policy")
    common(o, 1_000_000, 10_000_000, 4, "label_propagation", 3)
    o.add_argument("--runs", default=",".join(RUNS),
                   help=f"comma-separated subset of {','.join(RUNS)}; also "
                   f"{','.join(OPTIONAL_RUNS)}")
    o.add_argument("--drop-caches", action="store_true",
                   help="drop the OS page cache before each timed epoch (needs root)")
    o.add_argument("--memory-limit", default=None,
                   help="run every out-of-core run in a memory cgroup of this size (e.g. "
                   "4GiB; needs root), page cache included: files larger than what is left of "
                   "it are read from the storage device, as the kernel's counts then show. "
                   f"{' and '.join(UNCAPPED_RUNS)} run uncapped (they hold every activation)")
    harness.add_budgets(o, help="the budgeted run's budget (e.g. 8GiB)")
    w = sub.add_parser("memory-wall", help="peak RSS against budgets, and PyG")
    common(w, 3_000_000, 30_000_000, 16, "contiguous", 2)
    harness.add_budgets(w, defaults=("2GiB", "2GiB"))
    w.add_argument("--skip-pyg", action="store_true")
    w.add_argument("--memory-limit", default=None,
                   help="run jgrind in a memory cgroup of this size (e.g. 5GiB; needs root): "
                   "as on a machine with that much RAM, page cache included")
    w.add_argument("--mapped", action="store_true",
                   help="jgrind reads the graph memory-mapped from a saved .npy folder "
                   "(`jgrind convert`, `npy:`) instead of loading it into memory")
    w.add_argument("--pyg-rss-cap", default="20GiB",
                   help="stop PyG when its resident memory passes this (default 20GiB), so a "
                   "peer that needs more RAM than the machine has fails cleanly")
    args = p.parse_args()
    if args.command == "overhead":
        args.runs = [r for r in args.runs.split(",") if r]
        unknown = set(args.runs) - set(RUNS) - set(OPTIONAL_RUNS)
        if unknown:
            p.error(f"unknown runs {sorted(unknown)}; choose from {RUNS + OPTIONAL_RUNS}")
        args.memory_limit = parse_bytes(args.memory_limit) if args.memory_limit else None
        if "budgeted" in args.runs and (args.device_budget is None
                                        or args.host_budget is None):
            p.error("the budgeted run needs --device-budget and --host-budget")
        results = overhead(args)
    else:
        args.pyg_rss_cap = parse_bytes(args.pyg_rss_cap)
        args.memory_limit = parse_bytes(args.memory_limit) if args.memory_limit else None
        results = memory_wall(args)
    results["command"] = harness.command()
    results["machine"] = machine()
    harness.write_json(args.json, results)


if __name__ == "__main__":
    main()
