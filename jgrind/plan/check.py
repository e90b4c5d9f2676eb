"""A run's epochs held against the plan's prediction: measured seconds per sweep beside the
cost model's, so a plan that misses is seen while the run trains, not in a later benchmark.

The engine times each sweep of the schedule it executes (`jgrind.engine.runner.Runner`); the
cost model priced the same sweeps, labelled alike (``"forward 0"``, ``"backward 2"``). An
epoch is `off` when its measured time differs from the predicted one by more than
`PLAN_MARGIN` of the prediction. Each sweep's time is also held against the model's parts of
it: compute, reads and writes (`jgrind.engine.timing`).

A run that re-plans (`jgrind.plan.replan`) holds its epochs against the prediction of the plan
they ran; its summaries (`run_check`, `sweep_table`) are of the last plan's epochs.

A run with a fixed policy has no plan; `engine_prediction` prices the fates its engine chose
with the same `jgrind.plan.cost.predict` that prices a plan, from the saved hardware profile
(`jgrind.plan.profile.load_current`), so its epochs are held against a prediction too.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

__all__ = ["PLAN_MARGIN", "EpochCheck", "check_epoch", "engine_prediction", "format_parts_table",
           "format_sweep_table", "parts_table", "run_check", "sweep_table"]

# The parts of a sweep the cost model prices (`jgrind.plan.cost.Sweep`)
PARTS = ("compute", "reads", "writes")

# The planner's accuracy target (docs/planner.md, "How good it is"): an epoch within a quarter
# of its prediction.
PLAN_MARGIN = 0.25


@dataclasses.dataclass(frozen=True)
class EpochCheck:
    """One epoch against its prediction. ``sweeps``: ``(label, predicted, measured)`` seconds
    of every sweep, in the schedule's order; ``predicted`` and ``measured`` the whole epoch's,
    the optimizer update included."""

    epoch: int
    predicted: float
    measured: float
    sweeps: tuple[tuple[str, float, float], ...]
    # per sweep, when the engine timed its parts: {"predicted": {part: s}, "measured":
    # `jgrind.engine.timing.SweepTiming.parts`}
    parts: tuple = ()

    @property
    def deviation(self) -> float:
        """``measured / predicted - 1``: +0.9 is 90 % slower than predicted."""
        return self.measured / self.predicted - 1.0 if self.predicted > 0 else 0.0

    def off(self, margin: float = PLAN_MARGIN) -> bool:
        return abs(self.deviation) > margin

    def furthest(self) -> tuple[str, float, float]:
        """The sweep whose measured time is furthest from its prediction, in seconds."""
        return max(self.sweeps, key=lambda s: abs(s[2] - s[1]))

    def line(self) -> str:
        label, predicted, measured = self.furthest()
        return (f"epoch {self.epoch} took {self.measured:.3g} s, the plan predicted "
                f"{self.predicted:.3g} s ({self.deviation:+.0%}); furthest off: {label}, "
                f"{measured:.3g} s against {predicted:.3g} s")

    def as_record(self) -> dict:
        """For the metrics log: the predicted epoch and every sweep's two times (and parts,
        when timed)."""
        record = {"predicted_seconds": self.predicted,
                  "sweep_seconds": [[label, p, m] for label, p, m in self.sweeps]}
        if self.parts:
            record["sweep_parts"] = [dict(p) for p in self.parts]
        return record


def check_epoch(prediction, measured_sweeps: Sequence[tuple[str, float]],
                epoch_seconds: float, epoch: int,
                measured_parts: Sequence[dict] = ()) -> EpochCheck:
    """``prediction`` (a `jgrind.plan.cost.Prediction`) against an epoch's measured sweeps
    (``[(label, seconds)]`` in the order run) and whole time, and their parts
    (`jgrind.engine.runner.Runner.sweep_parts`, or none). The sweeps must be the ones
    predicted, in the same order: a check of another schedule is a ValueError."""
    predicted = [(s.label, prediction.sweep_seconds(s)) for s in prediction.sweeps]
    if [label for label, _ in predicted] != [label for label, _ in measured_sweeps]:
        raise ValueError(f"the measured sweeps {[label for label, _ in measured_sweeps]} are "
                         f"not the predicted ones {[label for label, _ in predicted]}")
    sweeps = tuple((label, float(p), float(m))
                   for (label, p), (_, m) in zip(predicted, measured_sweeps))
    parts = ()
    if len(measured_parts) == len(sweeps):
        # the engine's own work for the steps is kept too (`Sweep.machinery`): it has no
        # measured counterpart of its own, being in the measured compute and I/O both; and
        # the I/O threads' own seconds (`Sweep.reader_own`), in their measured time
        parts = tuple({"predicted": {name: float(getattr(s, name, 0.0))
                                     for name in PARTS + ("machinery", "reader_own",
                                                          "writer_own")},
                       "measured": measured}
                      for s, measured in zip(prediction.sweeps, measured_parts))
    return EpochCheck(epoch, float(prediction.epoch_seconds), float(epoch_seconds), sweeps,
                      parts)


def engine_prediction(engine, num_params: int, profile=None, directory=None):
    """The cost model's prediction (`jgrind.plan.cost.predict`, as the planner prices a plan)
    of an out-of-core ``engine``'s epoch: its workload, the fates its policy gave every block
    and its store's host cache, with ``num_params`` parameters to update. ``profile``: a
    `jgrind.plan.profile.Profile`, else the saved one for the store ``directory`` if it is
    current (nothing is measured); None when there is none."""
    from jgrind.plan import profile as hw
    from jgrind.plan.cost import Assignment, predict
    if profile is None:
        profile = hw.load_current(directory)
        if profile is None:
            return None
    w = engine.workload
    a = Assignment.from_fates(engine.fates, w.num_layers, w.num_parts)
    return predict(w, a, profile, engine.store.cache.capacity, num_params)


def _of_last_plan(history: Sequence[dict]) -> list[dict]:
    """The checked epochs of the plan the run ended with (``plan``: how many re-plans came
    before an epoch; absent, none)."""
    checked = [r for r in history if "sweep_seconds" in r]
    if not checked:
        return []
    last = checked[-1].get("plan", 0)
    return [r for r in checked if r.get("plan", 0) == last]


def run_check(history: Sequence[dict], margin: float = PLAN_MARGIN):
    """The run's epochs against the plan, from its metrics log (`EpochCheck.as_record`
    fields): a dict with the predicted epoch, the median measured one, how many epochs
    missed by more than ``margin``, the sweep furthest off in the median, and a ``line``;
    None when no epoch was checked (in memory, or no plan predicted the run)."""
    checked = _of_last_plan(history)
    if not checked:
        return None
    measured = sorted(r["seconds"] for r in checked)[len(checked) // 2]
    predicted = checked[-1]["predicted_seconds"]
    off = sum(abs(r["seconds"] / r["predicted_seconds"] - 1.0) > margin for r in checked)
    labels = [label for label, _, _ in checked[-1]["sweep_seconds"]]
    median = {label: sorted(r["sweep_seconds"][i][2] for r in checked)[len(checked) // 2]
              for i, label in enumerate(labels)}
    planned = {label: p for label, p, _ in checked[-1]["sweep_seconds"]}
    worst = max(labels, key=lambda label: abs(median[label] - planned[label]))
    deviation = measured / predicted - 1.0 if predicted > 0 else 0.0
    replans = [r["replan"] for r in history if "replan" in r]
    line = (f"plan check: predicted {predicted:.3g} s per epoch, measured {measured:.3g} s "
            f"(median of {len(checked)}, {deviation:+.0%}); {off} of {len(checked)} epochs off "
            f"by more than {margin:.0%}; furthest off: {worst}, {median[worst]:.3g} s against "
            f"{planned[worst]:.3g} s")
    if replans:
        back = [r["epoch"] for r in replans if r.get("stepped_back")]
        line += (f"; re-planned {len(replans)}x (after epoch "
                 f"{', '.join(str(r['epoch']) for r in replans)}"
                 + (f"; after epoch {back[0]} back to the plan before, which measured faster"
                    if back else "") + "), these are the last plan's epochs")
    return {"predicted_seconds": predicted, "median_seconds": measured, "epochs": len(checked),
            "off": off, "margin": margin, "furthest": worst, "replans": len(replans),
            "line": line}


def sweep_table(history: Sequence[dict]) -> list[tuple[str, float, float]]:
    """``(label, predicted, measured)`` seconds of every sweep of a run's checked epochs, in
    the schedule's order, the measured one the median over those epochs; [] when none was
    checked."""
    checked = _of_last_plan(history)
    if not checked:
        return []
    rows = []
    for i, (label, predicted, _) in enumerate(checked[-1]["sweep_seconds"]):
        measured = sorted(r["sweep_seconds"][i][2] for r in checked)
        rows.append((label, float(predicted), float(measured[len(measured) // 2])))
    return rows


def format_sweep_table(rows: Sequence[tuple[str, float, float]]) -> str:
    """The sweeps' predicted and measured seconds as a table, one sweep per line."""
    lines = [f"  {'sweep':<14} {'predicted':>10} {'measured':>10} {'':>7}"]
    for label, predicted, measured in rows:
        deviation = measured / predicted - 1.0 if predicted > 0 else 0.0
        lines.append(f"  {label:<14} {predicted:>9.4f}s {measured:>9.4f}s {deviation:>+7.0%}")
    total_p, total_m = sum(r[1] for r in rows), sum(r[2] for r in rows)
    lines.append(f"  {'sweeps':<14} {total_p:>9.4f}s {total_m:>9.4f}s "
                 f"{(total_m / total_p - 1.0) if total_p > 0 else 0.0:>+7.0%}")
    return "\n".join(lines)


