"""Seeded synthetic node-classification graphs: a contextual SBM and an R-MAT power-law graph.

Both generators are deterministic: the same arguments (seed included) give a bit-identical
`Graph`. Randomness comes only from `np.random.Generator` streams spawned from the seed, one per
concern (labels, edges, features, split), so that for example changing ``num_features`` changes
the features but not the edges or the split.

Both build the CSR directly (no `from_edges`, whose argsort of E int64 indices is the memory
peak at ogbn-products size) with no self loops, no duplicate edges and each CSR row sorted by
source id; undirected graphs (always for `csbm`, by default for `rmat`) store every edge in both
directions.

N nodes, E directed edges, F features, C classes throughout.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import scipy.sparse as sp

from jgrind.graph import Graph, index_dtype

# Candidate R-MAT pairs drawn per vectorised step. Each of the ~10 array passes per recursion
# level then works on 256 KiB int32 arrays that stay in cache; measured flat from 32k to 256k,
# 35% slower at 1M (memory-bound) and slower below 32k (per-call overhead).
_RMAT_CHUNK = 1 << 16

# Rows / keys handled per step in the passes that would otherwise make E-sized int64 or
# [N, F] temporaries (key decoding, feature noise).
_BLOCK = 1 << 22

# Low id bits that carry an R-MAT node's class (see `rmat`): 4096 bit patterns spread over the
# classes, so every class gets many patterns and class sizes and edge masses even out.
_COMMUNITY_BITS = 12

# Sampling rounds before `rmat` gives up on reaching the requested number of distinct edges
# (the default size takes 2; each round costs a linear merge of all samples so far).
_MAX_ROUNDS = 25


# ------------------------------------------------------------------------------------------
# Contextual stochastic block model
# ------------------------------------------------------------------------------------------
def csbm(num_nodes: int = 10_000, num_classes: int = 4, num_features: int = 32,
         avg_degree: float = 10.0, homophily: float = 0.8, feature_signal: float = 1.0,
         train_fraction: float = 0.6, val_fraction: float = 0.2, seed: int = 0,
         num_tasks: int = 0, target_noise: float = 0.1, name: Optional[str] = None) -> Graph:
    """A contextual stochastic block model: class-dependent Gaussian features on an SBM graph.

    Labels: ``[N]`` int32, balanced (class sizes differ by at most one node), assigned to nodes
    in a seeded random order. With ``num_tasks = T >= 2`` the task is multi-label instead
    (like ogbn-proteins): labels ``[N, T]`` binary targets, a node's being its class's code
    (one fair coin per class and task) with each target flipped with probability
    ``target_noise``; the graph, the features and the split are those of the same call with
    ``num_tasks=0``, and ``num_classes`` is T.

    Features: ``[N, F]`` float32, ``mu[label] + noise`` with ``noise ~ N(0, I)`` and ``mu[c]`` a
    random direction of length ``feature_signal`` (a normalised Gaussian vector, so class means
    are nearly orthogonal when F >> C). Features alone separate classes only partly; averaging
    over neighbours shrinks the noise while, with ``homophily`` well above ``1 / C``, keeping
    the class mean, which is what a GNN exploits.

    Edges: ``round(N * avg_degree / 2)`` pairs. Every node is the first endpoint of
    ``floor(avg_degree / 2)`` or one more pairs (the extra ones go to random nodes); the second
    endpoint is, with probability ``homophily``, a uniform node of the first's class and
    otherwise a uniform node of a uniformly chosen *other* class. Pairs are made undirected
    (stored in both directions); self loops and repeated pairs are dropped, so E is a little
    under ``N * avg_degree`` (a fraction ~``avg_degree * C / N`` of pairs is lost) and the edge
    homophily (fraction of edges joining same-class nodes) is ``homophily`` up to sampling
    noise. ``homophily = 1 / C`` gives a graph independent of the labels; below that it is
    heterophilous.

    Split: one split, a seeded random ``train_fraction`` / ``val_fraction`` / rest (test)
    partition of all nodes (rounded to whole nodes).

    Defaults: 10,000 nodes, 99,852 directed edges (mean degree 10, min 5), edge homophily 0.80,
    4 classes of 2,500, 32 features, 6,000 / 2,000 / 2,000 train / val / test nodes. A
    nearest-class-mean classifier fitted on the train nodes scores 0.55 test accuracy on raw
    features and 0.88 after one mean aggregation over ``A + I`` (chance 0.25); with
    ``homophily=0.25`` the aggregation drops it to 0.30.

    Args:
      num_nodes: N >= num_classes.
      num_classes: C >= 1.
      num_features: F >= 1.
      avg_degree: target mean number of directed edges per node (>= 0).
      homophily: in ``[0, 1]``, probability that a sampled pair stays inside a class.
      feature_signal: length of each class mean (>= 0); 0 makes features pure noise.
      train_fraction, val_fraction: shares of nodes in the train and val masks (>= 0, sum <= 1).
      seed: seeds every random choice.
      num_tasks: 0 (one class per node) or T >= 2 binary targets per node.
      target_noise: in ``[0, 1]``, the chance that a multi-label target disagrees with its
        class's code.
      name: graph name; default ``"csbm-<N>"``.

    Returns:
      A `Graph` with int32 (or int64 past 2**31 entries) CSR, float32 features and one split.

    Time and memory are O(N * F + E), vectorised NumPy throughout: 1M nodes / 10M edges / 128
    features takes ~4 s and 0.72 GiB peak RSS on a 2-core machine, 0.52 GiB of it the graph.
    """
    n, k = int(num_nodes), int(num_classes)
    if k < 1 or n < k:
        raise ValueError(f"csbm needs num_classes >= 1 and num_nodes >= num_classes, got "
                         f"num_nodes={num_nodes}, num_classes={num_classes}")
    if num_features < 1:
        raise ValueError(f"csbm needs num_features >= 1, got {num_features}")
    if not avg_degree >= 0:
        raise ValueError(f"avg_degree must be >= 0, got {avg_degree}")
    _check_probability("homophily", homophily)
    if not feature_signal >= 0:
        raise ValueError(f"feature_signal must be >= 0, got {feature_signal}")
    _check_fractions(train_fraction, val_fraction)
    _check_tasks(num_tasks, target_noise)
    # a fifth stream: spawned children do not depend on how many are spawned, so the first
    # four (and a single-label graph) are unchanged
    label_rng, edge_rng, feat_rng, split_rng, task_rng = _streams(seed, 5)

    # labels[order[i]] = i % C, so the members of class c are exactly order[c::C]: a uniform
    # member is order[c + C * j] with j uniform below the class size, no per-class index needed.
    order = label_rng.permutation(n)
    labels = np.empty(n, np.int32)
    labels[order] = np.arange(n, dtype=np.int64) % k
    class_size = (n - np.arange(k) + k - 1) // k

    m = int(round(n * float(avg_degree) / 2))
    first = np.concatenate([np.tile(np.arange(n, dtype=np.int64), m // n),
                            edge_rng.choice(n, m % n, replace=False)])
    cls = labels[first].astype(np.int64)
    if k > 1:
        # A uniform *other* class: shift by 1..C-1 modulo C.
        leave = edge_rng.random(m) >= homophily
        cls[leave] = (cls[leave] + edge_rng.integers(1, k, int(leave.sum()))) % k
    second = order[cls + k * edge_rng.integers(0, class_size[cls])]
    del cls

    keys = _pair_keys(first, second, n, undirected=True)
    del first, second
    keys.sort()
    keys = keys[_run_starts(keys)]
    indptr, indices = _csr_from_keys(keys, n, undirected=True)
    del keys

    features = _class_features(labels, k, int(num_features), float(feature_signal), feat_rng)
    train, val, test = _random_split(n, train_fraction, val_fraction, split_rng)
    if num_tasks:
        labels, k = _class_targets(labels, k, num_tasks, target_noise, task_rng), num_tasks
    return Graph(indptr=indptr, indices=indices, features=features, labels=labels,
                 train_mask=train, val_mask=val, test_mask=test, num_classes=k,
                 name=name if name is not None else f"csbm-{n}")


def _check_tasks(num_tasks, target_noise) -> None:
    if num_tasks != 0 and not (isinstance(num_tasks, (int, np.integer)) and num_tasks >= 2):
        raise ValueError(f"num_tasks must be 0 (class ids) or at least 2 (binary targets), got "
                         f"{num_tasks!r}")
    _check_probability("target_noise", target_noise)


def _class_targets(labels: np.ndarray, num_classes: int, num_tasks: int, noise: float,
                   rng: np.random.Generator) -> np.ndarray:
    """``[N, T]`` int8 binary targets: each node's class's code (a fair coin per class and
    task), each target flipped with probability ``noise``; drawn a slice of rows at a time."""
    code = rng.random((num_classes, int(num_tasks))) < 0.5
    out = np.empty((labels.size, int(num_tasks)), np.int8)
    step = max(1, (16 << 20) // int(num_tasks))
    for s in range(0, labels.size, step):
        flip = rng.random((min(step, labels.size - s), int(num_tasks))) < noise
        out[s:s + step] = code[labels[s:s + step]] ^ flip
    return out


# ------------------------------------------------------------------------------------------
# R-MAT
# ------------------------------------------------------------------------------------------
def rmat(num_nodes: int = 2_449_029, num_edges: int = 61_859_140, num_features: int = 100,
         num_classes: int = 47, a: float = 0.57, b: float = 0.19, c: float = 0.19,
         homophily: float = 0.8, feature_signal: float = 2.5, train_fraction: float = 0.08,
         val_fraction: float = 0.02, undirected: bool = True, seed: int = 0,
         num_tasks: int = 0, target_noise: float = 0.1, name: Optional[str] = None) -> Graph:
    """An R-MAT power-law graph with exactly ``num_edges`` edges and learnable planted classes.

    The defaults give ogbn-products' node, feature and class counts: 2,449,029 nodes,
    61,859,140 directed edges (30,929,570 undirected pairs), 100 float32 features, 47 classes;
    0.25 GB of int32 indices plus 0.98 GB of features. Note that ogbn-products itself has
    61,859,140 *undirected* edges, 123,718,280 directed ones once made symmetric (as PyG loads
    it, mean degree 50.5): pass ``num_edges=123_718_280`` to match that too.

    Edges (R-MAT, Chakrabarti et al. 2004): with ``s = ceil(log2 N)``, each candidate pair
    picks one quadrant of the ``2**s x 2**s`` adjacency matrix per recursion level, with
    probabilities ``a, b, c, d = 1 - a - b - c`` (top-left, top-right, bottom-left,
    bottom-right), fixing one bit of the source and one of the destination id. Skewed
    ``a`` concentrates edges on ids with many zero bits, which gives the heavy-tailed degrees.
    Pairs with an endpoint ``>= N`` (when N is not a power of two) and self loops are rejected.

    Classes (planted, so that linked nodes tend to share labels): a node's class is a fixed,
    seeded, balanced function of the low ``min(s, max(12, ceil(log2 C)))`` bits of its R-MAT
    id, so class node counts agree within about 1%. With probability ``homophily`` a
    candidate's destination then has those low bits redrawn from the R-MAT distribution of
    destinations *restricted to the source's class*; its high bits are untouched. When
    ``b == c`` (the default) this keeps every node's expected degree in the sampled
    multigraph; after de-duplication hubs lose somewhat more repeats (their intra-class draws
    collide more), so the simple graph is a little less skewed than plain R-MAT (at 20k nodes
    the maximum degree is about halved; the median and 90th percentile barely move). Edge
    homophily ends a little under ``homophily`` for the same reason: 0.73-0.76 for 0.8 from 100k
    to 2.4M nodes. (Plain R-MAT, ``homophily=0``, is no use here: the id bits of linked nodes
    are barely correlated, ``a * d ~ b * c``, so no function of the id would give labels that
    neighbours share.)

    Exact edge count: undirected=True needs an even ``num_edges`` and targets ``num_edges / 2``
    distinct unordered pairs, each stored in both directions; undirected=False targets
    ``num_edges`` distinct directed pairs. Candidates are drawn in rounds, sorted, and
    de-duplicated; while short, another round is drawn, sized from a Good-Turing estimate of
    how many fresh samples are new (the default size takes two rounds, ~1.3 candidates per
    kept pair). If the last round overshoots, a seeded uniform random subset of the surplus
    distinct pairs is dropped. The result has exactly ``num_edges`` directed edges; a target
    too dense for the skew to fill (say 90% of all pairs on 1,000 nodes; 40% still works)
    raises ValueError after ``max(3 * target, 2**24)`` candidates or 25 rounds.

    Node ids are finally relabelled by a seeded random permutation, so id says nothing about
    degree or class (raw R-MAT puts hubs at low ids).

    Features: ``[N, F]`` float32, ``mu[label] + N(0, I)`` with ``mu[c]`` a random direction of
    length ``feature_signal``. The default 2.5 is chosen so that features alone give roughly
    the accuracy an MLP gets on ogbn-products (~0.6) and the graph adds ~0.2 on top.

    Split: one split, a seeded random ``train_fraction`` / ``val_fraction`` / rest partition;
    the defaults 8% / 2% / 90% mimic the proportions of ogbn-products' 8% / 1.6% / 90.4%
    sales-rank split (not which nodes).

    What the defaults produce: mean degree 25.3, median 1, 99th percentile 547, maximum
    42,678; 39% of nodes are isolated (as in any R-MAT graph: ids with many one-bits have
    tiny expected degree; 29% with ``num_edges=123_718_280``). Edge homophily 0.755. A
    nearest-class-mean classifier fitted on the train nodes scores 0.59 test accuracy on raw
    features and 0.79 after one mean aggregation over ``A + I`` (chance 1/47). Generation takes
    15-22 s (2-core machine, varying with load) and 1.53 GiB peak RSS, 1.17 GiB of it the
    graph itself.

    Args:
      num_nodes: N >= 2 (or >= 1 when num_edges is 0).
      num_edges: exact number of directed edges E of the result.
      num_features: F >= 1.
      num_classes: C >= 1; when ``2**s < C`` (tiny graphs) some classes have no nodes.
      a, b, c: R-MAT quadrant probabilities, all > 0 with ``a + b + c < 1``; ``d`` is the rest.
      homophily: in ``[0, 1]``, probability that a candidate's destination is redrawn inside
        the source's class.
      feature_signal: length of each class mean (>= 0); 0 makes features pure noise.
      train_fraction, val_fraction: shares of nodes in the train and val masks (>= 0, sum <= 1).
      undirected: store every pair in both directions (True) or keep a directed graph.
      seed: seeds every random choice.
      num_tasks, target_noise: as `csbm`'s: 0, or T >= 2 binary targets per node (a
        multi-label task like ogbn-proteins: ``[N, T]`` labels from the planted classes'
        codes, ``num_classes`` T), on the same graph, features and split.
      name: graph name; default ``"rmat-<N>-<E>"``.

    Returns:
      A `Graph` with int32 (or int64 past 2**31 entries) CSR with sorted rows, no self loops
      and no duplicate edges, float32 features and one split.

    Memory: candidates are generated in 64k chunks and kept only as int64 keys (8 bytes per
    candidate pair, ~1.3 candidates per kept pair); no E-sized float array is ever built. At
    the default size the edge phase peaks 0.65 GiB above its own output (1.2 GiB with
    ``num_edges=123_718_280``) and the overall peak is the graph plus ~0.3 GiB (then mostly
    `Graph.validate`'s [N, F] finiteness mask).
    """
    n, k, e = int(num_nodes), int(num_classes), int(num_edges)
    d = 1.0 - a - b - c
    if not (a > 0 and b > 0 and c > 0 and d > 0):
        raise ValueError(f"R-MAT needs a, b, c > 0 and a + b + c < 1, got a={a}, b={b}, c={c}")
    if k < 1 or num_features < 1 or n < 1:
        raise ValueError(f"rmat needs num_nodes, num_classes and num_features >= 1, got "
                         f"{num_nodes}, {num_classes}, {num_features}")
    if e < 0 or e > n * (n - 1):
        raise ValueError(f"num_edges must lie in [0, N * (N - 1)] = [0, {n * (n - 1)}] for "
                         f"N={n} without self loops, got {num_edges}")
    if undirected and e % 2:
        raise ValueError(f"an undirected graph stores every edge twice, so num_edges must be "
                         f"even, got {num_edges}")
    _check_probability("homophily", homophily)
    if not feature_signal >= 0:
        raise ValueError(f"feature_signal must be >= 0, got {feature_signal}")
    _check_fractions(train_fraction, val_fraction)
    _check_tasks(num_tasks, target_noise)
    class_rng, perm_rng, edge_rng, feat_rng, split_rng, task_rng = _streams(seed, 6)

    scale = max(1, math.ceil(math.log2(n)))
    bits = min(scale, max(_COMMUNITY_BITS, math.ceil(math.log2(k))))
    pattern_class = (class_rng.permutation(1 << bits) % k).astype(np.int32)
    id_t = np.int32 if scale <= 31 else np.int64
    perm = perm_rng.permutation(n).astype(id_t)  # raw R-MAT id -> final node id

    sampler = _RmatSampler(n, scale, a, b, c, float(homophily), bits, pattern_class, perm,
                           undirected, edge_rng)
    keys = _distinct_keys(e // 2 if undirected else e, sampler, edge_rng)
    indptr, indices = _csr_from_keys(keys, n, undirected)
    del keys

    labels = np.empty(n, np.int32)
    labels[perm] = pattern_class[np.arange(n, dtype=id_t) & id_t((1 << bits) - 1)]
    features = _class_features(labels, k, int(num_features), float(feature_signal), feat_rng)
    train, val, test = _random_split(n, train_fraction, val_fraction, split_rng)
    if num_tasks:
        labels, k = _class_targets(labels, k, num_tasks, target_noise, task_rng), num_tasks
    return Graph(indptr=indptr, indices=indices, features=features, labels=labels,
                 train_mask=train, val_mask=val, test_mask=test, num_classes=k,
                 name=name if name is not None else f"rmat-{n}-{e}")


class _RmatSampler:
    """Draws valid candidate edges (in range, no self loop, classes planted) as int64 keys."""

    def __init__(self, n, scale, a, b, c, homophily, bits, pattern_class, perm, undirected, rng):
        self.n, self.scale, self.perm, self.undirected, self.rng = n, scale, perm, undirected, rng
        self.id_t = perm.dtype.type
        # Quadrant thresholds on one uniform draw per level: [0,a) a, [a,a+b) b, [a+b,a+b+c) c.
        self.t_a, self.t_ab, self.t_abc = (np.float32(v) for v in (a, a + b, a + b + c))
        self.homophily, self.pattern_class = homophily, pattern_class
        self.low = self.id_t((1 << bits) - 1)
        # R-MAT probability of each low-bit pattern as a destination: each zero bit is a left
        # column (a + c), each one bit a right one (b + d).
        patterns = np.arange(1 << bits)
        ones = ((patterns[:, None] >> np.arange(bits)) & 1).sum(axis=1)
        mass = (a + c) ** (bits - ones) * (1.0 - a - c) ** ones
        # Walker alias tables, one per class over that class's patterns, so that a draw
        # restricted to a class costs O(1) gathers (an inverse-CDF searchsorted was 4x slower).
        self.seg_start, self.seg_size, self.alias_prob, self.alias_pattern = _alias_tables(
            pattern_class, mass, self.id_t)

    def __call__(self, count: int) -> np.ndarray:
        """``[count]`` int64 keys of fresh valid candidates, in draw order."""
        out = np.empty(count, np.int64)
        filled = 0
        size = _RMAT_CHUNK
        r = np.empty(size, np.float32)
        t1, t2, t3 = (np.empty(size, bool) for _ in range(3))
        src, dst = np.empty(size, self.id_t), np.empty(size, self.id_t)
        while filled < count:
            src.fill(0)
            dst.fill(0)
            for _ in range(self.scale):
                self.rng.random(out=r, dtype=np.float32)
                np.greater_equal(r, self.t_a, out=t1)
                np.greater_equal(r, self.t_ab, out=t2)
                np.greater_equal(r, self.t_abc, out=t3)
                np.left_shift(src, 1, out=src)
                src |= t2                                  # row bit: quadrant c or d
                np.logical_xor(t1, t2, out=t1)
                np.logical_xor(t1, t3, out=t1)             # column bit: quadrant b or d
                np.left_shift(dst, 1, out=dst)
                dst |= t1
            if self.homophily > 0:
                self._plant_classes(src, dst)
            ok = (src < self.n) & (dst < self.n) & (src != dst)
            keys = _pair_keys(self.perm[src[ok]], self.perm[dst[ok]], self.n, self.undirected)
            take = min(keys.size, count - filled)
            out[filled:filled + take] = keys[:take]
            filled += take
        return out

    def _plant_classes(self, src, dst):
        """Redraw, with probability `homophily`, the low bits of dst inside src's class."""
        hit = np.flatnonzero(self.rng.random(src.size, dtype=np.float32) < self.homophily)
        cls = self.pattern_class[src[hit] & self.low]
        # One uniform gives both the alias slot (integer part) and the coin (fraction).
        u = self.rng.random(hit.size) * self.seg_size[cls]
        slot = u.astype(np.int64)
        u -= slot
        np.minimum(slot, self.seg_size[cls] - 1, out=slot)  # u * size < size, but be safe
        slot += self.seg_start[cls]
        dst[hit] = (dst[hit] & ~self.low) | np.where(
            u < self.alias_prob[slot], self.alias_pattern[0, slot], self.alias_pattern[1, slot])


def _alias_tables(pattern_class: np.ndarray, mass: np.ndarray, id_t):
    """Walker/Vose alias tables for drawing a pattern with probability ``mass`` restricted to
    one class.

    Returns ``seg_start [C]``, ``seg_size [C]`` (each class's slots are
    ``seg_start[k] + [0, seg_size[k])``), ``prob [P]`` float64 and ``pattern [2, P]``: slot t
    yields ``pattern[0, t]`` with probability ``prob[t]``, else ``pattern[1, t]``. P = 2**bits
    (small), so building the tables in Python is cheap.
    """
    order = np.argsort(pattern_class, kind="stable")
    seg_size = np.bincount(pattern_class, minlength=int(pattern_class.max()) + 1)
    seg_start = np.concatenate([[0], np.cumsum(seg_size)[:-1]])
    prob = np.ones(order.size)
    pattern = np.stack([order, order]).astype(id_t)
    for start, size in zip(seg_start.tolist(), seg_size.tolist()):
        members = order[start:start + size]
        scaled = (mass[members] * (size / mass[members].sum())).tolist()
        small = [i for i, q in enumerate(scaled) if q < 1.0]
        large = [i for i, q in enumerate(scaled) if q >= 1.0]
        while small and large:
            s, g = small.pop(), large[-1]
            prob[start + s] = scaled[s]
            pattern[1, start + s] = members[g]
            scaled[g] -= 1.0 - scaled[s]
            if scaled[g] < 1.0:
                small.append(large.pop())
        # Leftovers are 1 up to round-off: they always keep their own pattern (prob stays 1).
    return seg_start, seg_size, prob, pattern


def _distinct_keys(target: int, draw, rng: np.random.Generator,
                   budget: Optional[int] = None) -> np.ndarray:
    """Exactly `target` distinct keys, sorted, from the candidate stream `draw(count)`.

    Draws at most `budget` samples (default ``max(3 * target, 2**24)``: enough for any sparse
    graph, ogbn-products size needs ~1.3x, while bounding memory and time for a target too
    dense for the R-MAT skew ever to fill) and raises ValueError past it.

    All samples are kept sorted with their repeats so that the number seen exactly once gives a
    Good-Turing estimate (singletons / samples) of how likely a fresh sample is new, which sizes
    the next round. Each new round is sorted on its own and merged by a stable sort, which
    NumPy's timsort does in one linear pass over the two runs.
    """
    budget = max(3 * target, 1 << 24) if budget is None else budget
    samples = draw(target)
    samples.sort()
    rounds = 1
    while True:
        starts = _run_starts(samples)
        distinct = int(np.count_nonzero(starts))
        if distinct >= target:
            break
        if samples.size >= budget or rounds >= _MAX_ROUNDS:
            raise ValueError(f"only {distinct:,} of {target:,} distinct R-MAT edges after "
                             f"{samples.size:,} samples in {rounds} rounds; the graph is too "
                             "dense for its skew: lower num_edges or make a, b, c, d more even")
        singles = int(np.count_nonzero(starts & np.append(starts[1:], True)))
        p_new = max(singles, 1) / samples.size
        more = min(int(1.1 * (target - distinct) / p_new) + 1024, budget - samples.size)
        fresh = draw(more)
        fresh.sort()
        samples = np.concatenate([samples, fresh])
        del fresh
        samples.sort(kind="stable")
        rounds += 1
    keys = samples[starts]
    del samples, starts
    if keys.size > target:
        drop = rng.choice(keys.size, keys.size - target, replace=False)
        keep = np.ones(keys.size, bool)
        keep[drop] = False
        keys = keys[keep]
    return keys


# ------------------------------------------------------------------------------------------
# Shared pieces
# ------------------------------------------------------------------------------------------
def _streams(seed: int, count: int) -> list[np.random.Generator]:
    """Independent generators, one per concern, so that one concern's draws never shift
    another's."""
    return [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(count)]


def _check_probability(what: str, p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{what} must lie in [0, 1], got {p}")


def _check_fractions(train_fraction: float, val_fraction: float) -> None:
    if not (train_fraction >= 0 and val_fraction >= 0 and train_fraction + val_fraction <= 1):
        raise ValueError(f"train_fraction and val_fraction must be >= 0 with sum <= 1, got "
                         f"{train_fraction} and {val_fraction}")


def _pair_keys(src: np.ndarray, dst: np.ndarray, n: int, undirected: bool) -> np.ndarray:
    """``[M']`` int64 key of every pair: ``min * N + max`` if undirected (the unordered pair;
    self loops are dropped here, so M' <= M), else ``dst * N + src`` (sorted keys are then in
    CSR order; the caller must have dropped self loops)."""
    if undirected:
        lo, hi = np.minimum(src, dst), np.maximum(src, dst)
        keep = lo != hi
        lo, hi = lo[keep], hi[keep]
        return lo.astype(np.int64) * n + hi
    return dst.astype(np.int64) * n + src


def _run_starts(sorted_keys: np.ndarray) -> np.ndarray:
    """``[M]`` bool, True at the first element of every run of equal keys."""
    starts = np.empty(sorted_keys.size, bool)
    starts[:1] = True
    np.not_equal(sorted_keys[1:], sorted_keys[:-1], out=starts[1:])
    return starts


def _decode(keys: np.ndarray, n: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(key // N, key % N)`` as `dtype` arrays, in blocks to avoid E-sized int64 temps."""
    q, r = np.empty(keys.size, dtype), np.empty(keys.size, dtype)
    for s in range(0, keys.size, _BLOCK):
        q[s:s + _BLOCK], r[s:s + _BLOCK] = np.divmod(keys[s:s + _BLOCK], n)
    return q, r


def _csr_from_keys(keys: np.ndarray, n: int, undirected: bool):
    """``(indptr [N + 1], indices [E])`` from sorted distinct `_pair_keys`.

    Directed keys are already in CSR order. Undirected keys are the upper triangle ``U`` (row
    lo, columns hi > lo, sorted); row i of ``U + U^T`` is row i of ``U^T`` (sources < i, in
    order) followed by row i of ``U`` (sources > i), so two block copies per row place every
    entry with the rows still sorted. ``U^T`` comes from SciPy's CSR -> CSC conversion, a
    linear counting sort (NumPy's stable argsort of E int32 is ~7x slower here).
    """
    idx_t = index_dtype(max(n, 2 * keys.size if undirected else keys.size))
    rows, cols = _decode(keys, n, idx_t)
    counts = np.bincount(rows, minlength=n)
    if not undirected:
        del rows
        indptr = np.zeros(n + 1, idx_t)
        np.cumsum(counts, out=indptr[1:])
        return indptr, cols
    up = np.zeros(n + 1, idx_t)
    np.cumsum(counts, out=up[1:])
    del rows
    upper = sp.csr_matrix((np.ones(cols.size, np.int8), cols, up), shape=(n, n), copy=False)
    lower = upper.tocsc()             # CSC of U is CSR of U^T: rows hi, sorted columns lo
    lp = lower.indptr.astype(idx_t, copy=False)
    lower_idx = lower.indices.astype(idx_t, copy=False)
    del upper, lower
    indptr = np.zeros(n + 1, idx_t)
    np.cumsum(np.diff(up) + np.diff(lp), out=indptr[1:])
    indices = np.empty(indptr[-1], idx_t)
    # Entry t of row i of a part moves by (where row i's part starts in the output) - (where
    # row i starts in the part).
    _place_rows(indices, indptr[:-1] - lp[:-1], lp, lower_idx)
    del lower_idx
    _place_rows(indices, indptr[:-1] + np.diff(lp) - up[:-1], up, cols)
    return indptr, indices


def _place_rows(out: np.ndarray, shift: np.ndarray, part_ptr: np.ndarray, part_idx: np.ndarray):
    """``out[t + shift[row(t)]] = part_idx[t]`` for every entry t of a CSR part."""
    pos = np.repeat(shift, np.diff(part_ptr))
    pos += np.arange(pos.size, dtype=pos.dtype)
    out[pos] = part_idx


def _class_features(labels: np.ndarray, num_classes: int, num_features: int, signal: float,
                    rng: np.random.Generator) -> np.ndarray:
    """``[N, F]`` float32: class mean (random direction, length `signal`) + N(0, I) noise,
    written in row blocks so no [N, F] float64 or second [N, F] array ever exists."""
    mu = rng.standard_normal((num_classes, num_features))
    mu *= signal / np.maximum(np.linalg.norm(mu, axis=1, keepdims=True), 1e-12)
    mu = mu.astype(np.float32)
    out = np.empty((labels.size, num_features), np.float32)
    rows = max(1, _BLOCK // num_features)
    for s in range(0, labels.size, rows):
        block = out[s:s + rows]
        rng.standard_normal(out=block, dtype=np.float32)
        block += mu[labels[s:s + rows]]
    return out


def _random_split(n: int, train_fraction: float, val_fraction: float,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``([1, N], [1, N], [1, N])`` bool train / val / test masks of a random partition."""
    order = rng.permutation(n)
    n_train = int(round(train_fraction * n))
    n_val = min(int(round(val_fraction * n)), n - n_train)
    masks = np.zeros((3, 1, n), bool)
    masks[0, 0, order[:n_train]] = True
    masks[1, 0, order[n_train:n_train + n_val]] = True
    masks[2, 0, order[n_train + n_val:]] = True
    return masks[0], masks[1], masks[2]
