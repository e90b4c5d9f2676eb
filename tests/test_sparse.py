"""jgrind.sparse: CSR / Adjacency containers, the three spmm backends, the custom VJP, and the
native kernel's build / fallback machinery."""

from __future__ import annotations

import os
import shutil
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.sparse as sp
from jax.test_util import check_grads

from jgrind import _kernels
from jgrind import sparse as S
from jgrind._kernels import build


def _native_or_skip():
    if not _kernels.available():
        pytest.skip(f"native kernel unavailable: {_kernels.unavailable_reason()}")


def _use(backend):
    if backend == "native":
        _native_or_skip()
    return backend


def random_csr(r, c, density=0.15, seed=0, empty_rows=True, power_law=False):
    """A random scipy CSR with (optionally) forced empty rows and skewed row degrees."""
    rng = np.random.default_rng(seed)
    if power_law:
        deg = np.minimum(rng.zipf(1.8, r) - 1, 4 * c)
    else:
        deg = rng.binomial(c, density, r)
    if empty_rows and r:
        deg[rng.random(r) < 0.2] = 0
    indptr = np.zeros(r + 1, np.int64)
    np.cumsum(deg, out=indptr[1:])
    indices = rng.integers(0, max(c, 1), indptr[-1])  # duplicates allowed: they add up
    data = rng.standard_normal(indptr[-1]).astype(np.float32)
    return sp.csr_matrix((data, indices, indptr), shape=(r, c))


def dense_product(m, x):
    return np.asarray(m.toarray(), np.float64) @ np.asarray(x, np.float64)


# -- containers ---------------------------------------------------------------------------------

def test_csr_from_graph_converts_and_validates():
    csr = S.csr_from_graph(np.array([0, 2, 2, 3], np.int64), np.array([1, 0, 2], np.int64), None, 4)
    assert csr.shape == (3, 4) and csr.nnz == 3
    assert csr.indptr.dtype == np.int32 and csr.indices.dtype == np.int32
    np.testing.assert_array_equal(csr.data, np.ones(3, np.float32))
    with pytest.raises(ValueError, match="column indices"):
        S.csr_from_graph([0, 1], [4], None, 4)
    with pytest.raises(ValueError, match="non-decreasing"):
        S.csr_from_graph([0, 2, 1, 3], [0, 0, 0], None, 1)
    with pytest.raises(ValueError, match="indptr\\[-1\\]"):
        S.csr_from_graph([0, 1], [0, 0], None, 1)
    with pytest.raises(TypeError, match="int32"):
        S.CSR(np.zeros(2, np.int64), np.zeros(0, np.int32), np.zeros(0, np.float32), (1, 1))


@pytest.mark.parametrize("r,c", [(37, 23), (23, 41), (0, 5), (5, 0)])
def test_transpose_matches_scipy(r, c):
    m = random_csr(r, c, seed=r + c)
    csr = S.CSR.from_scipy(m)
    t = csr.transpose()
    assert t.shape == (c, r)
    np.testing.assert_array_equal(t.todense(), m.toarray().T)
    assert np.all(np.diff(t.indptr) >= 0) and t.indptr[-1] == t.nnz == m.nnz
    back = t.transpose()  # rows sorted by column after a round trip
    np.testing.assert_array_equal(back.todense(), m.toarray())


def test_adjacency_pytree_and_transpose():
    m = random_csr(7, 5)
    adj = S.Adjacency.from_scipy(m)
    assert adj.shape == (7, 5) and adj.bwd.shape == (5, 7)
    leaves, treedef = jax.tree_util.tree_flatten(adj)
    assert len(leaves) == 6
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert again.shape == adj.shape and again.T.shape == (5, 7)
    assert adj.T.fwd is adj.bwd and adj.T.bwd is adj.fwd
    on_device = jax.device_put(adj)
    assert isinstance(on_device.fwd.indptr, jax.Array)


