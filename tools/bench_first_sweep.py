"""Why a sweep runs over its price (issue 42): its time inside the epoch, run again alone, and
its inputs gathered alone, beside the row kernel's own cost per row.

    python tools/bench_first_sweep.py --config no-ssd --parts 256

On a planner configuration (`harness.CONFIGS`) with `host_offload` at ``--parts`` partitions:
``--epochs`` epochs after a compiling one, each sweep's seconds; then, after each of
``--repeats`` more epochs, forward 0 run three more times straight after it (the same
parameters and key): if those cost what forward 0 costs inside the epoch, neither the
optimizer update nor anything left from the backward pass is in its time. Then every
partition's input of layers 0 and 1 gathered alone on the main thread (seconds, per row, and
the native row kernel's share, by cProfile), and the row kernel alone
(`jgrind.hostio.rows.take_rows`) at 8, 64 and 256 wide on a table of the graph's row count at
the gathers' density (their mean rows per partition), beside the profile's price per row
(``gather_row_seconds`` plus the bytes at ``gather_bw``) when ``--profile`` names one.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import harness
from harness import CONFIGS, build_config, planner_config


def _kernel_seconds(profiled: cProfile.Profile) -> float:
    """Seconds spent in the native row kernel's caller (`jgrind.hostio.rows._in_parts`)."""
    stats = pstats.Stats(profiled).stats
    return sum(v[2] for (path, _, name), v in stats.items()
               if name == "_in_parts" and path.endswith("rows.py"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=[c.name for c in CONFIGS], default="no-ssd")
    harness.add_parts(p, 256)
    harness.add_epochs(p, 3)
    p.add_argument("--repeats", type=int, default=3, help="epochs followed by forward 0 again")
    p.add_argument("--profile", help="a saved hardware profile to price the rows with")
    args = p.parse_args()

    import jax
    import numpy as np
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.hostio.rows import take_rows
    from jgrind.plan import policies
    from jgrind.plan.measure import _best_seconds  # the profile's own timer
    cfg = planner_config(args.config)
    graph, model = build_config(cfg)
    optimizer = optax.adam(1e-3)
    ex = OutOfCore(graph, model, optimizer, policy=policies.host_offload(),
                   num_parts=args.parts, device_budget=cfg.device_budget,
                   host_budget=cfg.host_budget)
    params = model.init(jax.random.key(0))
    state = optimizer.init(params)

    def epoch(e: int) -> None:
        nonlocal params, state
        params, state, loss = ex.step(params, state, jax.random.key(e))
        jax.block_until_ready((params, loss))

    print(f"# {harness.command()}\n# {harness.machine()}", flush=True)
    for e in range(args.epochs + 1):
        epoch(e)
        if e:
            print("epoch", e, "  ".join(f"{label} {s:.3f}" for label, s in
                                        ex.runner.sweep_seconds), flush=True)
    sweeps, key = ex.runner.sweeps, jax.random.key(99)
    for r in range(args.repeats):
        epoch(100 + r)
        split = ex.built.executed.split_params(params)
        sweeps.epoch_start(split, key)
        again = []
        for _ in range(3):
            start = time.perf_counter()
            sweeps.forward(split, 0, key)
            again.append(time.perf_counter() - start)
        inside = dict(ex.runner.sweep_seconds)["forward 0"]
        print(f"forward 0 inside the epoch {inside:.3f} s; run again straight after it: "
              + ", ".join(f"{s:.3f}" for s in again) + " s", flush=True)

    built = ex.built
    profile = None
    if args.profile:
        from jgrind.plan.profile import load
        profile = load(args.profile)
    for layer in (0, 1):
        table = built.activations[layer]
        load_input = sweeps.input_loader(layer, table)
        rows = sum(part.num_in for part in built.parts)

        def gather_all():
            for part in built.parts:
                load_input(part)
        seconds = _best_seconds(gather_all, 3)
        profiled = cProfile.Profile()
        profiled.enable()
        gather_all()
        profiled.disable()
        print(f"H_{layer} ({table.width} wide): every partition's input gathered alone "
              f"{seconds:.3f} s, {seconds / rows * 1e9:.0f} ns a row over {rows:,} rows; the row "
              f"kernel {_kernel_seconds(profiled):.3f} s of one such pass", flush=True)

    rng = np.random.default_rng(0)
    picked = int(np.mean([part.num_in - part.num_owned for part in built.parts]))
    table_rows = graph.num_nodes
    for width in (8, 64, 256):
        table = np.ones((table_rows, width), np.float32)
        out_rows = picked + picked // 4
        dst = np.sort(rng.choice(out_rows, picked, replace=False))
        out = np.empty((out_rows, width), np.float32)
        sets = [np.sort(rng.choice(table_rows, picked, replace=False)) for _ in range(8)]

        def take_all():
            for rows in sets:
                take_rows(table, rows, out=out, dst=dst)
        per_row = _best_seconds(take_all, 5) / len(sets) / picked
        priced = "" if profile is None else (
            f"; priced {(profile.gather_row_seconds + width * 4 / profile.gather_bw) * 1e9:.0f}"
            " ns")
        print(f"row kernel alone, {picked:,} of {table_rows:,} rows, {width} wide: "
              f"{per_row * 1e9:.0f} ns a row{priced}", flush=True)


if __name__ == "__main__":
    main()
