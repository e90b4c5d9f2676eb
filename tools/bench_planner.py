"""Planner benchmarks (issue 4): is the cost model honest, is the plan worth having, is planning
fast.

    python tools/bench_planner.py accuracy            # 7 configurations x 5 policies, ~50 min
    python tools/bench_planner.py accuracy --only 1,2 --epochs 2     # a quick subset
    python tools/bench_planner.py accuracy --reprofile   # a fresh profile per configuration
    python tools/bench_planner.py planning-time       # 5-layer model, 1024 partitions
    python tools/bench_planner.py fast-path           # the fast path's price, 30k-1M nodes
    python tools/bench_planner.py report --json results.json --stat min   # re-render a run

``accuracy``: for every configuration (`harness.CONFIGS`: graph size, model, hidden size,
budgets chosen to force each tier) the planner makes a plan (`jgrind.plan.policies.auto`), then
the run is measured under ``auto`` and under every fixed policy. ``auto`` trains through
`jgrind.train.train`, as a user's run does, so it re-plans where its review says so
(`jgrind.plan.replan`: after the median of its first `REVIEW_EPOCHS` timed epochs); its row is
the last plan's epochs, and a run that re-planned also reports its first plan's (predicted
and measured) beside them. The fixed policies never re-plan: ``in_memory`` (the fast path,
where it fits the device budget), ``host_offload``, ``ssd_offload``, ``recompute_activations``.
Fixed policies run on the partitioning the planner chose, so they differ from ``auto`` only in
the fates. A fixed policy whose blocks exceed a budget is reported as "does not fit" (the
engine's budget check). For every run that fits, the cost model's prediction for *that run's*
fates is printed beside the measured median epoch time and the store's peak accounts per tier.
Then (``--turns R``, 4 by default) every run that fits is built again, all at once, and timed
epoch by epoch by turns for R rounds (`tools/turns.py`): ``auto``'s last plan (and its first,
where it re-planned) against each fixed policy by the median of their epochs' ratios within a
round, which this machine's drift over minutes does not move (the rounds' minima above compare
runs minutes apart). ``auto``'s last plan is built twice, and the second copy (``auto, again``)
held against the first gives the comparison's own noise: the same plan against itself.

``planning-time``: `Workload.build` and `plan` for a 5-layer GCN on 1024 partitions.

``fast-path``: the in-memory fast path's predicted step (`cost.in_memory_seconds`, calibrated
by the profile's whole-graph reference steps) against its measured step, on graphs from 30k
to 1M nodes, GCN and SAGE.

The hardware profile is `jgrind.plan.profile.load_or_measure()` (measured on first use).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Optional

import harness
from harness import CONFIGS, MiB, Config, build_config

FIXED = ("in_memory", "host_offload", "ssd_offload", "recompute")
# the control of the runs by turns: auto's last plan built a second time
AGAIN = "auto, again"


def time_epochs(executor, model, epochs: int, sweeps: Optional[list] = None) -> list[float]:
    """Seconds of ``epochs`` timed epochs after a compiling one. ``sweeps``: gets, per timed
    epoch, the engine's measured ``(label, seconds)`` of every sweep (an out-of-core engine)."""
    import jax
    import optax
    training = harness.Training(executor, model, optax.adam(1e-3))
    key = jax.random.key(1)
    times = []
    for e in range(epochs + 1):
        seconds = training.epoch(jax.random.fold_in(key, e))[0]
        if e:  # the first epoch compiles
            times.append(seconds)
            if sweeps is not None:
                sweeps.append((list(executor.sweep_seconds),
                               list(getattr(executor.runner, "sweep_parts", []))))
    return times


def sweep_rows(prediction, measured: tuple) -> list:
    """``[label, predicted, measured, parts]`` of every sweep: ``measured`` is one epoch's
    ``(executor.sweep_seconds, runner.sweep_parts)``, ``prediction`` the cost model's for its
    fates; ``parts``: the model's compute, reads and writes seconds beside the engine's
    (`jgrind.engine.timing.SweepTiming.parts`), where it timed them."""
    seconds, parts = measured
    rows = []
    for i, (s, (label, m)) in enumerate(zip(prediction.sweeps, seconds)):
        if s.label != label:
            break
        rows.append([label, prediction.sweep_seconds(s), m, {
            "predicted": {"compute": s.compute, "reads": s.reads, "writes": s.writes,
                          "machinery": s.machinery, "reader_own": s.reader_own,
                          "writer_own": s.writer_own},
            "measured": parts[i] if i < len(parts) else None}])
    return rows


