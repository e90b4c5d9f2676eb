"""A seeded heterogeneous graph the size of ogbn-mag, for benchmarks that cannot download it.

ogbn-mag (OGB's heterogeneous citation graph): 736,389 papers, 1,134,649 authors, 8,740
institutions, 59,965 fields of study; author-writes-paper 7,145,660 edges,
author-affiliated_with-institution 1,043,998, paper-cites-paper 5,416,271,
paper-has_topic-field_of_study 7,505,078; 128 features on papers, 349 classes (venues).
`mag_like` makes a graph of those sizes (times ``scale``), registered as ``mag-like``.
"""

from __future__ import annotations

import math

import numpy as np

from jgrind.generators import _class_features, _distinct_keys, _streams
from jgrind.hetero import HeteroGraph, RelationCSR
from jgrind.graph import index_dtype

NODE_TYPES = (("paper", 736_389), ("author", 1_134_649), ("institution", 8_740),
              ("field_of_study", 59_965))
RELATIONS = ((("author", "writes", "paper"), 7_145_660),
             (("author", "affiliated_with", "institution"), 1_043_998),
             (("paper", "cites", "paper"), 5_416_271),
             (("paper", "has_topic", "field_of_study"), 7_505_078))
NUM_FEATURES = 128
NUM_CLASSES = 349
# ogbn-mag's time split: 629,571 / 64,879 / 41,939 papers
TRAIN_FRACTION, VAL_FRACTION = 629_571 / 736_389, 64_879 / 736_389

# How skewed each end of a relation is: a node is drawn as ``floor(n * u ** k)`` of a random
# ordering (u uniform), so k = 1 is uniform and larger k puts more edges on fewer nodes (the
# heavy tails of citation counts, prolific authors, large institutions and broad fields).
_SKEW = {("author", "writes", "paper"): (2.0, 1.5),  # (source, destination)
         ("author", "affiliated_with", "institution"): (1.0, 3.0),
         ("paper", "cites", "paper"): (1.5, 3.0),
         ("paper", "has_topic", "field_of_study"): (1.5, 3.0)}


def mag_like(scale: float = 1.0, seed: int = 0, homophily: float = 0.6,
             feature_signal: float = 1.0, name=None) -> HeteroGraph:
    """A `HeteroGraph` shaped like ogbn-mag: its four node types and four relations, each count
    times ``scale`` (rounded, at least 1; ``scale=1`` gives ogbn-mag's exact counts), 128
    features on papers (the other types have none), 349 classes on papers.

    Every node of every type gets a class (papers' are the labels, uniform at random). A
    candidate edge of writes, cites and has_topic joins nodes of one class with probability
    ``homophily`` (a node of the destination's class), else a node drawn without regard to
    class; both ends are skewed (see ``_SKEW``). Edges within a relation are distinct, and
    cites has no self loops; dropping repeated candidates lowers the share of same-class
    edges (cites at scale 0.01: 0.49 for ``homophily=0.6``). Paper features: a class mean of length ``feature_signal`` plus N(0, I) noise
    (`jgrind.generators.csbm`'s). Split: one random split of the papers in ogbn-mag's time
    split proportions (85.5 / 8.8 / 5.7 %).

    Deterministic in its arguments. At full size the result holds about 0.5 GiB (mostly the
    paper features); generating it peaked at 0.8 GiB RSS (``/usr/bin/time -v``).
    """
    if not (isinstance(scale, (int, float)) and not isinstance(scale, bool)
            and 0 < scale <= 1 and math.isfinite(scale)):
        raise ValueError(f"scale must be a number in (0, 1], got {scale!r}")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"homophily must lie in [0, 1], got {homophily}")
    counts = {t: max(1, round(c * scale)) for t, c in NODE_TYPES}
    class_rng, feature_rng, split_rng, *edge_rngs = _streams(seed, 3 + len(RELATIONS))
    classes = {t: class_rng.integers(0, NUM_CLASSES, counts[t]).astype(np.int32)
               for t, _ in NODE_TYPES}
    pickers = {t: _Picker(classes[t], class_rng) for t, _ in NODE_TYPES}
    relations = {}
    for ((src, rel, dst), edges), rng in zip(RELATIONS, edge_rngs):
        target = min(max(1, round(edges * scale)), counts[src] * counts[dst]
                     - (counts[src] if src == dst else 0))
        classed = rel != "affiliated_with"
        relations[(src, rel, dst)] = _relation(
            target, pickers[src], pickers[dst], _SKEW[(src, rel, dst)], src == dst,
            homophily if classed else 0.0, rng)
    labels = classes["paper"]
    n = counts["paper"]
    order = split_rng.permutation(n)
    n_train, n_val = round(TRAIN_FRACTION * n), round(VAL_FRACTION * n)
    masks = np.zeros((3, 1, n), bool)
    for m, ids in zip(masks, np.split(order, [n_train, n_train + n_val])):
        m[0, ids] = True
    features = _class_features(labels, NUM_CLASSES, NUM_FEATURES, feature_signal, feature_rng)
    return HeteroGraph(node_types=tuple(counts.items()), relations=relations,
                       features={"paper": features}, target="paper", labels=labels,
                       train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                       num_classes=NUM_CLASSES,
                       name=name or ("mag-like" if scale == 1 else f"mag-like:{scale:g}"))


