"""Benchmark the partitioners: quality, time and peak memory on a power-law graph.

    python tools/bench_partition.py                      # 1M nodes / 10M edges, k = 8, 64, 256
    python tools/bench_partition.py --nodes 100000 --edges 1000000 --parts 4 16
    python tools/bench_partition.py --graph geometric --partitioners \
        label_propagation label_propagation:clusters metis
    python tools/bench_partition.py --dataset minesweeper --parts 4 16

Graphs (``--graph``): ``rmat`` (`jgrind.generators.rmat`: undirected R-MAT, shuffled ids, no
locality), ``csbm`` (`jgrind.generators.csbm` with 64 classes: planted communities) or
``geometric`` (a random geometric graph in the unit square, shuffled ids: mesh-like locality,
as in road networks and meshes); or any ``--dataset`` that `jgrind.datasets.load` reads.
``label_propagation:START`` runs it with ``init=START`` (``clusters`` is the single-level
start). Peak memory is the process RSS high-water mark above the start of each run (see
`jgrind.partition.measure`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from jgrind.graph import Graph
from jgrind.partition import PARTITIONERS, measure, partition_graph, quality


def partitioner_spec(name: str) -> tuple[str, dict]:
    """``(name in PARTITIONERS, keyword arguments)``: ``label_propagation:START`` is
    ``label_propagation`` with ``init=START``, and ``label_propagation:edge_imbalance=2.5``
    (``key=value``, comma-separated, numbers read as floats) passes those arguments."""
    partitioner, _, spec = name.partition(":")
    options = {}
    for item in filter(None, spec.split(",")):
        key, eq, value = item.partition("=")
        options.update({key: float(value)} if eq else {"init": item})
    return partitioner, options


def _empty_graph(indptr, indices, n: int, name: str) -> Graph:
    return Graph(indptr=indptr, indices=indices, features=np.zeros((n, 1), np.float32),
                 labels=np.zeros(n, np.int32), train_mask=np.zeros((1, n), bool),
                 val_mask=np.zeros((1, n), bool), test_mask=np.zeros((1, n), bool),
                 num_classes=1, name=name)


def geometric_graph(n: int, e: int, seed: int) -> Graph:
    """``n`` uniform points in the unit square, linked when closer than the radius that gives
    about ``e`` directed edges; ids shuffled, stored in both directions."""
    import scipy.sparse as sp
    from scipy.spatial import cKDTree
    rng = np.random.default_rng(seed)
    points = rng.random((n, 2))
    radius = np.sqrt((e / n) / (np.pi * n))
    pairs = cKDTree(points).query_pairs(radius, output_type="ndarray")
    perm = rng.permutation(n)
    src, dst = perm[pairs[:, 0]], perm[pairs[:, 1]]
    a = sp.coo_matrix((np.ones(src.size, np.int8), (src, dst)), shape=(n, n))
    a = (a + a.T).tocsr()
    a.sort_indices()
    return _empty_graph(a.indptr.astype(np.int64), a.indices.astype(np.int32), n,
                        f"geometric-{n}-{a.nnz}")


def make_graph(kind: str, n: int, e: int, seed: int) -> Graph:
    from jgrind.generators import csbm, rmat
    if kind == "rmat":
        return rmat(num_nodes=n, num_edges=e, num_features=1, num_classes=4, seed=seed)
    if kind == "csbm":
        return csbm(n, num_classes=64, num_features=1, avg_degree=e / n, seed=seed)
    return geometric_graph(n, e, seed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--parts", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--partitioners", nargs="+",
                    default=["contiguous", "random", "label_propagation"])
    ap.add_argument("--graph", choices=["rmat", "csbm", "geometric"], default="rmat")
    ap.add_argument("--dataset", help="a dataset for jgrind.datasets.load instead of --graph")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--partition-seeds", type=int, default=1, metavar="N",
                    help="run every partitioner with seeds --seed ... --seed + N - 1 on the same "
                    "graph, and print the mean cut and halo rows after its rows")
    ap.add_argument("--verbose", action="store_true", help="print every full quality report")
    args = ap.parse_args(argv)
    unknown = [name for name in args.partitioners
               if partitioner_spec(name)[0] not in PARTITIONERS]
    if unknown:
        raise SystemExit(f"unknown partitioner(s) {unknown}; choose from {sorted(PARTITIONERS)}")

    t0 = time.perf_counter()
    if args.dataset:
        from jgrind.datasets import load
        g = load(args.dataset)
    else:
        g = make_graph(args.graph, args.nodes, args.edges, args.seed)
    deg = g.in_degree()
    print(f"{g}  (built in {time.perf_counter() - t0:.1f} s; max in-degree {deg.max():,}, "
          f"{np.mean(deg == 0):.1%} nodes without in-edges)")
    head = (f"{'k':>5} {'partitioner':<26} {'time s':>7} {'peak MiB':>9} {'cut %':>6} "
            f"{'node imb':>8} {'edge imb':>8} {'halo/own':>8} {'max h/o':>8} "
            f"{'halo rows':>11} {'shapes':>6} {'build s':>7}")
    print(head)
    print("-" * len(head))
    seeds = range(args.seed, args.seed + max(1, args.partition_seeds))
    for k in args.parts:
        for name in args.partitioners:
            partitioner, options = partitioner_spec(name)
            cuts, halos = [], []
            for seed in seeds:
                m = measure(partitioner, g, k, seed=seed, **options)
                t1 = time.perf_counter()
                pg = partition_graph(g, m.assignment, num_parts=k)
                build = time.perf_counter() - t1
                q = quality(pg, m)
                label = name if len(seeds) == 1 else f"{name} s={seed}"
                print(f"{k:>5} {label:<26} {q.seconds:>7.2f} "
                      f"{q.peak_memory_bytes / 2**20:>9.1f} "
                      f"{100 * q.edge_cut_fraction:>6.2f} {q.imbalance:>8.3f} "
                      f"{q.edge_imbalance:>8.3f} {q.halo_ratio_mean:>8.3f} "
                      f"{q.halo_ratio_max:>8.3f} {q.total_halo:>11,} {q.num_shapes:>6} "
                      f"{build:>7.2f}", flush=True)
                if args.verbose:
                    print(q.format())
                cuts.append(100 * q.edge_cut_fraction)
                halos.append(q.total_halo)
                del pg
            if len(seeds) > 1:
                print(f"{k:>5} {name} mean of {len(seeds)} seeds: cut {np.mean(cuts):.2f} %, "
                      f"halo rows {np.mean(halos):,.0f}", flush=True)


if __name__ == "__main__":
    main()
