"""Sparse adjacency products: ``Y = A @ X`` with ``A`` in CSR, differentiable w.r.t. ``X``.

This is the aggregation step of GCN / GraphSAGE and the most expensive operation of full-graph
training on CPU. Three interchangeable implementations ("backends"):

  ``native``   a multi-threaded C++ kernel registered as an XLA FFI custom call
               (`jgrind._kernels`, compiled on first use; CPU only). Default when it builds.
  ``bcsr``     ``jax.experimental.sparse.BCSR @ dense`` (single-threaded on CPU; cuSPARSE on GPU).
               Default when the native kernel is unavailable or the default device is no CPU.
  ``segment``  gather + ``jax.ops.segment_sum`` in pure ``jax.numpy`` (`spmm_reference`).
               Materialises ``[nnz, F]``: for tests and small graphs.

The backend is resolved once per process by `default_backend` (override with the environment
variable ``JGRIND_SPMM=native|bcsr|segment`` or `set_default_backend`), or passed explicitly.

Gradients: `spmm` has a custom VJP. The cotangent of ``X`` is ``A^T @ G``, computed by the same
backend as a *forward* product with the precomputed transpose held in `Adjacency` (no scatter,
no run-time transpose), so the backward costs the same as the forward. **Gradients with respect
to the edge weights ``A.data`` are not propagated** (they are returned as zeros): the weights of
GCN / SAGE normalisations are constants; models that learn edge weights (attention) use another
path. Integer arrays get no cotangent. Forward-mode differentiation (``jax.jvp``) is not
supported; reverse mode works to any order (the backward is itself an `spmm`).

Host-side construction (`csr_from_graph`, `adjacency`, `CSR.transpose`) runs in NumPy/SciPy in
O(nnz); the resulting arrays are NumPy arrays: move them to the device once
(``jax.device_put(adj)``) and pass them to jitted functions as arguments, never as closed-over
constants (that would embed the whole graph in the compiled program).
"""

from __future__ import annotations

import functools
import os
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["BACKENDS", "CSR", "Adjacency", "adjacency", "csr_from_graph", "default_backend",
           "set_default_backend", "spmm", "spmm_T", "spmm_reference"]

BACKENDS = ("native", "bcsr", "segment")
_INT32_MAX = np.iinfo(np.int32).max


# ------------------------------------------------------------------------------------------------
# Containers
# ------------------------------------------------------------------------------------------------

def _is_array(a) -> bool:
    return hasattr(a, "shape") and hasattr(a, "dtype")


