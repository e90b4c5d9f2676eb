"""Recursive bisection of a small weighted graph: a start for the multilevel partitioner's
coarsest graph (`jgrind.partition.partitioners`).

Label propagation moves nodes only towards labels next to them, so the cut of the coarsest
graph decides where the boundaries lie: later levels smooth them but do not move them far. On
mesh-like graphs, cutting the coarsest graph into ranges of a cluster order left about twice
the cut edges that this start leaves (docs/results.md, section 6). Here, as in METIS's and
KaMinPar's initial partitioning, the graph is cut in two again and again: one side, sized for
its share of the parts, is grown from a random node, the best-connected node first (greedy
graph growing); the lowest cut of a few tries is cut further. The partitioner's label
propagation then refines the result, as it refines every start. (Fiduccia-Mattheyses passes
after each growth were tried and dropped: on a grid, minesweeper and a geometric graph the
cuts with and without them differed by under 8 %, either way, in an ad-hoc comparison.)

Balance is by node weight only: a side is grown to its share, and tries that leave a side over
its bound (its share of the partitions' capacity, the slack spread over the levels of the
recursion) rank last. The caller keeps the result only where it meets the node and edge
bounds (`jgrind.partition.partitioners._initial_partition`).

Plain Python and NumPy, for graphs of a few thousand nodes: a growth costs a few microseconds
per neighbour entry.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

TRIES = 4  # growths from different random nodes per bisection; the lowest cut is kept


def recursive_bisection(indptr: np.ndarray, indices: np.ndarray, weights, node_weight: np.ndarray,
                        node_cap: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Labels ``0..k-1`` for a symmetric graph (CSR ``indptr``, ``indices``; edge ``weights`` or
    None for ones; self loops ignored), each part of at most about ``node_cap`` node weight
    (the bound holds where the nodes are light enough to split finely; the caller checks)."""
    n = indptr.size - 1
    labels = np.zeros(n, np.int64)
    total = int(node_weight.sum())
    depth = max(1, math.ceil(math.log2(max(k, 2))))
    # slack per level: compounded over the levels, it is the slack of node_cap over a fair share
    slack = max(node_cap * k / max(total, 1), 1.0) ** (1.0 / depth) - 1.0
    heaviest = int(node_weight.max(initial=1))
    stack = [(np.arange(n), (indptr, indices, weights), k, 0)]
    while stack:
        nodes, graph, parts, first = stack.pop()
        if parts == 1 or nodes.size == 0:
            labels[nodes] = first
            continue
        nw = node_weight[nodes]
        left = parts // 2
        sub_total = int(nw.sum())
        bounds = []
        for share_parts in (left, parts - left):
            share = share_parts / parts * sub_total
            bounds.append(min(share_parts * node_cap,
                              max(math.floor(share * (1 + slack)), math.ceil(share) + heaviest)))
        best = None
        edges = edge_weights(*graph)
        for _ in range(TRIES):
            side = _grow(graph[0], graph[1], edges, nw, left / parts * sub_total, rng)
            cut = cut_weight(graph[1], edges, side)
            load = np.bincount(side, weights=nw, minlength=2)
            key = (float(np.maximum(load - bounds, 0).sum()), cut)
            if best is None or key < best[0]:
                best = (key, side)
        side = best[1]
        for s, share_parts, label in ((0, left, first), (1, parts - left, first + left)):
            members = np.flatnonzero(side == s)
            stack.append((nodes[members], induced(*graph, members), share_parts, label))
    return labels


def edge_weights(indptr, indices, weights) -> tuple[np.ndarray, np.ndarray]:
    """``(rows, weights)`` of every entry, self loops weighted 0."""
    rows = np.repeat(np.arange(indptr.size - 1), np.diff(indptr))
    w = np.ones(indices.size, np.int64) if weights is None else weights.astype(np.int64)
    return rows, np.where(rows == indices, 0, w)


def cut_weight(indices, edges, labels) -> int:
    """The summed weight of the entries between parts; ``edges`` from `edge_weights`."""
    rows, w = edges
    return int(w[labels[rows] != labels[indices]].sum())


def _grow(indptr, indices, edges, node_weight, target: float, rng) -> np.ndarray:
    """Side 0 grown from a random node, the node with the most weight into it (less its
    weight elsewhere) first, until it holds about ``target`` node weight; a new random node
    starts where the region has no neighbour left. ``edges``: `edge_weights`."""
    n = indptr.size - 1
    rows, w = edges
    degree = np.bincount(rows, weights=w, minlength=n).astype(np.int64)
    side = np.ones(n, np.int64)
    inside = np.zeros(n, np.int64)  # weight of edges into side 0
    tie = rng.permutation(n)
    order = rng.permutation(n)
    heap: list = []
    load, next_seed = 0, 0
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
        if load > 0 and load + node_weight[v] - target > target - load:
            break  # closer to the target without it
        side[v] = 0
        load += int(node_weight[v])
        for e in range(indptr[v], indptr[v + 1]):
            u = int(indices[e])
            if side[u] == 1 and w[e]:
                inside[u] += w[e]
                heapq.heappush(heap, (-(2 * inside[u] - degree[u]), int(tie[u]), u))
    return side


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
