"""Host <-> device transfers and host row moves, each alone: the rates an out-of-core epoch's
floor is made of, and which of JAX's ways of moving a step's rows is cheapest.

    python tools/bench_transfers.py                 # 128 MiB blocks, 5 repeats, median
    python tools/bench_transfers.py --rows 131072 --width 256 --repeats 7

Prints one line per measurement: seconds (median), GB/s, and for the device-to-host paths the
time the *calling thread* is held (what the engine's main or writer thread pays) apart from
the time until the rows are on the host. Measured:
- host-to-device from pageable NumPy memory (`jax.device_put`), and from a ``pinned_host``
  array (JAX's page-locked host memory kind);
- device-to-host: ``np.asarray`` alone; ``copy_to_host_async()`` (its call, then the wait);
  the same on an output already finished (so the call's own cost shows apart from the step);
  `jax.device_put` to ``pinned_host``, then ``np.asarray`` of that; a jitted step whose output
  is placed in ``pinned_host`` by XLA;
- host memory: a fresh NumPy array's first touch, a copy into touched memory, and
  `jgrind.hostio.rows.take_rows` / `add_rows` of scattered rows on 1, 4, 8 and 16 threads.
On the CPU backend the transfers are host copies (or none); the lines still print.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=131072)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--table-rows", type=int, default=1_000_000,
                   help="rows of the host table the row moves read")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()

    import jax
    from jax.sharding import SingleDeviceSharding

    from jgrind.hostio import rows

    dev = jax.devices()[0]
    kinds = [m.kind for m in dev.addressable_memories()]
    print(f"device {dev.device_kind} ({jax.default_backend()}), memory kinds {kinds}")
    shape = (args.rows, args.width)
    nbytes = args.rows * args.width * 4
    rng = np.random.default_rng(0)
    host = rng.standard_normal(shape, dtype=np.float32)
    pinned = SingleDeviceSharding(dev, memory_kind="pinned_host") if "pinned_host" in kinds \
        else None
    on_device = SingleDeviceSharding(dev)

    def line(name: str, seconds: list, held: list | None = None, size: int = nbytes) -> None:
        s = statistics.median(seconds)
        extra = f"; caller held {statistics.median(held) * 1e3:8.2f} ms" if held else ""
        print(f"  {name:<58} {s * 1e3:8.2f} ms {size / s / 1e9:7.2f} GB/s{extra}")

    def timed(fn, repeats=args.repeats):
        fn()  # warm-up: compiles, allocator pools
        out = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return out

    print(f"block {shape} float32 = {nbytes / 2**20:.0f} MiB; median of {args.repeats}")
    print("host to device:")
    line("device_put(pageable NumPy)", timed(lambda: jax.device_put(host).block_until_ready()))
    if pinned is not None:
        src = jax.device_put(host, pinned)
        line("device_put(pinned_host array)",
             timed(lambda: jax.device_put(src, on_device).block_until_ready()))

    step = jax.jit(lambda x: x * 1.5 + 1.0)
    x = jax.device_put(host)

    def fresh():  # a finished step output the host has not seen yet
        y = step(x)
        y.block_until_ready()
        return y

    print("device to host (each from a fresh step output):")
    d2h = []
    for _ in range(args.repeats + 1):
        y = fresh()
        t = time.perf_counter()
        np.asarray(y)
        d2h.append(time.perf_counter() - t)
    line("np.asarray (blocking)", d2h[1:])
    for ready_first in (False, True):
        held, total = [], []
        for _ in range(args.repeats + 1):
            y = step(x)
            if ready_first:
                y.block_until_ready()
            t = time.perf_counter()
            y.copy_to_host_async()
            h = time.perf_counter() - t
            np.asarray(y)
            held.append(h)
            total.append(time.perf_counter() - t)
        line("copy_to_host_async + np.asarray" + (" (output ready)" if ready_first else
                                                  " (step dispatched)"), total[1:], held[1:])
    if pinned is not None:
        to_pinned = []
        then_np = []
        for _ in range(args.repeats + 1):
            y = fresh()
            t = time.perf_counter()
            z = jax.device_put(y, pinned)
            z.block_until_ready()
            to_pinned.append(time.perf_counter() - t)
            t = time.perf_counter()
            np.asarray(z)
            then_np.append(time.perf_counter() - t)
        line("device_put(to pinned_host)", to_pinned[1:])
        line("np.asarray(pinned_host array)", then_np[1:])
        try:
            step_pinned = jax.jit(lambda x: x * 1.5 + 1.0, out_shardings=pinned)
            line("step with its output in pinned_host (compute + copy)",
                 timed(lambda: step_pinned(x).block_until_ready()))
            line("np.asarray(that output)", timed(lambda: np.asarray(step_pinned(x))))
        except Exception as e:  # noqa: BLE001 - a backend without the placement: say so
            print(f"  step with its output in pinned_host: not supported here ({e!r:.120})")

    print("host memory:")
    line("np.empty + first touch (fill)", timed(lambda: np.empty(shape, np.float32).fill(1.0)))
    dst = np.empty_like(host)
    line("np.copyto into touched memory", timed(lambda: np.copyto(dst, host)))
    table = rng.standard_normal((args.table_rows, args.width), dtype=np.float32)
    idx = np.sort(rng.choice(args.table_rows, size=args.rows, replace=False)).astype(np.int32)
    out = np.empty(shape, np.float32)
    for n in (1, 4, 8, 16):
        rows.set_threads(n)
        line(f"take_rows, {n} thread(s), {args.rows} of {args.table_rows} rows",
             timed(lambda: rows.take_rows(table, idx, out)))
        line(f"add_rows, {n} thread(s)", timed(lambda: rows.add_rows(table, idx, out)))
    rows.set_threads(None)


if __name__ == "__main__":
    main()