def train_auto(graph, model, cfg: Config, profile, store, epochs: int,
               plans: Optional[list] = None) -> dict:
    """``auto`` trained through `jgrind.train.train` (re-planning as a user's run does):
    long enough for its review (`REVIEW_EPOCHS` timed epochs after the compiling one), a new
    plan's review after its compiling epoch (which may go back to the first plan,
    `jgrind.plan.replan.STEP_BACK_MARGIN`), and ``epochs`` timed epochs of the plan it ends
    with after its compiling epoch. Returns the first
    plan's and the last plan's predicted epoch and measured epoch times, whether it re-planned,
    the last plan's predicted peaks and the store's measured ones. ``plans``: gets the first
    and the last `jgrind.plan.planner.Plan` (the same one where it kept its plan)."""
    import jax
    import optax
    from jgrind.plan import policies
    from jgrind.plan.replan import REVIEW_EPOCHS
    from jgrind.train import train
    made = []
    policy = policies.auto(profile=profile, directory=store, on_plan=made.append)
    reviewed = max(REVIEW_EPOCHS, epochs)
    total = 1 + reviewed + 1 + reviewed + 1 + epochs
    result = train(jax.random.key(1), graph, model, optax.adam(1e-3), epochs=total,
                   policy=policy, store=store, device_budget=cfg.device_budget,
                   host_budget=cfg.host_budget, progress=False, eval_every=total)
    checked = [r for r in result.history if "predicted_seconds" in r]
    first = [r for r in checked if r.get("plan", 0) == 0]
    last_plan = max(r.get("plan", 0) for r in checked)
    last = [r for r in checked if r.get("plan", 0) == last_plan]
    replans = [r["replan"] for r in result.history if "replan" in r]
    # every review, kept plans' too: their calibration and the best other plan's price
    reviews = [r["plan_review"] for r in result.history if "plan_review" in r]
    if plans is not None:
        plans[:] = [made[0], result.plan if result.plan is not None else made[0]]
    m = made[0].prediction.memory
    peaks = {"device": m.peak_device, "host": m.peak_host, "ssd": m.peak_ssd}
    if replans:
        peaks = replans[-1]["new_peaks"]
    memory = result.memory or {}
    # a kept plan is held against its re-priced prediction after the review: the plan's own
    # prediction is its first checked epoch's
    return {"replanned": bool(replans), "replans": replans, "reviews": reviews,
            "predicted_first": first[0]["predicted_seconds"],
            "times_first": [r["seconds"] for r in first],
            "predicted": last[0]["predicted_seconds"], "times": [r["seconds"] for r in last],
            "predicted_memory": peaks,
            "accounts": {t: memory.get(f"peak_{t}", 0) for t in ("device", "host", "ssd")},
            "num_parts": made[0].num_parts,
            # every checked epoch's sweeps beside the plan's own prediction (as a fixed
            # policy's `sweeps`), so that `tools/replay_sweeps.py` replays the plans auto
            # chose too; a kept plan's epochs after its review are checked against a re-priced
            # prediction, so only the epochs before it are kept for it
            "sweeps_first": _checked_sweeps(first, first[0]["predicted_seconds"]),
            "sweeps": _checked_sweeps(last, last[0]["predicted_seconds"])}


def _checked_sweeps(records: list, predicted: float) -> list:
    """``[{"seconds", "sweeps": [label, predicted, measured, parts]}]`` of the checked epochs
    in ``records`` (`jgrind.train.train`'s history) held against the prediction ``predicted``
    (the plan's own, not a review's re-priced one), in `sweep_rows`' form."""
    out = []
    for r in records:
        if r["predicted_seconds"] != predicted or "sweep_parts" not in r:
            continue
        out.append({"seconds": r["seconds"], "sweeps": [
            [label, p, m, parts] for (label, p, m), parts
            in zip(r["sweep_seconds"], r["sweep_parts"])]})
    return out