# -- forward ------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", S.BACKENDS)
@pytest.mark.parametrize("r,c,f", [(37, 23, 1), (37, 23, 129), (23, 41, 3), (23, 41, 16)])
def test_spmm_matches_dense(backend, r, c, f):
    backend = _use(backend)
    m = random_csr(r, c, seed=f)
    adj = S.Adjacency.from_scipy(m)
    x = np.random.default_rng(f).standard_normal((c, f)).astype(np.float32)
    y = jax.jit(lambda a, x: S.spmm(a, x, backend=backend))(adj, x)
    assert y.shape == (r, f) and y.dtype == jnp.float32
    np.testing.assert_allclose(y, dense_product(m, x), rtol=1e-5, atol=1e-5)
    yt = jax.jit(lambda a, g: S.spmm_T(a, g, backend=backend))(adj, np.ones((r, f), np.float32))
    np.testing.assert_allclose(yt, dense_product(m.T, np.ones((r, f))), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", S.BACKENDS)
@pytest.mark.parametrize("r,c,nnz_zero", [(0, 4, True), (4, 0, True), (5, 6, True), (1, 1, False)])
def test_spmm_degenerate_shapes(backend, r, c, nnz_zero):
    backend = _use(backend)
    m = sp.csr_matrix((r, c), dtype=np.float32) if nnz_zero else sp.csr_matrix(np.ones((r, c),
                                                                                   np.float32))
    adj = S.Adjacency.from_scipy(m)
    x = np.arange(c * 2, dtype=np.float32).reshape(c, 2)
    y = jax.jit(lambda a, x: S.spmm(a, x, backend=backend))(adj, x)
    np.testing.assert_allclose(y, dense_product(m, x))
    g = jax.jit(jax.grad(lambda x, a: S.spmm(a, x, backend=backend).sum()))(x, adj)
    np.testing.assert_allclose(g, dense_product(m.T, np.ones((r, 2))))


@pytest.mark.parametrize("backend", S.BACKENDS)
def test_spmm_vector_and_low_precision(backend):
    backend = _use(backend)
    m = random_csr(20, 15, seed=3)
    adj = S.Adjacency.from_scipy(m)
    v = np.random.default_rng(0).standard_normal(15).astype(np.float32)
    y = S.spmm(adj, v, backend=backend)
    assert y.shape == (20,)
    np.testing.assert_allclose(y, m @ v, rtol=1e-5, atol=1e-5)
    xb = jnp.asarray(np.tile(v[:, None], (1, 4)), jnp.bfloat16)
    yb = S.spmm(adj, xb, backend=backend)
    assert yb.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(yb, np.float32),
                               dense_product(m, np.asarray(xb, np.float32)), rtol=2e-2, atol=3e-2)


def test_backends_agree_on_power_law_and_wide_features():
    """Skewed degrees (load balance, chunking) and F > 256 (several column tiles + tail)."""
    _native_or_skip()
    m = random_csr(3000, 2500, power_law=True, seed=7)
    adj = jax.device_put(S.Adjacency.from_scipy(m))
    for f in (47, 600):
        x = jnp.asarray(np.random.default_rng(f).standard_normal((2500, f)), jnp.float32)
        ref = np.asarray(S.spmm(adj, x, backend="segment"))
        np.testing.assert_allclose(S.spmm(adj, x, backend="bcsr"), ref, rtol=1e-4, atol=1e-4)
        one = np.asarray(S.spmm(adj, x, backend="native", num_threads=1))
        np.testing.assert_allclose(one, ref, rtol=1e-4, atol=1e-4)
        for nt in (2, 5):  # each row is summed by one thread in a fixed order: bitwise equal
            np.testing.assert_array_equal(S.spmm(adj, x, backend="native", num_threads=nt), one)


def test_native_concurrent_callers():
    """Two Python threads calling the kernel at once share the one thread pool safely."""
    _native_or_skip()
    m = random_csr(800, 700, density=0.05, seed=11)
    adj = jax.device_put(S.Adjacency.from_scipy(m))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((700, 33)), jnp.float32)
    f = jax.jit(lambda a, x: S.spmm(a, x, backend="native", num_threads=2))
    want = np.asarray(f(adj, x))
    errors = []

    def hammer():
        try:
            for _ in range(20):
                np.testing.assert_array_equal(f(adj, x), want)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_native_rejects_out_of_range_indices():
    _native_or_skip()
    bad = S.CSR(np.array([0, 1], np.int32), np.array([9], np.int32), np.ones(1, np.float32),
                (1, 3))
    adj = S.Adjacency(bad, S.CSR(np.array([0, 0, 0, 1], np.int32), np.array([0], np.int32),
                                 np.ones(1, np.float32), (3, 1)))
    with pytest.raises(Exception, match="out of range"):
        jax.block_until_ready(S.spmm(adj, jnp.ones((3, 2)), backend="native"))
    with pytest.raises(ValueError, match="out of range"):
        _kernels.load().csr_spmm(bad.indptr, bad.indices, bad.data, np.ones((3, 2), np.float32))


