"""Tests of the synthetic graph generators: determinism, exact sizes, structure, learnability."""


import numpy as np
import pytest
import scipy.sparse as sp

from jgrind import generators
from jgrind.generators import csbm, rmat
from jgrind.graph import from_edges
from jgrind.transforms import coo, is_symmetric, remove_duplicate_edges

FIELDS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")


def assert_same_graph(g, h):
    for f in FIELDS:
        a, b = getattr(g, f), getattr(h, f)
        assert a.dtype == b.dtype and np.array_equal(a, b), f
    assert (g.num_classes, g.name) == (h.num_classes, h.name)


def assert_simple_csr(g):
    """No self loops, no duplicate edges, every row strictly increasing: the CSR equals the
    reference built by `from_edges` + `remove_duplicate_edges` (sorted, deduplicated)."""
    src, dst = coo(g)
    assert not np.any(src == dst)
    ref = remove_duplicate_edges(from_edges(src, dst, g.features, g.labels))
    assert np.array_equal(ref.indptr, g.indptr)
    assert np.array_equal(ref.indices, g.indices)


def edge_homophily(g):
    src, dst = coo(g)
    return float(np.mean(g.labels[src] == g.labels[dst]))


def nearest_mean_accuracy(g, aggregate):
    """Test accuracy of a nearest-class-mean classifier fitted on the train nodes, on raw
    features or after one mean aggregation over ``A + I`` (a closed-form stand-in for a GNN)."""
    x = g.features
    if aggregate:
        n = g.num_nodes
        a = sp.csr_matrix((np.ones(g.num_edges, np.float32), g.indices, g.indptr), shape=(n, n))
        x = (a @ x + x) / (g.in_degree() + 1.0)[:, None].astype(np.float32)
    tr, te = g.train_mask[0], g.test_mask[0]
    mu = np.stack([x[tr & (g.labels == c)].mean(0) for c in range(g.num_classes)])
    xt = x[te]
    dist = (mu**2).sum(1)[None] - 2 * xt @ mu.T  # |x - mu|^2 up to the per-row |x|^2
    return float(np.mean(dist.argmin(1) == g.labels[te]))


# -- csbm ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def default_csbm():
    return csbm()


def test_csbm_is_deterministic_and_seeded(default_csbm):
    assert_same_graph(default_csbm, csbm())
    other = csbm(seed=1)
    assert not np.array_equal(other.indices, default_csbm.indices)
    assert not np.array_equal(other.features, default_csbm.features)
    assert not np.array_equal(other.labels, default_csbm.labels)


def test_csbm_streams_are_independent(default_csbm):
    # Features have their own stream: changing their width leaves edges, labels, split alone.
    g = csbm(num_features=5)
    for f in ("indptr", "indices", "labels", "train_mask", "val_mask", "test_mask"):
        assert np.array_equal(getattr(g, f), getattr(default_csbm, f)), f


def test_csbm_structure(default_csbm):
    g = default_csbm
    assert (g.num_nodes, g.num_features, g.num_classes, g.name) == (10_000, 32, 4, "csbm-10000")
    assert g.features.dtype == np.float32 and g.indices.dtype == np.int32
    assert is_symmetric(g)
    assert_simple_csr(g)
    # ~N * avg_degree directed edges; only a handful of repeated pairs are lost.
    assert 0.99 * 100_000 <= g.num_edges <= 100_000
    assert g.in_degree().min() >= 4  # every node drew 5 pairs of its own
    assert np.array_equal(np.bincount(g.labels), [2500] * 4)
    assert abs(edge_homophily(g) - 0.8) < 0.01
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [6000, 2000, 2000]
    assert np.all(g.train_mask | g.val_mask | g.test_mask)


def test_csbm_split_and_degree_arguments():
    g = csbm(num_nodes=1001, num_classes=3, avg_degree=3.0, train_fraction=0.5,
             val_fraction=0.1, seed=4)
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [500, 100, 401]
    assert abs(g.num_edges - 3003) < 30
    assert np.bincount(g.labels).tolist() == [334, 334, 333]
    assert csbm(num_nodes=5, num_classes=5, avg_degree=0.0).num_edges == 0


def test_csbm_is_learnable_through_the_graph(default_csbm):
    feat = nearest_mean_accuracy(default_csbm, aggregate=False)
    agg = nearest_mean_accuracy(default_csbm, aggregate=True)
    assert feat > 0.25 + 0.2       # features alone carry signal (chance 0.25)
    assert agg > feat + 0.2        # neighbours carry much more


def test_csbm_without_homophily_gives_neighbours_no_signal():
    # homophily = 1 / C makes the graph independent of the labels: aggregation then only
    # dilutes a node's own features. This is the case the learnability test must tell apart.
    g = csbm(homophily=0.25)
    assert abs(edge_homophily(g) - 0.25) < 0.01
    assert nearest_mean_accuracy(g, aggregate=True) < nearest_mean_accuracy(g, aggregate=False)


@pytest.mark.parametrize("kwargs", [dict(num_nodes=3, num_classes=4), dict(num_classes=0),
                                    dict(homophily=1.5), dict(avg_degree=-1.0),
                                    dict(feature_signal=-1.0), dict(num_features=0),
                                    dict(train_fraction=0.9, val_fraction=0.2)])
def test_csbm_rejects_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        csbm(**kwargs)


# -- rmat ------------------------------------------------------------------------------------
MID = dict(num_nodes=100_000, num_edges=1_000_000, num_features=16)