@jax.tree_util.register_pytree_node_class
class CSR:
    """A sparse ``[R, C]`` matrix in compressed sparse row form (a JAX pytree).

    Attributes:
      indptr: ``[R + 1]`` int32 row pointers, ``indptr[0] == 0``, ``indptr[R] == nnz``.
      indices: ``[nnz]`` int32 column of every stored entry, in ``[0, C)``.
      data: ``[nnz]`` float32 value of every stored entry (duplicates add up).
      shape: static ``(R, C)``.

    The arrays may be NumPy (host) or JAX arrays; ``shape`` is static pytree metadata. Build
    one with `csr_from_graph` or `CSR.from_scipy`, which validate the structure.
    """

    __slots__ = ("indptr", "indices", "data", "shape")

    def __init__(self, indptr, indices, data, shape):
        self.indptr = indptr
        self.indices = indices
        self.data = data
        self.shape = (int(shape[0]), int(shape[1]))
        if all(map(_is_array, (indptr, indices, data))):
            r = self.shape[0]
            if tuple(indptr.shape) != (r + 1,):
                raise ValueError(f"CSR: indptr has shape {tuple(indptr.shape)}, expected "
                                 f"({r + 1},) for {r} rows")
            if len(indices.shape) != 1 or tuple(data.shape) != tuple(indices.shape):
                raise ValueError(f"CSR: indices {tuple(indices.shape)} and data "
                                 f"{tuple(data.shape)} must be 1-D of equal length")
            for name, a, want in (("indptr", indptr, np.int32), ("indices", indices, np.int32),
                                  ("data", data, np.float32)):
                if np.dtype(a.dtype) != want:
                    raise TypeError(f"CSR: {name} has dtype {a.dtype}, expected "
                                    f"{np.dtype(want).name} (use csr_from_graph to convert)")

    # pytree protocol: the arrays are children, the shape is static.
    def tree_flatten(self):
        return (self.indptr, self.indices, self.data), self.shape

    @classmethod
    def tree_unflatten(cls, shape, children):
        obj = object.__new__(cls)  # no checks: leaves may be tracers, None or sentinels
        obj.indptr, obj.indices, obj.data = children
        obj.shape = shape
        return obj

    @property
    def nnz(self) -> int:
        """Stored entries (static)."""
        return int(self.indices.shape[0])

    def __repr__(self) -> str:
        return f"CSR(shape={self.shape}, nnz={self.nnz})"

    @classmethod
    def from_scipy(cls, m) -> "CSR":
        """From any ``scipy.sparse`` matrix (converted to CSR; duplicates kept)."""
        m = m.tocsr()
        return csr_from_graph(m.indptr, m.indices, m.data, m.shape[1])

    def to_scipy(self):
        import scipy.sparse as sp

        return sp.csr_matrix((np.asarray(self.data), np.asarray(self.indices),
                              np.asarray(self.indptr)), shape=self.shape)

    def todense(self) -> np.ndarray:
        """Dense NumPy copy (tests, debugging)."""
        return self.to_scipy().toarray()

    def transpose(self) -> "CSR":
        """``A^T`` as a CSR of shape ``(C, R)``, computed on the host in O(nnz + R + C).

        A counting sort by column (SciPy's ``csr_tocsc``): within every row of the result the
        entries stay in increasing column order, which keeps the gathers of the backward product
        as local as those of the forward.
        """
        import scipy.sparse as sp

        r, c = self.shape
        indptr = np.asarray(self.indptr)
        nnz = int(indptr[-1]) if indptr.size else 0
        if nnz == 0:
            return CSR(np.zeros(c + 1, np.int32), np.zeros(0, np.int32),
                       np.zeros(0, np.float32), (c, r))
        m = sp.csr_matrix((np.asarray(self.data)[:nnz], np.asarray(self.indices)[:nnz], indptr),
                          shape=self.shape).tocsc()
        return CSR(m.indptr.astype(np.int32, copy=False), m.indices.astype(np.int32, copy=False),
                   m.data.astype(np.float32, copy=False), (c, r))

    @property
    def T(self) -> "CSR":  # noqa: N802 - NumPy spelling
        return self.transpose()

    def validate(self) -> "CSR":
        """Full O(nnz) structural check on the host; returns self. Raises ValueError."""
        r, c = self.shape
        indptr = np.asarray(self.indptr)
        indices = np.asarray(self.indices)
        data = np.asarray(self.data)
        if indptr[0] != 0:
            raise ValueError(f"CSR: indptr[0] is {indptr[0]}, expected 0")
        if int(indptr[-1]) != indices.size:
            raise ValueError(f"CSR: indptr[-1] is {indptr[-1]} but there are {indices.size} "
                             "entries")
        if r and np.any(indptr[1:] < indptr[:-1]):
            raise ValueError("CSR: indptr is not non-decreasing")
        if indices.size and (indices.min() < 0 or indices.max() >= c):
            raise ValueError(f"CSR: column indices must lie in [0, {c}), found "
                             f"[{indices.min()}, {indices.max()}]")
        if not np.isfinite(data).all():
            raise ValueError("CSR: data holds NaN or infinite values")
        return self


def _as_int32(a, name: str) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got {a.dtype}")
    if a.dtype != np.int32:
        if a.size and (int(a.max()) > _INT32_MAX or int(a.min()) < -_INT32_MAX):
            raise ValueError(f"{name} holds values beyond int32; sparse products take at most "
                             f"2^31 - 1 rows, columns and entries per matrix: partition the "
                             "graph")
        a = a.astype(np.int32)
    return np.ascontiguousarray(a)


def csr_from_graph(indptr, indices, weights, num_cols: int, *, validate: bool = True) -> CSR:
    """A `CSR` of shape ``[len(indptr) - 1, num_cols]`` from host arrays.

    Args:
      indptr: ``[R + 1]`` row pointers (any integer type; converted to int32).
      indices: ``[nnz]`` column indices (converted to int32).
      weights: ``[nnz]`` values, or None for all ones (converted to float32).
      num_cols: C.
      validate: run the O(nnz) structural check (`CSR.validate`).
    """
    indptr = _as_int32(indptr, "indptr")
    indices = _as_int32(indices, "indices")
    if indptr.ndim != 1 or indptr.size < 1:
        raise ValueError("indptr must be 1-D with at least one entry")
    if weights is None:
        data = np.ones(indices.shape, np.float32)
    else:
        data = np.ascontiguousarray(np.asarray(weights, dtype=np.float32))
    csr = CSR(indptr, indices, data, (indptr.size - 1, int(num_cols)))
    return csr.validate() if validate else csr


