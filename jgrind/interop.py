"""Conversions to and from other graph containers: ``jraph.GraphsTuple`` and SciPy CSR.

A `Graph` is a CSR by destination; a ``GraphsTuple`` is an edge list (``senders`` ->
``receivers``). Converting back and forth keeps edges, weights and features exactly (edges come
back in CSR order).
"""

from __future__ import annotations

import jraph
import numpy as np
import scipy.sparse as sp

from jgrind.graph import Graph, GraphError, from_edges


def to_graphs_tuple(graph: Graph) -> jraph.GraphsTuple:
    """One ``GraphsTuple`` (NumPy arrays): ``nodes`` = features, ``edges`` = edge weights
    ``[E]`` (None if unweighted), ``senders``/``receivers`` = sources/destinations."""
    return jraph.GraphsTuple(
        nodes=graph.features, edges=graph.edge_weight, senders=graph.indices,
        receivers=graph.edge_destinations(), n_node=np.array([graph.num_nodes]),
        n_edge=np.array([graph.num_edges]), globals=None)


def from_graphs_tuple(graphs: jraph.GraphsTuple, labels, *, num_classes=None, train_mask=None,
                      val_mask=None, test_mask=None, name="jraph") -> Graph:
    """A `Graph` from a single (unbatched) ``GraphsTuple``. ``edges``, if per-edge scalars
    (``[E]`` or ``[E, 1]``), are kept as edge weights; wider edge features are refused (jgrind's
    layers take node features only). GraphError for a tuple whose parts disagree."""
    if not isinstance(graphs, jraph.GraphsTuple):
        raise GraphError(f"{name}: expected a jraph.GraphsTuple, got {type(graphs).__name__}")
    if np.asarray(graphs.n_node).size != 1:
        raise GraphError(f"{name}: from_graphs_tuple takes one graph, got a batch of "
                         f"{np.asarray(graphs.n_node).size}; use jraph.unbatch first")
    nodes = None if graphs.nodes is None else np.asarray(graphs.nodes)
    if nodes is None or nodes.ndim != 2:
        raise GraphError(f"{name}: nodes must be a [N, F] feature array, got "
                         f"{None if nodes is None else nodes.shape}")
    senders, receivers = np.asarray(graphs.senders), np.asarray(graphs.receivers)
    n_node, n_edge = int(np.asarray(graphs.n_node).sum()), int(np.asarray(graphs.n_edge).sum())
    if (n_node, n_edge) != (nodes.shape[0], senders.size):
        raise GraphError(f"{name}: n_node={n_node} and n_edge={n_edge} disagree with "
                         f"{nodes.shape[0]} node rows and {senders.size} senders")
    edges = graphs.edges
    if edges is not None:
        edges = np.asarray(edges)
        if edges.ndim == 2 and edges.shape[1] == 1:
            edges = edges[:, 0]
        if edges.shape != (senders.size,):
            raise GraphError(f"{name}: edges of shape {edges.shape}: jgrind keeps per-edge "
                             f"scalar weights ([{senders.size}] or [{senders.size}, 1]); pass "
                             "edges=None to drop edge features")
    return from_edges(senders, receivers, nodes, labels, edge_weight=edges,
                      num_classes=num_classes, train_mask=train_mask, val_mask=val_mask,
                      test_mask=test_mask, name=name)


def to_scipy(graph: Graph) -> sp.csr_matrix:
    """``A[dst, src]`` as a SciPy CSR matrix (weights, or ones)."""
    data = graph.edge_weight if graph.edge_weight is not None \
        else np.ones(graph.num_edges, np.float32)
    return sp.csr_matrix((data, graph.indices, graph.indptr),
                         shape=(graph.num_nodes, graph.num_nodes))


def from_scipy(matrix, features, labels, *, weighted: bool = True, num_classes=None,
               train_mask=None, val_mask=None, test_mask=None, name="scipy") -> Graph:
    """A `Graph` from a SciPy sparse adjacency matrix in `to_scipy`'s convention: entry
    ``A[dst, src]`` is the edge ``src -> dst`` (for a symmetric matrix the direction does not
    matter). Stored entries become edges, explicit zeros included; their values are the edge
    weights unless ``weighted=False``."""
    if not sp.issparse(matrix):
        raise GraphError(f"{name}: expected a SciPy sparse matrix, got {type(matrix).__name__}")
    n = np.asarray(features).shape[0] if np.ndim(features) == 2 else None
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or (n is not None
                                                                 and matrix.shape[0] != n):
        raise GraphError(f"{name}: the adjacency matrix has shape {matrix.shape}, expected "
                         f"[N, N] for the {n} feature rows")
    coo = matrix.tocoo()
    return from_edges(coo.col, coo.row, features, labels,
                      edge_weight=np.asarray(coo.data, np.float32) if weighted else None,
                      num_classes=num_classes, train_mask=train_mask, val_mask=val_mask,
                      test_mask=test_mask, name=name)
