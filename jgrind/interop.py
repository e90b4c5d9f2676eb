"""Conversions to and from other graph containers: ``jraph.GraphsTuple`` and SciPy CSR.

A `Graph` is a CSR by destination; a ``GraphsTuple`` is an edge list (``senders`` ->
``receivers``). Converting back and forth keeps edges, weights and features exactly (edges come
back in CSR order).

A graph with relations (`jgrind.hetero`) keeps them, in the layout PyG's
``HeteroData.to_homogeneous`` uses: a relation id per edge (``edge_type``) and a type id per
node (``node_type``), with the names beside the arrays. In a ``GraphsTuple`` they are
``edges = {"edge_type": [E], "weight": [E]}`` (the weight only for a weighted graph) and
``nodes = {"features": [N, F], "node_type": [N]}`` (the type only when the graph names node
types); the names are `Graph.relations` and the type names of `Graph.node_types`, passed back
to `from_graphs_tuple`. A SciPy matrix has no room for them: `to_scipy` drops them.
"""

from __future__ import annotations

import jraph
import numpy as np
import scipy.sparse as sp

from jgrind.graph import Graph, GraphError, from_edges


def to_graphs_tuple(graph: Graph) -> jraph.GraphsTuple:
    """One ``GraphsTuple`` (NumPy arrays): ``nodes`` = features, ``edges`` = edge weights
    ``[E]`` (None if unweighted), ``senders``/``receivers`` = sources/destinations. A graph with
    relations has dict ``edges`` and, with node types, dict ``nodes`` (module docstring)."""
    edges, nodes = graph.edge_weight, graph.features
    if graph.edge_type is not None:
        edges = {"edge_type": graph.edge_type.astype(np.int32)}
        if graph.edge_weight is not None:
            edges["weight"] = graph.edge_weight
    if graph.node_types:
        counts = [c for _, c in graph.node_types]
        nodes = {"features": graph.features,
                 "node_type": np.repeat(np.arange(len(counts), dtype=np.int32), counts)}
    return jraph.GraphsTuple(
        nodes=nodes, edges=edges, senders=graph.indices,
        receivers=graph.edge_destinations(), n_node=np.array([graph.num_nodes]),
        n_edge=np.array([graph.num_edges]), globals=None)


def from_graphs_tuple(graphs: jraph.GraphsTuple, labels, *, num_classes=None, train_mask=None,
                      val_mask=None, test_mask=None, relations=(), node_type_names=(),
                      name="jraph") -> Graph:
    """A `Graph` from a single (unbatched) ``GraphsTuple``. ``edges``, if per-edge scalars
    (``[E]`` or ``[E, 1]``), are kept as edge weights; wider edge features are refused (jgrind's
    layers take node features only). ``to_graphs_tuple``'s dicts of a graph with relations are
    read back: ``edges["edge_type"]`` with the ``relations`` names (one per id), and
    ``nodes["node_type"]`` with ``node_type_names`` (one per id; each type's nodes
    contiguous, as `Graph.node_types` numbers them). GraphError for a tuple whose parts
    disagree."""
    if not isinstance(graphs, jraph.GraphsTuple):
        raise GraphError(f"{name}: expected a jraph.GraphsTuple, got {type(graphs).__name__}")
    if np.asarray(graphs.n_node).size != 1:
        raise GraphError(f"{name}: from_graphs_tuple takes one graph, got a batch of "
                         f"{np.asarray(graphs.n_node).size}; use jraph.unbatch first")
    nodes, node_types = _typed_nodes(graphs.nodes, node_type_names, name)
    if nodes is None or nodes.ndim != 2:
        raise GraphError(f"{name}: nodes must be a [N, F] feature array, got "
                         f"{None if nodes is None else nodes.shape}")
    senders, receivers = np.asarray(graphs.senders), np.asarray(graphs.receivers)
    n_node, n_edge = int(np.asarray(graphs.n_node).sum()), int(np.asarray(graphs.n_edge).sum())
    if (n_node, n_edge) != (nodes.shape[0], senders.size):
        raise GraphError(f"{name}: n_node={n_node} and n_edge={n_edge} disagree with "
                         f"{nodes.shape[0]} node rows and {senders.size} senders")
    edges, edge_type = graphs.edges, None
    if isinstance(edges, dict):
        unknown = set(edges) - {"edge_type", "weight"}
        if unknown or "edge_type" not in edges:
            raise GraphError(f"{name}: dict edges hold 'edge_type' and optionally 'weight'; "
                             f"got keys {sorted(edges)}")
        edge_type, edges = np.asarray(edges["edge_type"]), edges.get("weight")
        if not relations:
            raise GraphError(f"{name}: the edges carry relation ids (edge_type); pass their "
                             "names as relations=(...), one per id")
    elif relations:
        raise GraphError(f"{name}: relations were named but the edges carry no edge_type")
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
                      test_mask=test_mask, name=name, edge_type=edge_type,
                      relations=tuple(relations), node_types=node_types)


def _typed_nodes(nodes, type_names, name: str):
    """``(features, node_types)`` from a ``GraphsTuple``'s ``nodes``: an array (no types), or
    ``{"features", "node_type"}`` read with ``type_names`` into `Graph.node_types`."""
    if not isinstance(nodes, dict):
        if type_names:
            raise GraphError(f"{name}: node type names were given but the nodes carry no "
                             "node_type")
        return (None if nodes is None else np.asarray(nodes)), ()
    if set(nodes) != {"features", "node_type"}:
        raise GraphError(f"{name}: dict nodes hold 'features' and 'node_type'; got keys "
                         f"{sorted(nodes)}")
    ids = np.asarray(nodes["node_type"]).reshape(-1)
    names = tuple(type_names)
    if not names:
        raise GraphError(f"{name}: the nodes carry type ids (node_type); pass their names as "
                         "node_type_names=(...), one per id")
    if ids.size and (ids.min() < 0 or ids.max() >= len(names)):
        raise GraphError(f"{name}: node_type holds ids outside [0, {len(names)}) for the "
                         f"{len(names)} named types")
    if np.any(np.diff(ids) < 0):
        raise GraphError(f"{name}: node_type must not decrease: jgrind numbers each type's "
                         "nodes contiguously (renumber the nodes by type first)")
    counts = np.bincount(ids, minlength=len(names))
    return np.asarray(nodes["features"]), tuple((t, int(c)) for t, c in zip(names, counts))


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
