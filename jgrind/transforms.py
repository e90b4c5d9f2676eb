"""Pure graph transforms: each takes a `Graph` and returns a new one (or derived arrays).

All of them work on the CSR in NumPy, in O(N + E) memory beyond the output, so that they run on
graphs far larger than the accelerator. A heterogeneous graph's relation ids (`Graph.edge_type`)
travel with their edges through every transform, as the edge weights do.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from jgrind.graph import Graph, GraphError, index_dtype

#: The relation `add_self_loops` gives the loops it adds to a heterogeneous graph.
SELF_RELATION = "self"


def _rebuild(graph: Graph, src: np.ndarray, dst: np.ndarray, weight=None,
             presorted: bool = False, edge_type=None) -> Graph:
    """A graph with the same nodes and the given edges (sorted by destination, then source;
    ``presorted`` says they already are, saving a sort of E)."""
    n = graph.num_nodes
    idx_t = index_dtype(max(n, src.size))
    order = slice(None) if presorted else np.lexsort((src, dst))
    indptr = np.zeros(n + 1, dtype=idx_t)
    np.cumsum(np.bincount(dst, minlength=n), out=indptr[1:])
    return graph.replace(indptr=indptr, indices=src[order].astype(idx_t),
                         edge_weight=None if weight is None else weight[order],
                         edge_type=None if edge_type is None else edge_type[order])


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


# -- row by row: self loops -------------------------------------------------------------------
# A CSR's rows are its edges grouped by destination, so edits that stay within rows (dropping
# self loops, adding one per node, sorting each row by source) need no sort of all E edges:
# they run over blocks of whole rows, about `BLOCK_EDGES` edges at a time, in memory of the
# output plus one block. Their results are the `_rebuild` of the same edges, bit for bit.
BLOCK_EDGES = 1 << 24


def row_blocks(indptr: np.ndarray, block_edges: Optional[int] = None):
    """``(first row, stop row)`` of consecutive blocks of whole rows covering every row, each
    of at most ``block_edges`` (default `BLOCK_EDGES`) edges unless a single row has more."""
    block_edges = BLOCK_EDGES if block_edges is None else block_edges
    n = indptr.size - 1
    row = 0
    while row < n:
        stop = int(np.searchsorted(indptr, int(indptr[row]) + block_edges, side="right")) - 1
        stop = min(max(stop, row + 1), n)
        yield row, stop
        row = stop


def _block_rows(indptr: np.ndarray, first: int, stop: int, dtype) -> np.ndarray:
    """The row (destination) of every edge of rows ``[first, stop)``."""
    return np.repeat(np.arange(first, stop, dtype=dtype), np.diff(indptr[first:stop + 1]))


def _sort_rows(indptr: np.ndarray, indices: np.ndarray, weight, n: int,
               edge_type=None) -> None:
    """Sort every row by source in place (stably: duplicates keep their order), block by block;
    rows already sorted cost one comparison per edge. ``weight`` and ``edge_type`` (or None)
    move with their edges."""
    for first, stop in row_blocks(indptr):
        lo, hi = int(indptr[first]), int(indptr[stop])
        cols = indices[lo:hi]
        rows = _block_rows(indptr, first, stop, np.int64)
        if not np.any((cols[1:] < cols[:-1]) & (rows[1:] == rows[:-1])):
            continue
        order = np.argsort((rows - first) * n + cols, kind="stable")
        indices[lo:hi] = cols[order]
        if weight is not None:
            weight[lo:hi] = weight[lo:hi][order]
        if edge_type is not None:
            edge_type[lo:hi] = edge_type[lo:hi][order]


def self_loop_mask(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``([E] bool: the entries that are not self loops, [N + 1] int64: the row pointers
    without the loops)`` of a CSR, a block of rows at a time."""
    n = indptr.size - 1
    keep = np.empty(indices.size, bool)
    loops = np.zeros(n, np.int64)
    for first, stop in row_blocks(indptr):
        lo, hi = int(indptr[first]), int(indptr[stop])
        rows = _block_rows(indptr, first, stop, indices.dtype)
        np.not_equal(indices[lo:hi], rows, out=keep[lo:hi])
        loops[first:stop] = np.bincount(rows[~keep[lo:hi]] - first, minlength=stop - first)
    new_indptr = np.zeros(n + 1, np.int64)
    np.cumsum(np.diff(indptr) - loops, out=new_indptr[1:])
    return keep, new_indptr


