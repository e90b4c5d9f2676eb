"""Host row moves: `jgrind.hostio.rows` (native loops) against NumPy's fancy indexing, per row.

    python tools/bench_rows.py [--rows 150000] [--picked 8000] [--widths 8,64,128,256]
                               [--threads 1]

Gathers ``picked`` sorted random rows of a ``rows``-row float32 table into scattered rows of an
output buffer (``out[dst] = table[idx]``, as the store places halo rows), and scatter-adds them
back (``table[idx] += values``), at each row width; prints nanoseconds per row for the native
path (`jgrind.hostio.rows.take_rows` / `add_rows`) and for NumPy (``out[dst] = np.take(...)``;
take, add and an indexed store). Best of 200 repeats each. ``--threads N`` splits the native
moves of at least `jgrind.hostio.rows.MIN_BYTES_PER_THREAD` a part across N threads
(`jgrind.hostio.rows.set_threads`).
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    import numpy as np

    from jgrind.hostio import rows
    from jgrind.plan.measure import _best_seconds

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=150_000)
    p.add_argument("--picked", type=int, default=8000)
    p.add_argument("--widths", default="8,64,128,256")
    p.add_argument("--threads", type=int, default=1,
                   help="threads a native move is split across [1]")
    args = p.parse_args()
    rows.set_threads(args.threads)
    if rows._native() is None:
        sys.exit("the native kernels are unavailable here; nothing to compare")
    rng = np.random.default_rng(0)

    def best(run):
        return _best_seconds(run, 200)  # the profile's own timer: fastest after a warm-up

    print(f"{args.picked} sorted random rows of a {args.rows}-row table, into scattered rows; "
          f"ns per row, best of 200; native moves on up to {args.threads} thread(s)")
    print(f"{'floats/row':>10} {'gather native':>14} {'gather numpy':>13} {'add native':>11} "
          f"{'add numpy':>10}")
    for width in (int(w) for w in args.widths.split(",")):
        table = rng.standard_normal((args.rows, width)).astype(np.float32)
        idx = np.sort(rng.choice(args.rows, args.picked, replace=False))
        out = np.empty((args.picked + args.picked // 4, width), np.float32)
        dst = np.sort(rng.choice(out.shape[0], args.picked, replace=False))
        values = out[dst].copy()

        def numpy_gather():
            out[dst] = np.take(table, idx, axis=0)

        def numpy_add():
            picked = np.take(table, idx, axis=0)
            np.add(picked, values, out=picked)
            table[idx] = picked

        per_row = [best(f) / args.picked * 1e9 for f in (
            lambda: rows.take_rows(table, idx, out=out, dst=dst), numpy_gather,
            lambda: rows.add_rows(table, idx, values), numpy_add)]
        print(f"{width:>10} " + " ".join(f"{t:>{n}.1f}" for t, n in zip(per_row,
                                                                     (14, 13, 11, 10))))


if __name__ == "__main__":
    main()
