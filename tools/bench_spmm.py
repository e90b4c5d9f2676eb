"""Benchmark of the sparse product ``Y = A @ X`` (and ``A^T @ X``) on CPU.

Times jgrind's backends (native kernel with 1 and 2 threads, jax.experimental.sparse BCSR,
pure-jnp segment_sum) and, when importable, ``torch.sparse.mm`` on a CSR tensor with 2 threads,
on a random ``R x C`` matrix with ``nnz`` uniformly placed entries (sorted CSR, float32 values,
int32 indices for JAX, torch's default int64 for torch). Methods are interleaved within every
repetition so that machine noise hits them alike; the table reports the median.

    python tools/bench_spmm.py                      # 1M x 1M, 10M nnz, F = 47, 128, 256
    python tools/bench_spmm.py --rows 100000 --nnz 1000000 --features 64 --reps 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (beside this file: Python puts tools/ on the path)


def random_csr(rows: int, cols: int, nnz: int, seed: int):
    """Uniformly random positions (duplicates possible, they add up), rows sorted by column."""
    rng = np.random.default_rng(seed)
    r = rng.integers(0, rows, nnz, dtype=np.int64)
    c = rng.integers(0, cols, nnz, dtype=np.int64)
    key = np.sort(r * cols + c)
    r, c = np.divmod(key, cols)
    indptr = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(r, minlength=rows), out=indptr[1:])
    data = rng.random(nnz, dtype=np.float32)
    return indptr, c, data


def available_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return 8 << 30


def main(argv=None) -> int:
    from jgrind.hostio.allocator import relaunch_if_wanted
    relaunch_if_wanted()  # JGRIND_HUGE_PAGES=1: with glibc huge pages, as the jgrind command
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--cols", type=int, default=None, help="default: --rows")
    p.add_argument("--nnz", type=int, default=10_000_000)
    p.add_argument("--features", default="47,128,256")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--segment-reps", type=int, default=1,
                   help="repetitions for the (slow) segment_sum backend")
    p.add_argument("--methods", default="native-1t,native-2t,kernel-2t,bcsr,segment,torch-2t",
                   help="kernel-2t: the native kernel called through ctypes into a preallocated "
                        "output, outside XLA (no output allocation / first-touch page faults)")
    p.add_argument("--seed", type=int, default=0)
    harness.add_json(p)
    args = p.parse_args(argv)
    cols = args.cols or args.rows
    feats = [int(f) for f in args.features.split(",")]
    methods = args.methods.split(",")

    import jax
    import jax.numpy as jnp

    from jgrind import _kernels, sparse

    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"jax {jax.__version__}, load average {os.getloadavg()[0]:.2f}", flush=True)
    native = None
    if any(m.startswith(("native", "kernel")) for m in methods):
        if _kernels.available():
            native = _kernels.load()
            how = f"compiled in {native.compile_seconds:.1f} s" if native.compiled else "cached"
            print(f"# native kernel: {native.isa}, {how} ({native.path})", flush=True)
        else:
            print(f"# native kernel unavailable: {_kernels.unavailable_reason()}", flush=True)
            methods = [m for m in methods if not m.startswith(("native", "kernel"))]
    torch = None
    if "torch-2t" in methods:
        try:
            import torch

            torch.set_num_threads(2)
            print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
        except ImportError:
            methods.remove("torch-2t")

    t0 = time.perf_counter()
    indptr, indices, data = random_csr(args.rows, cols, args.nnz, args.seed)
    adj = sparse.adjacency(indptr, indices, data, cols)
    print(f"# matrix {args.rows} x {cols}, {args.nnz} nnz: built with transpose in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    adj = jax.device_put(adj)
    torch_mats = {}
    if torch is not None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "sparse CSR support is in beta"
            for d, csr in (("A@X", adj.fwd), ("A^T@X", adj.bwd)):
                torch_mats[d] = torch.sparse_csr_tensor(
                    torch.from_numpy(np.asarray(csr.indptr).astype(np.int64)),
                    torch.from_numpy(np.asarray(csr.indices).astype(np.int64)),
                    torch.from_numpy(np.asarray(csr.data)), size=csr.shape)

    def jax_method(backend, threads, transposed):
        def f(a, x):
            return sparse.spmm(a.T if transposed else a, x, backend=backend, num_threads=threads)
        return jax.jit(f)

    results = []
    for F in feats:
        x = jax.device_put(jnp.asarray(
            np.random.default_rng(F).standard_normal((cols, F), dtype=np.float32)))
        for direction in ("A@X", "A^T@X"):
            transposed = direction != "A@X"
            if transposed and args.rows != cols:
                xin = jax.device_put(jnp.asarray(np.random.default_rng(F).standard_normal(
                    (args.rows, F), dtype=np.float32)))
            else:
                xin = x
            runs = {}
            for m in methods:
                if m == "segment" and 1.5 * args.nnz * F * 4 > 0.7 * available_bytes():
                    print(f"# skip segment at F={F}: needs ~{1.5 * args.nnz * F * 4 / 2**30:.0f} GiB",
                          flush=True)
                    continue
                if m == "kernel-2t":
                    csr = adj.bwd if transposed else adj.fwd
                    host = [np.asarray(a) for a in (csr.indptr, csr.indices, csr.data)]
                    x_h = np.asarray(xin)
                    y_h = np.zeros((csr.shape[0], F), np.float32)  # touched once, here
                    runs[m] = (lambda h=host, x_h=x_h, y_h=y_h: native.lib.jgrind_csr_spmm_f32(
                        h[0].ctypes.data, h[1].ctypes.data, h[2].ctypes.data, x_h.ctypes.data,
                        y_h.ctypes.data, y_h.shape[0], x_h.shape[0], F, h[1].size, 2))
                    continue
                if m == "torch-2t":
                    A_t = torch_mats[direction]
                    X_t = torch.from_numpy(np.asarray(xin))
                    runs[m] = (lambda A_t=A_t, X_t=X_t: torch.sparse.mm(A_t, X_t))
                    continue
                backend, threads = {"native-1t": ("native", 1), "native-2t": ("native", 2),
                                    "bcsr": ("bcsr", None), "segment": ("segment", None)}[m]
                fn = jax_method(backend, threads, transposed).lower(adj, xin).compile()
                runs[m] = (lambda fn=fn: jax.block_until_ready(fn(adj, xin)))
            times = {m: [] for m in runs}
            for m, run in runs.items():  # warm-up (page faults, thread pool start)
                if m != "segment":
                    run()
            for rep in range(args.reps):
                for m, run in runs.items():
                    if m == "segment" and rep >= args.segment_reps:
                        continue
                    t = time.perf_counter()
                    run()
                    times[m].append(time.perf_counter() - t)
            row = {"F": F, "product": direction,
                   **{m: float(np.median(ts)) for m, ts in times.items()}}
            results.append(row)
            print("# " + json.dumps(row), flush=True)
        del x

    # table
    cols_ = [m for m in methods if any(m in r for r in results)]
    head = f"| {'F':>4} | {'product':<7} | " + " | ".join(f"{m:>10}" for m in cols_)
    ratio = "native-2t" in cols_ and "torch-2t" in cols_
    if ratio:
        head += " | native-2t / torch-2t"
    print()
    print(f"median of {args.reps} (segment: {args.segment_reps}) in seconds; "
          f"{args.rows} x {cols}, {args.nnz} nnz, load average now "
          f"{os.getloadavg()[0]:.2f}")
    print(head + " |")
    print("|" + "|".join("-" * len(c) for c in (head + " |").split("|")[1:-1]) + "|")
    for r in results:
        line = f"| {r['F']:>4} | {r['product']:<7} | " + " | ".join(
            f"{r[m]:>10.3f}" if m in r else f"{'-':>10}" for m in cols_)
        if ratio:
            line += f" | {r['native-2t'] / r['torch-2t']:>20.2f}"
        print(line + " |")
    harness.write_json(args.json, {"rows": args.rows, "cols": cols, "nnz": args.nnz,
                                   "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