def remove_self_loops(graph: Graph) -> Graph:
    """Drop every edge ``v -> v``; each row comes out sorted by source."""
    n, indices = graph.num_nodes, graph.indices
    keep, new_indptr = self_loop_mask(graph.indptr, indices)
    new_indices = indices[keep]
    weight = None if graph.edge_weight is None else graph.edge_weight[keep]
    edge_type = None if graph.edge_type is None else graph.edge_type[keep]
    _sort_rows(new_indptr, new_indices, weight, n, edge_type)
    idx_t = index_dtype(max(n, new_indices.size))
    return graph.replace(indptr=new_indptr.astype(idx_t, copy=False),
                         indices=new_indices.astype(idx_t, copy=False), edge_weight=weight,
                         edge_type=edge_type)


def add_self_loops(graph: Graph, fill_value: float = 1.0) -> Graph:
    """Add one self loop to every node (after removing any existing ones, as PyG does); each
    row comes out sorted by source, the loop in its place. In a heterogeneous graph the loops
    are the relation `SELF_RELATION`, added to the relations if missing."""
    g = remove_self_loops(graph)
    n, indptr, indices = g.num_nodes, g.indptr, g.indices
    below = np.zeros(n, np.int64)  # per row: sources smaller than the row, before its loop
    for first, stop in row_blocks(indptr):
        lo, hi = int(indptr[first]), int(indptr[stop])
        rows = _block_rows(indptr, first, stop, indices.dtype)
        below[first:stop] = np.bincount(rows[indices[lo:hi] < rows] - first,
                                        minlength=stop - first)
    at = indptr[:-1].astype(np.int64) + below  # (np.insert puts equal positions in order)
    idx_t = index_dtype(max(n, indices.size + n))
    new_indices = np.insert(indices.astype(idx_t, copy=False), at, np.arange(n, dtype=idx_t))
    weight = None
    if g.edge_weight is not None:
        weight = np.insert(g.edge_weight, at, np.float32(fill_value))
    types = {}
    if g.edge_type is not None:
        relations = g.relations if SELF_RELATION in g.relations \
            else (*g.relations, SELF_RELATION)
        wide = np.int8 if len(relations) <= 127 else np.int16
        types = dict(relations=relations,
                     edge_type=np.insert(g.edge_type.astype(wide), at,
                                         relations.index(SELF_RELATION)))
    return g.replace(indptr=indptr.astype(np.int64) + np.arange(n + 1), indices=new_indices,
                     edge_weight=weight, **types)


def remove_duplicate_edges(graph: Graph) -> Graph:
    """Keep one copy of every ``(src, dst)`` pair (of a heterogeneous graph: every
    ``(src, dst, relation)``); weights of duplicates are summed."""
    src, dst = coo(graph)
    if graph.edge_type is not None:
        return _remove_duplicate_typed_edges(graph, src, dst)
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


def _remove_duplicate_typed_edges(graph: Graph, src: np.ndarray, dst: np.ndarray) -> Graph:
    order = np.lexsort((graph.edge_type, src, dst))
    s, d, t = src[order], dst[order], graph.edge_type[order]
    first = np.ones(s.size, bool)
    first[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1]) | (t[1:] != t[:-1])
    w = None
    if graph.edge_weight is not None:
        w = np.bincount(np.cumsum(first) - 1, weights=graph.edge_weight[order],
                        minlength=int(first.sum())).astype(np.float32)
    return _rebuild(graph, s[first], d[first], w, presorted=True, edge_type=t[first])


