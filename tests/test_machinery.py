"""The engine's own cost per partition step (`jgrind.engine.machinery`): measured by running
the engine, installed in every profile measured, and priced per step and per SSD call."""

import dataclasses

import numpy as np
import pytest

import jgrind
from jgrind.engine import machinery
from jgrind.plan import measure as measuring, profile as profiles
from jgrind.plan.cost import D, H, S, Assignment, predict

from test_planner import MACHINERY, brute_force_case, fixed_profile


def test_the_engine_measures_its_own_cost_per_step(tmp_path):
    figures = machinery.measure(tmp_path, parts=16, epochs=2)
    assert set(figures) == {"forward", "top", "backward", "params", "ssd_call", "device_mix",
                            "kept_forward", "kept_backward", "kept_params", "loader",
                            "writer"}
    for kind in ("forward", "top", "backward", "params", "kept_forward", "kept_backward",
                 "kept_params"):
        # a step dispatches programs and hands data between three threads: well over 50 us,
        # and under a second for 32 nodes
        assert 5e-5 < figures[kind] < 1.0, (kind, figures[kind])
    assert figures["ssd_call"] >= 0.0 and figures["device_mix"] >= 0.0
    # the I/O threads' calls into the store with next to nothing to move: tens of us at
    # least (routes, a table call, the hand-over), and less than a whole step
    for thread in ("loader", "writer"):
        assert 1e-5 < figures[thread] < figures["backward"], (thread, figures[thread])
    assert not list(tmp_path.iterdir())  # the SSD run's store is gone


def test_every_profile_measured_runs_the_engines_probe(monkeypatch, tmp_path):
    """The plan layer cannot import the engine: the package installs the probe
    (``jgrind/__init__.py``), and the profile's measurement passes it on."""
    assert jgrind.plan.profile._machinery_probe is machinery.measure
    seen = {}

    def fake_measure(directory, *, quick, progress, machinery):
        seen["machinery"] = machinery
        return "a profile"
    monkeypatch.setattr(measuring, "measure", fake_measure)
    assert profiles.measure(tmp_path) == "a profile"
    assert seen["machinery"] is machinery.measure


@pytest.mark.measures_profile
def test_a_measured_profile_keeps_the_figures(monkeypatch, tmp_path):
    """`jgrind.plan.measure.measure` puts the probe's figures in the profile, and a profile
    made without them prices `sweep_step` inside each step's compute instead."""
    figures = {"forward": 1e-3, "top": 2e-3, "backward": 3e-3, "params": 4e-3,
               "ssd_call": 5e-4, "device_mix": 6e-4, "kept_forward": 7e-4,
               "kept_backward": 8e-4, "kept_params": 9e-4, "loader": 3e-4, "writer": 2e-4}
    quick = measuring.measure(tmp_path, quick=True, machinery=lambda d: figures)
    assert quick.machinery_forward == 0.0  # quick skips the probe (tests, a few seconds)
    monkeypatch.setattr(measuring, "_FULL", measuring._QUICK)
    full = measuring.measure(tmp_path, machinery=lambda d: figures)
    assert (full.machinery_forward, full.machinery_top, full.machinery_backward,
            full.machinery_params, full.machinery_ssd_call, full.machinery_device_mix,
            full.machinery_kept_forward, full.machinery_kept_backward,
            full.machinery_kept_params, full.machinery_loader, full.machinery_writer) == \
        (1e-3, 2e-3, 3e-3, 4e-3, 5e-4, 6e-4, 7e-4, 8e-4, 9e-4, 3e-4, 2e-4)
    assert profiles.Profile.from_json(full.to_json()) == full
    assert "engine step" in full.format() and "not measured" not in \
        [line for line in full.format().splitlines() if "engine step" in line][0]


def test_a_halo_call_on_a_table_split_with_the_device_costs_the_engines_figure():
    """A gather of ``H_l`` or a scatter-add into ``G_l`` whose table has blocks both on the
    device and off it adds the probe's figure to every active step of its sweep; a table all
    on the device or all off it adds nothing."""
    w, _ = brute_force_case()
    P = w.num_parts
    profile = fixed_profile(**MACHINERY)
    none = dataclasses.replace(profile, machinery_device_mix=0.0)
    split = np.array([D, H, S][:P], np.int8)
    host, device = np.full(P, H, np.int8), np.full(P, D, np.int8)
    active = int(np.sum(w.owned > 0))
    per_step = MACHINERY["machinery_device_mix"] * active

    def extra(a):
        return {s.label: s.machinery - n.machinery for s, n in
                zip(predict(w, a, profile).sweeps, predict(w, a, none).sweeps)}
    got = extra(Assignment((split, host), (device, split), {}))
    # H_0 is split: forward 0 and backward 0 gather it; G_1 is split: the top adds into it
    assert got == pytest.approx({"forward 0": per_step, "backward 1": per_step,
                                 "backward 0": per_step})
    got = extra(Assignment((device, host), (device, device), {}))
    assert got == pytest.approx({"forward 0": 0.0, "backward 1": 0.0, "backward 0": 0.0})