# -- gradients ----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", S.BACKENDS)
@pytest.mark.parametrize("r,c", [(31, 31), (29, 17)])
def test_grad_is_transpose_product(backend, r, c):
    """Square non-symmetric and rectangular: a VJP using A (or a wrong transpose) fails."""
    backend = _use(backend)
    m = random_csr(r, c, density=0.2, seed=r * c)
    assert r != c or abs(m - m.T).sum() > 0
    adj = S.Adjacency.from_scipy(m)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((c, 5)).astype(np.float32)
    w = rng.standard_normal((r, 5)).astype(np.float32)
    loss = lambda x, a: jnp.sum(S.spmm(a, x, backend=backend) * w)  # noqa: E731
    g = jax.jit(jax.grad(loss))(x, adj)
    np.testing.assert_allclose(g, dense_product(m.T, w), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["native", "bcsr"])
def test_check_grads_finite_differences(backend):
    backend = _use(backend)
    m = random_csr(6, 4, density=0.5, seed=2, empty_rows=False)
    adj = S.Adjacency.from_scipy(m)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3)), jnp.float32)
    # order 2: the backward is itself a differentiable spmm
    check_grads(lambda x: jnp.tanh(S.spmm(adj, x, backend=backend)), (x,), order=2,
                modes=["rev"], eps=1e-2, atol=2e-2, rtol=2e-2)


def test_edge_weight_cotangent_is_zero():
    """Documented behaviour: no gradient flows into A.data; integer leaves get float0."""
    m = random_csr(9, 8, density=0.4, seed=4)
    adj = S.Adjacency.from_scipy(m)
    x = np.ones((8, 2), np.float32)
    ga = jax.grad(lambda a: S.spmm(a, x).sum(), allow_int=True)(adj)
    np.testing.assert_array_equal(ga.fwd.data, 0)
    np.testing.assert_array_equal(ga.bwd.data, 0)
    assert ga.fwd.indptr.dtype == jax.dtypes.float0


# -- backend selection and fallback -------------------------------------------------------------

@pytest.fixture
def fresh_default():
    S.set_default_backend(None)
    yield
    S.set_default_backend(None)


def test_default_backend_env_override(monkeypatch, fresh_default):
    monkeypatch.setenv("JGRIND_SPMM", "segment")
    assert S.default_backend() == "segment"
    monkeypatch.setenv("JGRIND_SPMM", "cusparse")
    S.set_default_backend(None)
    with pytest.raises(ValueError, match="JGRIND_SPMM"):
        S.default_backend()
    with pytest.raises(ValueError, match="backend"):
        S.spmm(S.Adjacency.from_scipy(random_csr(3, 3)), jnp.ones((3, 1)), backend="nope")


def test_fallback_when_native_disabled(monkeypatch, fresh_default):
    monkeypatch.delenv("JGRIND_SPMM", raising=False)
    monkeypatch.setenv("JGRIND_DISABLE_NATIVE", "1")
    assert not _kernels.available()
    assert "JGRIND_DISABLE_NATIVE" in _kernels.unavailable_reason()
    assert S.default_backend() == "bcsr"
    m = random_csr(12, 10, seed=5)
    adj = S.Adjacency.from_scipy(m)
    x = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    np.testing.assert_allclose(jax.jit(S.spmm)(adj, x), dense_product(m, x), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="JGRIND_DISABLE_NATIVE"):
        S.spmm(adj, x, backend="native")


def test_fallback_when_build_fails(monkeypatch, fresh_default):
    """A failed build is remembered with its reason and the default falls back to bcsr."""
    monkeypatch.delenv("JGRIND_SPMM", raising=False)
    monkeypatch.delenv("JGRIND_DISABLE_NATIVE", raising=False)
    monkeypatch.setattr(_kernels, "_state", None)
    monkeypatch.setattr(_kernels, "_error", None)

    def broken():
        raise build.BuildError("no C++ compiler: 'g++' is not on PATH")

    monkeypatch.setattr(build, "build", broken)
    assert not _kernels.available()
    assert "no C++ compiler" in _kernels.unavailable_reason()
    assert S.default_backend() == "bcsr"


def test_build_reports_missing_compiler(monkeypatch):
    monkeypatch.setenv("CXX", "definitely-not-a-compiler-xyz")
    with pytest.raises(build.BuildError, match="not on PATH"):
        build.build()


def test_native_builds_where_a_compiler_exists():
    """Guard against silently skipping every native test: with g++ present it must build."""
    if _kernels.disabled() or shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("native kernels disabled or no compiler")
    assert _kernels.available(), _kernels.unavailable_reason()
    native = _kernels.load()
    assert native.path.is_file() and native.isa
    again = build.build()  # cached now: no second compile
    assert again.path == native.path and not again.compiled
