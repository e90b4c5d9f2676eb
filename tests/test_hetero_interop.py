"""Interop keeps a heterogeneous graph's relation and node types: a jraph ``GraphsTuple``
round trip, and the bad input `from_graphs_tuple` refuses."""

import numpy as np
import pytest

from jgrind import interop
from jgrind.graph import GraphError
from test_hetero_graph import toy


def graph(weighted: bool = False):
    g = toy().with_inverses().to_graph()
    if weighted:
        g = g.replace(edge_weight=np.linspace(0.5, 2.0, g.num_edges, dtype=np.float32))
    return g


def back(gt, g):
    return interop.from_graphs_tuple(
        gt, g.labels, num_classes=g.num_classes, train_mask=g.train_mask, val_mask=g.val_mask,
        test_mask=g.test_mask, relations=g.relations,
        node_type_names=[t for t, _ in g.node_types], name=g.name)


@pytest.mark.parametrize("weighted", [False, True])
def test_a_graphs_tuple_round_trip_keeps_edge_and_node_types(weighted):
    g = graph(weighted)
    gt = interop.to_graphs_tuple(g)
    assert set(gt.edges) == ({"edge_type", "weight"} if weighted else {"edge_type"})
    np.testing.assert_array_equal(gt.nodes["node_type"], [0, 0, 0, 1, 1, 2, 3])
    r = back(gt, g)
    assert r.relations == g.relations and r.node_types == g.node_types
    for a in ("indptr", "indices", "edge_type", "features", "labels", "train_mask"):
        np.testing.assert_array_equal(getattr(r, a), getattr(g, a), err_msg=a)
    if weighted:
        np.testing.assert_array_equal(r.edge_weight, g.edge_weight)
    else:
        assert r.edge_weight is None


def test_a_graph_without_types_keeps_the_plain_fields():
    g = graph()
    plain = g.replace(edge_type=None, relations=(), node_types=())
    gt = interop.to_graphs_tuple(plain)
    assert gt.edges is None and isinstance(gt.nodes, np.ndarray)
    r = interop.from_graphs_tuple(gt, g.labels, num_classes=g.num_classes)
    assert r.edge_type is None and r.relations == () and r.node_types == ()


@pytest.mark.parametrize("change, message", [
    (lambda gt, kw: (gt, {**kw, "relations": ()}), "pass their names as relations"),
    (lambda gt, kw: (gt, {**kw, "node_type_names": ()}), "node_type_names"),
    (lambda gt, kw: (gt._replace(edges={"edge_type": gt.edges["edge_type"], "kind": 1}), kw),
     "dict edges hold"),
    (lambda gt, kw: (gt._replace(nodes={**gt.nodes, "node_type": gt.nodes["node_type"][::-1]}),
                     kw), "must not decrease"),
    (lambda gt, kw: (gt, {**kw, "node_type_names": ["paper"]}), r"outside \[0, 1\)"),
    (lambda gt, kw: (gt._replace(edges=None), kw), "carry no edge_type"),
])
def test_bad_types_are_one_clear_line(change, message):
    g = graph()
    kw = dict(relations=g.relations, node_type_names=[t for t, _ in g.node_types])
    gt, kw = change(interop.to_graphs_tuple(g), kw)
    with pytest.raises(GraphError, match=message):
        interop.from_graphs_tuple(gt, g.labels, num_classes=g.num_classes, **kw)
