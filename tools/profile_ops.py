"""Where an out-of-core epoch goes, operation by operation, beside the cost model's terms.

    python tools/profile_ops.py --config ssd --policy ssd --parts 128 --host-budget 0
    python tools/profile_ops.py --rmat 300000 3000000 --policy device --parts 8
    python tools/profile_ops.py --config deep-sage --policy auto    # the planner's own plan

Runs `jgrind.engine.OutOfCore` *serially* (prefetch off) and blocks on every store operation
(gather, write, read, accumulate) and every jitted step, so each is timed alone; the sums are
for the last of three epochs. Serial timing adds up what the engine normally overlaps, so the
epoch here is longer than a normal one. Then it prints the cost model's figure for each term
(`jgrind.plan.cost`, with the page-cache regime the model picks), to see which term is off.

``--config`` takes a configuration of `tools/bench_planner.py` (graph, model, device budget);
with ``--policy auto`` the planner's plan for it (its partitions, fates and budgets);
``--rmat`` an R-MAT graph with a 3-layer GCN (hidden 256, dropout 0.5) and no budgets.

``--overlapped`` runs a normal epoch instead (the loader and writer threads on) and says where
each thread spends it: store operations per thread, the steps' dispatch on the main thread,
the writer's wait for the step whose output it stores, and the main thread's waits for the
loader (inputs not ready: I/O is the bottleneck) and for the writer (a full write queue).
Store operations are still waited for, so a device-tier read on the main thread blocks it
where a normal epoch would go on dispatching::

    python tools/profile_ops.py --rmat 1000000 10000000 --policy host --parts 8 --overlapped
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import dataclasses
import functools
import resource
import sys
import threading
import time

import harness


def main() -> None:
    from jgrind.hostio.allocator import relaunch_if_wanted
    relaunch_if_wanted()  # JGRIND_HUGE_PAGES=1: with glibc huge pages, as the jgrind command
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    harness.add_source(p, config=True)
    harness.add_policy(p, harness.POLICIES + ("auto",))
    harness.add_parts(p, default=None, help="partitions (required but with --policy auto)")
    harness.add_budgets(p, device=False)
    harness.add_store(p)
    p.add_argument("--overlapped", action="store_true",
                   help="run a normal epoch (prefetch and writer threads on) and say where "
                        "each thread spends it, and where the main thread waits on the others "
                        "(implies --skip-model)")
    p.add_argument("--skip-model", action="store_true",
                   help="print the measured operations only, without measuring a hardware "
                        "profile for the cost model's terms (minutes on a fresh machine)")
    args = p.parse_args()

    import jax
    import optax

    import jgrind.engine.engine as engine_module
    from jgrind.engine import OutOfCore
    from jgrind.engine import store as store_module
    from jgrind.executed.moved_dropout import unwrap
    from jgrind.plan import cost
    from jgrind.plan import profile as hardware

    graph, model, cfg = harness.graph_and_model(args.config, args.rmat)
    device_budget = cfg.device_budget if cfg and args.policy != "device" else None
    if args.policy == "auto" and not args.config:
        p.error("--policy auto plans a --config (its budgets)")
    if args.policy != "auto" and args.parts is None:
        p.error("--parts is required")
    planned = None
    if args.policy == "auto":
        from jgrind.plan.planner import plan_run
        planned = plan_run(graph, model, hardware.load_or_measure(log=print),
                           device_budget=cfg.device_budget, host_budget=cfg.host_budget,
                           directory=args.store if cfg.store else None)
        if planned.in_memory:
            p.error("the plan is the in-memory fast path: nothing to profile")
        if args.host_budget is None:
            args.host_budget = cfg.host_budget
        policy, args.parts = planned.policy(), planned.num_parts
    else:
        policy = harness.policy(args.policy, args.store)

    seconds: dict = collections.defaultdict(float)
    # minor page faults of the whole process while each operation runs (serial profile only:
    # XLA's steps run on its own threads, and nothing else runs beside an operation there)
    faults: dict = collections.defaultdict(int)

    def role() -> str:
        """Which of the engine's threads runs this: "main", "loader" or "writer"."""
        name = threading.current_thread().name
        return name.split("-")[1].split("_")[0] if name.startswith("jgrind-") else "main"

    def timed(name, fn):
        @functools.wraps(fn)
        def wrapper(*a, **k):
            key = name(a) if callable(name) else name
            if args.overlapped:
                key = f"{role()}: {key}"
                if key.startswith("main: step"):  # dispatch only: the step runs on
                    # asynchronously, and the writer's wait for its output counts it
                    start = time.perf_counter()
                    out = fn(*a, **k)
                    seconds[key + " (dispatch)"] += time.perf_counter() - start
                    return out
                if isinstance(a[-1], jax.Array):  # a write's or accumulate's values: wait
                    # for the step that makes them first, and count that apart
                    start = time.perf_counter()
                    jax.block_until_ready(a[-1])
                    seconds[f"{role()}: (waiting for the step that makes it)"] += \
                        time.perf_counter() - start
            start, flt = time.perf_counter(), _minor_faults()
            out = fn(*a, **k)
            jax.block_until_ready(out)
            if a and isinstance(a[0], store_module.Table) and a[0].device is not None:
                jax.block_until_ready(a[0].device)
            seconds[key] += time.perf_counter() - start
            faults[key] += _minor_faults() - flt
            return out
        return wrapper

    if args.overlapped:  # the main thread's waits on the I/O threads
        plain_result = cf.Future.result

        def result(self, timeout=None):
            if role() != "main" or self.done():
                return plain_result(self, timeout)
            start = time.perf_counter()
            try:
                return plain_result(self, timeout)
            finally:
                seconds[f"main: waiting for the {getattr(self, 'jgrind_role', '?')} thread"] += \
                    time.perf_counter() - start
        cf.Future.result = result

    for op in ("gather", "write", "accumulate", "read"):
        setattr(store_module.Table, op,
                timed(lambda a, op=op: f"{op} {a[0].name} {a[0].layer}",
                      getattr(store_module.Table, op)))
    # the module through which the engine builds its steps calls `layer_steps` by name
    builder = sys.modules.get("jgrind.engine.build", engine_module)
    plain_steps = builder.layer_steps

    def counted_steps(layer, *args, **kwargs):  # layer_steps' own arguments, passed on
        return counted(layer, plain_steps(layer, *args, **kwargs))

    def counted(layer, steps):
        inner = unwrap(layer)  # a layer running its consumer's dropout: named "+dropout"
        label = (f"{type(inner).__name__}{'+dropout' if inner is not layer else ''} "
                 f"{layer.in_channels}->{getattr(layer, 'out_channels', '')}")
        fields = ("forward", "backward", "backward_params", "top", "masked_backward",
                  "masked_backward_params", "forward_saving", "saved_backward",
                  "saved_backward_params")
        return dataclasses.replace(steps, **{f: timed(f"step {f} ({label})", getattr(steps, f))
                                             for f in fields if getattr(steps, f) is not None})
    if hasattr(plain_steps, "__wrapped__"):  # uncached, for arguments that do not hash
        counted_steps.__wrapped__ = lambda layer, *a, **k: counted(
            layer, plain_steps.__wrapped__(layer, *a, **k))
    builder.layer_steps = counted_steps

    pg = planned.partitioned if planned is not None else harness.partition(graph, model,
                                                                           args.parts)
    ex = OutOfCore(graph, model, optax.adam(1e-3), policy=policy, partitioned=pg,
                   store=args.store, device_budget=device_budget, host_budget=args.host_budget,
                   prefetch=args.overlapped)
    for pool, name in ((ex.pool, "loader"), (ex.writer, "writer")):
        if pool is not None:  # tag its futures, for the main thread's waits
            pool.submit = _tagging(pool.submit, name)
    try:
        training = harness.Training(ex, model, optax.adam(1e-3))
        for epoch in range(3):
            seconds.clear()
            faults.clear()
            flt = _minor_faults()
            total, _ = training.epoch(jax.random.key(epoch))
            total_faults = _minor_faults() - flt
        w = ex.workload
        if args.overlapped:
            print(f"normal epoch {total:.3f} s ({args.policy}, {args.parts} parts); seconds "
                  "per thread, last epoch:")
            for who in ("main", "loader", "writer"):
                mine = {k: v for k, v in seconds.items() if k.startswith(who + ":")}
                print(f"  {who} thread: {sum(mine.values()):.3f} s in these")
                for key in sorted(mine):
                    print(f"    {key[len(who) + 2:]:<54} {mine[key]:8.3f}")
            return
        if args.skip_model:
            print(f"serial epoch {total:.3f} s ({args.policy}, {args.parts} parts)")
            _print_measured(seconds, faults, total, total_faults)
            return
        a = cost.Assignment.from_fates(ex.fates, w.num_layers, w.num_parts)
        prof = hardware.load_or_measure(log=print)
        pred = cost.predict(w, a, prof, ex.store.cache.capacity)
        cached = cost.page_cached(prof, pred.memory)
        prof = cost.with_page_cache(prof, cached)
    finally:
        ex.close()

    print(f"serial epoch {total:.3f} s ({args.policy}, {args.parts} parts, output masks "
          f"{'on' if w.masks else 'off'}); the model's normal (overlapped) epoch "
          f"{pred.epoch_seconds:.3f} s, SSD priced {'from the page cache' if cached else 'from disk'}")
    _print_measured(seconds, faults, total, total_faults)
    _print_prediction(pred, seconds)
    L = w.num_layers
    print("the cost model's terms (s per sweep, with no host cache in front of the SSD tier):")
    for l in range(L):
        print(f"  gather activation {l:<30} {cost.gather_seconds(w, prof, l, a.activations[l]):8.3f}")
    for l in range(1, L):
        print(f"  write activation {l:<31} {cost.write_seconds(w, prof, l, a.activations[l]):8.3f}")
        print(f"  accumulate gradient {l:<28} "
              f"{cost.accumulate_seconds(w, prof, l, a.gradients[l]):8.3f}")
        print(f"  read gradient {l:<34} "
              f"{cost.read_block_seconds(w, prof, l, a.gradients[l]):8.3f}")
    for l in sorted(a.kept):
        print(f"  read aggregation {l:<31} "
              f"{cost.read_block_seconds(w, prof, l, a.aggregations[l], width=w.aggregated[l], verified=True):8.3f}")
        print(f"  write aggregation {l:<30} "
              f"{cost.write_seconds(w, prof, l, a.aggregations[l], w.aggregated[l]):8.3f}")
    for l in range(L):
        kinds = (["forward"] if l < L - 1 else []) + \
            [cost.backward_kind(w, l, l in a.kept)]
        for kind in kinds:
            masked = None if kind == "forward" else l + 1 not in a.kept
            print(f"  step {kind} layer {l:<33} "
                  f"{cost.step_seconds(w, prof, l, kind, masked=masked):8.3f}")
    for width in sorted(w.ssd_calls):
        print(f"  SSD halo spans at width {width}: {int(w.ssd_calls[width].sum()):,} read calls "
              f"and {int(w.ssd_rows[width].sum()):,} rows per sweep for "
              f"{int(w.halo.sum()):,} halo rows")


