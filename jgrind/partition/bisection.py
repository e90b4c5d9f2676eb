"""Recursive bisection of a small weighted graph under two balance constraints: a start for
the partitioner's coarsest graph (`jgrind.partition.partitioners`).

Label propagation moves nodes only towards labels next to them, so the cut of the coarsest
graph decides where the boundaries lie: later levels smooth them but do not move them far. On
mesh-like graphs, cutting the coarsest graph into ranges of a cluster order left about twice
the cut edges that this start leaves (docs/results-history.md, section 6). Here, as in METIS's and
KaMinPar's initial partitioning, the graph is cut in two again and again: one side, sized for
its share of the parts, is grown from a random node, the best-connected node first (greedy
graph growing); the best of a few tries is cut further. The partitioner's label propagation
then refines the result, as it refines every start. (Fiduccia-Mattheyses passes after each
growth were tried and dropped: on a grid, minesweeper and a geometric graph the cuts with and
without them differed by under 8 %, either way, in an ad-hoc comparison.)

Balance is by every weight of ``constraints`` (the partitioner's: nodes and edge loads), each
with its bound on a part (the slack spread over the levels of the recursion), as METIS
balances several constraints. Growing a side to its share of the nodes alone leaves the edge
load out of balance wherever a few nodes carry many of the edges (citation graphs: on
CiteSeer at k = 16 such a start broke the edge bound by 650-870 entries of 9,104 after
refinement). So a side is grown to its share of both weights together (their sum, each as a
fraction of its total), and then balanced: nodes move across, the cheapest in cut per unit
of excess first, until no bound is exceeded or no single move helps. (Growing by the node
weight alone, or alternating the two, gave cuts within 7 % of these, either way, on Cora,
CiteSeer and minesweeper once balanced, in an ad-hoc comparison over 3 seeds and k = 4-32.)
Tries rank by the excess left first, then by cut. The caller keeps the result only where it
ranks before its other start (`jgrind.partition.partitioners._initial_partition`).

The growing and the balancing run in native code (``jgrind/_kernels/bisection.cc``) where the
kernels can be built, else in Python: the same partition either way. The Python balancing
scores every node at every move; the native one takes the same moves from upper bounds on
the scores, scoring a few hundred nodes a move where the Python code scores all of them. On
a mesh's coarsest graph of 67,245 nodes (k = 1024) the first balancing took 0.07 s, against
1.3 s in native code that scored every node, and the whole bisection 1.4 s in native code,
against over 19 s in Python; so the partitioner tries it on larger graphs where the kernels are
built (`jgrind.partition.partitioners._bisected`). A large bisection's tries run on threads
(`_PARALLEL_NODES`), with the same result.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import heapq
import math

import numpy as np

from jgrind import _kernels

TRIES = 4  # growths per bisection from different random nodes; the best is kept
# a bisection's tries run on threads from this many nodes (the kernels' calls then outweigh
# the threads' overhead)
_PARALLEL_NODES = 4096


def recursive_bisection(indptr: np.ndarray, indices: np.ndarray, weights,
                        constraints: list[tuple[np.ndarray, int]], k: int,
                        rng: np.random.Generator) -> np.ndarray:
    """Labels ``0..k-1`` for a symmetric graph (CSR ``indptr``, ``indices``; edge ``weights`` or
    None for ones; self loops ignored). ``constraints``: ``(node weights, cap)`` pairs; each
    part holds at most about ``cap`` of every weight (the bounds hold where the nodes are light
    enough to split finely; the caller checks)."""
    n = indptr.size - 1
    indices = np.ascontiguousarray(indices, np.int64)  # once: the kernels take int64
    labels = np.zeros(n, np.int64)
    depth = max(1, math.ceil(math.log2(max(k, 2))))
    # slack per level: compounded over the levels, it is the slack of cap over a fair share
    slacks = [max(cap * k / max(int(w.sum()), 1), 1.0) ** (1.0 / depth) - 1.0
              for w, cap in constraints]
    heaviest = [int(w.max(initial=1)) for w, _ in constraints]
    stack = [(np.arange(n), (indptr, indices, weights), k, 0)]
    # the tries of a large bisection on threads: the kernels release the GIL, and the tries
    # are independent, so the result is the same as one after the other
    threads = min(TRIES, _kernels.num_threads())
    parallel = threads > 1 and n >= _PARALLEL_NODES and _kernels.library() is not None
    with cf.ThreadPoolExecutor(threads) if parallel else contextlib.nullcontext() as pool:
        while stack:
            _split(stack, labels, constraints, slacks, heaviest, rng, pool)
    return labels


def _split(stack, labels, constraints, slacks, heaviest, rng, pool) -> None:
    """One step of `recursive_bisection`: the subgraph on top of ``stack`` labelled where it is
    one part, else cut in two (the best of `TRIES` growths, each balanced), both sides pushed.
    ``pool``: threads for the tries of a large subgraph, or None."""
    nodes, graph, parts, first = stack.pop()
    if parts == 1 or nodes.size == 0:
        labels[nodes] = first
        return
    left = parts // 2
    loads = [w[nodes].astype(np.float64) for w, _ in constraints]
    bounds = np.array([_side_bounds(load.sum(), left, parts, cap, slack, heavy)
                       for load, (_, cap), slack, heavy
                       in zip(loads, constraints, slacks, heaviest)])
    # every weight as a fraction of its total in this subgraph: excesses add up fairly
    totals = np.array([max(load.sum(), 1.0) for load in loads])
    shares = np.stack(loads) / totals[:, None]
    measure = shares.sum(axis=0)
    target = left / parts * measure.sum()
    edges = edge_weights(*graph)

    def attempt(draws):
        side = _grow(graph[0], graph[1], edges, measure, target, draws)
        excess = _balance(graph[0], graph[1], edges, side, shares, bounds / totals[:, None])
        return (excess, cut_weight(graph[1], edges, side)), side

    # every try's random numbers drawn first, in order, so that the tries may run at once
    draws = [_growth_draws(rng, nodes.size) for _ in range(TRIES)]
    if pool is not None and nodes.size >= _PARALLEL_NODES:
        tries = list(pool.map(attempt, draws))
    else:
        tries = [attempt(d) for d in draws]
    best = None
    for key, side in tries:  # the first of the lowest (excess, cut)
        if best is None or key < best[0]:
            best = (key, side)
    side = best[1]
    for s, share_parts, label in ((0, left, first), (1, parts - left, first + left)):
        members = np.flatnonzero(side == s)
        stack.append((nodes[members], induced(*graph, members), share_parts, label))


def _side_bounds(total, left, parts, cap, slack, heaviest) -> list[float]:
    """The most of a weight (``total`` in the subgraph) each side may hold: its share with the
    level's slack, or room for the heaviest node, within its parts' caps."""
    bounds = []
    for share_parts in (left, parts - left):
        share = share_parts / parts * total
        bounds.append(min(share_parts * cap,
                          max(math.floor(share * (1 + slack)), math.ceil(share) + heaviest)))
    return bounds


def edge_weights(indptr, indices, weights) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, weights)`` of every entry, self loops weighted 0."""
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    w = np.ones(indices.size, np.int64) if weights is None else weights.astype(np.int64)
    return rows, np.where(rows == indices, 0, w)


