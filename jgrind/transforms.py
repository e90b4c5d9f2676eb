"""Pure graph transforms: each takes a `Graph` and returns a new one (or derived arrays).

All of them work on the CSR in NumPy, in O(N + E) memory beyond the output, so that they run on
graphs far larger than the accelerator.
"""

from __future__ import annotations

import numpy as np

from jgrind.graph import Graph, index_dtype


def _rebuild(graph: Graph, src: np.ndarray, dst: np.ndarray, weight=None,
             presorted: bool = False) -> Graph:
    """A graph with the same nodes and the given edges (sorted by destination, then source;
    ``presorted`` says they already are, saving a sort of E)."""
    n = graph.num_nodes
    idx_t = index_dtype(max(n, src.size))
    order = slice(None) if presorted else np.lexsort((src, dst))
    indptr = np.zeros(n + 1, dtype=idx_t)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return graph.replace(indptr=indptr, indices=src[order].astype(idx_t),
                         edge_weight=None if weight is None else weight[order])


def _sorted_unique(keys: np.ndarray, return_inverse: bool = False):
    """``np.unique`` by sort + adjacent-difference mask: about 20x faster than ``np.unique`` on
    tens of millions of distinct int64 keys with NumPy 2.4."""
    order = np.argsort(keys, kind="stable") if return_inverse else None
    sorted_keys = keys[order] if return_inverse else np.sort(keys)
    first = np.ones(sorted_keys.size, bool)
    first[1:] = sorted_keys[1:] != sorted_keys[:-1]
    uniq = sorted_keys[first]
    if not return_inverse:
        return uniq
    inverse = np.empty(keys.size, np.int64)
    inverse[order] = np.cumsum(first) - 1
    return uniq, inverse


def coo(graph: Graph) -> tuple[np.ndarray, np.ndarray]:
    """``(src, dst)``, each ``[E]``, in CSR order."""
    return graph.indices, graph.edge_destinations()


def remove_self_loops(graph: Graph) -> Graph:
    src, dst = coo(graph)
    keep = src != dst
    w = None if graph.edge_weight is None else graph.edge_weight[keep]
    return _rebuild(graph, src[keep], dst[keep], w)


def add_self_loops(graph: Graph, fill_value: float = 1.0) -> Graph:
    """Add one self loop to every node (after removing any existing ones, as PyG does)."""
    g = remove_self_loops(graph)
    src, dst = coo(g)
    loops = np.arange(g.num_nodes, dtype=src.dtype)
    w = None
    if g.edge_weight is not None:
        w = np.concatenate([g.edge_weight, np.full(g.num_nodes, fill_value, np.float32)])
    return _rebuild(g, np.concatenate([src, loops]), np.concatenate([dst, loops]), w)


def remove_duplicate_edges(graph: Graph) -> Graph:
    """Keep one copy of every ``(src, dst)`` pair; weights of duplicates are summed."""
    src, dst = coo(graph)
    key = dst.astype(np.int64) * graph.num_nodes + src.astype(np.int64)
    w = None
    if graph.edge_weight is not None:
        uniq, inverse = _sorted_unique(key, return_inverse=True)
        w = np.bincount(inverse, weights=graph.edge_weight, minlength=uniq.size)
        w = w.astype(np.float32)
    else:
        uniq = _sorted_unique(key)
    new_dst, new_src = np.divmod(uniq, graph.num_nodes)
    # the unique (dst * n + src) keys come out sorted: already CSR order
    return _rebuild(graph, new_src, new_dst, w, presorted=True)


def make_undirected(graph: Graph) -> Graph:
    """Add the reverse of every edge, then drop duplicates (weights of a pair are summed once
    per direction present, so an edge stored in both directions keeps its weight)."""
    src, dst = coo(graph)
    if graph.edge_weight is None:
        n = np.int64(graph.num_nodes)
        key = _sorted_unique(np.concatenate([dst.astype(np.int64) * n + src,
                                             src.astype(np.int64) * n + dst]))
        new_dst, new_src = np.divmod(key, n)
        return _rebuild(graph, new_src, new_dst, presorted=True)
    # Weighted: keep the max of the two directions' weights, so symmetric input is unchanged.
    n = graph.num_nodes
    s2 = np.concatenate([src, dst]).astype(np.int64)
    d2 = np.concatenate([dst, src]).astype(np.int64)
    w2 = np.concatenate([graph.edge_weight, graph.edge_weight])
    key = d2 * n + s2
    order = np.lexsort((-w2, key))
    key, w2 = key[order], w2[order]
    first = np.ones(key.size, bool)
    first[1:] = key[1:] != key[:-1]
    new_dst, new_src = np.divmod(key[first], n)
    return _rebuild(graph, new_src, new_dst, w2[first], presorted=True)


def is_symmetric(graph: Graph) -> bool:
    src, dst = coo(graph)
    n = np.int64(graph.num_nodes)
    fwd = np.sort(dst.astype(np.int64) * n + src)
    rev = np.sort(src.astype(np.int64) * n + dst)
    return bool(np.array_equal(fwd, rev))


def gcn_norm(graph: Graph, add_loops: bool = True) -> Graph:
    """Symmetric GCN normalisation ``D^-1/2 (A + I) D^-1/2`` as edge weights.

    Computed once on the whole graph: partitioning later slices these weights, so the model does
    not depend on how the graph is cut. Degrees are weighted in-degrees of ``A + I`` (rows of the
    CSR), as in PyG's ``gcn_norm``; nodes of degree 0 get weight 0.
    """
    g = add_self_loops(graph) if add_loops else graph
    w = g.edge_weight if g.edge_weight is not None else np.ones(g.num_edges, np.float32)
    src, dst = coo(g)
    deg = np.bincount(dst, weights=w, minlength=g.num_nodes)
    with np.errstate(divide="ignore"):
        dinv = np.where(deg > 0, 1.0 / np.sqrt(deg), 0.0)
    return g.replace(edge_weight=(dinv[src] * w * dinv[dst]).astype(np.float32))


def mean_norm(graph: Graph) -> Graph:
    """Row normalisation ``D^-1 A``: the mean over in-neighbours (GraphSAGE-mean). Nodes with no
    in-neighbours aggregate to zero."""
    g = graph
    w = g.edge_weight if g.edge_weight is not None else np.ones(g.num_edges, np.float32)
    deg = np.bincount(g.edge_destinations(), weights=w, minlength=g.num_nodes)
    with np.errstate(divide="ignore"):
        inv = np.where(deg > 0, 1.0 / deg, 0.0)
    return g.replace(edge_weight=(w * inv[g.edge_destinations()]).astype(np.float32))


def permute_nodes(graph: Graph, perm: np.ndarray) -> Graph:
    """Relabel nodes so that new node ``k`` is old node ``perm[k]``."""
    perm = np.asarray(perm)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=perm.dtype)
    src, dst = coo(graph)
    g = graph.replace(features=graph.features[perm], labels=graph.labels[perm],
                      train_mask=graph.train_mask[:, perm], val_mask=graph.val_mask[:, perm],
                      test_mask=graph.test_mask[:, perm])
    return _rebuild(g, inv[src], inv[dst], graph.edge_weight)
