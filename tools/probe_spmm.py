"""The jitted sparse product's rate by width and by the size of its input, beside the profile's
one figure (`jgrind.plan.measure`'s ``spmm_rate``: 200k rows, 2M nonzeros, 64 wide, an input
of 51 MB, out of the caches). A partition step's input is its rows and halo, often a few MB:

    python tools/probe_spmm.py                      # 200k and 20k rows, widths 8-512
    python tools/probe_spmm.py --rows 200000 6000 --widths 128 512 --runs 2

Each figure is the fastest of ``--repeats`` products after a compiling one, on a random square
matrix with uniform degrees (10 per row), built as the profile builds it
(`jgrind.plan.measure.spmm_operands`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import harness


def seconds(rows: int, width: int, repeats: int, rng) -> float:
    import jax
    from jgrind.plan.measure import spmm_operands
    from jgrind.sparse import spmm
    adj, x, _ = spmm_operands(rows, 10 * rows, width, rng)
    product = jax.jit(spmm)
    product(adj, x).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        product(adj, x).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[200_000, 20_000])
    p.add_argument("--widths", type=int, nargs="+", default=[8, 32, 64, 128, 256, 512])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runs", type=int, default=1, help="passes over every size, in turn")
    args = p.parse_args()
    print(f"# {harness.command()}\n# {harness.machine()}", flush=True)
    print("| rows | nonzeros | width | input MB | ms | G nonzeros x width/s |")
    print("|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for _ in range(args.runs):
        for rows in args.rows:
            for width in args.widths:
                s = seconds(rows, width, args.repeats, rng)
                nnz = 10 * rows
                print(f"| {rows:,} | {nnz:,} | {width} | {rows * width * 4 / 1e6:.1f} | "
                      f"{s * 1e3:.2f} | {nnz * width / s / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()