def make_undirected(graph: Graph) -> Graph:
    """Add the reverse of every edge, then drop duplicates (weights of a pair are summed once
    per direction present, so an edge stored in both directions keeps its weight).
    A heterogeneous graph is refused: the reverse of a relation is another relation."""
    if graph.edge_type is not None:
        raise GraphError(f"{graph.name}: make_undirected cannot reverse typed edges (the "
                         "reverse of 'a__r__b' is a relation 'b__...__a' of its own); add "
                         "inverse relations when building the heterogeneous graph instead")
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
    CSR), as in PyG's ``gcn_norm``; nodes of degree 0 get weight 0. Row block by row block,
    in the memory of the weights plus one block.
    """
    g = add_self_loops(graph) if add_loops else graph
    w = g.edge_weight
    deg = _row_sums(g, w)
    with np.errstate(divide="ignore"):
        dinv = np.where(deg > 0, 1.0 / np.sqrt(deg), 0.0)
    out = np.empty(g.num_edges, np.float32)
    for first, stop in row_blocks(g.indptr):
        lo, hi = int(g.indptr[first]), int(g.indptr[stop])
        rows = _block_rows(g.indptr, first, stop, g.indices.dtype)
        ones = np.ones(hi - lo, np.float32) if w is None else w[lo:hi]
        out[lo:hi] = dinv[g.indices[lo:hi]] * ones * dinv[rows]
    return g.replace(edge_weight=out)


def mean_norm(graph: Graph) -> Graph:
    """Row normalisation ``D^-1 A``: the mean over in-neighbours (GraphSAGE-mean). Nodes with no
    in-neighbours aggregate to zero."""
    g = graph
    w = g.edge_weight
    deg = _row_sums(g, w)
    with np.errstate(divide="ignore"):
        inv = np.where(deg > 0, 1.0 / deg, 0.0)
    out = np.empty(g.num_edges, np.float32)
    for first, stop in row_blocks(g.indptr):
        lo, hi = int(g.indptr[first]), int(g.indptr[stop])
        rows = _block_rows(g.indptr, first, stop, g.indices.dtype)
        ones = np.ones(hi - lo, np.float32) if w is None else w[lo:hi]
        out[lo:hi] = ones * inv[rows]
    return g.replace(edge_weight=out)


def relation_mean_norm(graph: Graph) -> Graph:
    """Per-relation mean (Schlichtkrull et al. 2018): edge ``j -> i`` of relation ``r`` gets
    weight ``w / c_{i,r}``, with ``c_{i,r}`` the in-edges of ``i`` in ``r`` (weighted: their
    summed weight; ``w`` is 1 when unweighted). Computed on the whole graph, so partitions use
    the global coefficients. A graph without relation ids is one relation: `mean_norm`."""
    if graph.edge_type is None:
        return mean_norm(graph)
    num_relations = len(graph.relations)
    w = graph.edge_weight
    out = np.empty(graph.num_edges, np.float32)
    for first, stop in row_blocks(graph.indptr):
        lo, hi = int(graph.indptr[first]), int(graph.indptr[stop])
        rows = _block_rows(graph.indptr, first, stop, np.int64) - first
        key = rows * num_relations + graph.edge_type[lo:hi]
        ones = np.ones(hi - lo, np.float32) if w is None else w[lo:hi]
        count = np.bincount(key, weights=ones, minlength=(stop - first) * num_relations)
        with np.errstate(divide="ignore", invalid="ignore"):
            out[lo:hi] = np.where(count[key] != 0, ones / count[key], 0.0)
    return graph.replace(edge_weight=out)


def _row_sums(graph: Graph, weight) -> np.ndarray:
    """``[N]`` float64: every row's weights summed (its in-degree when unweighted), in edge
    order, as ``np.bincount(destinations, weights)`` sums them."""
    deg = np.zeros(graph.num_nodes, np.float64)
    for first, stop in row_blocks(graph.indptr):
        lo, hi = int(graph.indptr[first]), int(graph.indptr[stop])
        rows = _block_rows(graph.indptr, first, stop, graph.indices.dtype) - first
        w = np.ones(hi - lo, np.float32) if weight is None else weight[lo:hi]
        deg[first:stop] = np.bincount(rows, weights=w, minlength=stop - first)
    return deg


def permute_nodes(graph: Graph, perm: np.ndarray) -> Graph:
    """Relabel nodes so that new node ``k`` is old node ``perm[k]``. Node types are kept when
    ``perm`` keeps every node within its type's id range, else dropped (a type's nodes would no
    longer be contiguous)."""
    perm = np.asarray(perm)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=perm.dtype)
    src, dst = coo(graph)
    g = graph.replace(features=graph.features[perm], labels=graph.labels[perm],
                      train_mask=graph.train_mask[:, perm], val_mask=graph.val_mask[:, perm],
                      test_mask=graph.test_mask[:, perm],
                      node_types=graph.node_types if _within_types(graph, perm) else ())
    return _rebuild(g, inv[src], inv[dst], graph.edge_weight, edge_type=graph.edge_type)


def node_type_ids(graph: Graph) -> np.ndarray:
    """``[N]`` int32 index into `Graph.node_types` of every node (all 0 without node types)."""
    if not graph.node_types:
        return np.zeros(graph.num_nodes, np.int32)
    counts = [c for _, c in graph.node_types]
    return np.repeat(np.arange(len(counts), dtype=np.int32), counts)


def _within_types(graph: Graph, perm: np.ndarray) -> bool:
    if not graph.node_types:
        return True
    types = node_type_ids(graph)
    return bool(np.array_equal(types[perm], types))


def largest_connected_component(graph: Graph) -> Graph:
    """The subgraph induced by the largest connected component (edges taken in either
    direction), the graph Shchur et al. ("Pitfalls of GNN evaluation") train and evaluate on.

    Nodes keep their order and are renumbered ``0..K-1``; features, labels, every split's masks
    and edge weights are sliced to match. Of several components of the largest size, the one
    holding the lowest node id is kept. A connected graph is returned as it is.
    """
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import connected_components
    n = graph.num_nodes
    adjacency = csr_matrix((np.ones(graph.num_edges, np.int8), graph.indices, graph.indptr),
                           shape=(n, n))
    count, component = connected_components(adjacency, directed=True, connection="weak")
    if count == 1:
        return graph
    # components are numbered in order of their lowest node, so argmax picks that one on a tie
    keep = component == np.argmax(np.bincount(component))
    ids = np.flatnonzero(keep)
    new_id = np.cumsum(keep) - 1
    src, dst = coo(graph)
    inside = keep[dst]  # an edge into a kept node comes from one: they share the component
    # renumbering is monotone, so the edges stay grouped by destination and sorted in rows
    new_src, new_dst = new_id[src[inside]], new_id[dst[inside]]
    node_types = ()
    if graph.node_types:
        kept = np.bincount(node_type_ids(graph)[ids], minlength=len(graph.node_types))
        node_types = tuple((t, int(c)) for (t, _), c in zip(graph.node_types, kept))
    idx_t = index_dtype(max(ids.size, new_src.size))
    indptr = np.zeros(ids.size + 1, dtype=idx_t)
    np.cumsum(np.bincount(new_dst, minlength=ids.size), out=indptr[1:])
    return graph.replace(
        indptr=indptr, indices=new_src.astype(idx_t), features=graph.features[ids],
        labels=graph.labels[ids], train_mask=graph.train_mask[:, ids],
        val_mask=graph.val_mask[:, ids], test_mask=graph.test_mask[:, ids],
        edge_weight=None if graph.edge_weight is None else graph.edge_weight[inside],
        edge_type=None if graph.edge_type is None else graph.edge_type[inside],
        node_types=node_types)


# -- the normalisations on some rows only -----------------------------------------------------
# A process that holds some of the nodes (`jgrind.devices.Sharded` over several processes)
# normalises its own rows' in-edges: the same edges, in the same order, with the same weights
# as the whole graph's normalisation gives those rows. ``rows`` are the rows' global ids;
# ``indptr`` / ``indices`` / ``weight`` the CSR over them (global source ids).
def rows_without_self_loops(rows: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                            weight=None, num_nodes: Optional[int] = None):
    """`remove_self_loops` of those rows: ``(indptr, indices, weight)``, each row sorted by
    source (stably)."""
    rows = np.asarray(rows, np.int64)
    local = np.repeat(np.arange(rows.size, dtype=np.int64), np.diff(indptr))
    keep = indices != rows[local]
    indices, local = np.asarray(indices, np.int64)[keep], local[keep]
    weight = None if weight is None else np.asarray(weight)[keep]
    new_indptr = np.zeros(rows.size + 1, np.int64)
    np.cumsum(np.bincount(local, minlength=rows.size), out=new_indptr[1:])
    n = int(num_nodes if num_nodes is not None else (indices.max(initial=-1) + 1))
    n = max(n, int(rows.max(initial=-1)) + 1, 1)
    if np.any((indices[1:] < indices[:-1]) & (local[1:] == local[:-1])):
        order = np.argsort(local * n + indices, kind="stable")
        indices = indices[order]
        weight = None if weight is None else weight[order]
    return new_indptr, indices, weight


def rows_with_self_loops(rows: np.ndarray, indptr: np.ndarray, indices: np.ndarray,
                         weight=None, fill_value: float = 1.0, num_nodes: Optional[int] = None):
    """`add_self_loops` of those rows: ``(indptr, indices, weight)``."""
    rows = np.asarray(rows, np.int64)
    indptr, indices, weight = rows_without_self_loops(rows, indptr, indices, weight, num_nodes)
    local = np.repeat(np.arange(rows.size, dtype=np.int64), np.diff(indptr))
    below = np.bincount(local[indices < rows[local]], minlength=rows.size)
    at = indptr[:-1] + below
    indices = np.insert(indices, at, rows)
    if weight is not None:
        weight = np.insert(weight, at, np.float32(fill_value))
    return indptr + np.arange(rows.size + 1), indices, weight


def row_degrees(indptr: np.ndarray, weight=None) -> np.ndarray:
    """``[n]`` float64 weighted in-degree of every row, summed as `gcn_norm` sums them."""
    n = indptr.size - 1
    local = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    w = np.ones(local.size, np.float32) if weight is None else weight
    return np.bincount(local, weights=w, minlength=n)


def gcn_norm_rows(rows: np.ndarray, indptr: np.ndarray, indices: np.ndarray, weight,
                  degree: np.ndarray) -> np.ndarray:
    """`gcn_norm`'s ``[e]`` float32 weights of rows that already have their self loops
    (`rows_with_self_loops`); ``degree``: ``[N]`` every node's `row_degrees` (of its looped
    row), or at least those of the rows and of their edges' sources."""
    with np.errstate(divide="ignore"):
        dinv = lambda d: np.where(d > 0, 1.0 / np.sqrt(d), 0.0)  # noqa: E731
        local = np.repeat(np.asarray(rows, np.int64), np.diff(indptr))
        ones = np.ones(local.size, np.float32) if weight is None else weight
        return (dinv(degree[indices]) * ones * dinv(degree[local])).astype(np.float32)


def mean_norm_rows(indptr: np.ndarray, weight) -> np.ndarray:
    """`mean_norm`'s ``[e]`` float32 weights of rows (without self loops, as SAGE's are)."""
    deg = row_degrees(indptr, weight)
    with np.errstate(divide="ignore"):
        inv = np.where(deg > 0, 1.0 / deg, 0.0)
    local = np.repeat(np.arange(indptr.size - 1, dtype=np.int64), np.diff(indptr))
    ones = np.ones(local.size, np.float32) if weight is None else weight
    return (ones * inv[local]).astype(np.float32)
