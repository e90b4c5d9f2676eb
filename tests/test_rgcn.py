"""Relational layers (R-GCN, RGAT) against dense NumPy references, and the relation ids a
`Graph` carries through transforms, saving and partitioning."""

import jax
import numpy as np
import pytest

from jgrind import models, transforms
from jgrind.datasets.stored import is_memory_mapped, load_saved, save_graph
from jgrind.graph import GraphError, from_edges
from jgrind.models.block import full_block
from jgrind.models.conv import LayerOptions, aggregation_split
from jgrind.models.rgat import RGATConv
from jgrind.models.rgcn import RGCNConv
from jgrind.partition import partition_graph

NODE_TYPES = (("paper", 150), ("author", 100), ("venue", 50))
RELATIONS = (("author", "writes", "paper"), ("paper", "written_by", "author"),
             ("paper", "cites", "paper"), ("paper", "published_in", "venue"))


def hetero_graph(num_features=8, edges_per_relation=300, seed=0, name="hetero"):
    """A generated heterogeneous graph: 300 nodes of 3 types (labels on papers), 4 relations
    of random edges between their types, duplicates and nodes without in-edges included."""
    rng = np.random.default_rng(seed)
    start = dict(zip([t for t, _ in NODE_TYPES],
                     np.cumsum([0] + [c for _, c in NODE_TYPES])[:-1]))
    count = dict(NODE_TYPES)
    src, dst, types = [], [], []
    for r, (s, _, d) in enumerate(RELATIONS):
        src.append(start[s] + rng.integers(0, count[s], edges_per_relation))
        dst.append(start[d] + rng.integers(0, count[d], edges_per_relation))
        types.append(np.full(edges_per_relation, r))
    n = sum(count.values())
    x = rng.standard_normal((n, num_features)).astype(np.float32)
    papers = count["paper"]
    labels = np.full(n, -1)
    labels[:papers] = rng.integers(0, 3, papers)
    train, val, test = (np.zeros(n, bool) for _ in range(3))
    train[:90], val[90:120], test[120:papers] = True, True, True
    return from_edges(np.concatenate(src), np.concatenate(dst), x, labels, num_classes=3,
                      train_mask=train, val_mask=val, test_mask=test,
                      edge_type=np.concatenate(types),
                      relations=tuple("__".join(r) for r in RELATIONS),
                      node_types=NODE_TYPES, name=name)


def relation_matrices(graph) -> np.ndarray:
    """``[R, N, N]`` float64: ``A_r[dst, src]``, the summed edge weights (ones if none)."""
    src, dst = transforms.coo(graph)
    w = np.ones(graph.num_edges) if graph.edge_weight is None else graph.edge_weight
    a = np.zeros((graph.num_relations, graph.num_nodes, graph.num_nodes))
    types = np.zeros(graph.num_edges, int) if graph.edge_type is None else graph.edge_type
    np.add.at(a, (types, dst, src), w)
    return a


# -- the Graph fields --------------------------------------------------------------------------

def test_edge_types_are_validated():
    g = hetero_graph()
    assert g.edge_type.dtype == np.int8 and g.num_relations == 4 and g.heterogeneous
    with pytest.raises(GraphError, match="outside"):
        g.replace(edge_type=np.full(g.num_edges, 4))
    with pytest.raises(GraphError, match="go together"):
        g.replace(relations=())
    with pytest.raises(GraphError, match="one relation id per edge"):
        g.replace(edge_type=g.edge_type[:-1])
    with pytest.raises(GraphError, match="sum to"):
        g.replace(node_types=(("paper", 150), ("author", 100)))
    wide = g.replace(relations=tuple(f"r{i}" for i in range(200)))
    assert wide.edge_type.dtype == np.int16
    plain = from_edges([0, 1], [1, 0], np.ones((2, 1)), [0, 0])
    assert plain.edge_type is None and plain.relations == () and plain.num_relations == 1