@pytest.fixture(scope="module")
def mid_rmat():
    return rmat(**MID)


def test_rmat_mid_size_is_exact(mid_rmat):
    # (its speed is measured in tools/, not here: a timed test fails on a busy machine)
    g = mid_rmat
    assert (g.num_nodes, g.num_edges, g.num_features, g.num_classes) == (100_000, 1_000_000, 16,
                                                                         47)
    assert g.name == "rmat-100000-1000000"
    assert g.features.dtype == np.float32 and g.indices.dtype == np.int32


def test_rmat_is_deterministic_and_seeded():
    kw = dict(num_nodes=5000, num_edges=40_000, num_features=8, num_classes=5)
    g = rmat(**kw)
    assert_same_graph(g, rmat(**kw))
    other = rmat(**kw, seed=1)
    assert not np.array_equal(other.indices, g.indices)
    assert not np.array_equal(other.features, g.features)
    assert not np.array_equal(other.labels, g.labels)


def test_rmat_structure(mid_rmat):
    g = mid_rmat
    assert is_symmetric(g)
    assert_simple_csr(g)
    sizes = np.bincount(g.labels, minlength=47)
    assert sizes.size == 47
    assert 0.9 * sizes.mean() < sizes.min() <= sizes.max() < 1.1 * sizes.mean()
    assert [int(m.sum()) for m in (g.train_mask, g.val_mask, g.test_mask)] == [8000, 2000, 90000]


def test_rmat_degrees_are_heavy_tailed_and_not_tied_to_ids(mid_rmat):
    g = mid_rmat
    deg = g.in_degree()
    assert deg.mean() == 10.0
    assert deg.max() > 100 * deg.mean()           # hubs (a csbm of this degree stays < 3x)
    assert np.median(deg) < deg.mean() / 2        # and most nodes sit far below the mean
    # The seeded relabelling spreads hubs: raw R-MAT would put the heaviest ids first.
    first = deg[:10_000].astype(float).sum() / deg.sum()
    assert 0.05 < first < 0.15


@pytest.mark.parametrize("n,e,undirected", [(1000, 5000 * 2, True), (1000, 7001, False),
                                            (997, 30_000, True), (3, 6, True), (2, 2, False),
                                            (1, 0, True), (50, 0, False), (64, 2000, False)])
def test_rmat_edge_count_is_exact(n, e, undirected):
    g = rmat(n, e, num_features=2, num_classes=3, undirected=undirected)
    assert (g.num_nodes, g.num_edges) == (n, e)
    assert_simple_csr(g)
    if undirected:
        assert is_symmetric(g)


def test_rmat_directed_is_directed():
    g = rmat(2000, 20_000, num_features=2, undirected=False)
    assert not is_symmetric(g)
    assert_simple_csr(g)


def test_rmat_classes_make_it_learnable(mid_rmat):
    g = mid_rmat
    assert edge_homophily(g) > 0.7   # homophily=0.8, less the intra-class repeats dropped
    feat = nearest_mean_accuracy(g, aggregate=False)
    agg = nearest_mean_accuracy(g, aggregate=True)
    assert feat > 3 / 47                           # features alone: a little (chance 1/47)
    assert agg > feat + 0.15                       # neighbours: a lot


def test_rmat_without_homophily_gives_neighbours_no_signal():
    # Plain R-MAT: bit-derived labels are (nearly) unrelated across edges, and aggregating
    # over neighbours does not help; so the learnability test above can fail.
    g = rmat(**MID, homophily=0.0)
    assert edge_homophily(g) < 0.1
    assert nearest_mean_accuracy(g, aggregate=True) < nearest_mean_accuracy(g, aggregate=False)


def test_rmat_classes_keep_degrees_heavy_tailed():
    # With b == c, planting classes redraws low id bits from the same distribution, so expected
    # (multigraph) degrees are unchanged; de-duplication then trims hubs somewhat more, since
    # their intra-class draws repeat more. A bug redrawing whole ids would flatten the tail.
    kw = dict(num_nodes=20_000, num_edges=200_000, num_features=1)
    planted = np.sort(rmat(**kw).in_degree())
    plain = np.sort(rmat(**kw, homophily=0.0).in_degree())
    assert planted[-1] > 50 * planted.mean()
    assert plain[-1] / 3 < planted[-1] <= plain[-1]
    for q in (0.5, 0.9, 0.99):
        i = int(q * planted.size)
        assert abs(int(planted[i]) - int(plain[i])) <= max(2, 0.3 * plain[i]), q


def test_distinct_keys_tops_up_and_trims_exactly():
    rng = np.random.default_rng(0)
    draw = lambda count: rng.integers(0, 1000, count)  # noqa: E731 - heavy repeats
    keys = generators._distinct_keys(900, draw, np.random.default_rng(1))
    assert keys.size == 900 and np.all(np.diff(keys) > 0) and keys.max() < 1000
    with pytest.raises(ValueError, match="too dense"):
        generators._distinct_keys(1001, draw, np.random.default_rng(1), budget=100_000)


@pytest.mark.parametrize("kwargs", [dict(num_edges=11), dict(num_nodes=10, num_edges=91),
                                    dict(a=0.5, b=0.3, c=0.3), dict(b=0.0), dict(homophily=-0.1),
                                    dict(num_classes=0), dict(train_fraction=1.5)])
def test_rmat_rejects_bad_arguments(kwargs):
    args = dict(num_nodes=10, num_edges=10, num_features=2)
    with pytest.raises(ValueError):
        rmat(**{**args, **kwargs})
