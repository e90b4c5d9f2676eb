"""`jgrind.hetero.HeteroGraph`: validation, inverses, and the homogeneous `Graph` it becomes;
the Macro-F1 / Micro-F1 metrics HGSL reports."""

import numpy as np
import pytest

from jgrind import metrics
from jgrind.graph import GraphError
from jgrind.hetero import HeteroGraph, RelationCSR, relation_csr


def toy(**changes):
    """paper 0..2 (target, 2 features), author 0..1 and inst 0 (no features), venue 0 (3
    features, reached by nothing)."""
    fields = dict(
        node_types=(("paper", 3), ("author", 2), ("inst", 1), ("venue", 1)),
        relations={("author", "writes", "paper"): relation_csr([0, 1, 1], [0, 0, 2], 3),
                   ("paper", "cites", "paper"): relation_csr([1, 2], [0, 0], 3),
                   ("author", "aff", "inst"): relation_csr([0, 1], [0, 0], 1)},
        features={"paper": np.arange(6, dtype=np.float32).reshape(3, 2),
                  "venue": np.array([[7, 8, 9]], np.float32)},
        target="paper", labels=[0, 1, 1], train_mask=[1, 0, 0], val_mask=[0, 1, 0],
        test_mask=[0, 0, 1], name="toy")
    fields.update(changes)
    return HeteroGraph(**fields)


def in_edges(g, node):
    """``{(source, relation name)}`` of a global node's in-edges."""
    lo, hi = g.indptr[node], g.indptr[node + 1]
    return sorted((int(s), g.relations[t]) for s, t in zip(g.indices[lo:hi],
                                                           g.edge_type[lo:hi]))


def test_to_graph_offsets_edge_types_labels_and_masks():
    h = toy()
    g = h.to_graph()
    assert h.offsets() == {"paper": 0, "author": 3, "inst": 5, "venue": 6}
    assert g.node_types == (("paper", 3), ("author", 2), ("inst", 1), ("venue", 1))
    assert g.relations == ("author__writes__paper", "paper__cites__paper", "author__aff__inst")
    assert g.num_nodes == 7 and g.num_edges == 7
    # paper 0: written by authors 0 and 1 (global 3, 4), cited by papers 1 and 2
    assert in_edges(g, 0) == [(1, "paper__cites__paper"), (2, "paper__cites__paper"),
                              (3, "author__writes__paper"), (4, "author__writes__paper")]
    assert in_edges(g, 2) == [(4, "author__writes__paper")]
    assert in_edges(g, 5) == [(3, "author__aff__inst"), (4, "author__aff__inst")]
    assert in_edges(g, 3) == [] and in_edges(g, 6) == []
    # within a row: by relation id, then the relation's own order
    assert g.edge_type[g.indptr[0]:g.indptr[1]].tolist() == [0, 0, 1, 1]
    np.testing.assert_array_equal(g.labels, [0, 1, 1, -1, -1, -1, -1])
    np.testing.assert_array_equal(g.train_mask, [[1, 0, 0, 0, 0, 0, 0]])
    np.testing.assert_array_equal(g.test_mask, [[0, 0, 1, 0, 0, 0, 0]])
    assert g.num_classes == 2


def test_featureless_types_get_their_in_neighbours_mean_round_by_round():
    g = toy().with_inverses().to_graph()
    x = g.features
    assert x.shape == (7, 3)  # the widest type's width
    np.testing.assert_array_equal(x[:3], [[0, 1, 0], [2, 3, 0], [4, 5, 0]])  # zero-padded
    np.testing.assert_array_equal(x[6], [7, 8, 9])
    # round 1: authors from the papers they wrote (rev_writes): author 0 -> paper 0,
    # author 1 -> papers 0 and 2 (inst is reached from authors only, not yet known)
    np.testing.assert_allclose(x[3], [0, 1, 0])
    np.testing.assert_allclose(x[4], [2, 3, 0])
    # round 2: inst from its two authors (aff), their round-1 features averaged
    np.testing.assert_allclose(x[5], [1, 2, 0])


def test_a_type_nothing_reaches_gets_zeros():
    # without inverses, authors are only sources, and inst is reached from authors only
    g = toy(features={"paper": np.ones((3, 2), np.float32)}).to_graph()
    assert g.features.shape == (7, 2)
    np.testing.assert_array_equal(g.features[:3], 1)
    np.testing.assert_array_equal(g.features[3:], 0)


def test_with_inverses_adds_only_the_missing_reverses():
    h = toy().with_inverses()
    assert h.relation_names() == (
        "author__writes__paper", "paper__cites__paper", "author__aff__inst",
        "paper__rev_writes__author", "paper__rev_cites__paper", "inst__rev_aff__author")
    rev = h.relations[("paper", "rev_writes", "author")]
    np.testing.assert_array_equal(rev.indptr, [0, 1, 3])
    np.testing.assert_array_equal(rev.indices, [0, 0, 2])
    assert h.with_inverses().relation_names() == h.relation_names()  # nothing more to add
    # a relation whose reverse is present under another name, and a symmetric self-relation
    both = toy(relations={
        ("author", "writes", "paper"): relation_csr([0, 1], [0, 2], 3),
        ("paper", "written_by", "author"): relation_csr([2, 0], [1, 0], 2),
        ("paper", "similar", "paper"): relation_csr([0, 1], [1, 0], 3)})
    assert both.with_inverses().relation_names() == both.relation_names()


