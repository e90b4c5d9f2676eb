"""How the SSD tier's span gap and checksum cost on a graph's real halos.

Partitions an R-MAT graph (label propagation, as the overhead benchmark does), writes a page-cached
SSD-tier file as wide as a hidden layer, and times one sweep of every partition's halo rows
through it: `SSDFile.read_rows` (a gather) and `SSDFile.add_rows` (a gradient scatter-add),
with rows less than each gap apart merged into one call (`jgrind.plan.cost.COALESCE_BYTES` is
the engine's choice). It also times the same read sweep through the Python span loops (native
kernels off) at each gap, and the block checksum (`jgrind.hostio.checksum`) against zlib's CRC-32.

    python tools/bench_span_gap.py --rmat 1000000 10000000 --parts 8
    python tools/bench_span_gap.py --cold --skip-python --parts 32 --gaps 128,64,32,16

``--cold`` drops the file from the page cache before every partition's call, so the reads
come from the disk, as when the store's files outgrow the RAM left for the page cache.

Prints, per width and gap, the best of ``--repeats`` sweeps in seconds and the bytes the calls
moved against the halo bytes asked for.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time
import zlib

import numpy as np

import harness


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_source(p, rmat=(1_000_000, 10_000_000))
    harness.add_parts(p, default=8)
    p.add_argument("--widths", default="256,128", help="row widths (floats), comma-separated")
    p.add_argument("--gaps", default="128,32,16,8,4", help="gaps in KiB, comma-separated")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--store", default=None, help="directory for the file (default: a temp dir)")
    p.add_argument("--cold", action="store_true",
                   help="drop the file from the page cache before every partition's call, "
                        "untimed (fsync, then posix_fadvise DONTNEED): reads come from the "
                        "disk, as when the store's files outgrow the RAM left for the page "
                        "cache")
    p.add_argument("--skip-python", action="store_true", help="do not time the Python loops")
    args = p.parse_args()

    from jgrind import _kernels
    from jgrind.hostio.checksum import checksum, method
    from jgrind.engine import ssd
    from jgrind.plan.cost import COALESCE_BYTES

    graph, model, _ = harness.graph_and_model(rmat=args.rmat)
    pg = harness.partition(graph, model, args.parts)
    halos = [np.sort(pg.position[part.halo]).astype(np.int64) for part in pg.partitions]
    print(f"R-MAT {args.rmat[0]:,} nodes, {args.rmat[1]:,} edges, {args.parts} partitions: "
          f"{sum(h.size for h in halos):,} halo rows; engine gap {COALESCE_BYTES >> 10} KiB; "
          f"native kernels: {'yes' if _kernels.library() is not None else 'no'}")
    plain_library = _kernels.library
    with tempfile.TemporaryDirectory(dir=args.store) as directory:
        for width in (int(w) for w in args.widths.split(",")):
            def written(name: str) -> ssd.SSDFile:
                """A file of the table's blocks, its row checksums made by whichever kernels
                `_kernels.library` gives now (CRC32C natively, zlib's CRC-32 without)."""
                file = ssd.SSDFile(pathlib.Path(directory) / name, pg.offsets, width, b"bench")
                rng = np.random.default_rng(0)
                for b in range(args.parts):
                    rows = int(pg.offsets[b + 1] - pg.offsets[b])
                    file.write_block(b, rng.standard_normal((rows, width), np.float32))
                return file

            f = written(f"h{width}")
            rng = np.random.default_rng(1)
            out = np.empty((max(h.size for h in halos), width), np.float32)
            values = rng.standard_normal(out.shape, np.float32)
            asked = sum(h.size for h in halos) * width * 4

            def sweep(kind: str, f: ssd.SSDFile = f) -> tuple[float, int]:
                best, moved = float("inf"), 0
                for _ in range(args.repeats):  # every row current: written whole above
                    before, elapsed = f.bytes_read, 0.0
                    for h in halos:
                        if args.cold:
                            os.fsync(f.fd)
                            os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)
                        start = time.perf_counter()
                        if kind == "read":
                            f.read_rows(h, out=out[:h.size])
                        else:
                            f.add_rows(h, values[:h.size])
                        elapsed += time.perf_counter() - start
                    best = min(best, elapsed)
                    moved = f.bytes_read - before
                return best, moved

            if args.cold:
                print(f"width {width:4d}, the file from the disk: {_cold_disk(f.fd, f.size)}")
            for gap_kib in (int(g) for g in args.gaps.split(",")):
                f._gap_rows = lambda g=gap_kib, w=width: (g << 10) // (w * 4)
                read_s, read_bytes = sweep("read")
                add_s, _ = sweep("add")
                python = ""
                if not args.skip_python:
                    # the Python span loops, on a file written without the kernels: its rows'
                    # checksums are then the ones the Python loops verify
                    _kernels.library = lambda: None
                    try:
                        plain = written(f"p{width}")
                        plain._gap_rows = f._gap_rows
                        python = f", Python read {sweep('read', plain)[0]:.3f} s"
                        plain.close()
                    finally:
                        _kernels.library = plain_library
                print(f"width {width:4d}, gap {gap_kib:4d} KiB: read {read_s:.3f} s "
                      f"({read_bytes / 2**30:.2f} GiB read for {asked / 2**30:.2f} GiB of "
                      f"halo rows), read-add-write {add_s:.3f} s{python}", flush=True)
            f.close()
    data = np.random.default_rng(1).standard_normal((1 << 25) // 4, np.float32)  # 32 MiB
    for name, fn in ((method(), lambda: checksum(data)), ("zlib.crc32", lambda: zlib.crc32(data))):
        best = min(_timed(fn) for _ in range(5))
        print(f"checksum {name}: {data.nbytes / best / 1e9:.2f} GB/s (32 MiB, best of 5)")


def _cold_disk(fd: int, size: int, reads: int = 300) -> str:
    """Random 4 KiB and 128 KiB reads and one sequential pass over the file, each after
    dropping it from the page cache: what the disk under the store gives a cold read."""
    def drop():
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    rng = np.random.default_rng(2)
    parts = []
    for span in (4 << 10, 128 << 10):
        drop()
        offsets = rng.integers(0, (size - span) // 4096, reads) * 4096
        start = time.perf_counter()
        for offset in offsets:
            os.pread(fd, span, int(offset))
        parts.append(f"{(time.perf_counter() - start) / reads * 1e6:.0f} us per random "
                     f"{span >> 10} KiB read")
    drop()
    start, offset = time.perf_counter(), 0
    while chunk := os.pread(fd, 16 << 20, offset):
        offset += len(chunk)
    parts.append(f"{offset / (time.perf_counter() - start) / 1e9:.2f} GB/s sequential")
    return ", ".join(parts)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