def test_relation_ids_travel_through_transforms():
    g = hetero_graph()
    before = relation_matrices(g)
    for transform in (transforms.remove_self_loops, transforms.remove_duplicate_edges,
                      transforms.largest_connected_component):
        h = transform(g)
        assert h.relations == g.relations and h.edge_type.shape == h.indices.shape
    # duplicates: counted per relation, so the typed matrices keep their support
    dedup = relation_matrices(transforms.remove_duplicate_edges(g))
    np.testing.assert_array_equal(dedup > 0, before > 0)
    looped = transforms.add_self_loops(g)
    assert looped.relations[-1] == transforms.SELF_RELATION
    loops = looped.edge_type == len(g.relations)
    np.testing.assert_array_equal(transforms.coo(looped)[0][loops],
                                  transforms.coo(looped)[1][loops])
    perm = np.random.default_rng(0).permutation(g.num_nodes)
    moved = transforms.permute_nodes(g, perm)
    np.testing.assert_array_equal(relation_matrices(moved), before[:, perm][:, :, perm])
    assert moved.node_types == ()  # the types are no longer contiguous ranges
    with pytest.raises(GraphError, match="inverse relations"):
        transforms.make_undirected(g)
    assert g.fingerprint()["edges_crc"] != g.replace(
        edge_type=np.zeros(g.num_edges, np.int8)).fingerprint()["edges_crc"]


def test_relation_mean_norm_is_the_per_relation_mean():
    g = hetero_graph()
    a = relation_matrices(transforms.relation_mean_norm(g))
    counts = relation_matrices(g).sum(axis=2, keepdims=True)
    expected = np.divide(relation_matrices(g), counts, out=np.zeros_like(a), where=counts > 0)
    np.testing.assert_allclose(a, expected, rtol=1e-6)
    plain = g.replace(edge_type=None, relations=())
    np.testing.assert_array_equal(transforms.relation_mean_norm(plain).edge_weight,
                                  transforms.mean_norm(plain).edge_weight)


def test_saved_graph_keeps_relations(tmp_path):
    g = hetero_graph()
    back = load_saved(save_graph(g, tmp_path / "g"))
    np.testing.assert_array_equal(back.edge_type, g.edge_type)
    assert back.relations == g.relations and back.node_types == g.node_types
    assert is_memory_mapped(back.edge_type)
    assert back.fingerprint() == g.fingerprint()


def test_partitions_carry_local_relation_ids():
    g = hetero_graph()
    assignment = np.random.default_rng(1).integers(0, 5, g.num_nodes)
    pg = partition_graph(g, assignment, 5)
    dst_of = g.edge_destinations()
    for part in pg:
        assert part.num_relations == 4
        for row, node in enumerate(part.owned):
            lo, hi = part.indptr[row], part.indptr[row + 1]
            mine = dst_of == node
            np.testing.assert_array_equal(part.edge_type[lo:hi], g.edge_type[mine])
            np.testing.assert_array_equal(part.input_ids[part.indices[lo:hi]],
                                          g.indices[mine])


# -- R-GCN against NumPy -----------------------------------------------------------------------

def _dense_relation_weights(layer, params) -> np.ndarray:
    if layer.num_bases:
        return np.einsum("rb,bio->rio", np.asarray(params["coefficients"], np.float64),
                         np.asarray(params["bases"], np.float64))
    if layer.num_blocks:
        blocks = np.asarray(params["blocks"], np.float64)
        r, k, bi, bo = blocks.shape
        w = np.zeros((r, k * bi, k * bo))
        for b in range(k):
            w[:, b * bi:(b + 1) * bi, b * bo:(b + 1) * bo] = blocks[:, b]
        return w
    return np.asarray(params["weight"], np.float64)


@pytest.mark.parametrize("decomposition", [{}, {"num_bases": 2}, {"num_blocks": 4}],
                         ids=["per-relation", "bases", "blocks"])
@pytest.mark.parametrize("self_loop", [True, False], ids=["self", "no-self"])
def test_rgcn_layer_equals_dense_reference(decomposition, self_loop):
    g = transforms.relation_mean_norm(hetero_graph())
    layer = RGCNConv(8, 12, 4, self_loop=self_loop, **decomposition)
    params = layer.init(jax.random.key(1))
    params["bias"] = jax.random.normal(jax.random.key(2), (12,))
    out = layer(params, full_block(g, needs_edges=False, needs_adjacency=True),
                np.asarray(g.features))
    x = np.asarray(g.features, np.float64)
    a = relation_matrices(g)
    w = _dense_relation_weights(layer, params)
    expected = np.einsum("rij,jk,rko->io", a, x, w) + np.asarray(params["bias"])
    if self_loop:
        expected += x @ np.asarray(params["root"], np.float64)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    if decomposition.get("num_blocks"):  # the expanded weights are block-diagonal
        np.testing.assert_allclose(np.asarray(layer.relation_weights(params)), w, rtol=1e-6)


