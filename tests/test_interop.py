import jax
import jraph
import numpy as np

from jgrind import interop, models, transforms

from helpers import community_graph, dense_adjacency


def test_graphs_tuple_round_trip_keeps_edges_and_weights():
    g = transforms.gcn_norm(community_graph(num_nodes=80, directed=True))
    gt = interop.to_graphs_tuple(g)
    assert isinstance(gt, jraph.GraphsTuple) and gt.n_edge[0] == g.num_edges
    back = interop.from_graphs_tuple(gt, g.labels, train_mask=g.train_mask)
    np.testing.assert_array_equal(dense_adjacency(back), dense_adjacency(g))
    np.testing.assert_array_equal(back.features, g.features)


def test_jraph_gcn_agrees_with_ours():
    """jraph's own GraphConvolution on the same normalised graph computes our GCN layer."""
    g = community_graph(num_nodes=60, num_features=5)
    norm = transforms.gcn_norm(g)
    layer = models.GCNConv(5, 4, bias=False)
    params = layer.init(jax.random.key(0))
    ours = layer(params, models.full_block(norm, needs_edges=False, needs_adjacency=True),
                 jax.numpy.asarray(g.features))
    gt = interop.to_graphs_tuple(norm)
    weights = gt.edges

    def aggregate(messages, segment_ids, num_segments):
        return jax.ops.segment_sum(messages * weights[:, None], segment_ids, num_segments)
    conv = jraph.GraphConvolution(update_node_fn=lambda x: x @ params["weight"],
                                  aggregate_nodes_fn=aggregate, add_self_edges=False,
                                  symmetric_normalization=False)
    theirs = conv(gt._replace(nodes=jax.numpy.asarray(g.features))).nodes
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs), rtol=1e-5, atol=1e-6)


def test_scipy_matrix():
    g = community_graph(num_nodes=30)
    np.testing.assert_array_equal(interop.to_scipy(g).toarray(), dense_adjacency(g))


def test_scipy_round_trip_keeps_direction_and_weights():
    import pytest
    import scipy.sparse as sp
    from jgrind.graph import GraphError
    g = transforms.gcn_norm(community_graph(num_nodes=50, directed=True))
    back = interop.from_scipy(interop.to_scipy(g), g.features, g.labels)
    np.testing.assert_array_equal(dense_adjacency(back), dense_adjacency(g))
    unweighted = interop.from_scipy(interop.to_scipy(g), g.features, g.labels, weighted=False)
    assert unweighted.edge_weight is None and unweighted.num_edges == g.num_edges
    with pytest.raises(GraphError, match="expected a SciPy sparse matrix"):
        interop.from_scipy(np.eye(50), g.features, g.labels)
    with pytest.raises(GraphError, match=r"shape \(40, 40\), expected \[N, N\] for the 50"):
        interop.from_scipy(sp.eye(40, format="csr"), g.features, g.labels)


def test_from_edges_takes_an_edge_index_and_weights():
    """A PyG edge_index [2, E] with edge weights in its own (unsorted) order."""
    import pytest
    import jgrind
    from jgrind.graph import GraphError
    edge_index = np.array([[2, 0, 1, 2], [0, 1, 2, 1]])
    weight = np.array([0.5, 2.0, 3.0, 4.0], np.float32)
    x, y = np.eye(3, dtype=np.float32), np.array([0, 1, 0])
    g = jgrind.from_edges(*edge_index, x, y, edge_weight=weight)
    dense = np.zeros((3, 3), np.float32)
    dense[edge_index[1], edge_index[0]] = weight  # A[dst, src]
    np.testing.assert_array_equal(dense_adjacency(g), dense)
    with pytest.raises(GraphError, match=r"edge_weight has shape \(3,\), expected \[4\]"):
        jgrind.from_edges(*edge_index, x, y, edge_weight=weight[:3])