@jax.tree_util.register_pytree_node_class
class Adjacency:
    """``A`` (``fwd``, shape ``[R, C]``) together with ``A^T`` (``bwd``, shape ``[C, R]``).

    Both are built once on the host (`adjacency`), so that the backward of ``A @ X`` is a
    forward product with ``A^T``. ``adj.T`` swaps the two (free).
    """

    __slots__ = ("fwd", "bwd")

    def __init__(self, fwd: CSR, bwd: CSR):
        self.fwd = fwd
        self.bwd = bwd
        if isinstance(fwd, CSR) and isinstance(bwd, CSR):
            if bwd.shape != fwd.shape[::-1]:
                raise ValueError(f"Adjacency: bwd has shape {bwd.shape}, expected "
                                 f"{fwd.shape[::-1]} (the transpose of fwd)")

    def tree_flatten(self):
        return (self.fwd, self.bwd), None

    @classmethod
    def tree_unflatten(cls, _, children):
        obj = object.__new__(cls)
        obj.fwd, obj.bwd = children
        return obj

    @property
    def shape(self) -> tuple[int, int]:
        return self.fwd.shape

    @property
    def nnz(self) -> int:
        return self.fwd.nnz

    @property
    def T(self) -> "Adjacency":  # noqa: N802
        return Adjacency(self.bwd, self.fwd)

    @classmethod
    def from_csr(cls, csr: CSR) -> "Adjacency":
        return cls(csr, csr.transpose())

    @classmethod
    def from_scipy(cls, m) -> "Adjacency":
        return cls.from_csr(CSR.from_scipy(m))

    def __repr__(self) -> str:
        return f"Adjacency(shape={self.shape}, nnz={self.nnz})"


def adjacency(indptr, indices, weights, num_cols: int, *, validate: bool = True) -> Adjacency:
    """`Adjacency` (``A`` and ``A^T``) from host CSR arrays; see `csr_from_graph`."""
    return Adjacency.from_csr(csr_from_graph(indptr, indices, weights, num_cols,
                                             validate=validate))


# ------------------------------------------------------------------------------------------------
# Backend selection
# ------------------------------------------------------------------------------------------------

_default: Optional[str] = None


def _resolve_default() -> str:
    from jgrind import _kernels

    env = os.environ.get("JGRIND_SPMM", "").strip().lower()
    if env:
        if env not in BACKENDS:
            raise ValueError(f"JGRIND_SPMM={env!r}: expected one of {', '.join(BACKENDS)}")
        if env == "native":
            _kernels.load()  # raises with the reason if it cannot be built
        return env
    if jax.default_backend() == "cpu" and _kernels.available():
        return "native"
    return "bcsr"


def default_backend() -> str:
    """The backend `spmm` uses when none is given; resolved on the first call, then fixed.

    ``$JGRIND_SPMM`` if set, else ``native`` when the default device is a CPU and the kernel
    builds, else ``bcsr``. Resolving may compile the native kernel (once, a few seconds).
    """
    global _default
    if _default is None:
        _default = _resolve_default()
    return _default


def set_default_backend(name: Optional[str]) -> None:
    """Fix the default backend (``None``: resolve again on the next call)."""
    global _default
    if name is not None and name not in BACKENDS:
        raise ValueError(f"unknown spmm backend {name!r}; expected one of {BACKENDS}")
    _default = name


# ------------------------------------------------------------------------------------------------
# Products
# ------------------------------------------------------------------------------------------------

def spmm_reference(a, x: jax.Array) -> jax.Array:
    """``A @ x`` by gather + ``segment_sum`` in pure ``jax.numpy``, differentiated by JAX itself.

    ``a`` is a `CSR` or an `Adjacency` (its ``fwd``). Memory O(nnz * F): tests and small graphs.
    Entries past ``indptr[R]`` (padding) are ignored.
    """
    csr = a.fwd if isinstance(a, Adjacency) else a
    r = csr.shape[0]
    x = jnp.asarray(x)
    k = jnp.arange(csr.nnz, dtype=jnp.int32)
    rows = jnp.searchsorted(jnp.asarray(csr.indptr), k, side="right").astype(jnp.int32) - 1
    msgs = jnp.asarray(csr.data, x.dtype)[:, None] * x[jnp.asarray(csr.indices)]
    # ids >= r (padding) are dropped by segment_sum.
    return jax.ops.segment_sum(msgs, rows, num_segments=r, indices_are_sorted=True)


def _native(csr: CSR, x: jax.Array, num_threads: Optional[int]) -> jax.Array:
    from jgrind import _kernels

    _kernels.load()  # registers the FFI target (first call only); raises if unavailable
    call = jax.ffi.ffi_call(_kernels.CSR_SPMM_TARGET,
                            jax.ShapeDtypeStruct((csr.shape[0], x.shape[1]), jnp.float32),
                            vmap_method="sequential")
    return call(jnp.asarray(csr.indptr), jnp.asarray(csr.indices), jnp.asarray(csr.data), x,
                num_threads=np.int64(num_threads or 0))