def test_rgcn_model_with_norm_residual_and_dropout_against_numpy():
    g = hetero_graph()
    model = models.rgcn(8, 16, 3, 4, num_layers=2, dropout=0.0, residual=True,
                        layer_norm=True, num_bases=3)
    normalized = model.normalize(g)
    params = model.init(jax.random.key(0))
    logits = jax.jit(model.apply)(params, model.block(normalized), np.asarray(g.features))
    a = relation_matrices(normalized)

    def norm(p, h):
        mu, var = h.mean(1, keepdims=True), h.var(1, keepdims=True)
        return (h - mu) / np.sqrt(var + 1e-5) * np.asarray(p["scale"]) + np.asarray(p["offset"])

    def dense(p):
        return {k: np.asarray(v, np.float64) for k, v in p.items() if k != "norm"}

    x = np.asarray(g.features, np.float64)
    lin_in, conv1, conv2, lin_out = params
    h = np.maximum(x @ dense(lin_in)["weight"] + dense(lin_in)["bias"], 0)
    for layer, p in zip(model.layers[1:3], (conv1, conv2)):
        z = norm(p["norm"], h)
        w = _dense_relation_weights(layer, dense(p))
        y = np.einsum("rij,jk,rko->io", a, z, w) + z @ dense(p)["root"] + dense(p)["bias"]
        h = h + np.maximum(y, 0)
    expected = norm(lin_out["norm"], h) @ dense(lin_out)["weight"] + dense(lin_out)["bias"]
    np.testing.assert_allclose(np.asarray(logits), expected, rtol=1e-4, atol=1e-4)
    # dropout is keyed by global node ids: the same masks whatever the block
    key = jax.random.key(7)
    drop = models.rgcn(8, 16, 3, 4, dropout=0.5)
    p = drop.init(key)
    apply = jax.jit(drop.apply)
    once = apply(p, drop.block(drop.normalize(g)), np.asarray(g.features), key)
    again = apply(p, drop.block(drop.normalize(g)), np.asarray(g.features), key)
    np.testing.assert_array_equal(np.asarray(once), np.asarray(again))


def test_rgcn_on_a_homogeneous_graph_is_one_relation():
    g = hetero_graph().replace(edge_type=None, relations=(), node_types=())
    model = models.rgcn(8, 16, 3, g.num_relations)
    model.check_fits(g)
    normalized = model.normalize(g)
    block = model.block(normalized)
    assert block.relation_adj is None and block.adj is not None
    params = model.init(jax.random.key(0))
    p = params[0]
    out = model.layers[0](p, block, np.asarray(g.features))
    a = relation_matrices(normalized)[0]
    x = np.asarray(g.features, np.float64)
    expected = np.maximum(a @ x @ np.asarray(p["weight"][0], np.float64)
                          + x @ np.asarray(p["root"], np.float64), 0)
    np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(GraphError, match="num_relations"):
        models.rgcn(8, 16, 3, 4).check_fits(g)


def test_relational_layers_have_no_aggregation_split_and_price_their_products():
    from jgrind.plan.inventory import dense_products
    layer = RGCNConv(8, 64, 4)
    assert aggregation_split(layer) is None and dense_products(layer) == 5
    assert dense_products(RGATConv(8, 4, 3, self_loop=False)) == 3


