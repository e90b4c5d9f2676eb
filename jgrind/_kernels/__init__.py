"""Native CPU kernels, compiled on first use and registered as XLA FFI targets.

Nothing happens at import: the first call of `load` (or `available`) compiles
``csr_spmm.cc`` (the sparse product), ``rows.cc`` (host row gathers and scatter-adds, see
`jgrind.hostio.rows`), ``spans.cc`` (the SSD tier's row reads and read-add-writes, see
`jgrind.engine.ssd`), ``checksum.cc`` (CRC32C, see `jgrind.hostio.checksum`), ``labels.cc``
(label propagation's inner loop, see `jgrind.partition.partitioners`) and ``bisection.cc``
(the recursive bisection's growing and balancing, see `jgrind.partition.bisection`) with the
system C++ compiler into one library in a cache directory (see `build`), loads it with ctypes
and registers the FFI target ``CSR_SPMM_TARGET`` for the CPU platform. The outcome, success or
failure, is remembered for the life of the process.

Environment:
  JGRIND_DISABLE_NATIVE=1   never build or use the kernels (callers fall back to pure JAX).
  JGRIND_CACHE              root of jgrind's caches; kernels go to ``$JGRIND_CACHE/kernels``.
  JGRIND_NUM_THREADS        threads of the kernel when the caller does not say (default: the
                            CPUs this process may run on).
  CXX                       the compiler (default ``g++``).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

CSR_SPMM_TARGET = "jgrind_csr_spmm_f32"
_ABI_VERSION = 7  # 2: the row kernels (rows.cc); 3: with int32 indices too;
#                  4: SSD row spans (spans.cc), the CRC32C checksum (checksum.cc);
#                  5: label propagation's kernels (labels.cc); 6: bisection.cc;
#                  7: row CRCs (jgrind_crc32c_rows), checked and kept by the span loops

_lock = threading.Lock()
_state: Optional["Native"] = None
_error: Optional[str] = None


@dataclass(frozen=True)
class Native:
    """A loaded kernel library."""

    path: Path
    isa: str  # "avx512", "avx2-autovec" or "generic-autovec"
    compiled: bool  # compiled by this process (False: from the cache)
    compile_seconds: float
    lib: ctypes.CDLL

    def csr_spmm(self, indptr, indices, data, x, num_threads: int = 0):
        """Host (NumPy) ``A @ x`` through the C entry point, outside XLA: for tools and tests."""
        import numpy as np

        indptr = np.ascontiguousarray(indptr, np.int32)
        indices = np.ascontiguousarray(indices, np.int32)
        data = np.ascontiguousarray(data, np.float32)
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim != 2 or indptr.ndim != 1 or indices.shape != data.shape:
            raise ValueError("expected indptr [R+1], indices [nnz], data [nnz], x [C, F]")
        rows = indptr.size - 1
        y = np.empty((rows, x.shape[1]), np.float32)
        rc = self.lib.jgrind_csr_spmm_f32(
            indptr.ctypes.data, indices.ctypes.data, data.ctypes.data, x.ctypes.data,
            y.ctypes.data, rows, x.shape[0], x.shape[1], indices.size, int(num_threads))
        if rc != 0:
            raise ValueError(f"jgrind csr_spmm failed with code {rc} (1: column index out of "
                             "range, 2: malformed indptr)")
        return y


def num_threads() -> int:
    """``JGRIND_NUM_THREADS``, else the CPUs this process may run on: the threads a caller of
    the kernels uses where it does not say."""
    try:
        return max(1, int(os.environ.get("JGRIND_NUM_THREADS", "")))
    except ValueError:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)


def disabled() -> bool:
    return os.environ.get("JGRIND_DISABLE_NATIVE", "").strip().lower() in ("1", "true", "yes")


def _load() -> Native:
    import jax

    from jgrind._kernels import build

    result = build.build()
    try:
        lib = ctypes.CDLL(str(result.path))
    except OSError as e:
        raise build.BuildError(f"cannot load {result.path}: {e}") from e
    finally:
        if result.private:  # loaded (or not): its folder is nobody's to reuse
            shutil.rmtree(result.path.parent, ignore_errors=True)
    lib.jgrind_kernel_abi_version.restype = ctypes.c_int
    if lib.jgrind_kernel_abi_version() != _ABI_VERSION:
        raise build.BuildError(f"{result.path} has ABI {lib.jgrind_kernel_abi_version()}, "
                               f"expected {_ABI_VERSION}")
    lib.jgrind_kernel_isa.restype = ctypes.c_char_p
    lib.jgrind_csr_spmm_f32.restype = ctypes.c_int
    lib.jgrind_csr_spmm_f32.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 5
    # (table, rows, idx, n, width, other, other rows, other idx): see rows.cc
    row_args = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    for kind in ("take", "add"):
        for index in ("i32", "i64"):
            fn = getattr(lib, f"jgrind_{kind}_rows_f32_{index}")
            fn.restype, fn.argtypes = ctypes.c_int, row_args
    # (fd, data start, file rows, width, rows, n, gap rows, table, its rows, its index,
    #  scratch, scratch rows, current, row CRCs, stats): see spans.cc
    span_args = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                 ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.jgrind_read_spans_f32.restype = ctypes.c_int
    lib.jgrind_read_spans_f32.argtypes = span_args + [ctypes.c_void_p] * 3
    lib.jgrind_add_spans_f32.restype = ctypes.c_int
    lib.jgrind_add_spans_f32.argtypes = span_args + [ctypes.c_void_p] * 3
    lib.jgrind_crc32c.restype = ctypes.c_uint32
    lib.jgrind_crc32c.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int64]
    # (rows' base, row bytes, index, first, count, out): see checksum.cc
    lib.jgrind_crc32c_rows.restype = None
    lib.jgrind_crc32c_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                       ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.jgrind_crc32c_zeros.restype = ctypes.c_uint32
    lib.jgrind_crc32c_zeros.argtypes = [ctypes.c_int64]
    lib.jgrind_crc32c_hardware.restype = ctypes.c_int
    # (indptr, indices, indices are int64, weights, labels, n, k, salt, per-node ties,
    #  penalty, extra, best, gain, threads): see labels.cc
    lib.jgrind_best_labels.restype = ctypes.c_int
    lib.jgrind_best_labels.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64, ctypes.c_int, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    # (indptr, indices, indices are int64, weights, inverse, member ptr, members, clusters,
    #  out ptr, out indices, out indices are int64, out weights, threads)
    lib.jgrind_contract.restype = ctypes.c_int
    lib.jgrind_contract.argtypes = [
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
        ctypes.c_int, ctypes.c_void_p, ctypes.c_int64]
    # (target, gain, random, m, k, order, group starts, threads)
    lib.jgrind_group_order.restype = ctypes.c_int
    lib.jgrind_group_order.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [
        ctypes.c_void_p] * 2 + [ctypes.c_int64]
    # (labels, best, n, candidates, m, k, constraints, their node weights, capacities, rooms)
    lib.jgrind_capacity_fits.restype = ctypes.c_int64
    lib.jgrind_capacity_fits.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                         ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                                         ctypes.c_void_p]
    # (labels, best, gain, candidates, m, k, constraints, node weights, rooms, random, threads)
    lib.jgrind_capacity_accept.restype = ctypes.c_int64
    lib.jgrind_capacity_accept.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 3 + [
        ctypes.c_void_p] * 3 + [ctypes.c_int64]
    # (indptr, indices, indices are int64, n, threads)
    lib.jgrind_is_symmetric.restype = ctypes.c_int
    lib.jgrind_is_symmetric.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int,
                                        ctypes.c_int64, ctypes.c_int64]
    # (indptr, indices, entry weights, measure, n, target, tie, order, side): bisection.cc
    lib.jgrind_grow.restype = ctypes.c_int
    lib.jgrind_grow.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_double] + [
        ctypes.c_void_p] * 3
    # (indptr, indices, entry weights, side, shares, bounds, constraints, n, excess left)
    lib.jgrind_balance.restype = ctypes.c_int
    lib.jgrind_balance.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 2 + [
        ctypes.c_void_p]
    jax.ffi.register_ffi_target(CSR_SPMM_TARGET, jax.ffi.pycapsule(lib.JgrindCsrSpmmF32),
                                platform="cpu")
    return Native(path=result.path, isa=lib.jgrind_kernel_isa().decode(),
                  compiled=result.compiled, compile_seconds=result.seconds, lib=lib)


def load() -> Native:
    """The kernels, building and registering them on the first call.

    Raises:
      RuntimeError: the kernels are disabled or could not be built; the message says why.
    """
    global _state, _error
    if disabled():
        raise RuntimeError("native kernels disabled by JGRIND_DISABLE_NATIVE")
    with _lock:
        if _state is None and _error is None:
            try:
                _state = _load()
            except Exception as e:  # noqa: BLE001 - any failure means "fall back", with reason
                _error = f"{type(e).__name__}: {e}"
        if _state is None:
            raise RuntimeError(f"native kernels unavailable: {_error}")
        return _state


def library() -> Optional[ctypes.CDLL]:
    """The loaded library, or None when the kernels are disabled or could not be built."""
    try:
        return load().lib
    except RuntimeError:
        return None


def available() -> bool:
    """Whether the native kernels can be used (builds them on the first call)."""
    try:
        load()
        return True
    except RuntimeError:
        return False


def unavailable_reason() -> Optional[str]:
    """Why `available` is False, or None when it is True."""
    try:
        load()
        return None
    except RuntimeError as e:
        return str(e)