def cut_weight(indices, edges, labels) -> int:
    """The summed weight of the entries between parts; ``edges`` from `edge_weights`."""
    rows, w = edges
    return int(w[labels[rows] != labels[indices]].sum())


def _growth_draws(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A growth's random numbers: a permutation breaking ties between equal gains, and the
    order in which nodes start regions."""
    return rng.permutation(n), rng.permutation(n)


def _grow(indptr, indices, edges, measure, target: float, draws) -> np.ndarray:
    """Side 0 grown from a random node, the node with the most weight into it (less its
    weight elsewhere) first, until it holds about ``target`` of ``measure`` (per node); a new
    random node starts where the region has no neighbour left. ``edges``: `edge_weights`;
    ``draws``: `_growth_draws`. In native code (``jgrind/_kernels/bisection.cc``) where the
    kernels can be built, else in Python: the same side either way."""
    n = indptr.size - 1
    tie, order = draws
    lib = _kernels.library()
    if lib is None:
        return _grow_python(indptr, indices, edges, measure, target, tie, order)
    side = np.empty(n, np.int64)
    ip, ix, w = _csr(indptr, indices, edges)
    measure = _f64(measure)
    _check_native(lib.jgrind_grow(ip.ctypes.data, ix.ctypes.data, w.ctypes.data,
                                  measure.ctypes.data, n, float(target), tie.ctypes.data,
                                  order.ctypes.data, side.ctypes.data))
    return side


def _grow_python(indptr, indices, edges, measure, target, tie, order) -> np.ndarray:
    """`_grow` in Python (``tie``, ``order``: its random permutations)."""
    n = indptr.size - 1
    rows, w = edges
    degree = np.bincount(rows, weights=w, minlength=n).astype(np.int64)
    side = np.ones(n, np.int64)
    inside = np.zeros(n, np.int64)  # weight of edges into side 0
    heap: list = []
    load, next_seed = 0.0, 0
    while load < target:
        while heap and (side[heap[0][2]] == 0
                        or -heap[0][0] != 2 * inside[heap[0][2]] - degree[heap[0][2]]):
            heapq.heappop(heap)  # stale: moved already, or its gain changed since
        if heap:
            v = heapq.heappop(heap)[2]
        else:
            while next_seed < n and side[order[next_seed]] == 0:
                next_seed += 1
            if next_seed == n:
                break
            v = int(order[next_seed])
        if load > 0 and load + measure[v] - target > target - load:
            break  # closer to the target without it
        side[v] = 0
        load += float(measure[v])
        for e in range(indptr[v], indptr[v + 1]):
            u = int(indices[e])
            if side[u] == 1 and w[e]:
                inside[u] += w[e]
                heapq.heappush(heap, (-(2 * inside[u] - degree[u]), int(tie[u]), u))
    return side


def _balance(indptr, indices, edges, side, shares, bounds) -> float:
    """Move nodes across until no side holds more of a weight than its bound, in place; each
    move takes, among the nodes whose move lowers the summed excess, the one of best gain per
    unit of excess removed (ties: the larger drop). ``shares``: the weights (one row per
    constraint), ``bounds``: ``(constraints, 2)`` in the same units. Returns the excess left:
    0 where balanced, else where no single move lowers it (a swap would be needed: the
    caller's refinement and its ranking of starts take it from there). ``shares`` and
    ``bounds`` are fractions of the weights' totals (the native code's bounds allow for
    rounding at that scale). In native code where the kernels can be built (scoring only the
    nodes whose bound reaches the best score), else in Python (scoring every node at every
    move): the same moves either way."""
    lib = _kernels.library()
    if lib is None or side.size >= 1 << 32:  # the native heaps hold 32-bit node ids
        return _balance_python(indptr, indices, edges, side, shares, bounds)
    if side.dtype != np.int64 or not side.flags.c_contiguous:
        raise ValueError("_balance: side must be a contiguous int64 array (moved in place)")
    ip, ix, w = _csr(indptr, indices, edges)
    shares, bounds = _f64(shares), _f64(bounds)
    left = np.zeros(1, np.float64)
    _check_native(lib.jgrind_balance(ip.ctypes.data, ix.ctypes.data, w.ctypes.data,
                                     side.ctypes.data, shares.ctypes.data, bounds.ctypes.data,
                                     shares.shape[0], side.size, left.ctypes.data))
    return float(left[0])


def _balance_python(indptr, indices, edges, side, shares, bounds) -> float:
    """`_balance` in Python."""
    rows, w = edges
    n = side.size
    load = np.stack([np.bincount(side, weights=s, minlength=2) for s in shares])
    to_side0 = np.bincount(rows, weights=w * (side[indices] == 0), minlength=n)
    degree = np.bincount(rows, weights=w, minlength=n)
    excess = _summed_excess(load, bounds)
    for _ in range(n):  # each move lowers the excess; n moves bound the loop all the same
        if excess <= 0:
            break
        leaving = np.where(side == 0, 1.0, -1.0) * shares  # what side 0 loses by each move
        after = (np.maximum(load[:, :1] - leaving - bounds[:, :1], 0).sum(axis=0)
                 + np.maximum(load[:, 1:] + leaving - bounds[:, 1:], 0).sum(axis=0))
        lowers = after < excess
        if not lowers.any():
            break
        same = np.where(side == 0, to_side0, degree - to_side0)
        gain = degree - 2 * same
        drop = np.where(lowers, excess - after, 1.0)
        # cut per unit of excess removed: a heavy node that costs a few cut edges beats
        # several light ones that cost one each (relative gain, as KaMinPar's balancer)
        score = np.where(lowers, np.where(gain < 0, gain / drop, gain * drop), -np.inf)
        candidates = np.flatnonzero(score == score.max())
        v = int(candidates[np.argmin(after[candidates])])
        was = int(side[v])
        side[v] = 1 - was
        load[:, was] -= shares[:, v]
        load[:, 1 - was] += shares[:, v]
        span = slice(indptr[v], indptr[v + 1])
        np.add.at(to_side0, indices[span], w[span] if was == 1 else -w[span])
        excess = _summed_excess(load, bounds)
    return excess


def _summed_excess(load, bounds) -> float:
    """The summed excess of ``load`` over ``bounds`` (``(constraints, 2)``), term by term in
    order (as the native code sums it)."""
    return sum(max(x, 0.0) for x in (load - bounds).ravel().tolist())


def _csr(indptr, indices, edges) -> tuple[np.ndarray, ...]:
    """The CSR and its entry weights as the native kernels take them: contiguous int64."""
    return tuple(np.ascontiguousarray(a, np.int64) for a in (indptr, indices, edges[1]))


def _f64(a) -> np.ndarray:
    return np.ascontiguousarray(a, np.float64)


def _check_native(rc: int) -> None:
    if rc != 0:
        raise MemoryError("recursive bisection: a native kernel ran out of memory; partition "
                          "on a machine with more memory, or with JGRIND_DISABLE_NATIVE=1")


def induced(indptr, indices, weights, members: np.ndarray):
    """The subgraph on ``members`` (renumbered ``0..len-1``): ``(indptr, indices, weights)``."""
    n = indptr.size - 1
    local = np.full(n, -1, np.int64)
    local[members] = np.arange(members.size)
    degree = np.diff(indptr)[members]
    starts = np.repeat(indptr[members] - np.concatenate([[0], np.cumsum(degree)[:-1]]), degree)
    entries = starts + np.arange(int(degree.sum()))
    cols = local[indices[entries]]
    keep = cols >= 0
    rows = np.repeat(np.arange(members.size), degree)[keep]
    sub_indptr = np.zeros(members.size + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=members.size), out=sub_indptr[1:])
    return (sub_indptr, cols[keep],
            None if weights is None else np.asarray(weights)[entries][keep])
