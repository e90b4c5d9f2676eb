"""The jitted sparse product's rate by width and by the size of its input, beside the profile's
one figure (`jgrind.plan.measure`'s ``spmm_rate``: 200k rows, 2M nonzeros, 64 wide, an input
of 51 MB, out of the caches). A partition step's input is its rows and halo, often a few MB:

    python tools/probe_spmm.py                      # 200k and 20k rows, widths 8-512
    python tools/probe_spmm.py --rows 200000 6000 --widths 128 512 --runs 2
    python tools/probe_spmm.py --rows 937 --halo 5.3 --degree 9 --widths 128 512

Each figure is measured as the profile measures its partition-shaped block
(`jgrind.plan.measure.queued_spmm_rate`: calls queued back to back on one input for about
0.2 s, the fastest of ``--repeats`` batches) on a random matrix with uniform degrees
(``--degree`` per row, 10 by default), built as the profile builds it
(`jgrind.plan.measure.spmm_operands`). Square by default; ``--halo H`` gives it ``H`` times as
many columns as rows, the shape of a partition step's block (its own rows out, its rows and
halo in).
"""

from __future__ import annotations

import argparse

import numpy as np

import harness


def rate(rows: int, columns: int, degree: int, width: int, repeats: int, rng) -> float:
    from jgrind.plan.measure import queued_spmm_rate
    return queued_spmm_rate(rows, columns, degree * rows, width, rng, repeats=repeats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, nargs="+", default=[200_000, 20_000])
    p.add_argument("--widths", type=int, nargs="+", default=[8, 32, 64, 128, 256, 512])
    p.add_argument("--halo", type=float, default=1.0,
                   help="columns (rows and halo in) per row out; 1: square")
    p.add_argument("--degree", type=int, default=10, help="nonzeros per row")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--runs", type=int, default=1, help="passes over every size, in turn")
    args = p.parse_args()
    print(f"# {harness.command()}\n# {harness.machine()}", flush=True)
    print("| rows | columns | nonzeros | width | input MB | ms | G nonzeros x width/s |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for _ in range(args.runs):
        for rows in args.rows:
            columns = max(rows, round(rows * args.halo))
            for width in args.widths:
                r = rate(rows, columns, args.degree, width, args.repeats, rng)
                nnz = args.degree * rows
                print(f"| {rows:,} | {columns:,} | {nnz:,} | {width} | "
                      f"{columns * width * 4 / 1e6:.1f} | {nnz * width / r * 1e3:.3f} | "
                      f"{r / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()
