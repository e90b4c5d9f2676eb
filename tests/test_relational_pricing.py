"""The cost model's sizes of relational blocks (issue 40) against the engine's own arrays, on a
small generated heterogeneous graph."""

import numpy as np
import optax
import pytest

from helpers import community_graph
from jgrind import models
from jgrind.datasets import load
from jgrind.engine import OutOfCore
from jgrind.plan import policies


@pytest.fixture(scope="module")
def mag_like():
    return load("mag-like:0.002")


@pytest.mark.parametrize("kind", ["rgcn", "rgat", "gcn", "gat"])
def test_structure_bytes_are_the_blocks_bytes(mag_like, kind):
    """`Workload.structure_bytes` is every padded block's bytes exactly: with relations, a row
    pointer per output row and relation (R-GCN) and a relation per edge (RGAT); without, as
    before less the pointers it counted twice. (It priced a relational block as a plain one:
    R-GCN's R row pointers per output row were missing, and RGAT's edge relations.)"""
    g = mag_like if kind.startswith("r") else community_graph(num_nodes=400, num_features=8)
    make = {"rgcn": lambda: models.rgcn(g.num_features, 16, g.num_classes, g.num_relations),
            "rgat": lambda: models.rgat(g.num_features, 16, g.num_classes, g.num_relations),
            "gcn": lambda: models.gcn(g.num_features, 16, g.num_classes),
            "gat": lambda: models.gat(g.num_features, 16, g.num_classes)}
    ex = OutOfCore(g, make[kind](), optax.adam(1e-2), policy=policies.host_offload(),
                   num_parts=4)
    try:
        parts = sorted(ex.built.parts, key=lambda p: p.index)
        assert [p.index for p in parts] == list(range(4))
        measured = np.array([p.nbytes() for p in parts])
        np.testing.assert_array_equal(ex.workload.structure_bytes(), measured)
        assert (ex.workload.relations > 1) == kind.startswith("r")
    finally:
        ex.close()


def test_rgcn_steps_are_priced_on_output_rows():
    """R-GCN aggregates first (one sparse product over the relation rows at the input width)
    and multiplies each output row's aggregates by the relation weights after, so its forward,
    and the recompute sweep that reruns it, cost the same however many halo rows the step
    reads; RGAT projects every input row once per relation, so its cost grows with them."""
    from jgrind.plan.cost import layer_products
    from test_planner import fixed_profile
    profile = fixed_profile()
    relations, w_in, w_out = 8, 64, 32
    rgcn = models.rgcn(w_in, w_out, 4, relations, num_layers=2).layers[0]
    rgat = models.rgat(w_in, w_out, 4, relations, num_layers=2).layers[0]
    n_out, nnz = np.array([1000]), np.array([20_000])
    few, many = np.array([1500]), np.array([15_000])
    products = {name: [layer_products(layer, w_in, w_out, n_out, n_in, nnz, profile).forward
                       for n_in in (few, many)] for name, layer in (("rgcn", rgcn),
                                                                    ("rgat", rgat))}
    assert products["rgcn"][0] == pytest.approx(products["rgcn"][1])
    dense = 2.0 * n_out * relations * w_in * w_out / profile.matmul_flops
    assert products["rgcn"][0] >= dense
    assert products["rgat"][1] > 2 * products["rgat"][0]
