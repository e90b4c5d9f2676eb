"""Row gathers and scatter-adds on host (NumPy) tables, done the fast way.

The store moves halo rows with these two operations, and the hardware profile measures them,
so the planner prices the very code the engine runs.

Both run one pass per row in native code (`jgrind._kernels`, ``rows.cc``) when the kernels
build, on the calling thread with the GIL released. NumPy is the fallback, and the reason for
the kernels: placing rows at scattered positions (``out[dst] = table[idx]``) or adding them
(``table[idx] += v``) goes through NumPy's advanced-indexing iterator once per array, whose
per-row cost dominates narrow rows. ``python tools/bench_rows.py`` on the 2-core test machine
(2026-11-23; 8000 rows of a 150k-row table into scattered rows): gathers 6.3 ns per row
native against 12.0 with NumPy at 8 floats per row, 21.3 against 73.7 at 128; scatter-adds
6.7 against 13.2 and 20.3 against 70.0. The hardware profile's scatter-add rate:
1.03-1.09 GB/s with ``table[idx] += v`` (profile version 5), 1.65 GB/s with take + add + put
(version 6).
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from typing import Optional

import numpy as np

# Threads one large row move is split across (`set_threads`, or $JGRIND_ROW_THREADS when the
# module loads); None until the first move decides (`threads`). One on a CPU backend: its
# steps use every core, and the store's moves run beside them on the loader and writer
# threads. On the 2-core test machine two threads moved rows 1.3-1.9x as fast as one, alone,
# and made a host-tier epoch no faster (docs/results-history.md, section 4, "Row moves on more than
# one thread"). Where the compute is elsewhere (a GPU), the host's cores are otherwise idle
# during the moves, and the moves bound the epoch: up to `ACCELERATOR_THREADS` then.
_threads: Optional[int] = None
ACCELERATOR_THREADS = 8
# Below this many bytes a part, a thread's share is not worth handing to the pool
MIN_BYTES_PER_THREAD = 1 << 20
_pool: Optional[cf.ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def set_threads(n: Optional[int]) -> Optional[int]:
    """Split each large `take_rows` / `add_rows` across ``n`` threads (the caller's and
    ``n - 1`` from a pool), or None: chosen by the backend at the next move (`threads`);
    returns the previous setting. Results are the same bits: every row is copied or added
    once, whichever thread does it. Call it between runs, not while a store is moving rows
    (its pool is replaced)."""
    global _threads, _pool
    if n is not None:
        n = int(n)
        if n < 1:
            raise ValueError(f"row threads must be at least 1, got {n}")
    with _pool_lock:
        previous, _threads = _threads, n
        if _pool is not None and previous != n:  # the pool has previous - 1 workers
            _pool.shutdown(wait=True)
            _pool = None
    return previous


def threads() -> int:
    """The number of threads a large row move is split across: as set (`set_threads`,
    $JGRIND_ROW_THREADS), else 1 on JAX's CPU backend and up to `ACCELERATOR_THREADS` of the
    allowed CPUs on any other. Asked at a row move, when the engine has started the backend
    already; importing jgrind starts none."""
    global _threads
    if _threads is None:
        import jax

        from jgrind._kernels import num_threads
        _threads = 1 if jax.default_backend() == "cpu" else \
            max(1, min(ACCELERATOR_THREADS, num_threads()))
    return _threads


def _parts(n: int, row_bytes: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]`` slices of ``n`` rows, one per thread that is worth its part."""
    k = min(threads(), max(1, (n * row_bytes) // MIN_BYTES_PER_THREAD))
    bounds = [n * i // k for i in range(k + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def _run_parts(parts, call) -> list[int]:
    """``call(start, stop)`` for every part (at least two), the first on this thread; their
    return codes."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = cf.ThreadPoolExecutor(max_workers=threads() - 1,
                                          thread_name_prefix="jgrind-rows")
        pool = _pool
    futures = [pool.submit(call, a, b) for a, b in parts[1:]]
    codes = [call(*parts[0])]
    return codes + [f.result() for f in futures]


def _native():
    """The native kernels, or None (disabled, not buildable)."""
    global _kernels_lib
    if _kernels_lib is False:
        from jgrind import _kernels
        try:
            _kernels_lib = _kernels.load().lib
        except RuntimeError:
            _kernels_lib = None
    return _kernels_lib


_kernels_lib = False  # not looked up yet


def _native_ok(*arrays: np.ndarray) -> bool:
    return all(a.flags.c_contiguous for a in arrays) and all(
        a.dtype == np.float32 for a in arrays)


def _indices(*arrays):
    """``arrays`` (index arrays or None) as one C-contiguous integer type the kernels take:
    int32 when every one is int32 already (the store's routes), else int64; and that type's
    name."""
    given = [a for a in arrays if a is not None]
    kind = "i32" if all(np.asarray(a).dtype == np.int32 for a in given) else "i64"
    dtype = np.int32 if kind == "i32" else np.int64
    return [None if a is None else np.ascontiguousarray(a, dtype) for a in arrays], kind


def _check(rc: int, what: str, rows: int, other: str, other_rows: int) -> None:
    if rc == 1:
        raise IndexError(f"{what}: a row index is outside [0, {rows})")
    if rc == 2:
        raise IndexError(f"{what}: a {other} index is outside [0, {other_rows})")
    if rc != 0:
        raise RuntimeError(f"{what}: native kernel failed with code {rc}")


def _check_range(idx: np.ndarray, rows: int, what: str) -> None:
    if np.size(idx) and (np.min(idx) < 0 or np.max(idx) >= rows):
        raise IndexError(f"{what} is outside [0, {rows})")


def _in_parts(kernel, table: np.ndarray, idx: np.ndarray, n: int, other: np.ndarray,
              other_idx: Optional[np.ndarray], what: str, other_name: str) -> None:
    """Run a native row kernel (``rows.cc``: ``kernel(table, table_rows, idx, n, width, other,
    other_rows, other_idx)``) over ``idx[:n]`` in parts (`_parts`), one per thread; the kernel
    releases the GIL. Part ``[a, b)`` passes ``idx[a:b]`` and, for ``other`` (a take's output,
    an add's values), ``other_idx[a:b]``, or without ``other_idx`` the rows of ``other`` from
    ``a`` on. Raises for the first part that found an index out of range."""
    width, step = table.shape[1], idx.itemsize
    if threads() == 1 or n * width * 4 < 2 * MIN_BYTES_PER_THREAD:  # one part: no pool, no
        # closure (small moves are frequent, e.g. a cached block's rows, and per-call costs add)
        rc = kernel(table.ctypes.data, table.shape[0], idx.ctypes.data, n, width,
                    other.ctypes.data, other.shape[0],
                    None if other_idx is None else other_idx.ctypes.data)
        _check(rc, what, table.shape[0], other_name, other.shape[0])
        return

    def part(a: int, b: int) -> int:
        if other_idx is None:
            at, rows, where = other.ctypes.data + a * width * 4, other.shape[0] - a, None
        else:
            at, rows, where = other.ctypes.data, other.shape[0], other_idx.ctypes.data + a * step
        return kernel(table.ctypes.data, table.shape[0], idx.ctypes.data + a * step, b - a,
                      width, at, rows, where)
    for rc in _run_parts(_parts(n, width * 4), part):
        _check(rc, what, table.shape[0], other_name, other.shape[0])


def take_rows(table: np.ndarray, idx: np.ndarray, out: Optional[np.ndarray] = None,
              dst: Optional[np.ndarray] = None) -> np.ndarray:
    """``table[idx]`` (rows), into ``out`` when given: ``out[dst] = table[idx]`` with ``dst``,
    else ``out[:len(idx)] = table[idx]``. Indices must lie in range (IndexError otherwise)."""
    n = int(np.size(idx))
    if out is None:
        out = np.empty((n,) + table.shape[1:], table.dtype)
    lib = _native()
    if lib is not None and table.ndim == 2 and _native_ok(table, out):
        (idx, dst_arr), kind = _indices(idx, dst)
        if dst_arr is not None and dst_arr.size != n:
            raise ValueError(f"take_rows: {n} rows but {dst_arr.size} destinations")
        if dst_arr is None and out.shape[0] < n:
            raise ValueError(f"take_rows: {n} rows do not fit an output of {out.shape[0]}")
        if out.shape[1:] != table.shape[1:]:
            raise ValueError(f"take_rows: rows of {table.shape[1:]} into {out.shape[1:]}")
        _in_parts(getattr(lib, f"jgrind_take_rows_f32_{kind}"), table, idx, n, out, dst_arr,
                  "take_rows", "destination")
        return out
    _check_range(idx, table.shape[0], "take_rows: a row index")
    if dst is not None:
        _check_range(dst, out.shape[0], "take_rows: a destination index")
    if dst is None:
        np.take(table, idx, axis=0, out=out[:n], mode="clip")
    else:
        out[dst] = np.take(table, idx, axis=0)
    return out


def add_rows(table: np.ndarray, idx: np.ndarray, values: np.ndarray,
             src: Optional[np.ndarray] = None) -> None:
    """``table[idx] += values`` (or ``values[src]``) for *unique* ``idx``: each row gets exactly
    one addition, the same float result as the fancy-index form."""
    n = int(np.size(idx))
    if n == 0:
        return
    lib = _native()
    if lib is not None and table.ndim == 2 and _native_ok(table, values):
        (idx, src_arr), kind = _indices(idx, src)
        if (src_arr.size if src_arr is not None else values.shape[0]) < n \
                or values.shape[1:] != table.shape[1:]:
            raise ValueError(f"add_rows: {n} rows of {table.shape[1:]} from values "
                             f"{values.shape}")
        # unique rows: the parts add into disjoint rows of the table
        _in_parts(getattr(lib, f"jgrind_add_rows_f32_{kind}"), table, idx, n, values, src_arr,
                  "add_rows", "source")
        return
    _check_range(idx, table.shape[0], "add_rows: a row index")
    if src is not None:
        _check_range(src, values.shape[0], "add_rows: a source index")
    picked = values[:n] if src is None else values[src]
    rows = np.take(table, idx, axis=0)
    np.add(rows, picked, out=rows)
    table[idx] = rows


def copy_rows(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for C-contiguous arrays of one shape, split by rows across the row
    threads (`threads`) when large: NumPy's copy releases the GIL, and one thread copied
    128 MiB at 4.4 GB/s on an H200's host, about a tenth of its PCIe link."""
    if dst.shape != src.shape:
        raise ValueError(f"copy_rows: {src.shape} into {dst.shape}")
    n = dst.shape[0] if dst.ndim else 0
    row_bytes = dst.itemsize * (int(np.prod(dst.shape[1:])) if dst.ndim > 1 else 1)
    parts = _parts(n, row_bytes) if n else []
    if len(parts) < 2 or not (dst.flags.c_contiguous and src.flags.c_contiguous):
        np.copyto(dst, src)
        return

    def part(a: int, b: int) -> int:
        np.copyto(dst[a:b], src[a:b])
        return 0
    _run_parts(parts, part)


def _threads_from_environment() -> Optional[int]:
    text = os.environ.get("JGRIND_ROW_THREADS", "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"JGRIND_ROW_THREADS={text!r}: set it to a whole number of threads, "
                         "at least 1 (or unset it to let the backend choose)")
    return int(text)


set_threads(_threads_from_environment())
