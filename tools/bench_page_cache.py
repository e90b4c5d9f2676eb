"""Page-cache reads, writes and read-add-writes by piece size: what sets the SSD tier's piece.

    python tools/bench_page_cache.py [--dir DIR] [--mib 256] [--width 128]

The SSD tier (`jgrind.engine.ssd`) reads row spans and updates gradient spans through one
per-thread scratch buffer, in pieces of at most `jgrind.plan.cost.SPAN_PIECE_BYTES`, and
`jgrind profile` times the page cache at that size. This script times, for a file the page
cache holds, per piece size: reads into one reused buffer, writes over cached pages, and the
read-add-write the scatter-adds do (read a piece, add 1/18 of its rows, write it back), in
GB/s of file bytes, best of three passes over the file. Larger pieces need fewer calls but
can fall out of the CPU caches between the read and the add or take.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def main() -> None:
    from jgrind.plan.cost import SPAN_PIECE_BYTES
    from jgrind.hostio.rows import add_rows

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", default=tempfile.gettempdir(), help="where the test file goes")
    p.add_argument("--mib", type=int, default=256, help="size of the test file")
    p.add_argument("--width", type=int, default=128, help="float32 values per row")
    args = p.parse_args()
    size = args.mib << 20
    row = args.width * 4
    fd, name = tempfile.mkstemp(dir=args.dir, prefix="jgrind-page-cache-")
    try:
        data = np.frombuffer(np.random.default_rng(0).bytes(1 << 20), np.uint8)
        for i in range(size // data.size):
            os.pwrite(fd, data, i * data.size)
        print(f"file {size >> 20} MiB in {args.dir}, rows of {args.width} floats; the SSD tier's "
              f"piece: {SPAN_PIECE_BYTES >> 10} KiB")
        print("piece KiB  read GB/s  write GB/s  read-add-write GB/s")
        for piece in (128 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20):
            scratch = np.empty((piece // row, args.width), np.float32)
            count = size // piece
            added = np.sort(np.random.default_rng(1).choice(scratch.shape[0],
                                                            max(1, scratch.shape[0] // 18),
                                                            replace=False))
            values = np.ones((added.size, args.width), np.float32)

            def run(read: bool, add: bool, write: bool) -> float:
                best = float("inf")
                for _ in range(3):
                    start = time.perf_counter()
                    with np.errstate(all="ignore"):  # the file holds random bytes
                        for i in range(count):
                            if read:
                                os.preadv(fd, [scratch], i * piece)
                            if add:
                                add_rows(scratch, added, values)
                            if write:
                                os.pwritev(fd, [scratch], i * piece)
                    best = min(best, time.perf_counter() - start)
                return count * piece / best / 1e9

            print(f"{piece >> 10:>9}  {run(True, False, False):>9.1f}  "
                  f"{run(False, False, True):>10.1f}  {run(True, True, True):>19.1f}")
    finally:
        os.close(fd)
        os.unlink(name)


if __name__ == "__main__":
    main()