def test_the_probe_splits_a_table_between_the_device_and_host_ram():
    """The probe's third run has every `machinery.MIX_EVERY`-th partition's activation and
    gradient blocks on the device and the others in host RAM, so its halo calls are the
    split tables' ones the figure is for."""
    from jgrind.plan.fates import AGGREGATION, GRADIENT, Fate, TensorInfo
    fates = [machinery._device_and_host(TensorInfo(GRADIENT, 1, p, (4, 8), "float32", 128))
             for p in range(2 * machinery.MIX_EVERY)]
    assert fates.count(Fate.DEVICE) == 2 and fates.count(Fate.HOST) == len(fates) - 2
    assert machinery._device_and_host(
        TensorInfo(AGGREGATION, 0, 0, (4, 8), "float32", 128)) is Fate.RECOMPUTE


def test_the_probes_fourth_run_keeps_every_aggregation_in_host_ram():
    from jgrind.plan.fates import AGGREGATION, ACTIVATION, Fate, TensorInfo
    for name in (AGGREGATION, ACTIVATION):
        assert machinery._kept_on_host(
            TensorInfo(name, 0, 3, (4, 8), "float32", 128)) is Fate.HOST


def test_a_layer_that_keeps_its_aggregation_is_priced_the_kept_steps():
    """Keeping ``Z_0`` makes forward 0's steps store two outputs and backward 0's read it:
    each active step costs the probe's kept figure instead of the plain one; a profile
    without kept figures prices them as plain steps."""
    w, _ = brute_force_case()
    P = w.num_parts
    profile = fixed_profile(**MACHINERY)
    host = np.full(P, H, np.int8)
    plain = Assignment((host, host), (host, host), {})
    kept = Assignment((host, host), (host, host), {0: host})
    active = int(np.sum(w.owned > 0))

    def steps(a, p):
        return {s.label: s.machinery for s in predict(w, a, p).sweeps}
    base, keeping = steps(plain, profile), steps(kept, profile)
    assert keeping["forward 0"] - base["forward 0"] == pytest.approx(
        active * (MACHINERY["machinery_kept_forward"] - MACHINERY["machinery_forward"]))
    assert keeping["backward 0"] - base["backward 0"] == pytest.approx(
        active * (MACHINERY["machinery_kept_params"] - MACHINERY["machinery_params"]))
    assert keeping["backward 1"] == base["backward 1"]  # the top step: never kept
    unmeasured = dataclasses.replace(profile, machinery_kept_forward=0.0,
                                     machinery_kept_params=0.0)
    without = steps(kept, unmeasured)
    assert without["forward 0"] == pytest.approx(base["forward 0"])
    assert without["backward 0"] == pytest.approx(base["backward 0"])


def test_a_sweep_is_priced_its_steps_and_ssd_calls():
    """Each active step costs the profile's figure for its kind, plus one SSD call's for each
    table of the sweep whose block is on SSD; the steps' compute then leaves out the trivial
    pipeline's `sweep_step`, which the figure replaces."""
    w, _ = brute_force_case()
    P = w.num_parts
    with_steps = fixed_profile(**MACHINERY)
    without = fixed_profile()
    half = np.array([S, H, S][:P], np.int8)
    a = Assignment((np.full(P, D, np.int8), half), (np.full(P, D, np.int8), half), {})
    sweeps = {s.label: s for s in predict(w, a, with_steps).sweeps}
    plain = {s.label: s for s in predict(w, a, without).sweeps}
    active = int(np.sum(w.owned > 0))
    ssd_blocks = int(np.sum(half[w.owned > 0] == S))
    # forward 0 gathers H_0 (device) and writes H_1 (two blocks on SSD)
    assert sweeps["forward 0"].machinery == pytest.approx(
        active * MACHINERY["machinery_forward"] + ssd_blocks * MACHINERY["machinery_ssd_call"])
    # the top layer's backward gathers H_1 and adds into G_1: two calls per SSD block
    assert sweeps["backward 1"].machinery == pytest.approx(
        active * MACHINERY["machinery_top"] + 2 * ssd_blocks * MACHINERY["machinery_ssd_call"])
    assert sweeps["backward 0"].machinery == pytest.approx(
        active * MACHINERY["machinery_params"] + ssd_blocks * MACHINERY["machinery_ssd_call"])
    for label, s in sweeps.items():
        assert plain[label].machinery == 0.0
        assert plain[label].compute == pytest.approx(s.compute + active * without.sweep_step)
    unmeasured = dataclasses.replace(with_steps, machinery_forward=0.0)
    assert all(s.machinery == 0.0 for s in predict(w, a, unmeasured).sweeps)
