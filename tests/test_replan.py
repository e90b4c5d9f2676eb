"""Re-planning between epochs (`jgrind.plan.replan`): a plan whose first timed epoch shows it
wrong is replaced, and the run's numbers do not change."""

import contextlib
import io

import jax
import numpy as np
import optax
import pytest

from helpers import community_graph
from jgrind import models
from jgrind.plan import policies
from jgrind.plan.check import check_epoch
from jgrind.plan.planner import plan_run
from jgrind.plan.replan import Replanner, calibrate
from jgrind.train import train
from test_planner import fixed_profile


def _small():
    graph = community_graph(num_nodes=240, num_features=8)
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=2, dropout=0.5)
    return graph, model


def _wrong_profile():
    """A profile of a machine far faster than this one, whose SSD is faster than its RAM: the
    planner puts every block it can on SSD, and the first timed epoch shows otherwise."""
    fast_compute = dict(matmul_flops=1e15, spmm_rate=1e13, contraction_bw=1e14,
                        sweep_step=1e-9, step_latency=1e-9)
    fast_ssd = dict(ssd_read_bw=1e15, ssd_write_bw=1e15, cached_read_bw=1e15,
                    cached_write_bw=1e15, checksum_bw=1e15, ssd_latency=1e-12,
                    cached_latency=1e-12, read_call_overhead=1e-12, update_call_overhead=1e-12)
    slower_host = dict(gather_bw=1e9, scatter_add_bw=1e9, copy_bw=1e9)
    return fixed_profile(**fast_compute, **fast_ssd, **slower_host)


def _params(result):
    return jax.tree.leaves(result.params)