def test_the_cost_model_prices_a_product_per_relation():
    """An R-GCN step's dense work grows with its relations (and shrinks with bases or
    blocks); an RGAT step's with its relations too; both beyond a one-weight layer's."""
    import numpy as np
    from jgrind.models.gcn import GCNConv
    from jgrind.plan.cost import layer_products
    from test_planner import fixed_profile
    profile = fixed_profile()
    shape = (64, 64, np.array([1000.0]), np.array([1500.0]), np.array([8000.0]), profile)

    def forward(layer):
        return float(layer_products(layer, *shape).forward[0])

    one, four, eight = (forward(RGCNConv(64, 64, r, self_loop=False)) for r in (1, 4, 8))
    assert four > 2 * one and eight > 1.6 * four
    assert forward(RGCNConv(64, 64, 8, num_bases=2, self_loop=False)) < 0.5 * eight
    assert forward(RGCNConv(64, 64, 8, num_blocks=4, self_loop=False)) < 0.5 * eight
    assert forward(RGCNConv(64, 64, 8)) > eight  # the self-connection
    assert forward(RGCNConv(64, 64, 4)) > forward(GCNConv(64, 64))
    product = 2 * 1500 * 64 * 64 / profile.matmul_flops  # one relation's x W on the inputs
    more = forward(RGATConv(64, 16, 6, heads=4)) - forward(RGATConv(64, 16, 1, heads=4,
                                                                     self_loop=False))
    assert more >= 5 * product


def test_the_working_set_holds_every_relation_s_aggregates():
    """A step of an R-GCN layer holds ``[out, R, in]`` aggregates (and their cotangent): the
    planner's bound on a step's temporaries grows with the relations."""
    from jgrind import models
    from jgrind.partition import partition_graph
    from jgrind.plan.cost import ITEMSIZE, Workload
    graph = hetero_graph()
    temps = {}
    for r in (1, 4):
        model = models.rgcn(graph.num_features, 16, graph.num_classes, r, num_layers=2)
        normalized = model.normalize(graph)
        pg = partition_graph(normalized, np.arange(graph.num_nodes) % 2, num_parts=2)
        w = Workload.build(pg, model)
        temps[r] = w.step_temp_bytes(0)
    assert np.all(temps[4] - temps[1] == 2 * ITEMSIZE * 3 * w.pad_out * graph.num_features)


def test_block_decomposition_must_divide_the_widths():
    with pytest.raises(ValueError, match="num_blocks=3 must divide"):
        RGCNConv(8, 12, 4, num_blocks=3)
    with pytest.raises(ValueError, match="give one of them"):
        RGCNConv(8, 12, 4, num_blocks=2, num_bases=2)
    # the builder keeps dense weights where the blocks do not divide (the logits layer)
    model = models.rgcn(8, 16, 3, 4, num_blocks=4)
    assert [layer.num_blocks for layer in model.layers] == [4, None]


def test_other_models_ignore_relations():
    g = hetero_graph()
    for build in (models.gcn, models.sage):
        normalized = build(8, 16, 3).normalize(g)
        assert normalized.edge_type is None
        block = build(8, 16, 3).block(normalized)
        assert block.adj is not None and block.relation_adj is None


# -- RGAT against NumPy ------------------------------------------------------------------------

@pytest.mark.parametrize("concat", [True, False], ids=["concat", "mean"])
def test_rgat_layer_equals_dense_reference(concat):
    g = hetero_graph()
    layer = RGATConv(8, 5, 4, heads=3, concat=concat,
                     options=LayerOptions(activation=None))
    params = layer.init(jax.random.key(3))
    block = full_block(g, needs_edges=True, needs_adjacency=False)
    out = np.asarray(layer(params, block, np.asarray(g.features)))
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    x = np.asarray(g.features, np.float64)
    src, dst = transforms.coo(g)
    n, heads, c = g.num_nodes, 3, 5
    z = np.einsum("ni,rio->rno", x, p["weight"]).reshape(4, n, heads, c)
    t = g.edge_type.astype(int)
    e = np.einsum("ehc,ehc->eh", z[t, src], p["att_src"][t]) \
        + np.einsum("ehc,ehc->eh", z[t, dst], p["att_dst"][t])
    e = np.where(e > 0, e, 0.2 * e)
    expected = np.zeros((n, heads, c))
    for i in range(n):  # softmax over every in-edge of i, across relations
        mine = np.flatnonzero(dst == i)
        if mine.size:
            alpha = np.exp(e[mine] - e[mine].max(0))
            alpha /= alpha.sum(0)
            expected[i] = np.einsum("eh,ehc->hc", alpha, z[t[mine], src[mine]])
    expected = expected.reshape(n, heads * c) if concat else expected.mean(1)
    expected += x @ p["root"] + p["bias"]
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)