class _Picker:
    """Draws nodes of one type: skewed over all nodes, or skewed within a given class."""

    def __init__(self, classes: np.ndarray, rng: np.random.Generator):
        self.n, self.classes = classes.size, classes
        self.order = rng.permutation(self.n)  # which nodes are the heavy ones
        shuffled = classes[self.order]
        by_class = np.argsort(shuffled, kind="stable")
        self.members = self.order[by_class]  # nodes sorted by class, random within a class
        self.size = np.bincount(classes, minlength=NUM_CLASSES)
        self.start = np.concatenate([[0], np.cumsum(self.size)[:-1]])

    def any(self, u: np.ndarray, skew: float) -> np.ndarray:
        return self.order[np.minimum((self.n * u ** skew).astype(np.int64), self.n - 1)]

    def of_class(self, u: np.ndarray, skew: float, cls: np.ndarray) -> np.ndarray:
        """A node of class ``cls[k]`` for each k, or of any class where that class has none."""
        size = self.size[cls]
        within = np.minimum((size * u ** skew).astype(np.int64), np.maximum(size - 1, 0))
        out = self.members[np.minimum(self.start[cls] + within, self.n - 1)]
        empty = size == 0
        if empty.any():
            out[empty] = self.any(u[empty], skew)
        return out


def _relation(target: int, src: _Picker, dst: _Picker, skew, same_type: bool,
              homophily: float, rng: np.random.Generator) -> RelationCSR:
    """``target`` distinct edges as a CSR ``[n_dst, n_src]`` (each row's sources sorted)."""
    src_skew, dst_skew = skew

    def draw(count: int) -> np.ndarray:
        d = dst.any(rng.random(count), dst_skew)
        s = src.any(rng.random(count), src_skew)
        alike = rng.random(count) < homophily
        if alike.any():
            s[alike] = src.of_class(rng.random(int(alike.sum())), src_skew,
                                    dst.classes[d[alike]])
        keys = d.astype(np.int64) * src.n + s
        return keys[d != s] if same_type else keys

    keys = _distinct_keys(target, draw, rng)  # sorted: destination-major, then source
    idx_t = index_dtype(max(src.n, dst.n, keys.size))
    rows, cols = np.divmod(keys, src.n)
    del keys
    indptr = np.zeros(dst.n + 1, idx_t)
    np.cumsum(np.bincount(rows, minlength=dst.n), out=indptr[1:])
    return RelationCSR(indptr, cols.astype(idx_t))