def _print_prediction(pred, seconds: dict) -> None:
    """The prediction sweep by sweep (with the run's host cache and page-cache pricing, as the
    planner sees it), and its serial totals beside the measured ones: steps against compute,
    gathers and reads against reads, writes and scatter-adds against writes."""
    print("the prediction, sweep by sweep (s; serial: compute + reads + writes):")
    print(f"  {'sweep':<14} {'compute':>8} {'reads':>8} {'writes':>8}  moves")
    for s in pred.sweeps:
        print(f"  {s.label:<14} {s.compute:8.3f} {s.reads:8.3f} {s.writes:8.3f}  "
              f"{'; '.join(s.moves)}")
    measured = {"compute": sum(v for k, v in seconds.items() if k.startswith("step ")),
                "reads": sum(v for k, v in seconds.items()
                             if k.startswith(("gather ", "read "))),
                "writes": sum(v for k, v in seconds.items()
                              if k.startswith(("write ", "accumulate ")))}
    predicted = {"compute": sum(s.compute for s in pred.sweeps),
                 "reads": sum(s.reads for s in pred.sweeps),
                 "writes": sum(s.writes for s in pred.sweeps)}
    print(f"  {'':<14} {'measured':>8} {'predicted':>9} {'ratio':>6}")
    for key in ("compute", "reads", "writes"):
        ratio = predicted[key] / measured[key] if measured[key] else float("nan")
        print(f"  {key:<14} {measured[key]:8.3f} {predicted[key]:9.3f} {ratio:6.2f}")


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _print_measured(seconds: dict, faults: dict, total: float, total_faults: int) -> None:
    """The serial profile's table: seconds and the process's minor page faults per operation
    (a fault costs microseconds on a VM: fresh buffers can cost more than the work in them)."""
    print("measured, last epoch:")
    print(f"  {'':<48} {'seconds':>8} {'faults':>10}")
    for key in sorted(seconds):
        print(f"  {key:<48} {seconds[key]:8.3f} {faults[key]:>10,}")
    print(f"  {'(outside these operations)':<48} {total - sum(seconds.values()):8.3f} "
          f"{total_faults - sum(faults.values()):>10,}")


def _tagging(submit, name: str):
    """``submit`` whose futures carry ``jgrind_role = name``."""
    def tagged(*a, **k):
        future = submit(*a, **k)
        future.jgrind_role = name
        return future
    return tagged


if __name__ == "__main__":
    main()