def run_config(cfg: Config, profile, epochs: int, store_root: str, rounds: int = 0) -> dict:
    """One configuration: the planner's plan, then ``auto`` and every fixed policy measured
    in two rounds (each run built, compiled and timed in turn); with ``rounds``, then every
    run that fits again, all built at once and timed epoch by epoch by turns (`compare`)."""
    import optax
    from jgrind.engine import BudgetError, OutOfCore
    from jgrind.plan import policies
    from jgrind.plan.check import engine_prediction
    from jgrind.plan.cost import in_memory_seconds
    from jgrind.plan.inventory import layer_widths
    from jgrind.plan.planner import dense_parameter_count, plan_run
    from jgrind.train import InMemory, in_memory_bytes

    graph, model = build_config(cfg)
    num_params = dense_parameter_count(layer_widths(model, graph.num_features))
    store = store_root if cfg.store else None
    t = time.perf_counter()
    the_plan = plan_run(graph, model, profile, device_budget=cfg.device_budget,
                        host_budget=cfg.host_budget, directory=store)
    plan_seconds = time.perf_counter() - t
    out = {"config": dataclasses.asdict(cfg), "plan": {
        "in_memory": the_plan.in_memory, "num_parts": the_plan.num_parts,
        "cache_bytes": the_plan.cache_bytes, "predicted": the_plan.epoch_seconds,
        "fates": [(r["tensor"], r["fate"]) for r in the_plan.groups()],
        "seconds_with_partitioning": plan_seconds}, "runs": {}}
    pg = the_plan.partitioned
    candidates = {"auto": the_plan.policy()}
    candidates.update({"host_offload": policies.host_offload(),
                       "ssd_offload": policies.ssd_offload(store) if store else None,
                       "recompute": policies.recompute_activations()})
    fits_in_memory = in_memory_bytes(graph, model) <= cfg.device_budget
    optimizer = optax.adam(1e-3)
    auto_plans: list = []  # the last round's first and last plan, for the runs by turns

    def engine(policy, partitioned, prediction=None):
        return OutOfCore(graph, model, optimizer, policy=policy, partitioned=partitioned,
                         store=store, device_budget=cfg.device_budget,
                         host_budget=cfg.host_budget, prediction=prediction)

    def measure(name: str, record: dict) -> None:
        """Build the run's executor, predict it (first round), time its epochs."""
        if (name == "auto" and the_plan.in_memory) or name == "in_memory":
            if not fits_in_memory:
                raise BudgetError("the in-memory path needs "
                                  f"{in_memory_bytes(graph, model) / MiB:.0f} MiB")
            ex = InMemory(graph, model, optimizer)
            if "predicted" not in record:
                from jgrind.plan.planner import _single_partition_workload
                record["predicted"] = in_memory_seconds(
                    _single_partition_workload(graph, model), profile)
                record["predicted_memory"] = record["accounts"] = None
            record["times"] += time_epochs(ex, model, epochs)
            return
        if name == "auto":
            run = train_auto(graph, model, cfg, profile, store, epochs, auto_plans)
            if run["num_parts"] != the_plan.num_parts:
                print(f"  (auto in train() planned {run['num_parts']} partitions, the "
                      f"benchmark's plan {the_plan.num_parts})", flush=True)
            record.setdefault("rounds", []).append(run)
            # the last plan's epochs; a round that re-planned has its first plan's apart
            record["predicted"] = run["predicted"]
            record["predicted_memory"], record["accounts"] = run["predicted_memory"], \
                run["accounts"]
            record["times"] += run["times"]
            record["replanned"] = record.get("replanned", False) or run["replanned"]
            if run["replanned"]:
                record.setdefault("times_first", []).extend(run["times_first"])
                record["predicted_first"] = run["predicted_first"]
            return
        policy = candidates[name]
        if policy is None:
            raise BudgetError("no SSD store in this configuration")
        if pg is None:  # auto took the fast path; fixed policies need a partitioning
            raise BudgetError("auto chose the fast path; no partitioning to compare on")
        ex = engine(policy, pg)
        try:
            pred = engine_prediction(ex, num_params, profile)
            if "predicted" not in record:  # as `jgrind.train` holds a fixed policy's run
                record["predicted"] = pred.epoch_seconds
                record["predicted_memory"] = {"device": pred.memory.peak_device,
                                              "host": pred.memory.peak_host,
                                              "ssd": pred.memory.peak_ssd}
            sweeps = []
            record["times"] += time_epochs(ex, model, epochs, sweeps)
            # each timed epoch's sweeps beside the model's: where a miss comes from
            record.setdefault("sweeps", []).extend(sweep_rows(pred, m) for m in sweeps)
            acc = ex.store.accounts
            record["accounts"] = {"device": acc.peak_device, "host": acc.peak_host,
                                  "ssd": acc.peak_ssd}
        finally:
            ex.close()

    # Two rounds, the second in reverse order: the first run after a configuration is built
    # runs slower (fresh memory pages), which would otherwise always penalise the same policy.
    # When auto's plan is the fast path it *is* the in_memory run: measured once, shared.
    names = [n for n in ("auto",) + FIXED if not (n == "auto" and the_plan.in_memory)]
    records = {n: {"times": []} for n in names}
    for order in (names, names[::-1]):
        for name in order:
            if "does_not_fit" in records[name]:
                continue
            try:
                measure(name, records[name])
            except BudgetError as err:
                records[name] = {"does_not_fit": str(err).split(";")[0]}
    if the_plan.in_memory:
        records["auto"] = dict(records["in_memory"], same_as="in_memory")
    for name in ("auto",) + FIXED:
        record = records[name]
        if "times" in record:
            record["measured"] = min(record["times"])
        out["runs"][name] = record
        print(f"  {name:<13} " + (f"measured {record['measured']:.3f} s, predicted "
                                  f"{record['predicted']:.3f} s" if "measured" in record
                                  else f"does not fit: {record['does_not_fit']}")
              + (f" (re-planned; the first plan measured {min(record['times_first']):.3f} s, "
                 f"predicted {record['predicted_first']:.3f} s)"
                 if record.get("replanned") and record.get("times_first") else ""),
              flush=True)
        if record.get("sweeps"):  # the fastest epoch's sweep furthest from its prediction
            fastest = record["sweeps"][record["times"].index(record["measured"])]
            label, p, m, _ = max(fastest, key=lambda r: abs(r[2] - r[1]))
            print(f"  {'':<13} furthest sweep: {label} measured {m:.3f} s, predicted "
                  f"{p:.3f} s ({(m / p - 1) * 100 if p else 0:+.0f} %)", flush=True)
    if rounds:
        fitting = [n for n in FIXED if "times" in records[n]]
        makers = {}
        if not the_plan.in_memory and auto_plans:  # (none if auto did not fit)
            first, last = auto_plans
            makers["auto"] = lambda: engine(last.policy(), last.partitioned, last.prediction)
            makers[AGAIN] = makers["auto"]  # the control: the same plan, built again
            if last is not first:
                makers["auto, first plan"] = lambda: engine(first.policy(), first.partitioned,
                                                            first.prediction)
        for name in fitting:
            makers[name] = (lambda: InMemory(graph, model, optimizer)) if name == "in_memory" \
                else (lambda policy=candidates[name]: engine(policy, pg))
        out["turns"] = compare(makers, model, rounds,
                               "in_memory" if the_plan.in_memory else "auto", fitting)
    return out


