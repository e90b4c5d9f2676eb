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

from typing import Optional

import numpy as np


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
        take = getattr(lib, f"jgrind_take_rows_f32_{kind}")
        rc = take(table.ctypes.data, table.shape[0], idx.ctypes.data, n, table.shape[1],
                  out.ctypes.data, out.shape[0], None if dst_arr is None else dst_arr.ctypes.data)
        _check(rc, "take_rows", table.shape[0], "destination", out.shape[0])
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
        add = getattr(lib, f"jgrind_add_rows_f32_{kind}")
        rc = add(table.ctypes.data, table.shape[0], idx.ctypes.data, n, table.shape[1],
                 values.ctypes.data, values.shape[0],
                 None if src_arr is None else src_arr.ctypes.data)
        _check(rc, "add_rows", table.shape[0], "source", values.shape[0])
        return
    _check_range(idx, table.shape[0], "add_rows: a row index")
    if src is not None:
        _check_range(src, values.shape[0], "add_rows: a source index")
    picked = values[:n] if src is None else values[src]
    rows = np.take(table, idx, axis=0)
    np.add(rows, picked, out=rows)
    table[idx] = rows
