import dataclasses

import numpy as np
import pytest

from jgrind import transforms
from jgrind.graph import Graph, GraphError, from_edges

from helpers import community_graph, dense_adjacency


def _tiny(**changes):
    kwargs = dict(indptr=np.array([0, 1, 2, 2]), indices=np.array([1, 0]),
                  features=np.ones((3, 2), np.float32), labels=np.array([0, 1, 0]),
                  train_mask=np.array([True, False, False]),
                  val_mask=np.array([False, True, False]),
                  test_mask=np.array([False, False, True]), num_classes=2, name="tiny")
    kwargs.update(changes)
    return Graph(**kwargs)


def test_valid_graph_is_frozen_and_int32():
    g = _tiny()
    assert g.num_nodes == 3 and g.num_edges == 2 and g.num_splits == 1
    assert g.indices.dtype == np.int32 and g.train_mask.shape == (1, 3)
    with pytest.raises(ValueError):
        g.features[0, 0] = 5.0
    with pytest.raises(AttributeError):
        g.num_classes = 3


@pytest.mark.parametrize("changes, message", [
    (dict(indices=np.array([1, 7])), "out of range"),
    (dict(indptr=np.array([0, 1, 3, 2])), "never decrease"),
    (dict(indptr=np.array([0])), "empty"),
    (dict(features=np.ones((2, 2), np.float32)), "expected [3, F]"),
    (dict(features=np.array([[1, 2], [np.nan, 0], [0, 0]], np.float32)), "NaN"),
    (dict(features=np.array([[1, 2], [np.inf, 0], [0, 0]], np.float32)), "NaN or inf"),
    (dict(labels=np.array([0, 2, 0])), "outside [0, 2)"),
    (dict(labels=np.array([0, 1])), "labels have shape"),
    (dict(val_mask=np.array([True, True, False])), "train and val masks overlap"),
    (dict(test_mask=np.array([False, True, True])), "val and test masks overlap"),
    (dict(labels=np.array([0, -1, 0])), "has no label"),
    (dict(edge_weight=np.array([1.0])), "edge_weight"),
])
def test_validation_names_the_problem(changes, message):
    with pytest.raises(GraphError, match=message.replace("[", r"\[").replace(")", r"\)")):
        _tiny(**changes)


def test_from_edges_rejects_out_of_range_ids():
    with pytest.raises(GraphError, match="destination 5 is out of range"):
        from_edges([0, 1], [1, 5], np.ones((3, 2)), [0, 0, 0])


def test_self_loops_and_duplicates():
    g = from_edges([0, 0, 1, 2, 2], [0, 1, 1, 1, 1], np.ones((3, 1)), [0, 0, 0])
    no_loops = transforms.remove_self_loops(g)
    assert no_loops.num_edges == 3
    dedup = transforms.remove_duplicate_edges(no_loops)
    assert sorted(zip(dedup.indices, dedup.edge_destinations())) == [(0, 1), (2, 1)]
    looped = transforms.add_self_loops(dedup)
    assert np.array_equal(np.diag(dense_adjacency(looped)), [1, 1, 1])


def _by_sorting_all_edges(graph, add_loops, fill=1.0):
    """The self-loop transforms and the GCN / mean weights as written before they ran row by
    row: every edge through one lexsort, degrees by one bincount. The reference for the
    row-wise ones."""
    src, dst, w = graph.indices, graph.edge_destinations(), graph.edge_weight
    if add_loops is not None:
        keep = src != dst
        src, dst, w = src[keep], dst[keep], None if w is None else w[keep]
    if add_loops:
        loops = np.arange(graph.num_nodes, dtype=src.dtype)
        src, dst = np.concatenate([src, loops]), np.concatenate([dst, loops])
        w = None if w is None else np.concatenate([w, np.full(graph.num_nodes, fill,
                                                              np.float32)])
    order = np.lexsort((src, dst)) if add_loops is not None else slice(None)
    indptr = np.zeros(graph.num_nodes + 1, np.int64)
    np.cumsum(np.bincount(dst, minlength=graph.num_nodes), out=indptr[1:])
    g = graph.replace(indptr=indptr, indices=src[order],
                      edge_weight=None if w is None else w[order])
    weights = np.ones(g.num_edges, np.float32) if g.edge_weight is None else g.edge_weight
    deg = np.bincount(g.edge_destinations(), weights=weights, minlength=g.num_nodes)
    with np.errstate(divide="ignore"):
        dinv = np.where(deg > 0, 1.0 / np.sqrt(deg), 0.0)
        inv = np.where(deg > 0, 1.0 / deg, 0.0)
    gcn = (dinv[g.indices] * weights * dinv[g.edge_destinations()]).astype(np.float32)
    mean = (weights * inv[g.edge_destinations()]).astype(np.float32)
    return g, gcn, mean