def compare(makers: dict, model, rounds: int, auto_name: str, fixed: list) -> dict:
    """The runs ``makers`` builds (by name), all built at once, then timed by turns for
    ``rounds`` rounds (`turns.by_turns`); ``auto_name``'s run (and its first plan's, where it
    re-planned) held against the ``fixed`` policies' by paired ratios (`turns.against_best`).
    Prints the comparison; returns ``{"rounds", "auto", "times"}``."""
    import optax
    import turns
    built = {}
    try:
        for name, make in makers.items():
            built[name] = make()
        times = turns.by_turns({n: harness.Training(ex, model, optax.adam(1e-3))
                                for n, ex in built.items()}, rounds)
    finally:
        for ex in built.values():
            getattr(ex, "close", lambda: None)()
    others = [n for n in fixed if n != auto_name]
    print(f"  by turns ({rounds} rounds; median epoch): " + ", ".join(
        f"{n} {statistics.median(t):.3f} s" for n, t in times.items()), flush=True)
    for name in (auto_name, "auto, first plan"):
        if name in times and others:
            ratio, which, _ = turns.against_best(times, name, others)
            print(f"  {name} / best fixed by turns: {ratio:.2f} (against {which})", flush=True)
    if AGAIN in times:
        print(f"  {AGAIN} / auto by turns: {turns.paired_ratio(times[AGAIN], times['auto']):.2f}"
              " (the same plan twice: the comparison's noise)", flush=True)
    return {"rounds": rounds, "auto": auto_name, "times": times}


