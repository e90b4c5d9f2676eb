"""How far the machine's own speed moves while nothing changes: the hardware profile's compute and
row probes run again and again, each beside a product of the planner configurations' shapes.

    python tools/probe_drift.py [--times 8] [--pause 5]

Every round runs the profile's matmul probe (`jgrind.plan.measure`, full size: a chain of
4096x256 @ 256x256 products, fastest of its repeats), a jitted 1000x512 @ 512x512 product with a
ReLU (a wide configuration's step shape, 200 calls), the profile's spmm probe and its host row
gather probe, then sleeps ``--pause`` seconds. Prints each round and the spread (largest over
smallest) of each figure. A prediction made from a profile measured at one moment carries that
moment's speed: where the spread here is a fifth or more, so is the spread of any predicted
epoch against a measured one (docs/results-history.md, section 7).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--times", type=int, default=8, help="rounds (default 8)")
    p.add_argument("--pause", type=float, default=5.0, help="seconds between rounds")
    args = p.parse_args()

    import jax
    import jax.numpy as jnp
    import numpy as np

    from jgrind.plan import measure

    rng = np.random.default_rng(0)
    sizes = measure._FULL
    step, x, work = measure._matmul_step(sizes, rng)
    wide = jax.jit(lambda a, b: jnp.maximum(a @ b, 0.0))
    a = jnp.ones((1000, 512), jnp.float32)
    b = jnp.full((512, 512), 1e-3, jnp.float32)
    wide(a, b).block_until_ready()

    def wide_rate() -> float:
        start = time.perf_counter()
        for _ in range(200):
            y = wide(a, b)
        y.block_until_ready()
        return 2.0 * 1000 * 512 * 512 * 200 / (time.perf_counter() - start)

    figures = {"matmul probe GFLOP/s": [], "1000x512@512x512 GFLOP/s": [],
               "spmm probe G/s": [], "row gather GB/s": [], "ns a row": []}
    for _ in range(args.times):
        matmul = measure._chain_rate(step, x, work, sizes) / 1e9
        product = wide_rate() / 1e9
        spmm = measure._spmm_rate(sizes, rng) / 1e9
        (gather_bw, gather_row), _ = measure._row_rates(sizes, rng)
        row = (gather_bw / 1e9, gather_row * 1e9)
        for name, value in zip(figures, (matmul, product, spmm, *row)):
            figures[name].append(value)
        print(f"{time.strftime('%H:%M:%S')}  " + "  ".join(
            f"{name} {values[-1]:.2f}" for name, values in figures.items()), flush=True)
        time.sleep(args.pause)
    print("spread (largest / smallest): " + ", ".join(
        f"{name} {max(v) / min(v):.2f}x ({min(v):.2f}-{max(v):.2f})"
        for name, v in figures.items()))


if __name__ == "__main__":
    main()