def priced_part(predicted: dict, name: str) -> float:
    """A sweep's priced ``name`` (one of `PARTS`) from a check's predicted parts, as its
    measurement counts it: reads and writes are their threads' time, so their threads' own
    seconds (`jgrind.plan.cost.Sweep.reader_own`, absent in older records) are in it."""
    own = {"reads": "reader_own", "writes": "writer_own"}.get(name)
    return predicted[name] + (predicted.get(own, 0.0) if own else 0.0)


def parts_table(history: Sequence[dict]) -> list[dict]:
    """Every sweep's parts, predicted and measured (the median over the last plan's checked
    epochs, part by part), in the schedule's order: ``{"label", "predicted": {part: s},
    "measured": {"compute", "reads", "writes", "read_wait", "write_wait": s, "reads_by_tier",
    "writes_by_tier": {tier: s}}}``; [] when no epoch's parts were timed."""
    checked = [r for r in _of_last_plan(history) if "sweep_parts" in r]
    if not checked:
        return []

    def median(values):
        values = sorted(values)
        return float(values[len(values) // 2])

    rows = []
    for i, (label, _, _) in enumerate(checked[-1]["sweep_seconds"]):
        measured = [r["sweep_parts"][i]["measured"] for r in checked]
        tiers = sorted({t for m in measured for side in ("reads", "writes") for t in m[side]})
        rows.append({
            "label": label, "predicted": dict(checked[-1]["sweep_parts"][i]["predicted"]),
            "measured": {
                "compute": median(m["compute"] for m in measured),
                "reads": median(sum(m["reads"].values()) for m in measured),
                "writes": median(sum(m["writes"].values()) for m in measured),
                "read_wait": median(m["read_wait"] for m in measured),
                "write_wait": median(m["write_wait"] for m in measured),
                "reads_by_tier": {t: median(m["reads"].get(t, 0.0) for m in measured)
                                  for t in tiers},
                "writes_by_tier": {t: median(m["writes"].get(t, 0.0) for m in measured)
                                   for t in tiers}}})
    return rows


def format_parts_table(rows: Sequence[dict]) -> str:
    """`parts_table`'s rows as a table: per sweep, each part predicted / measured, and the
    main thread's waits on reads and writes, with the reads and writes per tier."""
    lines = [f"  {'sweep':<14} {'compute':>17} {'reads':>17} {'writes':>17} "
             f"{'waits r/w':>15}  by tier (measured reads/writes)"]
    for row in rows:
        p, m = row["predicted"], row["measured"]
        cells = " ".join(f"{priced_part(p, name):>8.4f}/{m[name]:<8.4f}" for name in PARTS)
        tiers = ", ".join(f"{t} {m['reads_by_tier'][t]:.4f}/{m['writes_by_tier'][t]:.4f}"
                          for t in m["reads_by_tier"])
        lines.append(f"  {row['label']:<14} {cells} {m['read_wait']:>7.4f}/"
                     f"{m['write_wait']:<7.4f}  {tiers}")
    return "\n".join(lines)
