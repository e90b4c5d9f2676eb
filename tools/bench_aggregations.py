"""Kept aggregations against regathering, interleaved, on the planner benchmark's graphs.

    python tools/bench_aggregations.py --configs device-tight:64,no-ssd:128,wide:64,deep-sage:32
    python tools/bench_aggregations.py --configs device-tight:64 --tier device --rounds 5

For each `tools/bench_planner.py` configuration (graph and model; its budgets are not applied)
cut into the given number of partitions by label propagation (seed 0), two engines share the
partitioning: ``host_offload()`` (GriNNder's regather in backward) and
``host_offload(aggregations=HOST)`` (docs/engine.md, "Kept aggregations"); ``--tier`` picks
``in_memory`` or ``ssd_offload`` instead. After one warm-up epoch each, they alternate for
``--rounds`` timed epochs, the order reversed every round, so the machine's drift hits both.
The 1M-node case is `tools/bench_out_of_core.py overhead --runs host,host-keep,...`.
"""

from __future__ import annotations

import argparse
import statistics

import harness


def main() -> None:
    from jgrind.hostio.allocator import relaunch_if_wanted
    relaunch_if_wanted()  # JGRIND_HUGE_PAGES=1: with glibc huge pages, as the jgrind command
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", required=True,
                   help="comma-separated NAME:PARTS, NAME a tools/bench_planner.py configuration")
    p.add_argument("--tier", choices=("device", "host", "ssd"), default="host")
    p.add_argument("--rounds", type=int, default=3)
    harness.add_store(p)
    args = p.parse_args()

    specs = []
    for item in args.configs.split(","):
        name, _, parts = item.partition(":")
        cfg = harness.planner_config(name)
        if cfg is None or not parts.isdigit():
            p.error(f"{item!r}: give NAME:PARTS with NAME one of "
                    f"{', '.join(c.name for c in harness.CONFIGS)}")
        specs.append((cfg, int(parts)))

    import jax
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.plan import Fate, policies

    def policy(keep: Fate):
        if args.tier == "device":
            return policies.in_memory(keep)
        if args.tier == "host":
            return policies.host_offload(keep)
        return policies.ssd_offload(args.store, aggregations=keep)

    tier = {"device": Fate.DEVICE, "host": Fate.HOST, "ssd": Fate.SSD}[args.tier]
    base = {"device": "in_memory()", "host": "host_offload()", "ssd": "ssd_offload(store)"}
    print(f"policy: {base[args.tier]} against aggregations kept in {tier.name}; "
          f"{args.rounds} interleaved epochs each after a warm-up")
    print(f"{'config':<14} {'parts':>5} {'regather s':>28} {'kept s':>28} {'kept / regather':>16}")
    for cfg, parts in specs:
        graph, model = harness.build_config(cfg)
        pg = harness.partition(graph, model, parts)
        engines = {keep: OutOfCore(graph, model, optax.adam(1e-3), policy=policy(keep),
                                   partitioned=pg, store=args.store)
                   for keep in (Fate.RECOMPUTE, tier)}
        times = {keep: [] for keep in engines}
        trainings = {keep: harness.Training(ex, model, ex.optimizer)
                     for keep, ex in engines.items()}
        key = jax.random.key(1)

        def epoch(keep, e):
            return trainings[keep].epoch(jax.random.fold_in(key, e))[0]

        try:
            for keep in engines:
                epoch(keep, 0)  # compiles
            for r in range(args.rounds):
                order = list(engines) if r % 2 == 0 else list(engines)[::-1]
                for keep in order:
                    times[keep].append(epoch(keep, r + 1))
        finally:
            for ex in engines.values():
                ex.close()
        regather, kept = (statistics.median(times[k]) for k in (Fate.RECOMPUTE, tier))
        show = lambda ts: ", ".join(f"{t:.2f}" for t in ts)  # noqa: E731
        print(f"{cfg.name:<14} {parts:>5} {show(times[Fate.RECOMPUTE]):>28} "
              f"{show(times[tier]):>28} {kept / regather:>16.2f}", flush=True)


if __name__ == "__main__":
    main()