def _bcsr(csr: CSR, x: jax.Array) -> jax.Array:
    from jax.experimental import sparse as jsparse

    m = jsparse.BCSR((jnp.asarray(csr.data), jnp.asarray(csr.indices), jnp.asarray(csr.indptr)),
                     shape=csr.shape)
    return m @ x


def _product(backend: str, num_threads: Optional[int], csr: CSR, x: jax.Array) -> jax.Array:
    """The forward product ``csr @ x`` (no autodiff rules of its own)."""
    r, c = csr.shape
    f = x.shape[1]
    if r == 0 or f == 0 or c == 0 or csr.nnz == 0:
        return jnp.zeros((r, f), x.dtype)
    if x.dtype == jnp.float64:  # x64 mode: exact, at reference speed
        return spmm_reference(csr, x)
    xf = x.astype(jnp.float32)  # bf16 / f16: accumulate in f32
    if backend == "native":
        y = _native(csr, xf, num_threads)
    elif backend == "bcsr":
        y = _bcsr(csr, xf)
    else:
        y = spmm_reference(csr, xf)
    return y.astype(x.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _spmm(backend: str, num_threads: Optional[int], adj: Adjacency, x: jax.Array) -> jax.Array:
    return _product(backend, num_threads, adj.fwd, x)


def _spmm_fwd(backend, num_threads, adj, x):
    # The residual is the adjacency itself (inputs: no copies). The product goes through the
    # custom VJP again (not `_product`) so that an outer differentiation of this rule works.
    return _spmm(backend, num_threads, adj, x), adj


def _spmm_bwd(backend, num_threads, adj, g):
    # d/dx (A x) . g = A^T g: a forward product with the precomputed transpose, through the
    # custom VJP again so that higher-order reverse mode works. No cotangent for the adjacency:
    # edge-weight gradients are deliberately not propagated (see the module docstring).
    return None, _spmm(backend, num_threads, adj.T, g)


_spmm.defvjp(_spmm_fwd, _spmm_bwd)


def spmm(adj: Adjacency, x, *, backend: Optional[str] = None,
         num_threads: Optional[int] = None) -> jax.Array:
    """``A @ x`` for ``adj`` holding ``A`` ``[R, C]`` (and ``A^T``) and ``x`` ``[C, F]`` (or ``[C]``).

    Differentiable w.r.t. ``x`` (the backward is ``A^T @ g`` with the stored transpose); **not**
    w.r.t. the edge weights, whose cotangent is zero. Works under ``jax.jit`` and ``jax.grad``.

    Args:
      adj: an `Adjacency` (see `adjacency`). Pass it to jitted functions as an argument.
      x: ``[C, F]`` (or ``[C]``) floating array; float32 is native, bf16/f16 accumulate in
        float32, float64 uses the exact reference path.
      backend: ``native``, ``bcsr`` or ``segment``; None for `default_backend`.
      num_threads: threads of the native kernel; None for ``$JGRIND_NUM_THREADS`` or all CPUs
        this process may use (small products use fewer).

    Returns:
      ``[R, F]`` (or ``[R]``) array of x's dtype.
    """
    if not isinstance(adj, Adjacency):
        raise TypeError(f"spmm takes an Adjacency (A with its transpose), got "
                        f"{type(adj).__name__}; build one with jgrind.sparse.adjacency or "
                        "Adjacency.from_csr")
    if backend is None:
        backend = default_backend()
    elif backend not in BACKENDS:
        raise ValueError(f"unknown spmm backend {backend!r}; expected one of {BACKENDS}")
    if num_threads is not None:
        num_threads = int(num_threads)
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"spmm: x must be floating, got {x.dtype}")
    vector = x.ndim == 1
    if vector:
        x = x[:, None]
    if x.ndim != 2:
        raise ValueError(f"spmm: x must be [C, F] or [C], got shape {x.shape}")
    if x.shape[0] != adj.shape[1]:
        raise ValueError(f"spmm: A is {adj.shape} but x has {x.shape[0]} rows")
    y = _spmm(backend, num_threads, adj, x)
    return y[:, 0] if vector else y


def spmm_T(adj: Adjacency, x, **kwargs) -> jax.Array:  # noqa: N802
    """``A^T @ x`` (the transposed product, from the stored transpose); see `spmm`."""
    return spmm(adj.T, x, **kwargs)