def test_scipy_matrices_are_taken_as_relations():
    import scipy.sparse as sp
    h = toy(relations={("author", "writes", "paper"):
                       sp.csr_matrix(np.array([[1, 1], [0, 0], [0, 1]]))})
    csr = h.relations[("author", "writes", "paper")]
    assert isinstance(csr, RelationCSR)
    np.testing.assert_array_equal(csr.indptr, [0, 2, 2, 3])


@pytest.mark.parametrize("changes, message", [
    (dict(relations={("author", "writes", "book"): relation_csr([0], [0], 1)}),
     "unknown destination node type 'book'"),
    (dict(relations={("writer", "writes", "paper"): relation_csr([0], [0], 3)}),
     "unknown source node type 'writer'"),
    (dict(relations={("author", "writes", "paper"): relation_csr([2], [0], 3)}),
     r"source id 2 is outside author's ids \[0, 2\)"),
    (dict(relations={("author", "writes", "paper"): RelationCSR(np.array([0, 1]),
                                                                np.array([0]))}),
     r"indptr has shape \(2,\), expected \[4\]"),
    (dict(labels=None), "the target type 'paper' has no labels"),
    (dict(labels=[0, 1]), "has 3 nodes but the labels have shape"),
    (dict(target="venue"), "has 1 nodes but the labels"),
    (dict(target="book"), "target type 'book' is not a node type"),
    (dict(features={"paper": np.zeros((2, 2))}), r"features of 'paper' have shape \(2, 2\)"),
    (dict(features={"paper": np.array([[0, 1], [np.nan, 0], [0, 0]])}), "NaN or inf in 1 rows"),
    (dict(features={"book": np.zeros((1, 2))}), "unknown node type 'book'"),
    (dict(node_types=(("paper", 3), ("paper", 2))), "node type names repeat"),
    (dict(node_types=(("paper", 3), ("author", 0))), "count 0"),
    (dict(val_mask=[1, 0, 0]), "masks overlap"),
    (dict(labels=[0, -1, 1]), "paper node 1 is in a mask but has no label"),
])
def test_bad_input_is_one_clear_line(changes, message):
    with pytest.raises(GraphError, match=message) as err:
        toy(**changes)
    assert "\n" not in str(err.value)


def test_no_features_at_all_is_refused_when_converted():
    with pytest.raises(GraphError, match="no node type has features"):
        toy(features={}).to_graph()


def test_arrays_are_frozen():
    h = toy()
    with pytest.raises(ValueError):
        h.labels[0] = 1
    with pytest.raises(TypeError):
        h.relations[("a", "b", "c")] = None


# -- Macro-F1 / Micro-F1 (HGSL's Table 2: over the test nodes, sklearn's f1_score) -------------
def test_macro_and_micro_f1_match_a_hand_computed_case():
    labels = np.array([0, 0, 1, 1, 2, 2, 0])
    predicted = np.array([0, 1, 1, 1, 0, 2, 0])
    logits = np.eye(3)[predicted]
    mask = np.array([1, 1, 1, 1, 1, 1, 0], bool)  # the last node is not a test node
    # class 0: tp 1, predicted 2, actual 2 -> F1 1/2; class 1: tp 2, 3 predicted, 2 actual ->
    # 4/5; class 2: tp 1, 1 predicted, 2 actual -> 2/3
    assert metrics.macro_f1(logits, labels, mask) == pytest.approx((1 / 2 + 4 / 5 + 2 / 3) / 3)
    assert metrics.micro_f1(logits, labels, mask) == pytest.approx(4 / 6)
    assert metrics.evaluate(logits, labels, mask, "macro_f1") == \
        pytest.approx((1 / 2 + 4 / 5 + 2 / 3) / 3)
    metrics.check_metric("macro_f1", 4, False)
    metrics.check_metric("micro_f1", 4, False)


def test_macro_and_micro_f1_match_sklearn():
    sklearn_metrics = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 200)
    logits = rng.standard_normal((200, 4)) + 2 * np.eye(4)[labels]
    mask = rng.random(200) < 0.5
    predicted = logits[mask].argmax(1)
    for average in ("macro", "micro"):
        expected = sklearn_metrics.f1_score(labels[mask], predicted, average=average)
        got = metrics.evaluate(logits, labels, mask, f"{average}_f1")
        assert got == pytest.approx(expected)


def test_a_graph_without_relations_becomes_one_without_edge_types():
    g = toy(relations={}).to_graph()
    assert g.num_edges == 0 and g.edge_type is None and g.relations == ()
    assert g.node_types[0] == ("paper", 3)


def test_dblp_is_scored_by_macro_f1_by_default():
    """HGSL's Table 2 reports Macro-F1 on DBLP; other datasets keep the task's default."""
    assert metrics.default_metric(4, False, "dblp") == "macro_f1"
    assert metrics.default_metric(4, False, "cora") == "accuracy"
    assert metrics.default_metric(2, False, "tolokers") == "roc_auc"
