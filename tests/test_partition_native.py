"""The label propagation partitioner's native kernels (``jgrind/_kernels/labels.cc``) against
their NumPy references: the same arrays bit for bit, so the partition does not depend on
whether the kernels could be built."""

import numpy as np
import pytest

from jgrind import _kernels
from jgrind.graph import Graph
from jgrind.partition import label_propagation, neighbour_csr
from jgrind.partition import partitioners as P

from helpers import community_graph


@pytest.fixture
def native():
    if not _kernels.available():
        pytest.skip(f"native kernels unavailable: {_kernels.unavailable_reason()}")


@pytest.fixture
def without_native(monkeypatch):
    """Run the code under test with the NumPy references (as without a C++ compiler)."""
    def use_numpy():
        monkeypatch.setattr(_kernels, "library", lambda: None)
    return use_numpy


def _random_csr(rng, n, e, *, loops=False, symmetric=False, sorted_rows=True):
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    if symmetric:
        src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
    if not loops:
        src, dst = src[src != dst], dst[src != dst]
    order = np.lexsort((src, dst)) if sorted_rows else np.argsort(dst, kind="stable")
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return indptr, src[order]


def _graph(indptr, indices):
    n = indptr.size - 1
    return Graph(indptr=indptr, indices=indices.astype(np.int32),
                 features=np.zeros((n, 1), np.float32), labels=np.zeros(n, np.int32),
                 train_mask=np.zeros((1, n), bool), val_mask=np.zeros((1, n), bool),
                 test_mask=np.zeros((1, n), bool), num_classes=1, name="g")


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def test_best_labels_equal_numpy_bit_for_bit(native):
    """Every option: weights, Spinner's penalty (with exact ties), an extra candidate,
    per-node or shared ties, int32 / int64 indices, a dense table (few labels) or sorting
    (a label per node)."""
    rng = np.random.default_rng(0)
    for trial in range(250):
        n = int(rng.integers(1, 60))
        indptr, indices = _random_csr(rng, n, int(rng.integers(0, 300)))
        indices = indices.astype(np.int32 if trial % 2 else np.int64)
        k = int(rng.choice([2, 5, n + 1, (1 << 16) + 5]))
        labels = rng.integers(0, min(k, 3 if trial % 3 == 0 else k), n)
        weights = rng.integers(1, 5, indices.size) if rng.random() < 0.5 else None
        penalty = None
        if rng.random() < 0.5:
            penalty = rng.random(k) if rng.random() < 0.5 else np.round(rng.random(k) * 3) / 3
        extra = rng.integers(0, k, n) if rng.random() < 0.5 else None
        salt, shared = int(rng.integers(0, 2**62)), bool(rng.random() < 0.5)
        args = (indptr, indices, weights, labels, k, salt)
        best, gain = P._best_labels(*args, 1 << 22, shared, penalty, extra)
        want_best, want_gain = P._best_labels_numpy(*args, int(rng.integers(1, 40)), shared,
                                                    penalty, extra)
        np.testing.assert_array_equal(best, want_best, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(_bits(gain), _bits(want_gain), err_msg=f"trial {trial}")


def test_contract_equals_scipy(native):
    rng = np.random.default_rng(1)
    for trial in range(200):
        n = int(rng.integers(1, 80))
        indptr, indices = _random_csr(rng, n, int(rng.integers(0, 400)))
        indices = indices.astype(np.int32 if trial % 2 else np.int64)
        weights = rng.integers(1, 5, indices.size) if trial % 3 else None
        labels = rng.integers(0, int(rng.integers(1, n + 1)), n)
        if trial % 5 == 0:  # labels that are not node ids take np.unique's way
            labels = labels * 7 + 1000
        node_weights = [np.ones(n, np.int64), rng.integers(0, 9, n)]
        got = P._contract(indptr, indices, weights, node_weights, labels)
        want = P._contract_numpy(indptr, indices, weights, node_weights, labels)
        for g, w in zip((*got[:3], *got[3], got[4]), (*want[:3], *want[3], want[4])):
            np.testing.assert_array_equal(g, w, err_msg=f"trial {trial}")
        assert got[1].dtype == want[1].dtype


def test_group_order_equals_lexsort(native):
    """Moves grouped by target, highest gain first, ties by the random key, then by position
    (lexsort is stable): the random keys repeat here so that every rule is needed."""
    rng = np.random.default_rng(2)
    for trial in range(200):
        m, k = int(rng.integers(0, 400)), int(rng.integers(1, 50))
        target = rng.integers(0, k, m)
        gain = rng.integers(1, 4, m) / (3 if trial % 2 else 1)
        random = np.round(rng.random(m) * 3) / 3
        order, starts = P._group_order(target, gain, random, k)
        want = np.lexsort((random, -gain, target))
        np.testing.assert_array_equal(order, want)
        np.testing.assert_array_equal(starts, np.searchsorted(target[want], np.arange(k)))


def test_symmetry_check_without_a_transpose(native, without_native):
    rng = np.random.default_rng(3)
    cases = []
    for trial in range(150):
        n = int(rng.integers(1, 40))
        cases.append(_random_csr(rng, n, int(rng.integers(0, 150)), loops=trial % 2 == 0,
                                 symmetric=trial % 3 != 0, sorted_rows=trial % 4 != 0))
    # symmetric but for one entry below the diagonal (row 3 holds 1, row 1 not 3): only the
    # count of entries below against above finds it
    cases.append((np.array([0, 0, 1, 2, 4]), np.array([2, 1, 1, 2])))
    # a pair listed twice one way and once the other
    cases.append((np.array([0, 2, 3]), np.array([1, 1, 0])))
    got = [P._is_symmetric(_graph(*c)) for c in cases]
    csrs = [neighbour_csr(_graph(*c)) for c in cases]
    without_native()
    assert got == [P._is_symmetric(_graph(*c)) for c in cases]
    assert 40 < sum(got) < len(got) - 40
    assert got[-2:] == [False, False]
    for c, (indptr, indices) in zip(cases, csrs):
        want_ptr, want_idx = neighbour_csr(_graph(*c))
        np.testing.assert_array_equal(indptr, want_ptr)
        np.testing.assert_array_equal(indices, want_idx)


def test_self_loops_dropped_block_by_block(monkeypatch):
    rng = np.random.default_rng(4)
    indptr, indices = _random_csr(rng, 50, 600, loops=True, sorted_rows=False)
    indices = indices.astype(np.int32)
    rows = np.repeat(np.arange(50), np.diff(indptr))
    keep = rows != indices
    assert not keep.all()
    from jgrind import transforms
    real = transforms.row_blocks
    monkeypatch.setattr(transforms, "row_blocks",  # many blocks
                        lambda ptr, block_edges=None: real(ptr, 7))
    new_ptr, new_idx = P._drop_self_loops(indptr, indices)
    np.testing.assert_array_equal(new_idx, indices[keep])
    np.testing.assert_array_equal(np.diff(new_ptr), np.bincount(rows[keep], minlength=50))
    assert new_idx.dtype == np.int32
    no_loops = (new_ptr, new_idx)
    assert all(a is b for a, b in zip(P._drop_self_loops(*no_loops), no_loops))


@pytest.mark.parametrize("k", [3, 8])
def test_label_propagation_does_not_depend_on_the_kernels(native, without_native, k):
    g = community_graph(num_nodes=2000)
    native_labels = label_propagation(g, k, seed=5)
    without_native()
    np.testing.assert_array_equal(native_labels, label_propagation(g, k, seed=5))


def test_a_hash_collision_goes_to_the_smaller_label(native):
    """Ties on value and on the 20-bit tie hash are rare; when they happen the NumPy code takes
    the first (smallest) label, and so must the kernel."""
    salt = 12345
    labels = np.arange(5000)
    h = P._hash(np.zeros(1, np.int64), labels, salt)
    first = {}
    for label, value in zip(labels.tolist(), h.tolist()):
        if value in first:
            pair = (first[value], label)
            break
        first[value] = label
    else:
        pytest.fail("no collision among 5000 labels")
    # node 0 has one neighbour labelled with each of the pair, in the larger-first order
    indptr = np.array([0, 2, 2, 2])
    indices = np.array([2, 1], np.int32)
    node_labels = np.array([5000, pair[0], pair[1]])  # node 0's own label is neither
    for fn in (P._best_labels, P._best_labels_numpy):
        best, _ = fn(indptr, indices, None, node_labels, 5001, salt, 1 << 22, False)
        assert best[0] == pair[0]


def test_capacity_moves_equal_numpy(native, without_native):
    """The same moves, the same labels after them, and the random stream left where NumPy's
    code leaves it; tight capacities (some labels start over them), one or two constraints,
    unit or integer node weights, with and without the move probability."""
    rng = np.random.default_rng(6)
    cases = []
    for trial in range(300):
        n, k = int(rng.integers(1, 200)), int(rng.integers(1, 30))
        labels = rng.integers(0, k, n)
        best, gain = rng.integers(0, k, n), rng.integers(-1, 4, n) / (3 if trial % 2 else 1)
        constraints = []
        for _ in range(1 + trial % 2):
            w = None if rng.random() < 0.5 else rng.integers(0, 5, n)
            peak = float(np.bincount(labels, weights=w, minlength=k).max())
            constraints.append((w, int(peak * rng.uniform(0.6, 1.3))))
        cases.append((labels, best, gain, constraints, k, int(rng.integers(0, 99)),
                      1.0 if trial % 3 else 0.5))

    def run():
        out = []
        for labels, best, gain, constraints, k, seed, p in cases:
            moved, stream = labels.copy(), np.random.default_rng(seed)
            count = P._capacity_moves(moved, best, gain, constraints, k, stream, p)
            out.append((count, moved, stream.random()))
        return out
    native_runs = run()
    without_native()
    numpy_runs = run()
    assert sum(count for count, _, _ in numpy_runs) > 1000
    for (count, moved, after), (want_count, want, want_after) in zip(native_runs, numpy_runs):
        assert count == want_count and after == want_after
        np.testing.assert_array_equal(moved, want)


def test_many_threads_and_rows(native, without_native, monkeypatch):
    """Rows and clusters pulled by several threads, in several batches each (4 threads, more
    rows than 4 x 4096): the same arrays as NumPy's."""
    monkeypatch.setenv("JGRIND_NUM_THREADS", "4")
    rng = np.random.default_rng(7)
    n = 30_000
    indptr, indices = _random_csr(rng, n, 240_000, symmetric=True)
    indices = indices.astype(np.int32)
    for k, shared in ((16, False), (n, True)):
        labels = rng.integers(0, k, n)
        penalty = rng.random(k) if k == 16 else None
        extra = rng.integers(0, k, n) if k == 16 else None
        got = P._best_labels(indptr, indices, None, labels, k, 99, 1 << 22, shared, penalty,
                             extra)
        want = P._best_labels_numpy(indptr, indices, None, labels, k, 99, 1 << 14, shared,
                                    penalty, extra)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(_bits(got[1]), _bits(want[1]))
    clusters = rng.integers(0, 5000, n)
    got = P._contract(indptr, indices, None, [np.ones(n, np.int64)], clusters)
    want = P._contract_numpy(indptr, indices, None, [np.ones(n, np.int64)], clusters)
    for g, w in zip((*got[:3], got[4]), (*want[:3], want[4])):
        np.testing.assert_array_equal(g, w)
    graph = _graph(indptr, indices)
    assert P._is_symmetric(graph)
    broken = indices.copy()
    broken[indptr[n // 2]] = (broken[indptr[n // 2]] + 1) % n  # one entry moved
    assert not P._is_symmetric(_graph(indptr, broken))
    without_native()
    assert not P._is_symmetric(_graph(indptr, broken))


def test_capacity_moves_past_two_hundred_rounds(native, without_native):
    """A chain of 300 full labels, each node wanting the next one: rejecting from "all
    moves accepted" takes a round per link, so after 200 rounds the rule restarts from
    "none accepted"; the kernel must do the same."""
    length = 300
    labels = np.arange(length + 1)
    best = np.minimum(labels + 1, length)
    weights = np.ones(length + 1, np.int64)  # every label full, the last one too
    args = (best, np.ones(length + 1), [(weights, 1)], length + 1)
    moved = labels.copy()
    count = P._capacity_moves(moved, *args, np.random.default_rng(0), 1.0)
    assert count == 0  # no move fits: stopping after 200 rounds would leave 100 accepted
    want = labels.copy()
    without_native()
    assert count == P._capacity_moves(want, *args, np.random.default_rng(0), 1.0)
    np.testing.assert_array_equal(moved, want)


def test_int64_indices_symmetry(native):
    """`Graph` keeps int32 indices below 2^31 edges; the kernel's int64 path is used above."""
    from types import SimpleNamespace
    rng = np.random.default_rng(8)
    indptr, indices = _random_csr(rng, 300, 2000, symmetric=True)
    for idx, want in ((indices, True), (np.r_[indices[:-1], (indices[-1] + 1) % 300], False)):
        g = SimpleNamespace(indptr=indptr, indices=idx.astype(np.int64), num_nodes=300,
                            num_edges=idx.size)
        assert P._is_symmetric(g) is want


def test_inputs_the_kernels_do_not_take(native):
    """Weights that are not whole numbers and non-finite penalties go to NumPy (a sum of
    fractions depends on its order); labels out of range and non-positive weights are
    errors; a NaN balance is refused."""
    indptr, indices = np.array([0, 2, 3, 4]), np.array([1, 2, 0, 0], np.int32)
    labels = np.array([0, 1, 2])
    best, gain = P._best_labels(indptr, indices, np.array([1.5, 1, 1, 1]), labels, 3, 0,
                                1 << 22, True)
    assert best[0] == 1 and gain[0] == 1.5
    best, _ = P._best_labels(indptr, indices, None, labels, 3, 0, 1 << 22, True,
                             np.array([np.nan, 0, 0]))
    want, _ = P._best_labels_numpy(indptr, indices, None, labels, 3, 0, 1 << 22, True,
                                   np.array([np.nan, 0, 0]))
    np.testing.assert_array_equal(best, want)
    with pytest.raises(ValueError, match="outside"):
        P._best_labels(indptr, indices, None, np.array([0, 1, 3]), 3, 0, 1 << 22, True)
    with pytest.raises(ValueError, match="positive"):
        P._best_labels(indptr, indices, np.array([1, 0, 1, 1]), labels, 3, 0, 1 << 22, True)
    with pytest.raises(ValueError, match="finite"):
        label_propagation(community_graph(num_nodes=100), 2, balance=float("nan"))
    for bad in ({"imbalance": float("nan")}, {"edge_imbalance": float("inf")},
                {"imbalance": 0.9}):
        with pytest.raises(ValueError, match="finite numbers >= 1.0"):
            label_propagation(community_graph(num_nodes=100), 2, **bad)


def test_out_of_memory_is_an_error_not_an_abort(native):
    """A C++ allocation that fails raises MemoryError in Python instead of terminating the
    process: under an address-space limit 300 MiB above the process, NumPy's 200 MB of group
    starts fit and the kernel's 200 MB copy of them does not."""
    import subprocess
    import sys
    code = (
        "import resource, numpy as np\n"
        "from jgrind import _kernels\n"
        "from jgrind.partition import partitioners as P\n"
        "assert _kernels.library() is not None\n"
        "size = int(next(l for l in open('/proc/self/status') if l.startswith('VmSize'))"
        ".split()[1]) * 1024\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + 300 * 2**20, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    P._group_order(np.zeros(0, np.int64), np.zeros(0), np.zeros(0), 25_000_000)\n"
        "except MemoryError as e:\n"
        "    print('MemoryError:', e)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "MemoryError: label propagation: a native kernel ran out of memory" in done.stdout


def test_bisection_kernels_equal_python_bit_for_bit(native):
    """`bisection.cc`'s growing and balancing against their Python references on random
    graphs, with and without edge weights and self loops."""
    from jgrind.partition import bisection as B
    rng = np.random.default_rng(3)
    for trial in range(200):
        n = int(rng.integers(2, 80))
        indptr, indices = _random_csr(rng, n, int(rng.integers(0, 300)), symmetric=True,
                                      loops=trial % 3 == 0)
        weights = None if trial % 2 else rng.integers(1, 5, indices.size)
        edges = B.edge_weights(indptr, indices, weights)
        node_weight = rng.integers(1, 4, n).astype(np.float64)
        load = np.bincount(edges[0], minlength=n).astype(np.float64)
        shares = np.stack([node_weight / node_weight.sum(), load / max(load.sum(), 1.0)])
        target = float(rng.uniform(0.2, 1.0))
        tie, order = B._growth_draws(np.random.default_rng(trial), n)
        side = B._grow(indptr, indices, edges, shares.sum(axis=0), target, (tie, order))
        np.testing.assert_array_equal(
            side, B._grow_python(indptr, indices, edges, shares.sum(axis=0), target, tie, order))
        bounds = np.array([[0.52, 0.52], [0.55, 0.55]]) * float(rng.uniform(0.9, 1.1))
        native_side, python_side = side.copy(), side.copy()
        left = B._balance(indptr, indices, edges, native_side, shares, bounds)
        assert left == B._balance_python(indptr, indices, edges, python_side, shares, bounds)
        np.testing.assert_array_equal(native_side, python_side)


def test_balancing_by_bounded_scores_takes_the_full_rankings_moves(native):
    """The native balancing scores only the nodes whose bound reaches the best score found;
    on larger graphs from lopsided starts (hundreds of moves, one to three constraints, some
    nodes of weight 0, sides over in different constraints so that the bounds' pattern flips)
    its moves are those of the Python code, which scores every node at every move."""
    from jgrind.partition import bisection as B
    rng = np.random.default_rng(11)
    moved = 0
    for trial in range(24):
        n = int(rng.integers(300, 2500))
        indptr, indices = _random_csr(rng, n, int(rng.integers(n, 5 * n)), symmetric=True,
                                      loops=trial % 4 == 0)
        weights = None if trial % 2 else rng.integers(1, 5, indices.size)
        edges = B.edge_weights(indptr, indices, weights)
        rows = []
        for c in range(1 + trial % 3):
            weight = (rng.integers(1, 4, n), np.bincount(edges[0], minlength=n),
                      rng.integers(0, 3, n))[(trial + c) % 3].astype(np.float64)
            rows.append(weight / max(weight.sum(), 1.0))
        shares = np.stack(rows)
        start = (rng.random(n) < rng.uniform(0.1, 0.9)).astype(np.int64)
        bounds = 0.5 * rng.uniform(0.97, 1.15, (shares.shape[0], 2))
        native_side, python_side = start.copy(), start.copy()
        left = B._balance(indptr, indices, edges, native_side, shares, bounds)
        assert left == B._balance_python(indptr, indices, edges, python_side, shares, bounds)
        np.testing.assert_array_equal(native_side, python_side)
        moved += int((native_side != start).sum())
    assert moved > 5000


def test_bisection_tries_on_threads_give_the_labels_of_one_thread(native, monkeypatch):
    """A bisection's tries run at once on threads (from `_PARALLEL_NODES` nodes, lowered here
    so that every split of this graph runs so): the labels are those of one thread."""
    from jgrind import _kernels
    from jgrind.partition import bisection as B
    g = community_graph(3000, num_classes=8, seed=2)
    indptr, indices = neighbour_csr(g)
    indptr = indptr.astype(np.int64)
    load = g.in_degree().astype(np.int64)
    constraints = [(np.ones(g.num_nodes, np.int64), 400), (load, int(1.1 * load.sum() / 8))]
    monkeypatch.setattr(B, "_PARALLEL_NODES", 2)
    labels = {}
    for threads in (1, 4):
        monkeypatch.setattr(_kernels, "num_threads", lambda threads=threads: threads)
        labels[threads] = B.recursive_bisection(indptr, indices, None, constraints, 8,
                                                np.random.default_rng(5))
    np.testing.assert_array_equal(labels[1], labels[4])


def test_recursive_bisection_is_the_same_without_the_kernels(native, without_native):
    from jgrind.partition.bisection import recursive_bisection
    g = community_graph(2000, num_classes=8, seed=1)
    indptr, indices = neighbour_csr(g)
    indptr = indptr.astype(np.int64)
    load = g.in_degree().astype(np.int64)
    constraints = [(np.ones(g.num_nodes, np.int64), 270), (load, int(1.1 * load.sum() / 8))]
    with_kernels = recursive_bisection(indptr, indices, None, constraints, 8,
                                       np.random.default_rng(0))
    without_native()
    np.testing.assert_array_equal(
        with_kernels, recursive_bisection(indptr, indices, None, constraints, 8,
                                          np.random.default_rng(0)))
