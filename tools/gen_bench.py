"""Time the synthetic graph generators and measure their peak memory.

Every case runs in its own fresh Python process, because peak RSS (``ru_maxrss``) only ever
grows: a case sharing a process would inherit the peak of the one before.

    python tools/gen_bench.py                 # all cases
    python tools/gen_bench.py rmat-products   # some cases, by name

Per case it prints wall time, peak RSS, the RSS of the bare process (Python + NumPy + SciPy +
jgrind imported), the graph's own bytes (`Graph.nbytes`) and what is left: the transient
overhead of generation, ``peak - baseline - graph``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import harness

# name -> (generator, kwargs). "products" is ogbn-products' size: 2,449,029 nodes, 61,859,140
# directed edges, 100 features, 47 classes (for csbm: mean degree 61,859,140 / 2,449,029).
CASES = {
    "csbm-1m": ("csbm", dict(num_nodes=1_000_000, avg_degree=10.0, num_features=128)),
    "rmat-1m": ("rmat", dict(num_nodes=1_000_000, num_edges=10_000_000, num_features=128)),
    "csbm-products": ("csbm", dict(num_nodes=2_449_029, avg_degree=61_859_140 / 2_449_029,
                                   num_features=100, num_classes=47)),
    "rmat-products": ("rmat", dict()),
    # ogbn-products as PyG loads it: its 61,859,140 undirected edges stored both ways.
    "rmat-products-x2": ("rmat", dict(num_edges=123_718_280)),
}


def _run_case(name: str) -> dict:
    """Generate one case in this process and return its measurements."""
    import psutil

    from jgrind import generators

    fn, kwargs = CASES[name]
    baseline = psutil.Process().memory_info().rss
    start = time.perf_counter()
    graph = getattr(generators, fn)(**kwargs)
    seconds = time.perf_counter() - start
    peak = harness.peak_rss()
    return dict(case=name, graph=repr(graph), seconds=seconds, peak_rss=peak,
                baseline_rss=baseline, graph_bytes=graph.nbytes(),
                transient=peak - baseline - graph.nbytes())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", help=f"cases to run, from {', '.join(CASES)} "
                        "(default: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one case, print JSON
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_run_case(args.child)))
        return
    unknown = sorted(set(args.cases) - set(CASES))
    if unknown:
        parser.error(f"unknown cases {unknown}; choose from {list(CASES)}")
    gib = 2.0**30
    print(f"{'case':<18}{'seconds':>9}{'peak GiB':>10}{'base GiB':>10}{'graph GiB':>11}"
          f"{'transient GiB':>15}  graph")
    for name in args.cases or list(CASES):
        r = harness.run_child([sys.executable, __file__, "--child", name], name)
        print(f"{name:<18}{r['seconds']:>9.1f}{r['peak_rss'] / gib:>10.2f}"
              f"{r['baseline_rss'] / gib:>10.2f}{r['graph_bytes'] / gib:>11.2f}"
              f"{r['transient'] / gib:>15.2f}  {r['graph']}", flush=True)


if __name__ == "__main__":
    main()
