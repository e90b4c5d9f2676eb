"""Whether a forward sweep's loads take their price when they run alone (issue 42): every
partition's step input gathered on the main thread, nothing else running, beside the cost
model's price of the same reads and the loader thread's seconds inside the epoch.

    python tools/bench_gathers.py --config deep-sage
    python tools/bench_gathers.py --config host-tight --policy ssd --parts 256

On a planner configuration (`harness.CONFIGS`), with the planner's own plan (``--policy
auto``, its partitions) or a fixed policy at ``--parts`` partitions: ``--epochs`` epochs
after a compiling one, each forward sweep's loader seconds per tier beside the priced reads.
Then one more epoch in which, before each forward sweep runs, every partition's input is
loaded the way the sweep's loader thread loads it (the gather, and its hand-over to the
device), ``--passes`` times over all partitions, the best kept; for a layer with SSD blocks,
the read calls and file bytes those loads made beside the ones the model counts
(`jgrind.plan.cost.ssd_span_reads`). The model prices a sweep's reads as if they ran on a core
of their own: if the loads alone take their price and the loader thread takes more inside
the epoch, what is missing is the sharing; if they take more alone, the read prices are (and
the calls and bytes say whether it is what is moved or what moving it costs).
"""

from __future__ import annotations

import argparse
import time

import harness
from harness import CONFIGS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=[c.name for c in CONFIGS], default="deep-sage")
    harness.add_policy(p, harness.POLICIES + ("auto",), default="auto")
    harness.add_parts(p, default=None, help="partitions (a fixed policy's; auto plans its own)")
    harness.add_epochs(p, 2)
    harness.add_store(p)
    p.add_argument("--passes", type=int, default=3, help="loads of every partition, best kept")
    args = p.parse_args()
    if args.passes < 1:
        p.error("--passes must be at least 1")

    import jax
    import numpy as np
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.engine import sweeps as sweeps_module
    from jgrind.engine.pipeline import _staged
    from jgrind.engine.store import BudgetError
    from jgrind.plan import profile as hw
    from jgrind.plan.cost import (ITEMSIZE, S, Assignment, memory, page_cached,
                                  ssd_span_reads, with_page_cache)
    from jgrind.plan.planner import plan_run

    graph, model, cfg = harness.graph_and_model(args.config, None)
    profile = hw.load_or_measure(log=print)
    if args.policy == "auto":
        planned = plan_run(graph, model, profile, device_budget=cfg.device_budget,
                           host_budget=cfg.host_budget,
                           directory=args.store if cfg.store else None)
        if planned.in_memory:
            p.error("the plan is the in-memory fast path: nothing is gathered")
        policy, parts, partitioned = planned.policy(), planned.num_parts, planned.partitioned
    else:
        if args.parts is None:
            p.error("--parts is required with a fixed policy")
        policy, parts = harness.policy(args.policy, args.store), args.parts
        partitioned = harness.partition(graph, model, parts)
    optimizer = optax.adam(1e-3)
    try:
        ex = OutOfCore(graph, model, optimizer, policy=policy, partitioned=partitioned,
                       store=args.store, device_budget=cfg.device_budget,
                       host_budget=cfg.host_budget)
    except BudgetError as err:
        p.exit(2, f"bench_gathers: {args.policy} does not fit {args.config}'s budgets: "
                  f"{err}\n")
    try:
        sweeps = harness.PricedSweeps(ex, model, graph, optimizer, profile)
        print(f"{args.config}, {args.policy}, {parts} partitions", flush=True)
        pred, priced = sweeps.prediction, sweeps.priced
        for e, label, seconds, measured, price in sweeps.epochs(args.epochs):
            if label.startswith("forward"):
                reads = measured.get("reads", {})
                print(f"epoch {e} {label}: {seconds:.3f} s (priced {pred.sweep_seconds(price):.3f}); "
                      f"its loader {sum(reads.values()):.3f} s ({_tiers(reads)}), priced reads "
                      f"{price.reads:.3f} s", flush=True)

        alone: dict = {}
        plain_forward = sweeps_module.Sweeps.forward

        def forward(self, params, l, key, *a, **k):
            """Every partition's input loaded alone, ``--passes`` times, then the sweep."""
            b = self.built
            load = self.input_loader(l, b.activations[l], stage=True)
            load = _staged(load, b.store.count, b.transfers.staging_pieces,
                           b.transfers.input_staging)
            best = float("inf")
            for _ in range(args.passes):
                before = dict(vars(b.store.accounts))
                start = time.perf_counter()
                for part in b.parts:
                    jax.block_until_ready(load(part))
                best = min(best, time.perf_counter() - start)
                after = vars(b.store.accounts)
                made = {k: after[k] - before[k] for k in ("ssd_read_ops", "ssd_file_read")}
            alone[f"forward {l}"] = best, made
            return plain_forward(self, params, l, key, *a, **k)

        sweeps_module.Sweeps.forward = forward
        try:
            sweeps.step(jax.random.key(args.epochs + 1))
        finally:
            sweeps_module.Sweeps.forward = plain_forward
        w = ex.workload
        a = Assignment.from_fates(ex.fates, w.num_layers, w.num_parts)
        cached = page_cached(profile, memory(w, a))
        rates = with_page_cache(profile, cached)  # the regime the model prices the SSD tier in
        for label, (seconds, made) in sorted(alone.items()):
            layer = int(label.split()[1])
            print(f"{label} (H_{layer}: {_tiers_of(ex, layer)}): every partition's load "
                  f"alone {seconds:.3f} s, priced reads {priced[label].reads:.3f} s "
                  f"({seconds / max(priced[label].reads, 1e-9):.2f}x)", flush=True)
            in_ssd = a.activations[layer] == S
            if w.local(layer) or not in_ssd.any():
                continue
            words = w.widths[layer]
            calls, span_rows = ssd_span_reads(w, words, in_ssd)
            own = int(np.count_nonzero(in_ssd & (w.owned > 0)))
            span = (int(span_rows.sum()) + int(w.owned[in_ssd].sum())) * words * ITEMSIZE
            print(f"  SSD: made {made['ssd_read_ops']:,} read calls and "
                  f"{made['ssd_file_read'] / 2**20:.1f} MiB; priced {int(calls.sum()) + own:,} "
                  f"calls and {span / 2**20:.1f} MiB (own blocks and halo spans), at the "
                  f"{'page cache' if cached else 'disk'}'s "
                  f"{(rates.ssd_latency + rates.read_call_overhead) * 1e6:.1f} us a call and "
                  f"{rates.ssd_read_bw / 1e9:.2f} GB/s", flush=True)
    finally:
        ex.close()


def _tiers(reads: dict) -> str:
    return ", ".join(f"{tier} {s:.3f}" for tier, s in reads.items() if s) or "none"


def _tiers_of(ex, layer: int) -> str:
    """``H_layer``'s blocks by tier, as the planner prints them (``host 35 + ssd 93``)."""
    import collections

    from jgrind.plan.fates import ACTIVATION
    counts = collections.Counter(fate.value for (name, l, _), fate in ex.fates.items()
                                 if name == ACTIVATION and l == layer)
    return " + ".join(f"{tier} {n}" for tier, n in sorted(counts.items())) or "?"


if __name__ == "__main__":
    main()
