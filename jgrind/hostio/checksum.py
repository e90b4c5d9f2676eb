"""Checksums for the SSD tier: CRC32C with the CPU's CRC instruction, else zlib's CRC-32.

The SSD tier (`jgrind.engine.ssd`) checksums every row it writes (`row_checksums`) and verifies
the checksums when it reads the rows back, so that a file damaged between a write and its read
raises instead of giving wrong gradients. That is a pass over every byte the tier moves, and
with zlib's CRC-32 it took about half of the SSD tier's CPU time on the 1M-node benchmark.
CRC32C has an instruction on x86 (SSE4.2) and ARMv8; the native kernel
(``jgrind/_kernels/checksum.cc``) runs it at 11.8 GB/s on the 2-core test machine, against
3.7 GB/s for zlib (``python tools/bench_span_gap.py``, 32 MiB, docs/results-history.md, section 4).

The checksums live in memory beside the files, never in them, so which function a process uses
is its own business. `checksum` is chosen once per process: the kernel when it built and the
CPU has the instruction, else zlib (faster than a table-driven CRC32C). `row_checksums` is the
kernel's CRC32C wherever the kernels built, since the native span loops compute the same CRCs,
else zlib's. The hardware profile times `checksum`; `row_checksums` runs about as fast on rows
of 128 bytes or more (three rows go through three chains at once, as a long buffer's three
lanes), and within 30 % of it on 32-byte rows.
"""

from __future__ import annotations

import threading
import zlib
from typing import Callable, Optional

import numpy as np

_lock = threading.Lock()
_chosen: Optional[tuple[str, Callable[[np.ndarray, int], int]]] = None


def _choose() -> tuple[str, Callable[[np.ndarray, int], int]]:
    global _chosen
    with _lock:
        if _chosen is None:
            _chosen = ("CRC-32 (zlib)", lambda data, value: zlib.crc32(data, value))
            from jgrind import _kernels
            lib = _kernels.library()
            if lib is not None and lib.jgrind_crc32c_hardware():
                crc32c = lib.jgrind_crc32c  # ctypes releases the GIL for the call
                _chosen = ("CRC32C (CPU instruction)",
                           lambda data, value: crc32c(value, data.ctypes.data, data.nbytes))
        return _chosen


def checksum(data: np.ndarray, value: int = 0) -> int:
    """The checksum of ``data``'s bytes, continuing ``value``: ``checksum(b, checksum(a))`` is
    the checksum of ``a`` then ``b`` (as ``zlib.crc32`` continues its own)."""
    data = np.ascontiguousarray(data)
    return int(_choose()[1](data, int(value)))


def row_checksums(rows: np.ndarray) -> np.ndarray:
    """The checksum of each row of ``rows`` (``[n, ...]``) as ``uint32[n]``: what the SSD tier
    keeps per file row.

    CRC32C by the native kernel wherever it built (with the CPU's instruction, else its table),
    since the native span loops of `jgrind.engine.ssd` compute the same CRCs themselves;
    without the kernels, zlib's CRC-32 of each row."""
    rows = np.ascontiguousarray(rows)
    n = rows.shape[0] if rows.ndim else 1
    out = np.empty(n, np.uint32)
    if n == 0:
        return out
    row_bytes = rows.nbytes // n
    from jgrind import _kernels
    lib = _kernels.library()
    if lib is not None:
        lib.jgrind_crc32c_rows(rows.ctypes.data, row_bytes, None, 0, n, out.ctypes.data)
        return out
    flat = rows.reshape(n, -1).view(np.uint8)
    for i in range(n):
        out[i] = zlib.crc32(flat[i])
    return out


def method() -> str:
    """Which function `checksum` computes in this process, in words."""
    return _choose()[0]
