"""A run's epochs held against the plan's prediction: measured seconds per sweep beside the
cost model's, so a plan that misses is seen while the run trains, not in a later benchmark.

The engine times each sweep of the schedule it executes (`jgrind.engine.runner.Runner`); the
cost model priced the same sweeps, labelled alike (``"forward 0"``, ``"backward 2"``). An
epoch is `off` when its measured time differs from the predicted one by more than
`PLAN_MARGIN` of the prediction.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

__all__ = ["PLAN_MARGIN", "EpochCheck", "check_epoch", "format_sweep_table", "run_check",
           "sweep_table"]

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
        """For the metrics log: the predicted epoch and every sweep's two times."""
        return {"predicted_seconds": self.predicted,
                "sweep_seconds": [[label, p, m] for label, p, m in self.sweeps]}


def check_epoch(prediction, measured_sweeps: Sequence[tuple[str, float]],
                epoch_seconds: float, epoch: int) -> EpochCheck:
    """``prediction`` (a `jgrind.plan.cost.Prediction`) against an epoch's measured sweeps
    (``[(label, seconds)]`` in the order run) and whole time. The sweeps must be the ones
    predicted, in the same order: a check of another schedule is a ValueError."""
    predicted = [(s.label, prediction.sweep_seconds(s)) for s in prediction.sweeps]
    if [label for label, _ in predicted] != [label for label, _ in measured_sweeps]:
        raise ValueError(f"the measured sweeps {[label for label, _ in measured_sweeps]} are "
                         f"not the predicted ones {[label for label, _ in predicted]}")
    sweeps = tuple((label, float(p), float(m))
                   for (label, p), (_, m) in zip(predicted, measured_sweeps))
    return EpochCheck(epoch, float(prediction.epoch_seconds), float(epoch_seconds), sweeps)


def run_check(history: Sequence[dict], margin: float = PLAN_MARGIN):
    """The run's epochs against the plan, from its metrics log (`EpochCheck.as_record`
    fields): a dict with the predicted epoch, the median measured one, how many epochs
    missed by more than ``margin``, the sweep furthest off in the median, and a ``line``;
    None when no epoch was checked (in memory, or no plan predicted the run)."""
    checked = [r for r in history if "predicted_seconds" in r]
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
    line = (f"plan check: predicted {predicted:.3g} s per epoch, measured {measured:.3g} s "
            f"(median of {len(checked)}, {deviation:+.0%}); {off} of {len(checked)} epochs off "
            f"by more than {margin:.0%}; furthest off: {worst}, {median[worst]:.3g} s against "
            f"{planned[worst]:.3g} s")
    return {"predicted_seconds": predicted, "median_seconds": measured, "epochs": len(checked),
            "off": off, "margin": margin, "furthest": worst, "line": line}


def sweep_table(history: Sequence[dict]) -> list[tuple[str, float, float]]:
    """``(label, predicted, measured)`` seconds of every sweep of a run's checked epochs, in
    the schedule's order, the measured one the median over those epochs; [] when none was
    checked."""
    checked = [r for r in history if "sweep_seconds" in r]
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
