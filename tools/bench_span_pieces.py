"""The SSD tier's span piece size, A/B in one process: epochs alternate between sizes.

    python tools/bench_span_pieces.py [--config host-tight] [--pieces 1048576,4194304] [--rounds 3]

Builds one `tools/bench_planner.py` configuration with `ssd_offload` (its planner's
partitioning), then times epochs with `jgrind.engine.ssd.SCRATCH_BYTES` set to each size in
turn, the order reversed every round, so drift of the machine hits every size alike. Prints
each size's epoch times and the median ratio to the first size.
"""

from __future__ import annotations

import argparse
import statistics

import harness


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="host-tight", choices=[c.name for c in harness.CONFIGS])
    p.add_argument("--pieces", default=f"{1 << 20},{4 << 20}", help="bytes, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    harness.add_store(p)
    args = p.parse_args()

    import jax
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.engine import ssd
    from jgrind.plan import policies
    from jgrind.plan.planner import plan_run
    from jgrind.plan.profile import load_or_measure

    cfg = harness.planner_config(args.config)
    graph, model = harness.build_config(cfg)
    planned = plan_run(graph, model, load_or_measure(), device_budget=cfg.device_budget,
                       host_budget=cfg.host_budget, directory=args.store)
    pieces = [int(x) for x in args.pieces.split(",")]
    times = {piece: [] for piece in pieces}
    with OutOfCore(graph, model, optax.adam(1e-3), policy=policies.ssd_offload(args.store),
                   partitioned=planned.partitioned, store=args.store,
                   device_budget=cfg.device_budget, host_budget=cfg.host_budget) as ex:
        training = harness.Training(ex, model, optax.adam(1e-3))
        key = jax.random.key(1)
        training.epoch(key)  # compiles
        for r in range(args.rounds):
            for piece in (pieces if r % 2 == 0 else pieces[::-1]):
                ssd.SCRATCH_BYTES = piece
                times[piece].append(training.epoch(jax.random.fold_in(key, r))[0])
    base = statistics.median(times[pieces[0]])
    print(f"{args.config}, ssd_offload, {planned.num_parts} partitions, {args.rounds} rounds")
    for piece in pieces:
        t = times[piece]
        print(f"  piece {piece >> 10:>5} KiB: " + ", ".join(f"{x:.3f}" for x in t)
              + f" s; median {statistics.median(t):.3f} s = {statistics.median(t) / base:.2f}x")


if __name__ == "__main__":
    main()