def _same_arrays(got, want):
    for field in ("indptr", "indices", "edge_weight"):
        a, b = getattr(got, field), getattr(want, field)
        assert (a is None) == (b is None), field
        if a is not None:  # the bits: -0.0 is not 0.0 here
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), field


def _row_wise_cases(rng):
    n, e = 40, 300
    src, dst = rng.integers(0, n, e), rng.integers(2, n // 2, e)  # rows 0, 1 and n/2.. empty
    src[:6], dst[:6] = [3, 3, 5, 5, 9, 9], [3, 3, 5, 4, 9, 9]  # several loops in a row
    yield src, dst, n
    yield np.array([], int), np.array([], int), 5  # no edges
    yield np.array([0, 0]), np.array([0, 0]), 1  # one node, only loops
    yield np.array([2, 2, 1, 0, 0]), np.array([2, 2, 1, 0, 0]), 3  # every edge a loop


@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("block", [1, 7, 1 << 24])
def test_row_wise_self_loops_and_norms_equal_sorting_every_edge(monkeypatch, weighted, block):
    """Self loops dropped and added, and GCN / mean weights, row block by row block: the same
    arrays, bit for bit, as one sort of all edges, on rows out of order, with duplicates, self
    loops (several in a row), empty rows, no edges, only loops, whatever the block size."""
    monkeypatch.setattr(transforms, "BLOCK_EDGES", block)
    rng = np.random.default_rng(7)
    for src, dst, n in _row_wise_cases(rng):
        weight = rng.uniform(0.5, 2, src.size).astype(np.float32) if weighted else None
        g = from_edges(src, dst, np.ones((n, 1)), np.zeros(n, int), edge_weight=weight)
        want, _, mean = _by_sorting_all_edges(g, False)
        _same_arrays(transforms.remove_self_loops(g), want)
        looped, gcn, _ = _by_sorting_all_edges(g, True, fill=0.3)
        _same_arrays(transforms.add_self_loops(g, fill_value=0.3), looped)
        _, gcn, _ = _by_sorting_all_edges(g, True)
        assert transforms.gcn_norm(g).edge_weight.tobytes() == gcn.tobytes()
        _, raw_gcn, raw_mean = _by_sorting_all_edges(g, None)  # the edges as they are
        assert transforms.gcn_norm(g, add_loops=False).edge_weight.tobytes() == \
            raw_gcn.tobytes()
        assert transforms.mean_norm(g).edge_weight.tobytes() == raw_mean.tobytes()
        assert transforms.mean_norm(want).edge_weight.tobytes() == mean.tobytes()


def test_make_undirected_is_symmetric_and_idempotent():
    g = community_graph(directed=True)
    assert not transforms.is_symmetric(g)
    u = transforms.make_undirected(g)
    assert transforms.is_symmetric(u)
    a = dense_adjacency(u)
    assert np.array_equal(a, a.T) and a.max() == 1
    assert transforms.make_undirected(u).num_edges == u.num_edges


def test_gcn_norm_matches_dense_formula():
    g = community_graph(num_nodes=50)
    a = dense_adjacency(g) + np.eye(g.num_nodes)
    d = a.sum(1)
    expected = a / np.sqrt(d)[:, None] / np.sqrt(d)[None, :]
    np.testing.assert_allclose(dense_adjacency(transforms.gcn_norm(g)), expected, rtol=1e-6)


def test_mean_norm_rows_sum_to_one():
    g = community_graph(num_nodes=50, directed=True)
    a = dense_adjacency(transforms.mean_norm(g))
    has_in = g.in_degree() > 0
    np.testing.assert_allclose(a.sum(1)[has_in], 1.0, rtol=1e-6)


def test_permute_nodes_relabels_consistently():
    g = community_graph(num_nodes=40)
    perm = np.random.default_rng(1).permutation(40)
    p = transforms.permute_nodes(g, perm)
    np.testing.assert_array_equal(p.features, g.features[perm])
    np.testing.assert_array_equal(dense_adjacency(p), dense_adjacency(g)[np.ix_(perm, perm)])


def test_nan_rows_are_found_slice_by_slice(monkeypatch):
    # the check reads features a slice of rows at a time (a memory-mapped file is not read
    # whole, no [N, F] mask is made); rows in every slice, the last one short, are found
    import jgrind.graph as graph_module
    monkeypatch.setattr(graph_module, "_CHECK_BYTES", 3 * 2 * 4)  # 3 rows of 2 floats a slice
    features = np.ones((10, 2), np.float32)
    bad = [1, 2, 5, 9]
    features[bad, [0, 1, 1, 0]] = [np.nan, np.inf, np.nan, -np.inf]
    np.testing.assert_array_equal(graph_module._non_finite_rows(features), bad)
    g = dict(indptr=np.zeros(11, np.int64), indices=np.zeros(0, np.int64),
             labels=np.zeros(10, np.int32), train_mask=np.zeros(10, bool),
             val_mask=np.zeros(10, bool), test_mask=np.zeros(10, bool), num_classes=1)
    with pytest.raises(GraphError, match=r"NaN or inf in 4 rows \(first: node 1\)"):
        Graph(features=features, **g)
    assert Graph(features=np.ones((10, 2), np.float32), **g).num_nodes == 10


def test_replace_does_not_scan_unchanged_features_again(monkeypatch):
    import jgrind.graph as graph_module
    scans = []
    real = graph_module._non_finite_rows
    monkeypatch.setattr(graph_module, "_non_finite_rows", lambda f: scans.append(f) or real(f))
    g = _tiny()
    assert len(scans) == 1
    h = transforms.gcn_norm(g.replace(name="other"))  # replace, add self loops, normalise
    assert h.features is g.features and len(scans) == 1
    with pytest.raises(GraphError, match="NaN"):  # new features are checked
        g.replace(features=np.array([[1, 2], [np.nan, 0], [0, 0]], np.float32))
    g.replace(features=np.zeros((3, 2), np.float32))
    assert len(scans) == 3
    Graph(**{f.name: getattr(g, f.name) for f in dataclasses.fields(g)})  # made anew: checked
    g.validate()  # asked for: checked
    assert len(scans) == 5


def test_class_count_refuses_gaps_unless_the_number_is_stated():
    from jgrind.graph import class_count
    assert class_count(np.array([0, 2, 1, -1])) == 3
    assert class_count(np.array([-1, -1])) == 1
    assert class_count(np.zeros((4, 5), np.int8)) == 5
    with pytest.raises(GraphError, match=r"use 3 class ids \(0-1, 4\).*5 classes of which 2 "
                                         r"\(2-3\) label no node.*num_classes=5"):
        class_count(np.array([0, 1, 4, 1]))
    assert class_count(np.array([0, 1, 4, 1]), stated=7) == 7
    with pytest.raises(GraphError, match="num_classes=4, but the labels run up to class id 4"):
        class_count(np.array([0, 1, 4, 1]), stated=4)
    with pytest.raises(GraphError, match="multi-label targets have 5 columns"):
        class_count(np.zeros((4, 5), np.int8), stated=3)
    # a stray huge id: named, with no advice to state a billion classes, and no array of them
    with pytest.raises(GraphError, match=r"\(0, 1000000000\).*return_inverse=True\)\)$"):
        class_count(np.array([0, 10**9]))
