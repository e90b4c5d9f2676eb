"""Benchmark the partitioners: quality, time and peak memory on a power-law graph.

    python tools/bench_partition.py                      # 1M nodes / 10M edges, k = 8, 64, 256
    python tools/bench_partition.py --nodes 100000 --edges 1000000 --parts 4 16

The graph is `jgrind.generators.rmat` (undirected R-MAT, shuffled ids) when that module exists,
else a quick Chung-Lu style power-law graph made here. Peak memory is the process RSS
high-water mark above the start of each run (see `jgrind.partition.measure`).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from jgrind.graph import Graph
from jgrind.partition import PARTITIONERS, measure, partition_graph, quality


def _power_law_graph(n: int, e: int, seed: int) -> Graph:
    """Fallback generator: ``e / 2`` pairs with endpoints drawn ~ Zipf-like weights, ids
    shuffled, stored in both directions, self loops and duplicates dropped."""
    import scipy.sparse as sp
    rng = np.random.default_rng(seed)
    w = 1.0 / np.arange(1, n + 1) ** 0.75
    w /= w.sum()
    perm = rng.permutation(n)
    m = e // 2
    src = perm[rng.choice(n, m, p=w)]
    dst = perm[rng.choice(n, m, p=w)]
    keep = src != dst
    a = sp.coo_matrix((np.ones(int(keep.sum()), np.int8), (dst[keep], src[keep])), shape=(n, n))
    a = (a + a.T).tocsr()
    a.sum_duplicates()
    a.sort_indices()
    return Graph(indptr=a.indptr, indices=a.indices, features=np.zeros((n, 1), np.float32),
                 labels=np.zeros(n, np.int32), train_mask=np.zeros((1, n), bool),
                 val_mask=np.zeros((1, n), bool), test_mask=np.zeros((1, n), bool),
                 num_classes=1, name=f"powerlaw-{n}-{e}")


def make_graph(n: int, e: int, seed: int) -> Graph:
    try:
        from jgrind.generators import rmat
    except ImportError:
        return _power_law_graph(n, e, seed)
    return rmat(num_nodes=n, num_edges=e, num_features=1, num_classes=4, seed=seed)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1_000_000)
    ap.add_argument("--edges", type=int, default=10_000_000)
    ap.add_argument("--parts", type=int, nargs="+", default=[8, 64, 256])
    ap.add_argument("--partitioners", nargs="+",
                    default=["contiguous", "random", "label_propagation"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="print every full quality report")
    args = ap.parse_args(argv)
    unknown = [name for name in args.partitioners if name not in PARTITIONERS]
    if unknown:
        raise SystemExit(f"unknown partitioner(s) {unknown}; choose from {sorted(PARTITIONERS)}")

    t0 = time.perf_counter()
    g = make_graph(args.nodes, args.edges, args.seed)
    deg = g.in_degree()
    print(f"{g}  (built in {time.perf_counter() - t0:.1f} s; max in-degree {deg.max():,}, "
          f"{np.mean(deg == 0):.1%} nodes without in-edges)")
    head = (f"{'k':>5} {'partitioner':<18} {'time s':>7} {'peak MiB':>9} {'cut %':>6} "
            f"{'node imb':>8} {'edge imb':>8} {'halo/own':>8} {'max h/o':>8} "
            f"{'halo rows':>11} {'shapes':>6} {'build s':>7}")
    print(head)
    print("-" * len(head))
    for k in args.parts:
        for name in args.partitioners:
            m = measure(name, g, k, seed=args.seed)
            t1 = time.perf_counter()
            pg = partition_graph(g, m.assignment, num_parts=k)
            build = time.perf_counter() - t1
            q = quality(pg, m)
            print(f"{k:>5} {name:<18} {q.seconds:>7.2f} {q.peak_memory_bytes / 2**20:>9.1f} "
                  f"{100 * q.edge_cut_fraction:>6.2f} {q.imbalance:>8.3f} "
                  f"{q.edge_imbalance:>8.3f} {q.halo_ratio_mean:>8.3f} "
                  f"{q.halo_ratio_max:>8.3f} {q.total_halo:>11,} {q.num_shapes:>6} "
                  f"{build:>7.2f}", flush=True)
            if args.verbose:
                print(q.format())
            del pg


if __name__ == "__main__":
    main()
