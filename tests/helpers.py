"""Small graphs for tests, built in memory (fast, deterministic)."""

from __future__ import annotations

import functools

import numpy as np
import optax

from jgrind import generators, transforms
from jgrind.graph import from_edges
from jgrind.train import InMemory


def community_graph(num_nodes=240, num_classes=3, num_features=12, degree=6, seed=0,
                    homophily=0.85, splits=1, directed=False, name="toy"):
    """A small planted-community graph with learnable features and random masks."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, num_classes, num_nodes)
    centers = rng.standard_normal((num_classes, num_features))
    x = (centers[y] * 0.7 + rng.standard_normal((num_nodes, num_features))).astype(np.float32)
    src = np.repeat(np.arange(num_nodes), degree)
    same = rng.random(src.size) < homophily
    pool = [np.flatnonzero(y == c) for c in range(num_classes)]
    dst = rng.integers(0, num_nodes, src.size)
    for c in range(num_classes):
        sel = same & (y[src] == c)
        dst[sel] = rng.choice(pool[c], sel.sum())
    masks = np.zeros((3, splits, num_nodes), bool)
    for s in range(splits):
        perm = rng.permutation(num_nodes)
        a, b = num_nodes // 5, 2 * num_nodes // 5
        masks[0, s, perm[:a]] = masks[1, s, perm[a:b]] = masks[2, s, perm[b:]] = True
    g = from_edges(src, dst, x, y, num_classes=num_classes, train_mask=masks[0],
                   val_mask=masks[1], test_mask=masks[2], name=name)
    g = transforms.remove_self_loops(g)
    if not directed:
        g = transforms.make_undirected(g)
    return transforms.remove_duplicate_edges(g)


@functools.cache
def csbm_graph():
    """The generated graph most engine tests check against (400 nodes, 8 features, mean degree
    6): one object, which the tests only read, so `reference` is shared between them too."""
    return generators.csbm(num_nodes=400, num_features=8, avg_degree=6, seed=1)


@functools.cache
def reference(graph, model):
    """The in-memory executor that out-of-core results are checked against, one per graph and
    model: a new `InMemory` compiles its whole-graph step again, seconds per test for a check
    that then takes a fraction of one. Graphs hash by identity, models by value."""
    return InMemory(graph, model, optax.sgd(0.1))


def mesh_graph(num_nodes: int, degree: float, seed=0):
    """A random geometric graph: ``num_nodes`` uniform points in the unit square, each linked
    to the points within the radius that gives about ``degree`` neighbours; shuffled ids, both
    directions (a mesh's locality, without a grid's straight cuts)."""
    from scipy.spatial import cKDTree
    rng = np.random.default_rng(seed)
    points = rng.random((num_nodes, 2))
    radius = np.sqrt(degree / (np.pi * num_nodes))
    pairs = cKDTree(points).query_pairs(radius, output_type="ndarray")
    ids = rng.permutation(num_nodes)
    src, dst = ids[pairs[:, 0]], ids[pairs[:, 1]]
    x = np.zeros((num_nodes, 1), np.float32)
    return from_edges(np.concatenate([src, dst]), np.concatenate([dst, src]), x,
                      np.zeros(num_nodes, np.int64), num_classes=1, name="mesh")


def dense_adjacency(graph, weights=None) -> np.ndarray:
    """``A[dst, src]`` as a dense matrix (tests only)."""
    a = np.zeros((graph.num_nodes, graph.num_nodes), np.float64)
    w = graph.edge_weight if weights is None else weights
    w = np.ones(graph.num_edges) if w is None else w
    np.add.at(a, (graph.edge_destinations(), graph.indices), w)
    return a


def fails(capsys, args, *needles) -> str:
    """Run ``jgrind ARGS`` in this process; it must exit 2 with one ``jgrind: error:`` line
    containing every needle (the project's rule for bad input and faults). Returns the line."""
    from jgrind.cli import main
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jgrind: error:") and "\n" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err
