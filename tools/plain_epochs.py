"""Plain epochs of a planner configuration's plan, nothing timed inside them: each epoch's seconds
and its sweeps', for a sampling profiler to watch from outside, and engine settings taken by
turns epoch by epoch in one process (so the machine's drift falls on each alike).

    python tools/plain_epochs.py --config host-tight --epochs 10
    py-spy record --threads --idle --format raw -o out.raw -- python tools/plain_epochs.py --config deep-sage
    python tools/plain_epochs.py --config deep-sage --epochs 13 --pending 1,4
    python tools/plain_epochs.py --config deep-sage --epochs 13 --bound steps,writes
    python tools/plain_epochs.py --config host-tight --epochs 13 --switch 0.005,0.0005,0.0001

``--policy auto`` (the default) runs the planner's plan for the configuration (its partitions,
fates and budgets); a fixed policy runs at the plan's partition count. ``--pending``: the
steps whose writes the pipeline lets wait behind the compute
(`jgrind.engine.pipeline.MAX_PENDING_STEPS`), one value per epoch in turn; ``--bound``: what
that bound counts, per epoch in turn: ``steps`` (the engine's), or ``writes`` (the rule before
it: at most that many writes wait, so a step with two outputs waits for its own first write,
and its kernels, before the next step is dispatched); ``--switch``: the interpreter's switch
interval in seconds (`sys.setswitchinterval`), likewise. The first epoch compiles.
"""

from __future__ import annotations

import argparse
import sys

import harness
from harness import CONFIGS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", choices=[c.name for c in CONFIGS], default="host-tight")
    harness.add_policy(p, harness.POLICIES + ("auto",), default="auto")
    harness.add_epochs(p, 8)
    harness.add_store(p)
    p.add_argument("--pending", type=_values(int), default=None,
                   help="MAX_PENDING_STEPS per epoch, in turn (e.g. 1,4)")
    p.add_argument("--bound", type=_names("steps", "writes"), default=None,
                   help="what the pending bound counts per epoch, in turn (steps,writes)")
    p.add_argument("--switch", type=_values(float), default=None,
                   help="the interpreter's switch interval per epoch, in turn (e.g. 0.005,0.0005)")
    args = p.parse_args()

    import jax
    import optax

    from jgrind.engine import OutOfCore
    from jgrind.engine import pipeline
    from jgrind.engine.store import BudgetError
    from jgrind.plan import profile as hw
    from jgrind.plan.planner import plan_run

    graph, model, cfg = harness.graph_and_model(args.config, None)
    planned = plan_run(graph, model, hw.load_or_measure(log=print),
                       device_budget=cfg.device_budget, host_budget=cfg.host_budget,
                       directory=args.store if cfg.store else None)
    if planned.in_memory:
        p.error(f"{args.config}'s plan is the in-memory fast path: no sweeps to watch")
    policy = planned.policy() if args.policy == "auto" else harness.policy(args.policy,
                                                                           args.store)
    optimizer = optax.adam(1e-3)
    try:
        ex = OutOfCore(graph, model, optimizer, policy=policy, partitioned=planned.partitioned,
                       store=args.store, device_budget=cfg.device_budget,
                       host_budget=cfg.host_budget)
    except BudgetError as err:
        p.exit(2, f"plain_epochs: {args.policy} does not fit {args.config}'s budgets: {err}\n")
    training = harness.Training(ex, model, optimizer)
    engines_write = pipeline.SweepIO.write
    print(f"# {harness.command()}\n# {harness.machine()}", flush=True)
    print(f"{args.config}, {args.policy}, {planned.num_parts} partitions", flush=True)
    try:
        for e in range(args.epochs):
            settings = []
            if args.pending:
                pipeline.MAX_PENDING_STEPS = args.pending[e % len(args.pending)]
                settings.append(f"pending {pipeline.MAX_PENDING_STEPS}")
            if args.bound:
                bound = args.bound[e % len(args.bound)]
                pipeline.SweepIO.write = engines_write if bound == "steps" else _bounded_writes
                settings.append(f"bound by {bound}")
            if args.switch:
                sys.setswitchinterval(args.switch[e % len(args.switch)])
                settings.append(f"switch {sys.getswitchinterval() * 1e3:g} ms")
            seconds, _ = training.epoch(jax.random.key(e))
            sweeps = " ".join(f"{s:.3f}" for _, s in ex.runner.sweep_seconds)
            print(f"epoch {e}{' (compiles)' if not e else ''}: {seconds:.3f} s"
                  f"{' (' + ', '.join(settings) + ')' if settings else ''}; sweeps {sweeps}",
                  flush=True)
    finally:
        ex.close()


def _bounded_writes(io, fn, *args) -> None:
    """`jgrind.engine.pipeline.SweepIO.write` with the bound counting writes rather than steps:
    at most ``MAX_PENDING_STEPS`` writes wait behind the compute, whichever step they store."""
    from jgrind.engine import pipeline
    writer = io._pipeline.writer
    if writer is None:
        fn(*args)
        return
    io._pending.append((io._yielded, writer.submit(fn, *args)))
    while len(io._pending) > pipeline.MAX_PENDING_STEPS:
        io._pending.popleft()[1].result()


def _names(*allowed):
    def parse(text: str) -> list:
        values = [v for v in text.split(",") if v]
        if not values or any(v not in allowed for v in values):
            raise argparse.ArgumentTypeError(f"give a comma-separated list of "
                                              f"{', '.join(allowed)}: {text!r}")
        return values
    return parse


def _values(kind):
    def parse(text: str) -> list:
        try:
            values = [kind(v) for v in text.split(",") if v]
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a comma-separated list: {text!r}") from None
        if not values or any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"give positive values: {text!r}")
        return values
    return parse


if __name__ == "__main__":
    main()