STATS = {"median": statistics.median, "min": min}


def report(results: list[dict], stat: str = "min") -> None:
    """Tables from the results; ``stat`` summarises each run's epoch times (the machine is
    noisy: the fastest epoch is the least disturbed one)."""
    for r in results:
        for rec in r["runs"].values():
            if "times" in rec:
                rec["measured"] = STATS[stat](rec["times"])
            if rec.get("times_first"):
                rec["measured_first"] = STATS[stat](rec["times_first"])
    print(f"\n(measured = {stat} of the timed epochs)")
    print("\n## Cost model: predicted vs measured (every run that fits)\n")
    print("| config | policy | parts | measured s | predicted s | error | device pred/meas MiB "
          "| host pred/meas MiB | ssd pred/meas MiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        for name, rec in r["runs"].items():
            if "measured" not in rec:
                continue
            err = rec["predicted"] / rec["measured"] - 1
            mem = []
            for tier in ("device", "host", "ssd"):
                if rec.get("accounts") is None:
                    mem.append("-")
                else:
                    mem.append(f"{rec['predicted_memory'][tier] / MiB:.1f} / "
                               f"{rec['accounts'][tier] / MiB:.1f}")
            parts = 1 if (name == "in_memory" or (name == "auto" and r["plan"]["in_memory"])) \
                else r["plan"]["num_parts"]
            label = name
            if name == "auto" and "rounds" in rec:
                replanned = sum(run["replanned"] for run in rec["rounds"])
                label = (f"auto, re-planned in {replanned} of {len(rec['rounds'])} rounds"
                         if replanned else "auto, kept its plan")
                if "measured_first" in rec:
                    first = rec["predicted_first"] / rec["measured_first"] - 1
                    print(f"| {r['config']['name']} | auto, first plan | {parts} | "
                          f"{rec['measured_first']:.3f} | {rec['predicted_first']:.3f} | "
                          f"{100 * first:+.0f} % | - | - | - |")
            print(f"| {r['config']['name']} | {label} | {parts} | {rec['measured']:.3f} | "
                  f"{rec['predicted']:.3f} | {100 * err:+.0f} % | " + " | ".join(mem) + " |")
    print(f"\n## auto against the fixed policies (measured epoch, {stat}, s)\n")
    print("| config | purpose | auto plan | auto | " + " | ".join(FIXED) +
          " | best fixed | auto / best | auto's first plan / best |")
    print("|---|---|---|---|" + "---|" * len(FIXED) + "---|---|---|")
    for r in results:
        runs = r["runs"]
        cell = lambda n: f"{runs[n]['measured']:.3f}" if "measured" in runs[n] else "no fit"  # noqa
        fixed = {n: runs[n]["measured"] for n in FIXED if "measured" in runs[n]}
        best = min(fixed, key=fixed.get) if fixed else None
        ratio = runs["auto"]["measured"] / fixed[best] if best and "measured" in runs["auto"] \
            else float("nan")
        plan = ("in-memory" if r["plan"]["in_memory"] else
                f"{r['plan']['num_parts']} parts: " + ", ".join(f"{t} {f}"
                                                                for t, f in r["plan"]["fates"]))
        for run in runs["auto"].get("rounds", ()):
            if run["replanned"]:
                last = run["replans"][-1]
                plan += (f"; re-planned to {last['was']}, then went back" if
                         last.get("stepped_back") else f"; re-planned to {last['now']}")
                break
        first = runs["auto"].get("measured_first")
        before = f"{first / fixed[best]:.2f}" if first and best else "(no re-plan)"
        print(f"| {r['config']['name']} | {r['config']['purpose']} | {plan} | {cell('auto')} | "
              + " | ".join(cell(n) for n in FIXED) + f" | {best} | {ratio:.2f} | {before} |")
    report_turns(results)


def report_turns(results: list[dict]) -> None:
    """The runs by turns (`compare`), where the results have them: each run's median epoch,
    and ``auto`` against the best fixed policy by paired ratios."""
    import turns
    with_turns = [r for r in results if r.get("turns")]
    if not with_turns:
        return
    print("\n## auto against the fixed policies by turns (median epoch, s; ratios: median "
          "of the rounds' paired ratios)\n")
    print("| config | rounds | auto | auto's first plan | " + " | ".join(FIXED) +
          " | auto / best fixed | faster than each | first plan / best fixed | "
          "auto again / auto |")
    print("|---|---|---|---|" + "---|" * len(FIXED) + "---|---|---|---|")
    for r in with_turns:
        t = r["turns"]
        times, auto_name = t["times"], t["auto"]
        others = [n for n in FIXED if n in times and n != auto_name]
        cell = lambda n: f"{statistics.median(times[n]):.3f}" if n in times else "-"  # noqa
        ratio = first = "-"
        faster = "-"
        if others:
            worst, which, _ = turns.against_best(times, auto_name, others)
            ratio, faster = f"{worst:.2f} ({which})", "yes" if worst < 1 else "no"
            if "auto, first plan" in times:
                worst, which, _ = turns.against_best(times, "auto, first plan", others)
                first = f"{worst:.2f} ({which})"
        control = f"{turns.paired_ratio(times[AGAIN], times[auto_name]):.2f}" \
            if AGAIN in times else "-"
        print(f"| {r['config']['name']} | {t['rounds']} | {cell(auto_name)} | "
              f"{cell('auto, first plan')} | " + " | ".join(cell(n) for n in FIXED)
              + f" | {ratio} | {faster} | {first} | {control} |")


def accuracy(args) -> list[dict]:
    from jgrind.plan.profile import load_or_measure
    profile = load_or_measure(args.profile, args.store, log=print)
    configs = [c for i, c in enumerate(CONFIGS, start=1)
               if not args.only or str(i) in args.only.split(",")
               or c.name in args.only.split(",")]
    results = []
    with tempfile.TemporaryDirectory(dir=args.store) as store_root:
        for cfg in configs:
            print(f"\n# {cfg.name}: {cfg.purpose}", flush=True)
            if args.reprofile:
                from jgrind.plan.profile import measure
                profile = measure(args.store)
                print(f"  profile re-measured: matmul {profile.matmul_flops / 1e9:.1f} GFLOP/s, "
                      f"spmm {profile.spmm_rate / 1e9:.2f} G/s, overlap {profile.overlap:.2f}",
                      flush=True)
            result = run_config(cfg, profile, args.epochs, store_root, args.turns)
            result["profile"] = profile.to_json()
            results.append(result)
            # after every configuration, so a long run can be cut short
            harness.write_json(args.json, results)
    report(results)
    return results


def planning_time(args) -> dict:
    from jgrind.generators import csbm
    from jgrind.models.model import gcn
    from jgrind.partition import partition_graph
    from jgrind.partition.partitioners import label_propagation
    from jgrind.plan.cost import Workload
    from jgrind.plan.planner import plan
    from jgrind.plan.profile import load_or_measure
    profile = load_or_measure(args.profile, args.store, log=print)
    graph = csbm(num_nodes=args.nodes, num_features=64, avg_degree=10, num_classes=8, seed=0)
    model = gcn(graph.num_features, 128, graph.num_classes, num_layers=5)
    normalized = model.normalize(graph)
    t = time.perf_counter()
    assignment = label_propagation(normalized, args.parts, seed=0)
    pg = partition_graph(normalized, assignment, num_parts=args.parts)
    t_part = time.perf_counter() - t
    builds, plans = [], []
    for _ in range(3):
        t = time.perf_counter()
        w = Workload.build(pg, model)
        builds.append(time.perf_counter() - t)
        stored = sum(int(w.block_bytes(l).sum()) for l in range(w.num_layers))
        t = time.perf_counter()
        p = plan(w, profile, device_budget=w.working_set() + stored // 8,
                 host_budget=stored // 3, directory=args.store)
        plans.append(time.perf_counter() - t)
    print(f"graph: {graph.num_nodes:,} nodes, {graph.num_edges:,} edges; 5-layer GCN, hidden "
          f"128; {args.parts} partitions (label propagation: {t_part:.1f} s, not counted)")
    print(f"Workload.build (shapes, halo counts): median {statistics.median(builds):.3f} s")
    print(f"plan (recompute sets x page-cache regimes, one MILP each, + cache modes): median "
          f"{statistics.median(plans):.3f} s")
    print(f"total planning: {statistics.median(builds) + statistics.median(plans):.3f} s "
          f"(target < 2 s); predicted epoch {p.epoch_seconds:.2f} s")
    return {"build": builds, "plan": plans, "partition_seconds": t_part}


FAST_PATH_GRAPHS = (  # nodes, mean degree, hidden, layers, model
    (30_000, 10, 128, 3, "gcn"), (60_000, 10, 128, 3, "gcn"), (150_000, 10, 128, 3, "gcn"),
    (150_000, 10, 256, 3, "gcn"), (100_000, 12, 128, 4, "sage"), (400_000, 10, 256, 3, "gcn"),
    (1_000_000, 10, 256, 3, "gcn"))


def fast_path(args) -> dict:
    import optax
    from jgrind.generators import csbm
    from jgrind.models.model import gcn, sage
    from jgrind.plan.cost import fused_scale, in_memory_seconds
    from jgrind.plan.planner import _single_partition_workload
    from jgrind.plan.profile import load_or_measure
    from jgrind.train import InMemory
    profile = load_or_measure(args.profile, args.store, log=print)
    rows = []
    print("| nodes | edges | model | hidden | layers | scale | predicted s | measured s (min) "
          "| error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for nodes, degree, hidden, layers, kind in FAST_PATH_GRAPHS[:args.graphs]:
        graph = csbm(num_nodes=nodes, num_features=64, avg_degree=degree, num_classes=8, seed=0)
        make = gcn if kind == "gcn" else sage
        model = make(graph.num_features, hidden, graph.num_classes, num_layers=layers,
                     dropout=0.5)
        w = _single_partition_workload(graph, model)
        predicted = in_memory_seconds(w, profile)
        measured = min(time_epochs(InMemory(graph, model, optax.adam(1e-3)), model,
                                   args.epochs))
        scale = fused_scale(profile, w.num_nodes * max(w.widths))
        rows.append({"nodes": nodes, "edges": graph.num_edges, "model": kind, "hidden": hidden,
                     "layers": layers, "scale": scale, "predicted": predicted,
                     "measured": measured})
        print(f"| {nodes:,} | {graph.num_edges:,} | {kind} | {hidden} | {layers} | {scale:.2f} "
              f"| {predicted:.3f} | {measured:.3f} | {100 * (predicted / measured - 1):+.0f} % |",
              flush=True)
    return {"profile_fused_steps": profile.fused_steps, "rows": rows}


def main():
    from jgrind.hostio.allocator import relaunch_if_wanted
    relaunch_if_wanted()  # JGRIND_HUGE_PAGES=1: with glibc huge pages, as the jgrind command
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    a = sub.add_parser("accuracy", help="cost model vs measurement; auto vs fixed policies")
    a.add_argument("--epochs", type=int, default=2,
                   help="timed epochs after one warm-up, in each of two rounds")
    a.add_argument("--only", default="", help="comma-separated config numbers or names")
    a.add_argument("--reprofile", action="store_true",
                   help="measure a fresh profile before each configuration (not saved): on a "
                        "machine whose speed drifts over minutes, this separates the cost "
                        "model's error from the drift")
    a.add_argument("--turns", type=int, default=4,
                   help="then every run that fits built at once and timed epoch by epoch, "
                        "by turns, for this many rounds: auto against the fixed policies "
                        "under the same machine (0: not)")
    r = sub.add_parser("report", help="print the tables of a saved accuracy run")
    r.add_argument("--json", required=True, help="the results file of an accuracy run")
    r.add_argument("--stat", choices=sorted(STATS), default="min")
    t = sub.add_parser("planning-time", help="planning time, 5 layers x 1024 partitions")
    t.add_argument("--nodes", type=int, default=200_000)
    t.add_argument("--parts", type=int, default=1024)
    f = sub.add_parser("fast-path", help="the fast path's predicted vs measured step")
    f.add_argument("--epochs", type=int, default=3, help="timed steps after a compiling one")
    f.add_argument("--graphs", type=int, default=len(FAST_PATH_GRAPHS),
                   help="the first N graphs only (the last, 1M nodes, takes ~1 min)")
    for s in (a, t, f):
        s.add_argument("--profile", default=None, help="profile file (default: jgrind's)")
        harness.add_store(s, help="SSD store directory")
        harness.add_json(s)
    args = p.parse_args()
    if args.mode == "report":
        with open(args.json) as f:
            report(json.load(f), args.stat)
        return
    result = {"accuracy": accuracy, "planning-time": planning_time,
              "fast-path": fast_path}[args.mode](args)
    harness.write_json(args.json, result)


if __name__ == "__main__":
    main()
