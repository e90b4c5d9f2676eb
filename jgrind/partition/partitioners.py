"""Node partitioners: ``(graph, num_parts, *, seed=0, ...) -> [N] int32`` partition of every node.

Every partitioner is deterministic for given inputs and seed, and returns a `np.int32` array
``assignment`` with ``0 <= assignment[v] < num_parts``. They all run on the host, in O(N + E)
memory, so they work on graphs far larger than the accelerator.

* `contiguous` - node ids cut into consecutive ranges (free, good when ids have locality).
* `random` - a seeded permutation cut into equal pieces (the worst-case baseline).
* `label_propagation` - multilevel balanced label propagation (GriNNder / KaMinPar-like):
  coarsen by clustering, partition the coarsest graph, refine level by level; native loops
  over the CSR (NumPy when the kernels cannot be built, with the same result).
* `metis` - METIS through the optional ``pymetis`` package.

`PARTITIONERS` maps the CLI names to these functions.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from jgrind import _kernels
from jgrind.arguments import number, whole_number
from jgrind.graph import Graph, GraphError
from jgrind.partition.bisection import cut_weight, edge_weights, recursive_bisection

__all__ = ["contiguous", "random", "label_propagation", "metis", "PARTITIONERS",
           "check_num_parts", "neighbour_csr"]


def check_num_parts(graph: Graph, num_parts) -> int:
    """Validate ``num_parts`` against the graph: an int in ``[1, N]``. Returns it as an int."""
    n = graph.num_nodes
    if isinstance(num_parts, bool) or not isinstance(num_parts, (int, np.integer)):
        raise GraphError(f"{graph.name}: num_parts must be an integer in [1, {n}], "
                         f"got {num_parts!r}")
    k = int(num_parts)
    if not 1 <= k <= n:
        raise GraphError(f"{graph.name}: num_parts must lie in [1, {n}] (the number of nodes), "
                         f"got {k}")
    return k


# -- contiguous ------------------------------------------------------------------------------
def contiguous(graph: Graph, num_parts: int, *, seed: int = 0,
               balance: str = "nodes+edges") -> np.ndarray:
    """Cut node ids ``0..N-1`` into ``num_parts`` consecutive ranges.

    ``balance="nodes+edges"`` (default) balances the cost ``1 + in_degree(v)`` summed over each
    range, i.e. roughly the work of a layer on that partition (rows plus CSR entries);
    ``balance="nodes"`` balances node counts only (sizes differ by at most one). Either way every
    range holds at least one node, so no partition is empty. ``seed`` is accepted for a uniform
    signature and ignored.
    """
    k = check_num_parts(graph, num_parts)
    n = graph.num_nodes
    if balance == "nodes":
        bounds = (np.arange(k + 1, dtype=np.int64) * n) // k
    elif balance == "nodes+edges":
        cost = np.cumsum(graph.in_degree().astype(np.int64) + 1)  # cost of nodes [0, v]
        targets = (np.arange(1, k, dtype=np.float64) * float(cost[-1])) / k
        # cut after the node whose cumulative cost first reaches the target
        cuts = np.searchsorted(cost, targets, side="left") + 1
        bounds = np.concatenate([[0], cuts, [n]]).astype(np.int64)
        # force strictly increasing bounds (every range non-empty) within [0, n]
        i = np.arange(k + 1, dtype=np.int64)
        c = np.minimum(np.maximum.accumulate(bounds - i), n - k)
        bounds = c + i
    else:
        raise ValueError(f"balance must be 'nodes' or 'nodes+edges', got {balance!r}")
    return np.repeat(np.arange(k, dtype=np.int32), np.diff(bounds))


# -- random ----------------------------------------------------------------------------------
def random(graph: Graph, num_parts: int, *, seed: int = 0) -> np.ndarray:
    """Balanced random assignment: a seeded permutation of the nodes cut into ``num_parts``
    pieces whose sizes differ by at most one."""
    k = check_num_parts(graph, num_parts)
    n = graph.num_nodes
    perm = np.random.default_rng(seed).permutation(n)
    out = np.empty(n, np.int32)
    out[perm] = (np.arange(n, dtype=np.int64) * k // n).astype(np.int32)
    return out


# -- label propagation -----------------------------------------------------------------------
def _csr_sorted_indices(indptr: np.ndarray, indices: np.ndarray, n: int) -> np.ndarray:
    """Indices of a CSR with every row sorted (scipy's per-row sort; O(E) extra memory)."""
    import scipy.sparse as sp
    m = sp.csr_matrix((np.ones(indices.size, np.int8), indices, indptr), shape=(n, n))
    if not m.has_sorted_indices:
        m = m.copy()
        m.sort_indices()
    return m.indices


def neighbour_csr(graph: Graph, symmetric=None) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the undirected neighbourhood: row ``v`` lists in- and
    out-neighbours of ``v``, self loops dropped.

    For a symmetric graph (checked structurally in O(N + E) time unless ``symmetric`` says so;
    natively in no extra memory when its rows are sorted) this is the graph's own CSR.
    Otherwise row ``v`` is the in-row followed by the out-row, so an edge stored in both
    directions is listed twice - it is cut twice if ``v`` is separated from it.
    """
    import scipy.sparse as sp
    n = graph.num_nodes
    if symmetric is None:
        symmetric = _is_symmetric(graph)
    if symmetric:
        return _drop_self_loops(np.asarray(graph.indptr), np.asarray(graph.indices))
    a = sp.csr_matrix((np.ones(graph.num_edges, np.int8), graph.indices, graph.indptr),
                      shape=(n, n))
    at = a.T.tocsr()  # counting sort: O(N + E), rows come out sorted
    del a
    deg_in = np.diff(graph.indptr).astype(np.int64)
    deg_out = np.diff(at.indptr).astype(np.int64)
    indptr = np.zeros(n + 1, np.int64)
    np.cumsum(deg_in + deg_out, out=indptr[1:])
    idx_t = np.int32 if indptr[-1] < 2**31 - 1 and n < 2**31 - 1 else np.int64
    indices = np.empty(int(indptr[-1]), idx_t)
    # entry j of in-row v goes to indptr[v] + j; entry j of out-row v to indptr[v] + deg_in[v] + j
    start_in = np.repeat(indptr[:-1] - np.asarray(graph.indptr[:-1], np.int64), deg_in)
    indices[start_in + np.arange(graph.num_edges)] = graph.indices
    del start_in
    start_out = np.repeat(indptr[:-1] + deg_in - at.indptr[:-1].astype(np.int64), deg_out)
    indices[start_out + np.arange(at.indices.size)] = at.indices
    return _drop_self_loops(indptr, indices)


def _is_symmetric(graph: Graph) -> bool:
    """Whether the graph's pattern, with multiplicities, equals its transpose's: natively
    without building the transpose when every row is sorted, else by scipy's transpose."""
    import scipy.sparse as sp
    lib = _kernels.library()
    indices = np.asarray(graph.indices)
    if lib is not None and indices.dtype in (np.int32, np.int64):
        indptr = np.ascontiguousarray(graph.indptr, np.int64)
        indices = np.ascontiguousarray(indices)
        verdict = lib.jgrind_is_symmetric(indptr.ctypes.data, indices.ctypes.data,
                                          int(indices.dtype == np.int64), graph.num_nodes,
                                          _kernels.num_threads())
        _check_native(verdict == -2)
        if verdict >= 0:
            return bool(verdict)
    n = graph.num_nodes
    a = sp.csr_matrix((np.ones(graph.num_edges, np.int8), graph.indices, graph.indptr),
                      shape=(n, n))
    at = a.T.tocsr()
    return bool(np.array_equal(at.indptr, graph.indptr)) and bool(np.array_equal(
        at.indices, _csr_sorted_indices(graph.indptr, graph.indices, n)))


def _drop_self_loops(indptr: np.ndarray, indices: np.ndarray):
    """The CSR without its diagonal entries (the same arrays when there are none), in its
    rows' order."""
    from jgrind.transforms import self_loop_mask
    keep, new_ptr = self_loop_mask(indptr, indices)
    return (indptr, indices) if keep.all() else (new_ptr, indices[keep])


_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def _hash(a: np.ndarray, b: np.ndarray, salt: int) -> np.ndarray:
    """A 20-bit pseudo-random value per (a, b) pair (splitmix64 finaliser, wrapping uint64)."""
    x = a.astype(np.uint64) * _M1 + b.astype(np.uint64) * _M3 + np.uint64(salt)
    x ^= x >> np.uint64(30)
    x *= _M2
    x ^= x >> np.uint64(27)
    x *= _M3
    x ^= x >> np.uint64(31)
    return (x >> np.uint64(44)).astype(np.int64)


def _chunks(indptr: np.ndarray, chunk_entries: int):
    """Node ranges ``[a, b)`` covering all nodes, each with about ``chunk_entries`` CSR entries
    (and at most ``chunk_entries`` nodes)."""
    n = indptr.size - 1
    nnz = int(indptr[-1])
    by_entries = np.searchsorted(indptr, np.arange(0, nnz, chunk_entries), side="right") - 1
    bounds = np.unique(np.concatenate([by_entries, np.arange(0, n, chunk_entries), [n]]))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


_EPS = 1e-12


def _best_labels(indptr, indices, weights, labels, k, salt, chunk_entries, per_node_ties,
                 penalty=None, extra=None):
    """Every node's best label and the gain of moving there: `_best_labels_numpy`'s result,
    bit for bit, from the native kernel (``labels.cc``: one pass, threaded, no E-sized
    temporaries) when it is available, else from NumPy."""
    lib = _kernels.library()
    if lib is None or not _whole(weights) or (penalty is not None
                                              and not np.isfinite(penalty).all()):
        return _best_labels_numpy(indptr, indices, weights, labels, k, salt, chunk_entries,
                                  per_node_ties, penalty, extra)
    for what, a in (("label", labels), ("extra label", extra)):
        if a is not None and a.size and not (0 <= a.min() and a.max() < k):
            raise ValueError(f"label propagation: a {what} lies outside [0, {k})")
    n = labels.size
    indptr = np.ascontiguousarray(indptr, np.int64)
    if indices.dtype not in (np.int32, np.int64):
        indices = indices.astype(np.int64)
    indices = np.ascontiguousarray(indices)
    labels = np.ascontiguousarray(labels, np.int64)
    if weights is not None:
        weights = np.ascontiguousarray(weights, np.int64)
    if penalty is not None:
        penalty = np.ascontiguousarray(penalty, np.float64)
    if extra is not None:
        extra = np.ascontiguousarray(extra, np.int64)
    best = np.empty(n, np.int64)
    gain = np.empty(n, np.float64)
    ptr = lambda a: None if a is None else a.ctypes.data  # noqa: E731
    rc = lib.jgrind_best_labels(indptr.ctypes.data, indices.ctypes.data,
                                int(indices.dtype == np.int64), ptr(weights), labels.ctypes.data,
                                n, k, salt, int(per_node_ties), ptr(penalty), ptr(extra),
                                best.ctypes.data, gain.ctypes.data, _kernels.num_threads())
    if rc == 1:
        raise ValueError("label propagation: edge weights must be positive")
    _check_native(rc != 0)
    return best, gain


def _whole(weights) -> bool:
    """Whether ``weights`` (or None: unit weights) are integers, as the kernels need: sums of
    them are exact in any order, which is what makes the kernels match NumPy bit for bit."""
    return weights is None or np.issubdtype(np.asarray(weights).dtype, np.integer)


def _check_native(failed: bool) -> None:
    if failed:
        raise MemoryError("label propagation: a native kernel ran out of memory; partition "
                          "on a machine with more memory, or with JGRIND_DISABLE_NATIVE=1")


def _best_labels_numpy(indptr, indices, weights, labels, k, salt, chunk_entries,
                       per_node_ties, penalty=None, extra=None):
    """Every node's best label and the gain of moving there.

    The value of label ``l`` for node ``v`` is the weight of v's neighbours labelled ``l``
    (unit weights when ``weights`` is None); with a ``penalty`` (``[k]`` floats, Spinner's load
    term) it is that weight *as a fraction of v's degree* minus ``penalty[l]``. Candidates are
    the labels of v's neighbours plus ``extra[v]`` (if given: a label v may move to without
    neighbours there, so that nodes can leave overloaded labels). Ties go to the current label,
    then to a pseudo-random one. The adjacency must have no self loops.

    Returns ``(best [N], gain [N] float64)`` with ``gain = value(best) - value(current)``.

    Counting builds, per chunk of about ``chunk_entries`` CSR entries, the sparse
    ``rows x k`` matrix whose row ``v`` holds the labels of v's neighbours and lets scipy sum the
    duplicates (a short sort per row): O(N + chunk) memory whatever k is, never N x k.
    ``per_node_ties=False`` breaks ties by a per-label priority shared by all nodes, which makes
    propagation from singletons merge quickly (neighbours agree on the same label).
    """
    import scipy.sparse as sp
    n = labels.size
    best = labels.copy()
    gain = np.zeros(n, np.float64)
    lab_t = np.int32 if k < 2**31 - 1 else np.int64
    for a, b in _chunks(indptr, chunk_entries):
        s, e = int(indptr[a]), int(indptr[b])
        rows_n = b - a
        ptr = (indptr[a:b + 1] - s).astype(np.int64)
        lab = labels[indices[s:e]].astype(lab_t)
        data = np.ones(e - s, np.float64) if weights is None else weights[s:e].astype(np.float64)
        if extra is not None:  # one more (zero-weight) entry at the end of every row
            deg = np.diff(ptr)
            pos = np.arange(e - s) + np.repeat(np.arange(rows_n), deg)
            ptr = ptr + np.arange(rows_n + 1)
            lab2 = np.empty(e - s + rows_n, lab_t)
            lab2[pos] = lab
            lab2[ptr[1:] - 1] = extra[a:b]
            data2 = np.zeros(lab2.size, np.float64)
            data2[pos] = data
            lab, data = lab2, data2
            del pos, lab2, data2
        if lab.size == 0:
            continue
        m = sp.csr_matrix((data, lab, ptr.astype(lab_t)), shape=(rows_n, k))
        m.sum_duplicates()  # sorts every row by label and sums repeated labels (keeps zeros)
        value, ulab = m.data, m.indices.astype(np.int64)
        row_len = np.diff(m.indptr).astype(np.int64)
        del m, data, lab
        nonempty = np.flatnonzero(row_len)
        starts = (np.cumsum(row_len) - row_len)[nonempty]
        urow = np.repeat(np.arange(rows_n, dtype=np.int64), row_len)
        node = urow + a
        if penalty is not None:
            degree = np.zeros(rows_n)
            degree[nonempty] = np.add.reduceat(value, starts)
            value = value / np.maximum(degree, 1e-300)[urow] - penalty[ulab]
        is_cur = ulab == labels[node]
        mx = np.maximum.reduceat(value, starts)
        top = value == np.repeat(mx, row_len[nonempty])
        tie = _hash(node if per_node_ties else np.zeros_like(node), ulab, salt)
        key2 = np.where(top, (is_cur.astype(np.int64) << 21) | tie, -1)
        mx2 = np.maximum.reduceat(key2, starts)
        hit = np.flatnonzero(key2 == np.repeat(mx2, row_len[nonempty]))
        hfirst = np.ones(hit.size, bool)  # first hit per row (a tie needs a 20-bit collision)
        hfirst[1:] = urow[hit[1:]] != urow[hit[:-1]]
        hit = hit[hfirst]
        if penalty is None:
            cur_value = np.zeros(rows_n)
        else:
            cur_value = -penalty[labels[a:b]].astype(np.float64)
        cur_value[urow[is_cur]] = value[is_cur]
        r = urow[hit]
        best[a + r] = ulab[hit]
        gain[a + r] = value[hit] - cur_value[r]
    return best, gain


def _capacity_moves(labels, best, gain, constraints, k, rng, move_probability):
    """Move nodes to their best label, as many as capacity allows, highest gain first.

    ``constraints`` is a list of ``(node_weight or None for ones, capacity)``: the load of a
    label is the sum of its nodes' weights, and a move may not push a load past its capacity.
    Label ``l`` accepts the longest prefix of its arrivals (by gain) that fits, for every
    constraint, in ``room[l] + departures[l]`` (``room = capacity - load``, departures = the
    accepted moves out of ``l``). The accepted set is the largest fixed point of that rule,
    found from "everyone moves" by rejecting the excess until nothing changes; so exchanges and
    cycles between full labels still happen. A label over capacity accepts no arrival until
    enough departures bring it under. Returns the number of moves.
    """
    cand = np.flatnonzero((best != labels) & (gain > _EPS))
    if move_probability < 1.0 and cand.size:
        cand = cand[rng.random(cand.size) < move_probability]
    if cand.size == 0:
        return 0
    lib = _kernels.library()
    if (lib is not None and labels.dtype == np.int64 and labels.flags.c_contiguous
            and all(_whole(w) for w, _ in constraints)):
        return _capacity_moves_native(lib, labels, best, gain, cand, constraints, k, rng)
    tgt, src = best[cand], labels[cand]
    weights, rooms = [], []
    for w, cap in constraints:
        load = np.bincount(labels, weights=w, minlength=k)
        rooms.append(np.floor(cap - load).astype(np.int64))
        weights.append(np.ones(cand.size, np.int64) if w is None else w[cand].astype(np.int64))
    # drop candidates that cannot fit even if every candidate left their target
    fits = np.ones(cand.size, bool)
    for w, room in zip(weights, rooms):
        fits &= w <= (room + np.bincount(src, weights=w, minlength=k).astype(np.int64))[tgt]
    cand, tgt, src = cand[fits], tgt[fits], src[fits]
    weights = [w[fits] for w in weights]
    order, group_start = _group_order(tgt, gain[cand], rng.random(cand.size), k)
    cand, tgt, src = cand[order], tgt[order], src[order]
    cums = []
    for i, w in enumerate(weights):
        w = weights[i] = w[order]
        cum = np.cumsum(w)
        cums.append(cum - np.concatenate([[0], cum])[group_start][tgt])

    def allowed(acc):
        ok = np.ones(cand.size, bool)
        for w, room, cum in zip(weights, rooms, cums):
            dep = np.bincount(src[acc], weights=w[acc], minlength=k).astype(np.int64)
            ok &= cum <= (room + dep)[tgt]
        return ok

    accepted = np.ones(cand.size, bool)
    for _ in range(200):  # top-down: decreasing towards the largest fixed point
        nxt = allowed(accepted)
        if np.array_equal(nxt, accepted):
            break
        accepted = nxt
    else:  # not converged (pathological chains): bottom-up is feasible at every step
        accepted = np.zeros(cand.size, bool)
        for _ in range(200):
            nxt = allowed(accepted)
            if np.array_equal(nxt, accepted):
                break
            accepted = nxt
    labels[cand[accepted]] = tgt[accepted]
    return int(accepted.sum())


def _capacity_moves_native(lib, labels, best, gain, cand, constraints, k, rng) -> int:
    """`_capacity_moves` from ``cand`` on, in ``labels.cc``: the same moves, drawing the same
    random numbers, without NumPy's dozen candidate-sized temporaries."""
    best = np.ascontiguousarray(best, np.int64)
    gain = np.ascontiguousarray(gain, np.float64)
    cand = np.array(cand, np.int64)  # filtered in place
    node_weights = [None if w is None else np.ascontiguousarray(w, np.int64)
                    for w, _ in constraints]
    pointers = np.array([0 if w is None else w.ctypes.data for w in node_weights], np.uint64)
    capacities = np.array([float(cap) for _, cap in constraints], np.float64)
    rooms = np.empty((len(constraints), k), np.int64)
    kept = lib.jgrind_capacity_fits(labels.ctypes.data, best.ctypes.data, labels.size,
                                    cand.ctypes.data, cand.size, k, len(constraints),
                                    pointers.ctypes.data, capacities.ctypes.data,
                                    rooms.ctypes.data)
    _check_native(kept < 0)
    random = np.ascontiguousarray(rng.random(kept))  # as the NumPy code draws them
    if kept == 0:
        return 0
    moves = lib.jgrind_capacity_accept(labels.ctypes.data, best.ctypes.data,
                                       gain.ctypes.data, cand.ctypes.data, kept, k,
                                       len(constraints), pointers.ctypes.data,
                                       rooms.ctypes.data, random.ctypes.data,
                                       _kernels.num_threads())
    _check_native(moves < 0)
    return int(moves)


def _group_order(target, gain, random, k):
    """``np.lexsort((random, -gain, target))`` (moves grouped by target, highest gain first,
    ties in a random order) and every group's start, ``[k]``; natively a counting sort by
    target and short sorts within the groups."""
    lib = _kernels.library()
    if lib is None:
        order = np.lexsort((random, -gain, target))
        return order, np.searchsorted(target[order], np.arange(k))
    target = np.ascontiguousarray(target, np.int64)
    gain = np.ascontiguousarray(gain, np.float64)
    random = np.ascontiguousarray(random, np.float64)
    order = np.empty(target.size, np.int64)
    group_start = np.empty(k, np.int64)
    rc = lib.jgrind_group_order(target.ctypes.data, gain.ctypes.data, random.ctypes.data,
                                target.size, k, order.ctypes.data, group_start.ctypes.data,
                                _kernels.num_threads())
    if rc == 1:
        raise ValueError("label propagation: a move's target label is out of range")
    _check_native(rc != 0)
    return order, group_start


def _contract(indptr, indices, weights, node_weights, labels, max_entries=None):
    """The graph of clusters: node ``c`` is the cluster ``labels == u[c]``, edge weights count
    the fine edges between clusters (intra-cluster edges dropped), node weights are summed.
    Returns ``(indptr, indices, weights, node_weights, inverse)``, ``inverse[v]`` = v's cluster;
    None when the coarse graph would have more than ``max_entries`` entries (natively found
    out before any of them is stored).

    Natively each coarse row gathers its members' rows (two passes: count, then fill), so
    the memory is the coarse graph's and what grows with the nodes; the NumPy reference
    (`_contract_numpy`, the same arrays) holds about 30 bytes per fine edge.
    """
    lib = _kernels.library()
    if lib is None or not _whole(weights):
        coarse = _contract_numpy(indptr, indices, weights, node_weights, labels)
        return None if max_entries is not None and coarse[1].size > max_entries else coarse
    n = labels.size
    if labels.min(initial=0) < 0 or labels.max(initial=0) >= n:
        inv = np.unique(labels, return_inverse=True)[1].astype(np.int64)
    else:  # labels are node ids (as `_cluster_order` makes them): no sort needed
        present = np.zeros(n, bool)
        present[labels] = True
        rank = np.cumsum(present, dtype=np.int64) - 1
        inv = rank[labels]  # np.unique's inverse: the rank of a node's label among those used
        del present, rank
    c = int(inv.max(initial=-1)) + 1
    counts = np.bincount(inv, minlength=c)
    mptr = np.zeros(c + 1, np.int64)
    np.cumsum(counts, out=mptr[1:])
    members = np.argsort(inv, kind="stable")
    indptr = np.ascontiguousarray(indptr, np.int64)
    if indices.dtype not in (np.int32, np.int64):
        indices = indices.astype(np.int64)
    indices = np.ascontiguousarray(indices)
    if weights is not None:
        weights = np.ascontiguousarray(weights, np.int64)
    out_ptr = np.zeros(c + 1, np.int64)
    args = (indptr.ctypes.data, indices.ctypes.data, int(indices.dtype == np.int64),
            None if weights is None else weights.ctypes.data, inv.ctypes.data,
            mptr.ctypes.data, members.ctypes.data, c)
    _check_native(lib.jgrind_contract(*args, out_ptr.ctypes.data, None, 0, None,
                                      _kernels.num_threads()) != 0)
    np.cumsum(out_ptr, out=out_ptr)
    if max_entries is not None and out_ptr[-1] > max_entries:
        return None
    idx_t = np.int32 if c < 2**31 - 1 else np.int64
    out_indices = np.empty(int(out_ptr[-1]), idx_t)
    out_weights = np.empty(int(out_ptr[-1]), np.int64)
    _check_native(lib.jgrind_contract(*args, out_ptr.ctypes.data, out_indices.ctypes.data,
                                      int(idx_t == np.int64), out_weights.ctypes.data,
                                      _kernels.num_threads()) != 0)
    inv = inv.astype(idx_t)
    nws = [np.bincount(inv, weights=nw, minlength=c).astype(np.int64) for nw in node_weights]
    return out_ptr, out_indices, out_weights, nws, inv


def _contract_numpy(indptr, indices, weights, node_weights, labels):
    """`_contract` in NumPy and scipy (COO -> CSR, duplicates summed): the reference, and the
    fallback without native kernels."""
    import scipy.sparse as sp
    _, inv = np.unique(labels, return_inverse=True)
    c = int(inv.max()) + 1
    inv = inv.astype(np.int32 if c < 2**31 - 1 else np.int64)
    n = labels.size
    rows = inv[np.repeat(np.arange(n, dtype=inv.dtype), np.diff(indptr))]
    cols = inv[indices]
    keep = rows != cols
    w = np.ones(int(keep.sum()), np.int64) if weights is None else weights[keep]
    m = sp.csr_matrix((w, (rows[keep], cols[keep])), shape=(c, c))  # sums duplicates
    del rows, cols, keep, w
    m.sum_duplicates()
    nws = [np.bincount(inv, weights=nw, minlength=c).astype(np.int64) for nw in node_weights]
    return m.indptr, m.indices, m.data.astype(np.int64), nws, inv


def _cluster_order(graph, k, rng, chunk_entries, cluster_iterations):
    """A node order that keeps clusters (and clusters of clusters) together.

    ``graph`` is ``(indptr, indices, edge_weights or None, [node weights, edge loads])``.
    Multilevel size-constrained label propagation (as in KaHIP's SCLaP coarsening): cluster
    the nodes from singletons, each cluster holding at most a ``1/k`` share of the node
    weight and of the edge load, contract, cluster the clusters with 4x larger bounds, ...
    until the graph stops shrinking. Nodes are ordered by their cluster at the coarsest level,
    then the next finer, and so on.
    """
    ip, ix, w, nws = graph
    total_n, total_e = int(nws[0].sum()), int(nws[1].sum())
    levels = []  # inverse maps, finest first
    size = ip.size - 1
    bound_n = -(-total_n // k)
    bound_e = max(1, -(-total_e // k), int(nws[1].max(initial=0)))
    while size > 1:
        labels = np.arange(size, dtype=np.int64)
        _propagate(ip, ix, w, labels, size, [(nws[0], bound_n), (nws[1], bound_e)],
                   cluster_iterations, rng, 1.0, False, chunk_entries)
        ip, ix, w, nws, inv = _contract(ip, ix, w, nws, labels)
        levels.append(inv)
        if ip.size - 1 > 0.95 * size or bound_n >= total_n:
            break
        size, bound_n, bound_e = ip.size - 1, bound_n * 4, bound_e * 4
    if not levels:
        return np.arange(size)
    keys = [levels[0]]  # cluster id at every level, coarsest most significant
    for inv in levels[1:]:
        keys.append(inv[keys[-1]])
    return np.lexsort(keys)  # lexsort: the last key is the primary one


def _propagate(indptr, indices, weights, labels, k, constraints, iterations, rng,
               move_probability, per_node_ties, chunk_entries, balance=0.0):
    """Capacity-constrained label propagation, in place on ``labels``; stops at a fixed point.

    ``balance > 0`` switches on Spinner's load penalty: the value of a label is the fraction of
    a node's neighbours there minus ``balance`` times the label's mean relative load over the
    constraints, and every node may also consider one light label without neighbours.
    """
    salt = int(rng.integers(0, 2**62))
    for _ in range(iterations):
        if per_node_ties:
            salt = int(rng.integers(0, 2**62))
        penalty = extra = None
        if balance > 0:
            rel = sum(np.bincount(labels, weights=w, minlength=k) / cap
                      for w, cap in constraints) / len(constraints)
            penalty = balance * rel
            light = np.argsort(rel, kind="stable")[:max(1, k // 8)]
            extra = light[_hash(np.arange(labels.size), np.zeros(1, np.int64), salt)
                          % light.size]
        best, gain = _best_labels(indptr, indices, weights, labels, k, salt, chunk_entries,
                                  per_node_ties, penalty, extra)
        if not np.any((best != labels) & (gain > _EPS)):
            break
        _capacity_moves(labels, best, gain, constraints, k, rng, move_probability)
    return labels


def _balanced_cut(order, node_weight, edge_load, free, k, node_capacity):
    """Cut ``order`` into ``k`` partitions of at most ``node_capacity`` node weight with
    near-equal shares of the edge load (in-degrees, summed over clusters).

    Nodes with neighbours (``~free``) are cut into consecutive ranges of ``order``: range ``i``
    ends where its load reaches the fair share of the remaining load, within the node bounds
    (at most ``node_capacity``; enough left for the ranges after it; with weighted nodes these
    bounds hold when the heaviest node leaves room, else see `_enforce_node_capacity`).
    Free nodes (no neighbour at all, so their placement never changes the cut; weight 1) then
    level the node counts, lowest partitions first (`_water_fill`), which balances nodes and
    edges together on graphs with many isolated nodes (R-MAT, crawls).
    """
    n = order.size
    busy = order[~free[order]]
    idle = order[free[order]]
    m = busy.size
    cum = np.zeros(m + 1, np.int64)
    np.cumsum(edge_load[busy], out=cum[1:])
    cum_nodes = np.zeros(m + 1, np.int64)
    np.cumsum(node_weight[busy], out=cum_nodes[1:])
    total, total_nodes = int(cum[-1]), int(cum_nodes[-1])
    # A range can end short of a node bound by up to the heaviest node's weight less one; the
    # ranges after it are kept that far within the bound, so that the last one fits too
    # (which holds from the start when ``k * (node_capacity - short) >= total weight``).
    short = int(node_weight[busy].max(initial=1)) - 1
    bounds = np.zeros(k + 1, np.int64)
    need = 1 if m >= k else 0  # every range non-empty when there are enough busy nodes
    s = 0
    for i in range(k - 1):
        left = k - i
        end = int(np.searchsorted(cum, cum[s] + (total - cum[s]) / left, side="left"))
        enough_left = int(np.searchsorted(
            cum_nodes, total_nodes - (left - 1) * (node_capacity - short), side="left"))
        within = int(np.searchsorted(cum_nodes, cum_nodes[s] + node_capacity, side="right")) - 1
        lo = max(s + need, enough_left)
        hi = min(within, m - (left - 1) * need)
        s = bounds[i + 1] = min(max(end, lo), hi)
    bounds[k] = m
    labels = np.empty(n, np.int64)
    labels[busy] = np.repeat(np.arange(k), np.diff(bounds))
    load = np.bincount(labels[busy], weights=node_weight[busy], minlength=k).astype(np.int64)
    labels[idle] = _water_fill(load, idle.size)
    return labels


def _water_fill(load, count):
    """Labels for ``count`` unit-weight items that raise the least loaded of ``k`` partitions
    (``load``) to a common level, lowest first: grouped by label."""
    k = load.size
    srt = np.argsort(load, kind="stable")
    sz = load[srt]
    csum = np.cumsum(sz)
    j = np.arange(1, k + 1)
    ok = np.flatnonzero(j * sz - csum <= count)  # cost to raise the first j to sz[j-1]
    top = int(ok[-1]) + 1
    level, extra = divmod(count + int(csum[top - 1]), top)
    fill = np.zeros(k, np.int64)
    fill[srt[:top]] = level - sz[:top]
    fill[srt[:extra]] += 1
    return np.repeat(np.arange(k), fill)


# -- multilevel: coarsen, partition the coarsest graph, refine on the way back ---------------
# Cluster weights are bounded by this fraction of the partitions' slack (capacity minus the
# fair share), so that whole clusters can still be moved between partitions near capacity
# and the coarsest graph can be cut within the node bound...
_CLUSTER_SLACK = 0.5
# ... or by this fraction of a partition's fair share, where that is more, up to
# `_CLUSTER_SLACK_MOST` of the slack. The slack's half alone (2.5 % of a share at the default
# bounds) kept clusters so small that coarsening stalled long before `_COARSEST_PER_PART`:
# a 1M-node mesh's coarsest graph had 499,645 nodes at k = 4096. An eighth of a share, in
# nodes and in edge load (with `_EDGE_EXCESS_TOLERANCE`), lowered that mesh's cut from 0.40
# to 0.33 % at k = 64, 1.01 to 0.75 % at k = 256 (METIS: 0.41 and 0.91 %), 2.91 to 1.80 % at
# k = 1024 and 14.04 to 5.07 % at k = 4096. On Cora, CiteSeer, minesweeper and tolokers
# (6 seeds, k = 4, 16, 64) the mean cuts moved by -11 % to +4 %, on R-MAT and csbm by -4 % to
# +1.2 % (docs/results-history.md, section 6). Clusters larger than the slack need the finer levels
# to even the partitions out; where the bounds are tight (imbalance 1.0-1.02)
# `_CLUSTER_SLACK_MOST` keeps them small enough that the coarsest cut meets the node bound by
# itself.
_CLUSTER_SHARE = 0.125
_CLUSTER_SLACK_MOST = 2.5
# Coarsening stops at this many clusters per partition (KaMinPar's contraction limit is of
# this order): enough for a good initial partition, few enough to try several.
_COARSEST_PER_PART = 64
# Synchronous label propagation lets every node adopt its neighbours' label at once, so
# neighbours swap labels instead of merging, and on meshes the clustering stalls after a
# level or two with far too many clusters; half of the nodes moving per round breaks the
# symmetry (docs/results-history.md, section 6: the mesh-like graph's cut comes from this).
_CLUSTER_MOVE_PROBABILITY = 0.5
# Coarsening stops at a level that leaves more than this fraction of the clusters: the
# clustering has stalled, and more levels would cost time for little.
_STALLED = 0.8
# A level is built only when its coarse graph has at most this fraction of the finer
# graph's neighbour entries (counted before any is stored). Contracting a graph without
# structure (uniform random edges) removes almost no edge, so its coarse graphs would cost
# 12 bytes per entry for no better cut; such graphs get the single-level start instead.
_SHRINK_ENTRIES = 0.85
# Coarse graphs are kept for the refinement on the way back while, together, they hold at
# most this fraction of the input's neighbour entries. On graphs without locality (R-MAT,
# SBM) every level keeps most of the entries (12 bytes each), so keeping them all would
# multiply the partitioner's memory for a few percent of cut; such levels are projected
# through without refinement.
_KEPT_ENTRIES = 0.5
# Initial partitions tried on the coarsest graph (the best cut is kept) when it has at most
# _ATTEMPT_ENTRIES neighbour entries.
_ATTEMPTS = 4
_ATTEMPT_ENTRIES = 1 << 20
# The graph the start is made for (the coarsest one, or the input where it is not coarsened) is
# also cut by recursive bisection (`jgrind.partition.bisection`) when it has at most
# `_BISECTION_NODES` nodes and at most `_BISECTION_ENTRIES` entries or, beyond that,
# `_BISECTION_DEGREE` per node (a mesh's coarsest graphs hold about 5 a node, tolokers' about
# 100). On a mesh of 1M nodes the coarsest graph has 22,707 nodes at k = 1024, 90,921 at
# k = 2048 and 101,673 at k = 4096; the partitioner took 2.4, 4.5 and 5.7 s on the test
# machine. Before the native balancing bounded its scores, the bisection was tried up to
# 40,000 nodes only, and at k = 2048 (then 229,603 coarsest nodes) it would have taken 40 s
# instead of 7.9 s. In Python, without the native kernels, the bisection's balancing scores
# every node at every move and the growing runs in the interpreter (30 s for 67,245 nodes), so
# there the limit stays at `_BISECTION_NODES_PYTHON`. Dense coarsest graphs (tolokers':
# 5,000-7,000 nodes, 520,000-850,000 entries) are left to the ranges: there the bisection's
# start cut less at k = 8 and 64 but more at k = 16 (73.0 % against 70.2 %), and took
# 1.3-3.3x the partitioner's time.
_BISECTION_NODES = 1 << 18
# A start whose partitions exceed the edge bound by this fraction of one partition's bound,
# in all, ranks as if within it: the finer levels' refinement and `_enforce_edge_capacity`
# move the few nodes that takes. Ranked above the cut, such an excess (5-12 entries of a bound
# of 857 on a mesh of 50,000 nodes at k = 512) threw away bisection starts that cut 40 % fewer
# edges than the ranges, in half of the seeds.
_EDGE_EXCESS_TOLERANCE = 0.02
_BISECTION_NODES_PYTHON = 40_000
_BISECTION_ENTRIES = 1 << 18
_BISECTION_DEGREE = 8


def _bisected(nodes: int, entries: int) -> bool:
    """Whether a start for a graph of this size is also tried by recursive bisection."""
    limit = (_BISECTION_NODES if _kernels.library() is not None
             else min(_BISECTION_NODES, _BISECTION_NODES_PYTHON))
    return nodes <= limit and entries <= max(_BISECTION_ENTRIES, _BISECTION_DEGREE * nodes)


def _cluster_bound(share: float, cap: int) -> int:
    """The most of a weight a cluster may hold, given a partition's fair ``share`` and its
    ``cap``: `_CLUSTER_SLACK` of the slack, or more up to `_CLUSTER_SHARE` of the share while
    that is within `_CLUSTER_SLACK_MOST` of the slack."""
    slack = cap - share
    return max(1, int(_CLUSTER_SLACK * slack),
               int(min(_CLUSTER_SHARE * share, _CLUSTER_SLACK_MOST * slack)))


def _coarsen(indptr, indices, in_degree, k, node_cap, edge_cap, rng, chunk_entries,
             cluster_iterations):
    """The multilevel hierarchy: ``(levels, coarsest)``, ``levels[i] = (graph_i, inverse_i)``
    with ``graph_0`` the input graph and ``inverse_i[v]`` the cluster of ``graph_i``'s node
    ``v`` in ``graph_{i+1}`` (the next one, or ``coarsest``); -1 for a node without
    neighbours, which is left out of the coarse graphs and placed by `_project`. ``graph_i``
    is None (i > 0) where keeping it would pass `_KEPT_ENTRIES`.

    A graph is ``(indptr, indices, edge_weights or None, [node weights, edge loads])``.
    Every level is size-constrained label propagation from singletons (at most
    `_CLUSTER_SLACK` of the slack or `_CLUSTER_SHARE` of a partition's share per cluster,
    whichever is more, in nodes and edge load) and a contraction;
    coarsening stops at `_COARSEST_PER_PART` clusters per partition, or when a level would
    leave more than `_STALLED` of the clusters or `_SHRINK_ENTRIES` of the entries.
    """
    n = in_degree.size
    bound_n = _cluster_bound(n / k, node_cap)
    bound_e = max(1, int(in_degree.max(initial=0)),
                  _cluster_bound(in_degree.sum() / k, edge_cap))
    graph = (indptr, indices, None, [np.ones(n, np.int64), in_degree])
    levels = []
    size = int(np.count_nonzero(np.diff(indptr)))
    room = _KEPT_ENTRIES * indices.size  # for coarse graphs kept for refinement
    while size > _COARSEST_PER_PART * k and bound_n > 1:
        ip, ix, w, nws = graph
        labels = np.arange(ip.size - 1, dtype=np.int64)
        _propagate(ip, ix, w, labels, labels.size, [(nws[0], bound_n), (nws[1], bound_e)],
                   cluster_iterations, rng, _CLUSTER_MOVE_PROBABILITY, False, chunk_entries)
        coarse = _contract(ip, ix, w, nws, labels, max_entries=_SHRINK_ENTRIES * ix.size)
        del labels
        if coarse is None:
            break
        coarse, inv = _drop_free(*coarse)
        coarse_size = coarse[0].size - 1
        if coarse_size > _STALLED * size:
            break
        keep = not levels or ix.size <= room  # the input is kept anyway
        if levels and keep:
            room -= ix.size
        levels.append((graph if keep else None, inv))
        graph, size = coarse, coarse_size
        del ip, ix, w, nws, coarse
    return levels, graph


def _drop_free(indptr, indices, weights, node_weights, inverse):
    """Leave single nodes without neighbours out of a contracted graph (their rows are empty,
    so no index changes but the renumbering): ``(graph, inverse)``, -1 for those nodes."""
    free = (np.diff(indptr) == 0) & (node_weights[0] == 1)
    if not free.any():
        return (indptr, indices, weights, node_weights), inverse
    keep = ~free
    renumber = np.cumsum(keep, dtype=np.int64) - 1
    renumber[free] = -1
    indptr = np.concatenate([[0], indptr[1:][keep]])
    indices = renumber.astype(indices.dtype)[indices]  # no int64 copy of the entries
    return (indptr, indices, weights, [w[keep] for w in node_weights]), renumber[inverse]


def _cut_weight(indptr, indices, weights, labels) -> int:
    """The summed weight of the entries between partitions."""
    return cut_weight(indices, edge_weights(indptr, indices, weights), labels)


def _initial_partition(graph, coarse, k, node_cap, edge_cap, rng, chunk_entries,
                       cluster_iterations, iterations, move_probability, balance):
    """Partition the coarsest graph: an order from `_cluster_order`, cut by `_balanced_cut`,
    refined to a fixed point (at most ``4 * iterations`` rounds); the lowest cut of
    `_ATTEMPTS` tries when the graph is small. When the graph is the input (not ``coarse``),
    a single try is left for the caller to refine, as the ``"clusters"`` start. A graph small
    and sparse enough (`_bisected`) is also cut by recursive bisection, whose partition is kept
    where it ranks first by `_start_key`."""
    ip, ix, w, nws = graph
    free = (np.diff(ip) == 0) & (nws[0] == 1)
    attempts = _ATTEMPTS if ix.size <= _ATTEMPT_ENTRIES else 1
    rounds = 4 * iterations if coarse else iterations if attempts > 1 else 0
    best_cut, best = None, None
    for _ in range(attempts):
        order = _cluster_order(graph, k, rng, chunk_entries, cluster_iterations)
        labels = _balanced_cut(order, nws[0], nws[1], free, k, node_cap)
        _propagate(ip, ix, w, labels, k, [(nws[0], node_cap), (nws[1], edge_cap)],
                   rounds, rng, move_probability, True, chunk_entries, balance)
        cut = _cut_weight(ip, ix, w, labels) if attempts > 1 else 0
        if best is None or cut < best_cut:
            best_cut, best = cut, labels
    if _bisected(ip.size - 1, ix.size):
        # Recursive bisection places the boundaries better (meshes: half the cut; citation
        # graphs: 10-54 % less at k = 16-64) and balances both weights, where the ranges can
        # break the edge bound (CiteSeer at k = 16: 1.6x the mean edge load). Kept where it
        # breaks the bounds less, or as little and cuts less. Its random numbers come from a
        # child generator, so that where it is not kept the partition is the one without it.
        own_rng = rng.spawn(1)[0]
        constraints = [(nws[0], node_cap), (nws[1], edge_cap)]
        labels = recursive_bisection(ip, ix, w, constraints, k, own_rng)
        _propagate(ip, ix, w, labels, k, constraints, rounds, own_rng, move_probability, True,
                   chunk_entries, balance)
        if _start_key(ip, ix, w, labels, constraints, k) < _start_key(ip, ix, w, best,
                                                                      constraints, k):
            best = labels
    return best


def _start_key(ip, ix, w, labels, constraints, k) -> tuple:
    """How a start ranks (lower is better): node excess, edge excess beyond
    `_EDGE_EXCESS_TOLERANCE`, then the cut."""
    (nodes, node_cap), (edges, edge_cap) = constraints
    edge_excess = _excess(labels, edges, edge_cap, k)
    return (_excess(labels, nodes, node_cap, k),
            max(0, edge_excess - int(_EDGE_EXCESS_TOLERANCE * edge_cap)),
            _cut_weight(ip, ix, w, labels))


def _excess(labels, weight, cap, k) -> int:
    """How far the partitions' summed ``weight`` exceeds ``cap``, over all of them."""
    load = np.bincount(labels, weights=weight, minlength=k)
    return int(np.maximum(load - cap, 0).sum())


def _project(coarse_labels, inverse, k):
    """Fine labels from the clusters' (``inverse``, -1 for left-out nodes, which then level
    the partitions' node counts, see `_water_fill`)."""
    left_out = inverse < 0
    if not left_out.any():
        return coarse_labels[inverse]
    labels = np.empty(inverse.size, np.int64)
    labels[~left_out] = coarse_labels[inverse[~left_out]]
    load = np.bincount(labels[~left_out], minlength=k)
    labels[left_out] = _water_fill(load, int(left_out.sum()))
    return labels


def _multilevel(indptr, indices, in_degree, k, node_cap, edge_cap, rng, chunk_entries,
                cluster_iterations, iterations, move_probability, balance):
    """Fine labels from the multilevel scheme, before the finest level's refinement (which
    `label_propagation` runs): coarsen, partition the coarsest graph, then project level by
    level, refining every coarse level with the same capacities (moves of whole clusters)."""
    levels, coarsest = _coarsen(indptr, indices, in_degree, k, node_cap, edge_cap, rng,
                                chunk_entries, cluster_iterations)
    labels = _initial_partition(coarsest, bool(levels), k, node_cap, edge_cap, rng,
                                chunk_entries, cluster_iterations, iterations, move_probability,
                                balance)
    for depth in range(len(levels) - 1, -1, -1):
        graph, inverse = levels[depth]
        labels = _project(labels, inverse, k)
        if depth > 0 and graph is not None:  # the finest level is refined by the caller
            _refine_level(graph, labels, k, node_cap, edge_cap, iterations, rng,
                          move_probability, chunk_entries, balance)
    return labels


def _refine_level(graph, labels, k, node_cap, edge_cap, iterations, rng, move_probability,
                  chunk_entries, balance):
    """Refine a coarse level's partition in place: label propagation moving whole clusters,
    with the partitions' capacities in fine nodes and edges (the clusters' summed weights)."""
    ip, ix, w, nws = graph
    _propagate(ip, ix, w, labels, k, [(nws[0], node_cap), (nws[1], edge_cap)], iterations, rng,
               move_probability, True, chunk_entries, balance)


def _enforce_node_capacity(indptr, indices, labels, k, node_cap):
    """Bring every partition within ``node_cap`` nodes, in place: the last guard of the hard
    node bound.

    Moves never push a partition past a capacity, and the cut of the coarsest graph meets the
    node bound whenever its heaviest cluster leaves room (see `_balanced_cut`), which the
    cluster bound of `_coarsen` ensures; this holds the bound should a start ever miss it.
    The excess nodes leave, those with the fewest neighbours in their partition first (ties:
    lowest id), for the partitions with the most room.
    """
    load = np.bincount(labels, minlength=k)
    excess = np.maximum(load - node_cap, 0)
    if not excess.any():
        return labels
    cand = np.flatnonzero(excess[labels] > 0)
    inside = _neighbours_inside(indptr, indices, labels, cand)
    order = np.lexsort((cand, inside, labels[cand]))  # by partition, fewest inside first
    cand = cand[order]
    rank = np.arange(cand.size) - np.searchsorted(labels[cand], labels[cand])
    movers = cand[rank < excess[labels[cand]]]
    room = np.maximum(node_cap - load, 0)
    by_room = np.argsort(-room, kind="stable")
    targets = np.repeat(by_room, room[by_room])[:movers.size]
    labels[movers] = targets
    return labels


def _neighbours_inside(indptr, indices, labels, nodes) -> np.ndarray:
    """For each of ``nodes``, how many of its CSR neighbours share its label."""
    deg = np.diff(indptr)[nodes]
    rows = np.repeat(np.arange(nodes.size), deg)
    starts = np.repeat(indptr[nodes] - np.concatenate([[0], np.cumsum(deg)[:-1]]), deg)
    same = labels[indices[np.arange(rows.size) + starts]] == labels[nodes][rows]
    return np.bincount(rows, weights=same, minlength=nodes.size)


def _enforce_edge_capacity(indptr, indices, labels, k, node_cap, edge_load, edge_cap,
                           rounds=20) -> int:
    """Bring partitions over ``edge_cap`` (summed ``edge_load``) under it where moves can, in
    place, keeping every partition within ``node_cap`` nodes; returns the number of moves.

    Label propagation's load penalty drains an overloaded partition only by single moves, and
    where the light partitions are full in nodes no move fits: tolokers (hubs of degree 2,138)
    kept its heaviest partition at 1.3-2.6x the mean edge load for k = 8-64. Here the nodes of
    an overloaded partition leave, the cheapest first (fewest neighbours left behind per unit
    of load), for the partition with the most edge room among those with room for a node too,
    else among all; where that partition is full in nodes, its lightest node comes back in
    exchange, so both keep their node counts.
    """
    moves = 0
    for _ in range(rounds):
        load = np.bincount(labels, weights=edge_load, minlength=k)
        over = np.flatnonzero(load > edge_cap)
        if over.size == 0:
            break
        count = np.bincount(labels, minlength=k)
        by_load = np.lexsort((np.arange(labels.size), edge_load, labels))  # lightest first
        grouped = labels[by_load]
        lightest = np.searchsorted(grouped, np.arange(k))  # the next exchange candidate
        group_end = np.searchsorted(grouped, np.arange(k), side="right")
        before = moves
        for p in over[np.argsort(-load[over], kind="stable")]:
            members = np.flatnonzero(labels == p)
            inside = _neighbours_inside(indptr, indices, labels, members)
            cost = (inside + 1) / np.maximum(edge_load[members], 1)
            for v in members[np.argsort(cost, kind="stable")]:
                if load[p] <= edge_cap:
                    break
                w = edge_load[v]
                if w <= 0:
                    continue
                room = edge_cap - load
                room[p] = -np.inf
                fits = room >= w
                if not fits.any():
                    continue
                # the most edge room, among partitions with room for a node where there are
                free = fits & (count < node_cap)
                q = int(np.argmax(np.where(free if free.any() else fits, room, -np.inf)))
                if count[q] >= node_cap:
                    u = _next_lightest(by_load, lightest, group_end, labels, q)
                    if u < 0 or edge_load[u] >= w:
                        continue
                    labels[u] = p
                    load[q] -= edge_load[u]
                    load[p] += edge_load[u]
                    count[q] -= 1
                    count[p] += 1
                labels[v] = q
                load[p] -= w
                load[q] += w
                count[p] -= 1
                count[q] += 1
                moves += 1
        if moves == before:
            break
    return moves


def _next_lightest(by_load, lightest, group_end, labels, q) -> int:
    """Partition ``q``'s lightest node still in it, or -1: ``by_load`` holds the nodes by
    partition, then edge load, as the round began; ``lightest[q]`` is where to look next in
    ``q``'s group, which ends at ``group_end[q]``."""
    while lightest[q] < group_end[q]:
        u = int(by_load[lightest[q]])
        lightest[q] += 1
        if labels[u] == q:
            return u
    return -1


_STARTS = ("multilevel", "clusters", "contiguous", "random")


def label_propagation(graph: Graph, num_parts: int, *, seed: int = 0, iterations: int = 10,
                      imbalance: float = 1.05, edge_imbalance: float = 1.1,
                      init: str = "multilevel", move_probability: float = 0.5,
                      balance: float = 1.0, cluster_iterations: int = 8, symmetric=None,
                      chunk_entries: int = 1 << 22) -> np.ndarray:
    """Balanced multilevel label propagation, in the spirit of GriNNder's partitioner,
    Spinner (Martella et al., 2017) and KaMinPar (Gottesbüren et al., 2021), over the CSR in
    O(N + E) memory.

    Balance: every partition holds at most ``max(ceil(N/k), floor(imbalance * N / k))`` nodes
    (a hard bound, always met), and no move pushes a partition past
    ``max(max in-degree, edge_imbalance * E / k)`` CSR entries (its local edges, i.e. its share
    of the compute). Partitions over that edge bound at the start are drained by the load
    penalty below; any still over it after refinement give up nodes, in exchange for light
    ones where the receiving partition is full (`_enforce_edge_capacity`), which brings them
    under it wherever some partition has room for their nodes' loads.

    1. A start (``init``):

       * ``"multilevel"`` (default): coarsen the graph by size-constrained label propagation
         (clusters of at most an eighth of a partition's share, or half its slack where the
         bounds are tight) and contraction, level after level, until about 64 clusters per
         partition are left (`_coarsen`); partition the coarsest graph as ``"clusters"``
         does below (best of a few tries), or where it is small and sparse enough
         (`_bisected`: up to 262,144 nodes with the native kernels, 40,000 without) and that
         breaks the bounds less or cuts less, by
         recursive bisection balanced in both weights (`jgrind.partition.bisection`: half
         the cut on meshes, 10-54 % less on citation graphs at k = 16-64, whose hubs the
         ranges can leave at 1.6-2.5x the mean edge load); then project the partition
         back level by level, refining it at every level (moving whole clusters at the coarse
         ones). The coarsest graph's partition places the boundaries as a whole, which
         node-level moves alone cannot do on graphs with locality (meshes, road networks,
         co-purchase graphs: they only shift the boundaries they start from); the refinement
         of every level then smooths them.
       * ``"clusters"``: one order of the nodes that keeps clusters together (`_cluster_order`:
         size-constrained label propagation with bounds growing 4x per level), cut into
         ``num_parts`` ranges of at most the node bound holding near-equal shares of the
         edges (`_balanced_cut`). Plain k-label propagation from a random or contiguous start
         gets stuck when two communities pick the same label (the label is full and nobody
         can leave), so a start matters on graphs without id locality.
       * ``"contiguous"``: node ids, cut the same way (keeps any locality of the ids).
       * ``"random"``: a seeded random permutation, cut the same way.

    2. ``iterations`` rounds of refinement of the nodes (and of every coarse level's
       clusters): node ``v`` values partition ``l`` at
       ``(neighbours of v in l) / deg(v) - balance * load(l)`` (Spinner's score; ``load`` is
       the mean of the node and edge loads relative to their bounds; neighbours are in- and
       out-neighbours, for a directed graph through a transpose computed once; on a coarse
       level, edges and loads are weighted), over the partitions of its neighbours plus one
       lightly loaded partition. Nodes whose best partition beats their current one move -
       each with probability ``move_probability``, since synchronous label propagation
       oscillates when everyone moves at once - highest gain first, as far as the bounds
       allow (see `_capacity_moves`). Stops early at a fixed point.

    The per-node work (best labels, the capacity-bounded moves, contracting clusters) runs in
    native code (``jgrind/_kernels/labels.cc``, on ``JGRIND_NUM_THREADS`` or all allowed CPUs)
    when the kernels can be built, else in NumPy: the same partition either way. In NumPy,
    per-(node, label) counting is a sparse ``rows x k`` matrix per chunk of ``chunk_entries``
    CSR entries: no dense ``N x k`` array.
    """
    k = check_num_parts(graph, num_parts)
    n = graph.num_nodes
    for name, value in (("imbalance", imbalance), ("edge_imbalance", edge_imbalance),
                        ("balance", balance), ("move_probability", move_probability)):
        number(value, name)  # a word from a command line is named, not compared below
    for name, value, least in (("iterations", iterations, 0),
                               ("cluster_iterations", cluster_iterations, 0),
                               ("chunk_entries", chunk_entries, 1)):
        whole_number(value, name, least)
    if not (1.0 <= imbalance < np.inf and 1.0 <= edge_imbalance < np.inf):  # NaN too
        raise ValueError(f"imbalance and edge_imbalance must be finite numbers >= 1.0, got "
                         f"{imbalance}, {edge_imbalance}")
    if not 0.0 < move_probability <= 1.0:
        raise ValueError(f"move_probability must lie in (0, 1], got {move_probability}")
    if not balance >= 0 or not np.isfinite(balance):
        raise ValueError(f"balance must be a finite number >= 0, got {balance}")
    if init not in _STARTS:
        raise ValueError(f"init must be one of {', '.join(map(repr, _STARTS))}; got {init!r}")
    if k == 1:
        return np.zeros(n, np.int32)
    rng = np.random.default_rng(seed)
    in_degree = graph.in_degree().astype(np.int64)
    node_cap = max(-(-n // k), int(np.floor(imbalance * n / k)))
    edge_cap = max(1, int(in_degree.max()), int(np.floor(edge_imbalance * graph.num_edges / k)))
    indptr, indices = neighbour_csr(graph, symmetric)
    indptr = indptr.astype(np.int64, copy=False)  # once, not in every kernel call
    if init == "multilevel":
        labels = _multilevel(indptr, indices, in_degree, k, node_cap, edge_cap, rng,
                             chunk_entries, cluster_iterations, iterations, move_probability,
                             balance)
    else:
        if init == "clusters":
            order = _cluster_order((indptr, indices, None, [np.ones(n, np.int64), in_degree]),
                                   k, rng, chunk_entries, cluster_iterations)
        elif init == "random":
            order = np.random.default_rng(seed).permutation(n)
        else:
            order = np.arange(n)
        labels = _balanced_cut(order, np.ones(n, np.int64), in_degree, np.diff(indptr) == 0,
                               k, node_cap)
    constraints = [(None, node_cap), (in_degree, edge_cap)]
    _propagate(indptr, indices, None, labels, k, constraints, iterations, rng, move_probability,
               True, chunk_entries, balance)
    _enforce_node_capacity(indptr, indices, labels, k, node_cap)
    if _enforce_edge_capacity(indptr, indices, labels, k, node_cap, in_degree, edge_cap):
        # the moves cost cut edges; refinement wins some back within both bounds (a move
        # never takes a partition past a capacity)
        _propagate(indptr, indices, None, labels, k, constraints, iterations, rng,
                   move_probability, True, chunk_entries, balance)
    return labels.astype(np.int32, copy=False)


# -- METIS -----------------------------------------------------------------------------------
class MissingExtraError(ImportError):
    """An optional package is not installed; the message names the extra that installs it."""


def metis(graph: Graph, num_parts: int, *, seed: int = 0, imbalance: float = 1.03) -> np.ndarray:
    """METIS k-way partitioning through ``pymetis`` (optional: ``pip install 'jgrind[metis]'``).

    METIS needs an undirected graph without self loops: the neighbourhood is symmetrised
    (``A + A^T`` pattern) and self loops and duplicates dropped before the call. ``imbalance``
    maps to METIS' ``ufactor`` (1.03 -> 30, METIS' default for k-way).
    """
    k = check_num_parts(graph, num_parts)
    try:
        import pymetis
    except ImportError as e:
        raise MissingExtraError("metis partitioning needs the optional pymetis package: "
                                "pip install 'jgrind[metis]', or use another partitioner "
                                "(label_propagation is the default)") from e
    if k == 1:
        return np.zeros(graph.num_nodes, np.int32)
    import scipy.sparse as sp
    n = graph.num_nodes
    a = sp.csr_matrix((np.ones(graph.num_edges, np.int32), graph.indices, graph.indptr),
                      shape=(n, n))
    s = (a + a.T).tocoo()  # duplicates summed: one entry per unordered neighbour pair
    off = s.row != s.col
    s = sp.csr_matrix((s.data[off], (s.row[off], s.col[off])), shape=(n, n))
    s.sum_duplicates()
    idx_t = pymetis.zero_copy_dtype() if hasattr(pymetis, "zero_copy_dtype") else np.int64
    xadj, adjncy = s.indptr.astype(idx_t), s.indices.astype(idx_t)
    opts = pymetis.Options()
    opts.seed = int(seed)
    opts.ufactor = max(1, int(round((imbalance - 1.0) * 1000)))
    if hasattr(pymetis, "CSRAdjacency"):  # pymetis >= 2025.2 deprecates xadj/adjncy
        _, parts = pymetis.part_graph(k, pymetis.CSRAdjacency(xadj, adjncy), options=opts)
    else:
        _, parts = pymetis.part_graph(k, xadj=xadj, adjncy=adjncy, options=opts)
    return np.asarray(parts, dtype=np.int32)


PARTITIONERS: dict[str, Callable[..., np.ndarray]] = {
    "contiguous": contiguous,
    "random": random,
    "label_propagation": label_propagation,
    "metis": metis,
}
