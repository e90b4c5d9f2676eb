"""Conversions to and from other graph containers: ``jraph.GraphsTuple`` and SciPy CSR.

A `Graph` is a CSR by destination; a ``GraphsTuple`` is an edge list (``senders`` ->
``receivers``). Converting back and forth keeps edges, weights and features exactly (edges come
back in CSR order).
"""

from __future__ import annotations

import jraph
import numpy as np
import scipy.sparse as sp

from jgrind.graph import Graph, from_edges


def to_graphs_tuple(graph: Graph) -> jraph.GraphsTuple:
    """One ``GraphsTuple`` (NumPy arrays): ``nodes`` = features, ``edges`` = edge weights
    ``[E]`` (None if unweighted), ``senders``/``receivers`` = sources/destinations."""
    return jraph.GraphsTuple(
        nodes=graph.features, edges=graph.edge_weight, senders=graph.indices,
        receivers=graph.edge_destinations(), n_node=np.array([graph.num_nodes]),
        n_edge=np.array([graph.num_edges]), globals=None)


def from_graphs_tuple(graphs: jraph.GraphsTuple, labels, *, num_classes=None, train_mask=None,
                      val_mask=None, test_mask=None, name="jraph") -> Graph:
    """A `Graph` from a single (unbatched) ``GraphsTuple``; ``edges``, if a ``[E]`` array, are
    kept as edge weights."""
    if np.asarray(graphs.n_node).size != 1:
        raise ValueError(f"from_graphs_tuple takes one graph, got a batch of "
                         f"{np.asarray(graphs.n_node).size}; use jraph.unbatch first")
    g = from_edges(np.asarray(graphs.senders), np.asarray(graphs.receivers),
                   np.asarray(graphs.nodes), labels, num_classes=num_classes,
                   train_mask=train_mask, val_mask=val_mask, test_mask=test_mask, name=name)
    edges = graphs.edges
    if edges is not None and np.ndim(edges) == 1:
        order = np.argsort(np.asarray(graphs.receivers), kind="stable")
        g = g.replace(edge_weight=np.asarray(edges, np.float32)[order])
    return g


def to_scipy(graph: Graph) -> sp.csr_matrix:
    """``A[dst, src]`` as a SciPy CSR matrix (weights, or ones)."""
    data = graph.edge_weight if graph.edge_weight is not None \
        else np.ones(graph.num_edges, np.float32)
    return sp.csr_matrix((data, graph.indices, graph.indptr),
                         shape=(graph.num_nodes, graph.num_nodes))