def test_a_wrong_plan_is_replaced_and_the_parameters_stay_exact(tmp_path, monkeypatch):
    """The first plan (SSD, from a profile that has it faster than RAM) re-plans after the
    median of epochs 1-3; after 6 epochs the parameters equal those of the same run without
    re-planning and of in-memory training. On this small graph the steps hold most of each
    sweep, so the plan off SSD is predicted only 4-6 % faster once the calibration counts the
    I/O without the kernels' share (a loaded machine made it 4.5 %): any gain re-plans here,
    which the rule's own thresholds are tested for elsewhere."""
    from jgrind.plan import replan
    monkeypatch.setattr(replan, "needed_gain", lambda least, calibration: 0.0)
    graph, model = _small()
    kwargs = dict(epochs=6, num_parts=4, host_budget=1 << 30, progress=False)
    printed = io.StringIO()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    budget = _device_floor(graph, model)
    first = []
    with contextlib.redirect_stdout(printed):
        replanned = train(jax.random.key(0), graph, model, optax.adam(1e-2),
                          policy=policies.auto(profile=_wrong_profile(),
                                               directory=tmp_path / "a", on_plan=first.append),
                          device_budget=budget, **kwargs)
        fixed = train(jax.random.key(0), graph, model, optax.adam(1e-2),
                      policy=policies.auto(profile=_wrong_profile(), directory=tmp_path / "b",
                                           replan=False),
                      device_budget=budget, **kwargs)
    in_memory = train(jax.random.key(0), graph, model, optax.adam(1e-2), epochs=6,
                      progress=False)
    replans = [r for r in replanned.history if "replan" in r]
    assert replans and replans[0]["epoch"] == 3  # (a second would need more epochs)
    assert replans[0]["replan"]["epochs"] == [1, 2, 3]
    assert replans[0]["replan"]["replanned"] and replans[0]["replan"]["calibration"]["ssd"] > 1
    assert not any("plan_review" in r for r in replanned.history[:3])
    said = [line for line in printed.getvalue().splitlines() if "re-planned" in line]
    assert len(said) == len(replans)
    assert said[0].startswith("jgrind: re-planned: epochs 1-3 took a median of ")
    assert "furthest off:" in said[0] and "the new plan (" in said[0]
    assert replanned.history[4].get("predicted_seconds") is None  # the new engine compiles
    assert replanned.history[5]["plan"] == 1 and "predicted_seconds" in replanned.history[5]
    assert not any("replan" in r for r in fixed.history)
    # the run hands back the plan it ended with: the re-planned one, off the SSD
    assert replanned.plan is not None and fixed.plan is None and in_memory.plan is None
    from jgrind.plan.replan import _describe
    assert replanned.plan is not first[0]
    assert _describe(replanned.plan) == replans[-1]["replan"]["now"] != _describe(first[0])
    # each sweep's parts: the first plan reads from SSD; waits and compute fit in the sweep
    assert set(replanned.history[1]["sweep_parts"][0]["measured"]["reads"]) == {"ssd"}
    for record in replanned.history[1:]:
        for parts, (_, _, seconds) in zip(record.get("sweep_parts", []),
                                          record.get("sweep_seconds", [])):
            m = parts["measured"]
            assert 0 <= m["compute"] and m["compute"] + m["read_wait"] + m["write_wait"] \
                <= seconds + 1e-9
            assert set(m["reads"]) | set(m["writes"]) <= {"device", "host", "ssd"}
    for a, b in zip(_params(replanned), _params(fixed)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(_params(replanned), _params(in_memory)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)


def _device_floor(graph, model) -> int:
    """A device budget that holds one partition's working set and little else."""
    from jgrind.plan.cost import Workload
    from jgrind.partition import partition_graph
    from jgrind.partition.partitioners import label_propagation
    normalized = model.normalize(graph)
    pg = partition_graph(normalized, label_propagation(normalized, 4, seed=0), num_parts=4)
    return int(Workload.build(pg, model).working_set() * 1.05)


def _as_measured(p, profile, slow: float = 1.0, ssd_writes: float = 0.0,
                 sweep_scale: float = 1.0) -> list:
    """Every sweep's parts as the engine times them when it runs ``slow`` times the plan's
    own prices (`jgrind.engine.timing`): the main thread's compute is the kernels and the
    engine's own work for them; an I/O thread's seconds are its bytes and its own seconds
    per step (`Sweep.reader_own`), and on the host's cores they hold the share of its sweep
    that the kernels held the cores (`jgrind.plan.replan.kernel_shares`).
    ``ssd_writes``: seconds of SSD writes added to every sweep; ``sweep_scale``: the sweeps
    measured that much longer than priced, by time no part shows."""
    from jgrind.plan.cost import HostCores
    from jgrind.plan.replan import kernel_shares
    cores = HostCores.of(profile)
    seconds = [sweep_scale * p.sweep_seconds(s) for s in p.sweeps]
    main = [{"compute": max(s.compute, s.engine_bound(cores))} for s in p.sweeps]
    shares = kernel_shares(p, main, seconds, cores) or [0.0] * len(p.sweeps)
    parts = []
    for s, q in zip(p.sweeps, shares):
        writes = {"host": (slow * s.writes + s.writer_own) / (1 - q)}
        if ssd_writes:
            writes["ssd"] = slow * ssd_writes
        parts.append({"compute": slow * max(s.compute, s.engine_bound(cores)),
                      "reads": {"host": (slow * s.reads + s.reader_own) / (1 - q)},
                      "writes": writes,
                      "read_wait": 0.0, "write_wait": 0.0})
    return parts


def _sweeps_slower_than_parts(scale: float) -> tuple:
    """A plan's epoch measured with every part as priced but every sweep ``scale`` times its
    price (time no part of the form holds): ``(plan, profile, parts, check, calibration,
    repriced)``, the last two `calibrate`'s."""
    graph, model = _small()
    profile = fixed_profile()
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    p = plan.prediction
    parts = _as_measured(p, profile, sweep_scale=scale)
    sweeps = [(s.label, scale * p.sweep_seconds(s)) for s in p.sweeps]
    measured = sum(t for _, t in sweeps) + p.update_seconds
    check = check_epoch(p, sweeps, measured, epoch=1, measured_parts=parts)
    calibration, _, repriced = calibrate(profile, plan.workload, plan.assignment,
                                         plan.cache_bytes, 0, parts, [t for _, t in sweeps])
    return plan, profile, parts, check, calibration, repriced


def test_a_right_profile_does_not_replan():
    """Measurements equal to the prediction calibrate the profile to itself, and the plan
    stays."""
    graph, model = _small()
    profile = fixed_profile()
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    assert not plan.in_memory
    p = plan.prediction
    sweeps = [(s.label, p.sweep_seconds(s)) for s in p.sweeps]
    parts = _as_measured(p, profile)
    check = check_epoch(p, sweeps, p.epoch_seconds, epoch=1, measured_parts=parts)
    calibration, _, repriced = calibrate(profile, plan.workload, plan.assignment,
                                         plan.cache_bytes, 0, parts, [s for _, s in sweeps])
    assert abs(calibration.compute - 1) < 1e-6 and abs(calibration.memory - 1) < 1e-6
    replanner = Replanner(plan, profile, 0)
    review = replanner.review(check, parts)
    assert review.plan is None and not review.record["replanned"]
    assert not replanner.due and replanner.replans == 0


def test_a_slow_epoch_replans_only_for_a_gain_worth_a_rebuild(monkeypatch):
    """An epoch 60 % slower than predicted, everywhere: a plan predicted 2 % faster than the
    current one re-priced is not worth a compiled epoch (the plan stays and the review hands
    back the re-priced prediction); one 10 % faster is."""
    import dataclasses
    from jgrind.plan import replan
    graph, model = _small()
    profile = fixed_profile()
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    p = plan.prediction
    slow = 1.6
    sweeps = [(s.label, slow * p.sweep_seconds(s)) for s in p.sweeps]
    parts = _as_measured(p, profile, slow)
    check = check_epoch(p, sweeps, slow * p.epoch_seconds, epoch=1, measured_parts=parts)
    assert check.off()
    _, _, repriced = calibrate(profile, plan.workload, plan.assignment, plan.cache_bytes, 0,
                               parts, [s for _, s in sweeps])
    other = tuple(np.roll(a, 1) if a.size > 1 and np.unique(a).size > 1 else 3 - a
                  for a in plan.assignment.activations)
    differing = dataclasses.replace(plan, assignment=dataclasses.replace(
        plan.assignment, activations=other))
    for gain, replans in ((0.02, False), (0.10, True)):
        new = dataclasses.replace(differing, epoch_seconds=(1 - gain) * repriced.epoch_seconds)
        monkeypatch.setattr(replan, "plan_for", lambda *a, new=new, **k: new)
        review = Replanner(plan, profile, 0).review(check, parts)
        assert (review.plan is not None) == replans, (gain, review.line)
        assert review.repriced.epoch_seconds == pytest.approx(repriced.epoch_seconds)


def test_a_replan_needs_a_gain_beyond_what_the_calibration_could_not_place(monkeypatch):
    """Parts measured as priced but every sweep 1.3x its price: the calibration places none
    of the extra 30 % (its residual, spread evenly over any plan's sweeps). A plan predicted
    15 % faster than the current one re-priced is within that and the plan stays, though the
    epoch was 30 % slow and 15 % is more than `REPLAN_GAIN`; one 35 % faster is replaced.
    (On the planner benchmark's deep-sage configuration the reviews left 13-36 % unplaced in
    runs AQ-AU and re-planned for 6-17 % to plans that measured as fast or slower.)"""
    import dataclasses
    from jgrind.plan import replan
    plan, profile, parts, check, calibration, repriced = _sweeps_slower_than_parts(1.3)
    assert check.deviation > 0.25  # slow: a gain over REPLAN_GAIN would do without the rule
    assert calibration.residual == pytest.approx(1.3, rel=1e-2)
    other = tuple(np.roll(a, 1) if a.size > 1 and np.unique(a).size > 1 else 3 - a
                  for a in plan.assignment.activations)
    differing = dataclasses.replace(plan, assignment=dataclasses.replace(
        plan.assignment, activations=other))
    monkeypatch.setattr(replan, "with_residual", lambda new, residual: new)
    for gain, replans in ((0.15, False), (0.35, True)):
        new = dataclasses.replace(differing, epoch_seconds=(1 - gain) * repriced.epoch_seconds)
        monkeypatch.setattr(replan, "plan_for", lambda *a, new=new, **k: new)
        review = Replanner(plan, profile, 0).review(check, parts)
        assert (review.plan is not None) == replans, (gain, review.line)
        if not replans:  # the log says why
            assert "30% of the epoch the calibration could not place" in review.line


def test_a_replan_that_measures_slower_goes_back_to_the_plan_before(monkeypatch):
    """The first plan's epochs run 60 % over it and another plan is predicted far faster: the
    run re-plans. The new plan's median measured 20 % over the first plan's: the run goes
    back to the first plan, held against its re-priced prediction, and reviews no more; 5 %
    over is the rule's ordinary review (the plan stays)."""
    import dataclasses
    from jgrind.plan import replan
    from jgrind.plan.replan import STEP_BACK_MARGIN, _same_plan
    graph, model = _small()
    profile = fixed_profile()
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    slow = 1.6

    def epoch(p, factor, at):
        sweeps = [(s.label, factor * p.sweep_seconds(s)) for s in p.sweeps]
        parts = _as_measured(p, profile, factor)
        return check_epoch(p, sweeps, factor * p.epoch_seconds, epoch=at,
                           measured_parts=parts), parts
    check, parts = epoch(plan.prediction, slow, 1)
    other = tuple(np.roll(a, 1) if a.size > 1 and np.unique(a).size > 1 else 3 - a
                  for a in plan.assignment.activations)
    new = dataclasses.replace(plan, assignment=dataclasses.replace(
        plan.assignment, activations=other), epoch_seconds=0.5 * plan.epoch_seconds)
    monkeypatch.setattr(replan, "plan_for", lambda *a, **k: new)
    for over, back in ((1.2, True), (1.05, False)):
        assert (over > 1 + STEP_BACK_MARGIN) == back
        replanner = Replanner(plan, profile, 0)
        first = replanner.review(check, parts)
        assert first.plan is not None and _same_plan(first.plan, new) and replanner.due
        later, later_parts = epoch(first.plan.prediction, 1.0, 5)
        later = dataclasses.replace(later, measured=over * check.measured)
        second = replanner.review(later, later_parts)
        if not back:
            assert second.plan is None and not second.record["replanned"]
            continue
        assert second.record["stepped_back"] and second.record["replanned"]
        assert _same_plan(second.plan, plan) and replanner.plan is second.plan
        assert second.plan.prediction is first.repriced  # held against what it measured
        assert second.plan.epoch_seconds == pytest.approx(first.repriced.epoch_seconds)
        assert second.line.startswith("went back to the plan before (")
        assert "+20% against the" in second.line
        assert not replanner.due


def test_a_fixed_policy_never_replans():
    graph, model = _small()
    result = train(jax.random.key(0), graph, model, optax.adam(1e-2), epochs=3,
                   policy=policies.host_offload(), num_parts=3, progress=False)
    assert not any("replan" in r or "plan_review" in r for r in result.history)


def test_a_review_calibrates_to_the_median_epoch_not_an_outlier():
    """Three checked epochs, one of them twice as slow everywhere: the review calibrates to
    the other two (the profile's own figures), and keeps the plan."""
    from jgrind.plan.replan import REVIEW_EPOCHS, median_epoch
    graph, model = _small()
    profile = fixed_profile()
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    p = plan.prediction
    replanner = Replanner(plan, profile, 0)
    assert REVIEW_EPOCHS == 3
    for epoch, slow in ((1, 1.0), (2, 2.0), (3, 1.0)):
        sweeps = [(s.label, slow * p.sweep_seconds(s)) for s in p.sweeps]
        parts = _as_measured(p, profile, slow, ssd_writes=1e-3)
        check = check_epoch(p, sweeps, slow * p.epoch_seconds, epoch=epoch,
                            measured_parts=parts)
        assert not replanner.ready
        replanner.observe(check, parts)
    assert replanner.ready and replanner.due
    median, parts = median_epoch(replanner.seen)
    assert median.epoch == 3 and median.measured == pytest.approx(p.epoch_seconds)
    assert parts[0]["compute"] == pytest.approx(p.sweeps[0].compute)
    assert parts[0]["writes"]["ssd"] == pytest.approx(1e-3)
    review = replanner.review()
    assert review.plan is None and review.record["epochs"] == [1, 2, 3]
    assert abs(review.record["calibration"]["compute"] - 1) < 1e-6
    assert not replanner.due and not replanner.seen


def test_a_review_counts_the_engines_own_work_in_the_measured_compute_on_the_host():
    """On the host's cores a sweep's measured compute (the main thread's time outside its I/O
    waits) is its kernels *and* the engine's own work for its steps, one after the other
    (`Sweep.engine_bound`). Epochs measured exactly as the plan prices them calibrate the
    compute by 1; counting only the larger of the two would read the engine's work as slow
    kernels and scale the compute up."""
    from test_planner import MACHINERY
    from jgrind.plan.cost import HostCores
    from jgrind.plan.profile import machine_fingerprint
    graph, model = _small()
    machine = {**machine_fingerprint(), "cores": 2, "backend": "cpu"}
    # the engine's work per step about as long as the small graph's kernels
    profile = fixed_profile(machine=machine, **{k: v / 50 for k, v in MACHINERY.items()})
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    p = plan.prediction
    cores = HostCores.of(profile)
    assert cores.compute_on_host
    # both parts weigh in what the sweeps measure: the test checks something
    kernels, engine = (sum(s.compute for s in p.sweeps), sum(s.machinery for s in p.sweeps))
    assert 0.3 < engine / kernels < 3
    replanner = Replanner(plan, profile, 0)
    for epoch in (1, 2, 3):
        sweeps = [(s.label, p.sweep_seconds(s)) for s in p.sweeps]
        parts = _as_measured(p, profile)
        replanner.observe(check_epoch(p, sweeps, p.epoch_seconds, epoch=epoch,
                                      measured_parts=parts), parts)
    review = replanner.review()
    assert review.record["calibration"]["compute"] == pytest.approx(1.0, abs=1e-3)


def test_a_review_on_the_host_reads_the_io_threads_work_without_the_kernels_time():
    """On the host's cores nothing else gets far while the steps' kernels run
    (`jgrind.plan.cost.HostCores`): an I/O thread spread over its sweep stands still for the
    kernels' share of it, and the engine times that as I/O. Epochs measured so, exactly as
    the plan prices them, calibrate every part by 1 and re-price the plan at what they
    measured; taken as the threads' own work, the I/O would read slower by that share, and
    the re-priced plan would come out slower than it ran (host-tight's review in run AM:
    6.04 s re-priced against a median of 4.94 s measured)."""
    from jgrind.plan.cost import HostCores
    from jgrind.plan.profile import machine_fingerprint
    graph, model = _small()
    machine = {**machine_fingerprint(), "cores": 2, "backend": "cpu"}
    profile = fixed_profile(machine=machine)
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    p = plan.prediction
    assert HostCores.of(profile).compute_on_host
    seconds = [p.sweep_seconds(s) for s in p.sweeps]
    shares = [s.compute / t for s, t in zip(p.sweeps, seconds)]
    # the kernels hold a good share of the sweeps that move bytes: the test checks something
    assert max(q for q, s in zip(shares, p.sweeps) if s.reads + s.writes > 0) > 0.2
    parts = [{"compute": s.engine_bound(HostCores.of(profile)),
              "reads": {"host": s.reads / (1 - q)}, "writes": {"host": s.writes / (1 - q)},
              "read_wait": 0.0, "write_wait": 0.0} for s, q in zip(p.sweeps, shares)]
    calibration, _, repriced = calibrate(profile, plan.workload, plan.assignment,
                                         plan.cache_bytes, 0, parts, seconds)
    assert calibration.memory == pytest.approx(1.0, rel=1e-3)
    assert calibration.compute == pytest.approx(1.0, rel=1e-3)
    assert repriced.epoch_seconds == pytest.approx(p.epoch_seconds, rel=1e-2)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_a_review_reads_the_io_threads_own_seconds_as_theirs_not_slow_bytes(backend):
    """An I/O thread's measured time is its bytes and its own seconds per step (the store's
    calls with their routes and hand-overs, `machinery_loader` and `machinery_writer`).
    Epochs measured so, at the plan's own prices, calibrate the I/O by 1 and re-price the
    plan at what they measured; read as bytes, the threads' own seconds made the SSD tier
    2.5-3.9x slower than priced in the planner benchmark's re-planned runs (AQ-AT), and the
    re-plans moved blocks off it to plans that measured slower."""
    from test_planner import MACHINERY
    from jgrind.plan.profile import machine_fingerprint
    graph, model = _small()
    machine = {**machine_fingerprint(), "cores": 2, "backend": backend}
    profile = fixed_profile(machine=machine, **MACHINERY)
    plan = plan_run(graph, model, profile, device_budget=_device_floor(graph, model),
                    host_budget=1 << 30, num_parts=4)
    p = plan.prediction
    own = sum(s.reader_own + s.writer_own for s in p.sweeps)
    io = sum(s.reads + s.writes for s in p.sweeps)
    assert own > 0.2 * io  # the threads' own seconds weigh in: the test checks something
    parts = _as_measured(p, profile)
    seconds = [p.sweep_seconds(s) for s in p.sweeps]
    calibration, _, repriced = calibrate(profile, plan.workload, plan.assignment,
                                         plan.cache_bytes, 0, parts, seconds)
    assert calibration.memory == pytest.approx(1.0, rel=1e-3)
    assert calibration.compute == pytest.approx(1.0, rel=1e-3)
    assert repriced.epoch_seconds == pytest.approx(p.epoch_seconds, rel=1e-2)


def test_a_review_holds_the_run_against_what_its_sweeps_measured():
    """Parts measured as priced but every sweep 1.2x its price: time that no part of the form
    holds (the main job's reviews on the host re-priced its plan 20 % under the epochs they
    reviewed). The review keeps it as a residual on every sweep: the plan re-priced at what
    the reviewed epochs measured, the new plan priced with the same residual, and the plan
    kept, as it would be without the residual."""
    plan, profile, parts, check, calibration, repriced = _sweeps_slower_than_parts(1.2)
    measured = check.measured
    assert calibration.residual == pytest.approx(1.2, rel=1e-2)
    assert abs(calibration.compute - 1) < 1e-3 and abs(calibration.memory - 1) < 1e-3
    assert repriced.epoch_seconds == pytest.approx(measured, rel=1e-2)
    review = Replanner(plan, profile, 0).review(check, parts)
    assert review.plan is None
    assert review.record["repriced_seconds"] == pytest.approx(measured, rel=1e-2)
    # the same plan planned again carries the residual too: it is priced as re-priced
    assert review.record["new_predicted_seconds"] == pytest.approx(measured, rel=1e-2)


def test_the_review_names_the_part_furthest_off_with_the_engines_work_in_the_compute():
    """A sweep's measured compute is the main thread's time outside its waits: the steps'
    kernels and the engine's own work for them. The review's "furthest off" holds it against
    both priced, so a sweep whose engine work was priced right is not named for it; on an
    accelerator the two run side by side (the longer counts)."""
    import types

    from jgrind.plan.cost import HostCores
    from jgrind.plan.replan import _furthest_part

    def part(compute, machinery, reads, measured_compute, measured_reads):
        return {"predicted": {"compute": compute, "machinery": machinery, "reads": reads,
                              "writes": 0.0},
                "measured": {"compute": measured_compute, "reads": {"host": measured_reads},
                             "writes": {}}}
    check = types.SimpleNamespace(
        sweeps=[("forward 0", 0.0, 0.0), ("forward 1", 0.0, 0.0)],
        parts=[part(0.10, 0.35, 0.20, 0.46, 0.20),    # compute as priced with the engine's
               part(0.10, 0.05, 0.20, 0.15, 0.40)])   # reads 0.2 s over their price
    host = HostCores(count=2, compute_on_host=True)
    assert _furthest_part(check, host) == ("forward 1", "reads", 0.20, 0.40)
    device = HostCores(count=2, compute_on_host=False)
    assert _furthest_part(check, device)[:3] == ("forward 1", "reads", 0.20)
    check.parts[0]["measured"]["compute"] = 0.80      # now the compute is off, by 0.35 s
    assert _furthest_part(check, host) == ("forward 0", "compute", pytest.approx(0.45), 0.80)
    assert _furthest_part(check, device) == ("forward 0", "compute", 0.35, 0.80)
