"""Re-planning between epochs: the first timed epochs' measurements (their median) as a fresh
profile of this very workload, and a new plan when the old one missed.

The rule (docs/planner.md, "Re-planning"):

1. After the first `REVIEW_EPOCHS` checked epochs of a plan (the first epoch of a run, or of
   a resume, and the first after a re-plan, compile; the epochs after are checked), or fewer
   when the run ends sooner, the profile is *calibrated* to their median (`median_epoch`:
   every sweep's parts, sweep by sweep and part by part): the cost model's compute, its
   host/device I/O and its SSD I/O are each scaled by measured over predicted, summed over
   the sweeps' parts (`jgrind.engine.timing`; where the steps run on the host's cores, an I/O
   thread's seconds less the share of its sweep the kernels took, `kernel_shares`; less the
   thread's own seconds per step as the profile has them, which are not its bytes), the
   overlap of I/O with compute is fitted to the measured sweeps' total, and what is left
   between the sweeps as priced and as measured scales every sweep (`Calibration.residual`).
   One epoch is too noisy to plan from: the main job's first timed epoch took 0.237, 0.235
   and 0.354 s in three runs of the same plan.
2. With that profile the current plan is priced again, and the planner plans again over the
   same partitions, budgets and store (`jgrind.plan.planner.plan`).
3. The run re-plans when the new plan is predicted faster than the current one (re-priced)
   by more than `PLAN_MARGIN` of it, or by more than `REPLAN_GAIN` of it when the measured
   epoch was more than `PLAN_MARGIN` slower than predicted: a rebuild costs a compiled
   epoch, which a gain of a few percent does not pay back. Either gain must also exceed the
   calibration's residual (the share of the epoch its parts could not place, which prices
   the new plan only to within that share). When the plan stays, the run is
   held from then on against the current plan re-priced with the calibrated profile.
4. After a re-plan the next plan is reviewed the same way (its first epoch compiles; the ones
   after are reviewed), but re-plans again only if their median missed its prediction by more
   than the margin (measurements keep missing) *and* the new plan is predicted faster by
   more than the margin: a rebuild costs a compiled epoch. A run re-plans at most
   `MAX_REPLANS` times. A plan reviewed without a re-plan is not reviewed again.
5. A re-plan is itself held against measurement: when the new plan's reviewed median is more
   than `STEP_BACK_MARGIN` slower than the median the plan it replaced measured, the run goes
   back to that plan (held against its re-priced prediction) and reviews no more. Both
   medians were measured, on this run: the calibrated model that chose the new plan was
   not. On the planner benchmark's host-tight configuration the first re-plan moved to a
   slower plan in runs AL, AM, AN and AQ (docs/results.md, section 7). Going back wrongly
   (the machine slowed between the two medians) costs a compiled epoch and a plan about as
   fast; staying wrongly costs the rest of the run.

A re-plan changes where tensors live, never the numbers: the trainer rebuilds the engine
with the new plan on the same partitions, and parameters, optimizer state, random keys and the
epoch counter go on as they were (`jgrind.train.train`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from jgrind.plan.check import PLAN_MARGIN, priced_part
from jgrind.plan.cost import HostCores, Prediction, predict
from jgrind.plan.planner import plan as plan_for

__all__ = ["MAX_REPLANS", "REPLAN_GAIN", "REVIEW_EPOCHS", "STEP_BACK_MARGIN", "Calibration",
           "Replan", "Replanner", "calibrate", "kernel_shares", "median_epoch", "needed_gain",
           "with_residual"]

MAX_REPLANS = 3
# The least predicted gain that re-plans after a slow epoch: a rebuild recompiles the steps.
REPLAN_GAIN = 0.05
# Checked epochs whose median a review calibrates to: the median of three ignores one outlier.
REVIEW_EPOCHS = 3
# How much slower than the plan it replaced a re-planned plan may measure before the run goes
# back, as a share of the replaced plan's median.
STEP_BACK_MARGIN = 0.10

# The profile's figures behind each part the calibration scales: rates are divided by the
# factor, per-call and per-row seconds multiplied by it.
COMPUTE = (("matmul_flops", "spmm_rate", "spmm_cached_rate", "contraction_bw"),
           ("sweep_step", "machinery_forward", "machinery_top", "machinery_backward",
            "machinery_params", "machinery_ssd_call", "machinery_device_mix",
            "machinery_kept_forward", "machinery_kept_backward", "machinery_kept_params"))
MEMORY = (("gather_bw", "scatter_add_bw", "copy_bw", "to_device_bw", "to_device_small_bw",
           "to_host_bw", "link_to_device_bw", "link_to_host_bw", "pageable_to_host_bw"),
          ("gather_row_seconds", "scatter_add_row_seconds", "step_latency", "device_call"))
SSD = (("ssd_read_bw", "ssd_write_bw", "cached_read_bw", "cached_write_bw", "checksum_bw"),
       ("ssd_latency", "cached_latency", "read_call_overhead", "update_call_overhead",
        "cached_take", "cache_lookup"))
_FIELDS = {"compute": COMPUTE, "memory": MEMORY, "ssd": SSD}
_ITERATIONS = 6  # fixed-point steps: a figure like copy_bw prices compute and I/O both


@dataclasses.dataclass(frozen=True)
class Calibration:
    """How a profile is scaled to what an epoch measured: ``compute``, ``memory`` (the host
    and device tiers' I/O) and ``ssd`` multiply the seconds of their part of the cost model;
    ``overlap`` replaces the profile's overlap of I/O with compute."""

    compute: float = 1.0
    memory: float = 1.0
    ssd: float = 1.0
    overlap: Optional[float] = None
    # the measured sweeps over the calibrated ones: what the parts' factors and the overlap
    # leave (`jgrind.plan.cost.Prediction.residual`)
    residual: float = 1.0

    def profile(self, base):
        """``base`` (a `jgrind.plan.hardware.Profile`) with these factors applied."""
        changes = {}
        for part, (rates, times) in _FIELDS.items():
            factor = getattr(self, part)
            changes.update({f: getattr(base, f) / factor for f in rates if hasattr(base, f)})
            changes.update({f: getattr(base, f) * factor for f in times if hasattr(base, f)})
        if self.overlap is not None:
            changes["overlap"] = self.overlap
        if dataclasses.is_dataclass(base):
            return dataclasses.replace(base, **changes)
        return type(base)(**{**vars(base), **changes})

    def as_record(self) -> dict:
        return dataclasses.asdict(self)


def _parts(prediction: Prediction, w, a, profile, cache: int, num_params: int) -> dict:
    """The predicted epoch's compute, host/device I/O and SSD I/O seconds. The SSD share is
    what the I/O loses when the SSD figures are made a million times faster."""
    io = sum(s.reads + s.writes for s in prediction.sweeps)
    fast_ssd = predict(w, a, Calibration(ssd=1e-6).profile(profile), cache, num_params)
    ssd = max(0.0, io - sum(s.reads + s.writes for s in fast_ssd.sweeps))
    # the measured compute is the sweeps' time the I/O did not hold up: the steps' kernels
    # and the engine's own time for them (`Sweep.engine_bound`: after it on the host's
    # cores, the longer of the two on an accelerator)
    cores = HostCores.of(profile)
    return {"compute": sum(max(s.compute, s.engine_bound(cores)) for s in prediction.sweeps),
            "memory": io - ssd, "ssd": ssd}


def measured_parts(sweep_parts: Sequence[dict],
                   shares: Optional[Sequence[float]] = None,
                   threads_own: Optional[Sequence[tuple]] = None) -> dict:
    """An epoch's measured compute, host/device I/O and SSD I/O seconds, summed over its
    sweeps (`jgrind.engine.runner.Runner.sweep_parts`). ``shares``: per sweep, the
    share of its time the steps' kernels held the host's cores (`kernel_shares`); that
    share of each I/O thread's time stood still behind them, and is not its own work.
    ``threads_own``: per sweep, the reader's and the writer's own seconds besides their
    bytes as priced (`jgrind.plan.cost.Sweep.reader_own`), taken off each thread's time
    (from its tiers in proportion): the I/O rates are what is left, so that a thread's
    fixed cost per step is not read as slow bytes."""
    out = {"compute": 0.0, "memory": 0.0, "ssd": 0.0}
    for i, parts in enumerate(sweep_parts):
        out["compute"] += parts["compute"]
        running = 1.0 - (shares[i] if shares is not None else 0.0)
        for j, side in enumerate(("reads", "writes")):
            total = running * sum(parts[side].values())
            fixed = threads_own[i][j] if threads_own is not None else 0.0
            keep = max(0.0, total - fixed) / total if total > 0 else 0.0
            for tier, seconds in parts[side].items():
                out["ssd" if tier == "ssd" else "memory"] += keep * running * seconds
    return out


def kernel_shares(prediction: Prediction, sweep_parts: Sequence[dict],
                  sweep_seconds: Sequence[float], cores: Optional[HostCores]) -> Optional[list]:
    """Per sweep, the share of its measured ``sweep_seconds`` that the steps' kernels took
    where they run on the host's cores (`HostCores`: nothing else gets far beside them), or
    None where they do not, or the sweeps do not match. The kernels' time is the sweep's
    measured compute (the main thread's time outside its waits: kernels and the engine's own
    work) in the share ``prediction`` gives the kernels of the two; read from the
    measurement, not from a calibrated price, so that the calibration's factors do not move
    it. An I/O thread spread over the sweep stands still that share of its time, so its
    measured seconds are its own work over one less the share: the form prices the work
    alone, after the kernels."""
    if cores is None or not cores.compute_on_host or \
            not (len(sweep_seconds) == len(sweep_parts) == len(prediction.sweeps)):
        return None
    shares = []
    for s, parts, t in zip(prediction.sweeps, sweep_parts, sweep_seconds):
        main = s.compute + s.machinery
        kernels = parts["compute"] * s.compute / main if main > 0 else 0.0
        shares.append(min(1.0, kernels / t) if t > 0 else 0.0)
    return shares


def calibrate(base, w, a, cache: int, num_params: int, sweep_parts: Sequence[dict],
              sweep_seconds: Sequence[float]) -> tuple[Calibration, object, Prediction]:
    """The `Calibration` under which assignment ``a`` (host cache ``cache``) on workload
    ``w`` is predicted as measured: each part's total as the epoch's ``sweep_parts``, the
    sweeps' total as ``sweep_seconds``. Returns it, the calibrated profile and the
    prediction. A part the model or the measurement puts at nothing keeps its factor."""
    before = predict(w, a, base, cache, num_params)
    threads_own = [(s.reader_own, s.writer_own) for s in before.sweeps] \
        if len(before.sweeps) == len(sweep_parts) else None
    measured = measured_parts(sweep_parts, kernel_shares(
        before, sweep_parts, sweep_seconds, HostCores.of(base)), threads_own)
    factors = {"compute": 1.0, "memory": 1.0, "ssd": 1.0}
    for _ in range(_ITERATIONS):
        profile = Calibration(**factors).profile(base)
        prediction = predict(w, a, profile, cache, num_params)
        predicted = _parts(prediction, w, a, profile, cache, num_params)
        for part in factors:
            if predicted[part] > 1e-12 and measured[part] > 0:
                factors[part] *= measured[part] / predicted[part]
    profile = Calibration(**factors).profile(base)
    prediction = predict(w, a, profile, cache, num_params)
    overlap = _fit_overlap(prediction, float(sum(sweep_seconds)))
    prediction = dataclasses.replace(prediction, overlap=overlap)
    # the parts can each equal what was measured while the sweeps (the form's maxima over
    # them) add up to less; the rest scales every sweep, of this plan and of the plans priced
    # with this calibration (`with_residual`), so that the run is held against what it ran
    priced = sum(prediction.sweep_seconds(s) for s in prediction.sweeps)
    ran = float(sum(sweep_seconds))
    residual = ran / priced if priced > 0 and ran > 0 else 1.0
    calibration = Calibration(**factors, overlap=overlap, residual=residual)
    profile = calibration.profile(base)
    return calibration, profile, dataclasses.replace(prediction, residual=residual)


def with_residual(plan, residual: float):
    """``plan`` (a `jgrind.plan.planner.Plan`) with its sweeps scaled by ``residual``
    (`Calibration.residual`), its predicted epoch with them."""
    p = plan.prediction
    if p is None or residual == 1.0:
        return plan
    sweeps = sum(p.sweep_seconds(s) for s in p.sweeps)
    scaled = dataclasses.replace(p, residual=p.residual * residual)
    return dataclasses.replace(plan, prediction=scaled,
                               epoch_seconds=plan.epoch_seconds + (residual - 1.0) * sweeps)


def _fit_overlap(prediction: Prediction, measured: float) -> float:
    """The overlap in [0, 1] at which ``prediction``'s sweeps add up to ``measured`` seconds
    (their time falls as the overlap grows), or the nearer end."""
    def total(overlap):
        return sum(prediction.sweep_seconds(s, overlap) for s in prediction.sweeps)
    low, high = 0.0, 1.0
    if total(high) >= measured:
        return high
    if total(low) <= measured:
        return low
    for _ in range(40):
        mid = (low + high) / 2
        low, high = (mid, high) if total(mid) > measured else (low, mid)
    return (low + high) / 2


@dataclasses.dataclass(frozen=True)
class Replan:
    """A review's decision. ``plan``: the new `jgrind.plan.planner.Plan`, or None to keep the
    current one; ``line``: what the log says; ``record``: what the metrics log keeps;
    ``repriced``: the current plan's `Prediction` under the calibrated profile."""

    plan: object
    line: str
    record: dict
    repriced: object = None


class Replanner:
    """Reviews a planned run's plan against its epochs (the module's rule).

    Args:
      plan: the `jgrind.plan.planner.Plan` the run starts with (not the fast path).
      profile: the profile it was planned with.
      num_params: the planner's parameter count (for the optimizer update's time).
      recompute, keep: what the planner may do (`jgrind.plan.auto.Auto`'s).
      ssd_free: bytes the store's directory could hold once the run's own files are gone;
        None: unlimited.
    """

    def __init__(self, plan, profile, num_params: int, *, recompute: bool = True,
                 keep: bool = True, ssd_free: Optional[int] = None,
                 margin: float = PLAN_MARGIN):
        self.plan, self.profile, self.num_params = plan, profile, num_params
        self.recompute, self.keep, self.ssd_free, self.margin = recompute, keep, ssd_free, \
            margin
        self.replans = 0
        self.reviewed = False  # the current plan has been reviewed
        self.seen: list = []  # the current plan's checked epochs not yet reviewed
        # (plan, its reviewed median, its re-priced prediction) of the plan the last re-plan
        # replaced, until the new one is reviewed against it
        self.replaced: Optional[tuple] = None

    @property
    def due(self) -> bool:
        """Whether the current plan's checked epochs are still collected for a review."""
        return not self.reviewed and self.replans < MAX_REPLANS

    @property
    def ready(self) -> bool:
        """Whether enough checked epochs were collected (`REVIEW_EPOCHS`) for a review."""
        return len(self.seen) >= REVIEW_EPOCHS

    def observe(self, check, sweep_parts: Sequence[dict]) -> None:
        """Collect a checked epoch (its `jgrind.plan.check.EpochCheck` and the sweeps'
        parts) for the next review."""
        self.seen.append((check, tuple(sweep_parts)))

    def review(self, check=None, sweep_parts: Sequence[dict] = ()) -> Replan:
        """Review the current plan against the median of the collected epochs, ``check``
        (an `jgrind.plan.check.EpochCheck`) and its sweeps' parts among them when given;
        returns the decision (and, when it re-plans, takes the new plan as the current
        one)."""
        if check is not None:
            self.observe(check, sweep_parts)
        if not self.seen:
            raise ValueError("no checked epoch to review the plan against")
        epochs = [c.epoch for c, _ in self.seen]
        check, sweep_parts = median_epoch(self.seen)
        self.seen = []
        self.reviewed = True
        old = self.plan
        replaced, self.replaced = self.replaced, None
        if replaced is not None and check.measured > (1.0 + STEP_BACK_MARGIN) * replaced[1]:
            return self._step_back(replaced, check, epochs)
        w, a = old.workload, old.assignment
        calibration, profile, repriced = calibrate(
            self.profile, w, a, old.cache_bytes, self.num_params, sweep_parts,
            [m for _, _, m in check.sweeps])
        new = plan_for(w, profile, device_budget=old.device_budget,
                       host_budget=old.host_budget, directory=old.directory,
                       ssd_free=self.ssd_free, recompute=self.recompute,
                       num_params=self.num_params, partitioned=old.partitioned,
                       keep=self.keep)
        new = with_residual(new, calibration.residual)
        slow = check.deviation > self.margin
        missed = abs(check.deviation) > self.margin
        unplaced = abs(calibration.residual - 1.0)
        faster = new.epoch_seconds < (1.0 - needed_gain(self.margin, calibration)) * \
            repriced.epoch_seconds
        gains = new.epoch_seconds < (1.0 - needed_gain(REPLAN_GAIN, calibration)) * \
            repriced.epoch_seconds
        changed = not _same_plan(new, old)
        trigger = (faster or (slow and gains)) if self.replans == 0 else (missed and faster)
        label, component, predicted, measured = _furthest_part(check, HostCores.of(self.profile))
        record = {"epoch": check.epoch, "epochs": epochs,
                  "calibration": calibration.as_record(),
                  "measured_seconds": check.measured, "predicted_seconds": check.predicted,
                  "repriced_seconds": repriced.epoch_seconds,
                  "new_predicted_seconds": new.epoch_seconds, "replanned": False,
                  "furthest": [label, component, predicted, measured]}
        took = f"epoch {check.epoch} took" if len(epochs) == 1 else \
            f"epochs {epochs[0]}-{epochs[-1]} took a median of"
        why = (f"{took} {check.measured:.3g} s against {check.predicted:.3g} s predicted "
               f"({check.deviation:+.0%}); furthest off: {component} of {label}, "
               f"{measured:.3g} s against {predicted:.3g} s")
        if not (changed and trigger):
            reason = "the plan stays" if not changed else \
                "no other plan is predicted enough faster to pay for a rebuild" + (
                    f" and beyond the {unplaced:.0%} of the epoch the calibration could "
                    "not place" if unplaced > REPLAN_GAIN else "")
            return Replan(None, f"reviewed the plan: {why}; {reason}", record, repriced)
        self.replans += 1
        self.plan, self.profile, self.reviewed = new, profile, False
        self.replaced = (old, check.measured, repriced)
        m = new.prediction.memory
        record.update(replanned=True, was=_describe(old), now=_describe(new),
                      new_peaks={"device": m.peak_device, "host": m.peak_host,
                                 "ssd": m.peak_ssd})
        line = (f"re-planned: {why}; re-priced with what was measured the plan takes "
                f"{repriced.epoch_seconds:.3g} s, the new plan ({_describe(new)}, was "
                f"{_describe(old)}) {new.epoch_seconds:.3g} s")
        return Replan(new, line, record, repriced)


    def _step_back(self, replaced: tuple, check, epochs: list) -> Replan:
        """Back to the plan ``replaced`` (``(plan, its reviewed median, its re-priced
        prediction)``), whose median beat this plan's ``check``; no more reviews."""
        before, measured_before, repriced = replaced
        back = dataclasses.replace(before, prediction=repriced,
                                   epoch_seconds=repriced.epoch_seconds)
        current = self.plan
        self.plan, self.reviewed = back, True
        self.replans = MAX_REPLANS  # both plans measured: nothing left to try
        m = back.prediction.memory
        took = f"epoch {check.epoch} took" if len(epochs) == 1 else \
            f"epochs {epochs[0]}-{epochs[-1]} took a median of"
        record = {"epoch": check.epoch, "epochs": epochs, "measured_seconds": check.measured,
                  "predicted_seconds": check.predicted, "replaced_seconds": measured_before,
                  "new_predicted_seconds": back.epoch_seconds, "replanned": True,
                  "stepped_back": True, "was": _describe(current), "now": _describe(back),
                  "new_peaks": {"device": m.peak_device, "host": m.peak_host,
                                "ssd": m.peak_ssd}}
        line = (f"went back to the plan before ({_describe(back)}): {took} "
                f"{check.measured:.3g} s, {check.measured / measured_before - 1:+.0%} against "
                f"the {measured_before:.3g} s the plan before measured "
                f"(predicted {check.predicted:.3g} s)")
        return Replan(back, line, record, None)


def needed_gain(least: float, calibration: Calibration) -> float:
    """The share of the current plan's re-priced epoch a new plan must be predicted faster
    by: ``least``, and at least the share of the measured epoch the calibration's parts
    could not place (its residual), which it spreads evenly over another plan's sweeps and so
    prices that plan no better than to within it."""
    return max(least, abs(calibration.residual - 1.0))


def median_epoch(seen: Sequence[tuple]) -> tuple:
    """``(check, sweep_parts)`` of the median of a plan's checked epochs, given as ``[(check,
    sweep_parts)]``: the epoch's time, every sweep's time and every sweep's parts (per tier
    for reads and writes) each the median over the epochs. The check keeps the last epoch's
    number and the plan's prediction."""
    checks = [c for c, _ in seen]
    last = checks[-1]
    if len(seen) == 1:
        return last, tuple(seen[0][1])

    def median(values) -> float:
        return float(np.median(np.asarray(list(values), dtype=float)))

    sweeps = tuple((label, p, median(c.sweeps[i][2] for c in checks))
                   for i, (label, p, _) in enumerate(last.sweeps))
    parts = []
    for i in range(min(len(p) for _, p in seen)):
        timed = [p[i] for _, p in seen]
        one = {name: median(t[name] for t in timed) for name in timed[-1]
               if name not in ("reads", "writes")}
        for side in ("reads", "writes"):
            tiers = sorted({tier for t in timed for tier in t[side]})
            one[side] = {tier: median(t[side].get(tier, 0.0) for t in timed) for tier in tiers}
        parts.append(one)
    checked_parts = ()
    if last.parts and len(parts) == len(last.parts):
        checked_parts = tuple({"predicted": dict(q["predicted"]), "measured": m}
                              for q, m in zip(last.parts, parts))
    check = dataclasses.replace(last, measured=median(c.measured for c in checks),
                                sweeps=sweeps, parts=checked_parts)
    return check, tuple(parts)


def _same_plan(a, b) -> bool:
    x, y = a.assignment, b.assignment
    same = all(np.array_equal(p, q) for p, q in zip(x.activations + x.gradients,
                                                     y.activations + y.gradients))
    same = same and sorted(x.aggregations) == sorted(y.aggregations) and all(
        np.array_equal(x.aggregations[l], y.aggregations[l]) for l in x.aggregations)
    return same and (a.cache_bytes > 0) == (b.cache_bytes > 0)


def _describe(plan) -> str:
    """A plan in a few words: blocks per fate."""
    counts: dict = {}
    for group in plan.groups():
        for fate, n in group["blocks"].items():
            counts[fate] = counts.get(fate, 0) + n
    text = ", ".join(f"{n} {fate}" for fate, n in counts.items() if n)
    return text + (", host cache" if plan.cache_bytes else "")


def _furthest_part(check, cores: Optional[HostCores] = None) -> tuple[str, str, float, float]:
    """The sweep and part (compute, reads, writes) furthest from its prediction, in seconds;
    the whole sweep when its parts were not timed. The measured compute is the main thread's
    time outside its waits, the engine's own work for the steps with their kernels: it is
    held against both priced (`jgrind.plan.cost.Sweep.engine_bound`), not the kernels alone;
    the measured reads and writes are their threads' time, held against their bytes' price
    and the threads' own seconds (`jgrind.plan.cost.Sweep.reader_own`)."""
    if not check.parts:
        label, predicted, measured = check.furthest()
        return label, "time", predicted, measured
    best = None
    for (label, _, _), parts in zip(check.sweeps, check.parts):
        measured = parts["measured"]
        priced = parts["predicted"]
        for name in ("compute", "reads", "writes"):
            m = measured[name] if name == "compute" else sum(measured[name].values())
            p = priced_part(priced, name)
            if name == "compute":
                engine = priced.get("machinery", 0.0)
                on_host = cores is None or cores.compute_on_host
                p = p + engine if on_host else max(p, engine)
            if best is None or abs(m - p) > abs(best[3] - best[2]):
                best = (label, name, p, m)
    return best
