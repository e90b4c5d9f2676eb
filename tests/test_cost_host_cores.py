"""The host's cores in a sweep's price (`jgrind.plan.cost.HostCores`): where the steps run on
the host, their kernels take every core, and the engine's own work, the reader and the writer
run around them, side by side on the cores."""

import pytest

from jgrind.plan.cost import HostCores, Sweep


def _sweep(compute, reads, writes):
    return Sweep("backward 1", 1, "backward", compute, reads, writes, ())


def test_the_io_threads_share_the_cores_around_the_kernels():
    two = HostCores(2, compute_on_host=True)
    s = _sweep(compute=0.5, reads=4.0, writes=7.0)
    # the writer's own time after the kernels: the reads fit beside it on the other core, the
    # kernels do not (a scatter-add into an SSD gradient took 1.3-1.4x its time alone on the
    # writer thread inside an epoch, its sweep's kernels about a fifth of it)
    assert s.seconds(0.5, 0.0, two) == pytest.approx(0.5 + 7.0)
    assert s.seconds(0.5, 0.0) == pytest.approx(0.5 + 11.0 - 0.5 * 0.5)  # threads one by one
    assert s.io_seconds(0.0, two) == pytest.approx(7.0)  # the I/O threads' own time
    # long kernels do not hide the writer either: 4 + 7 (it was 4 + (6 + 7) / 2 when the
    # threads shared the cores with the kernels)
    assert _sweep(4.0, 6.0, 7.0).seconds(0.5, 0.0, two) == pytest.approx(11.0)


def test_steps_that_keep_the_cores_busy_add_the_io_spread_over_the_cores():
    """A step as long as the I/O, as the profile measures the overlap: the step keeps both
    cores busy, and the I/O adds its work over the two cores, what the threads' form gives
    there too at an overlap of 0.5 when reads do not run beside writes. The form reads no
    overlap: the profile's is too noisy to price from."""
    two = HostCores(2, compute_on_host=True)
    s = _sweep(compute=6.0, reads=3.0, writes=3.0)
    assert s.seconds(0.5, 0.0, two) == pytest.approx(6.0 + 6.0 / 2)
    assert s.seconds(0.5, 0.0, two) == pytest.approx(s.seconds(0.5, 0.0))
    assert s.seconds(0.9, 0.7, two) == s.seconds(0.1, 0.0, two)
    # one core: everything one after the other
    assert _sweep(2.0, 1.0, 1.0).seconds(0.9, 0.9, HostCores(1, True)) == pytest.approx(4.0)


def test_an_accelerators_steps_take_no_host_core():
    s = _sweep(compute=6.0, reads=3.0, writes=5.0)
    sixteen = HostCores(16, compute_on_host=False)
    assert s.io_seconds(0.0, sixteen) == pytest.approx(5.0)
    assert s.seconds(0.5, 0.0, sixteen) == pytest.approx(6.0 + 5.0 - 0.5 * 5.0)
    assert s.io_seconds(0.0, HostCores(1, compute_on_host=False)) == pytest.approx(8.0)


def test_an_io_threads_own_seconds_per_step_are_on_its_thread():
    """The loader and the writer spend their own seconds per step in the store's calls
    (`jgrind.plan.cost.thread_own`) besides their bytes: on their threads, not in the cores'
    share, which the engine's own work (whose probe runs those threads too) holds already."""
    two = HostCores(2, compute_on_host=True)
    s = Sweep("forward 1", 1, "forward", 0.1, 0.4, 0.1, (), machinery=0.5, reader_own=0.2,
              writer_own=0.1)
    assert s.seconds(0.5, 0.0, two) == pytest.approx(0.1 + 0.6)  # the reader: 0.4 + 0.2
    bare = Sweep("forward 1", 1, "forward", 0.1, 0.4, 0.1, (), machinery=0.5)
    assert bare.seconds(0.5, 0.0, two) == pytest.approx(0.1 + 0.5)  # the engine's work
    assert s.io_seconds(0.0, two) == pytest.approx(0.6)
    sixteen = HostCores(16, compute_on_host=False)
    assert s.io_seconds(0.0, sixteen) == pytest.approx(0.6)  # each thread on its core
    assert s.io_seconds(0.0) == pytest.approx(0.6 + 0.2)     # one after the other


def test_a_sweep_is_priced_its_io_threads_own_seconds_per_step():
    from test_planner import MACHINERY, brute_force_case, fixed_profile
    from jgrind.plan.cost import H, Assignment, predict
    import dataclasses
    import numpy as np
    w, _ = brute_force_case()
    host = np.full(w.num_parts, H, np.int8)
    a = Assignment((host, host), (host, host), {})
    profile = fixed_profile(**MACHINERY)
    steps = int(np.sum(w.owned > 0))
    sweeps = {s.label: s for s in predict(w, a, profile).sweeps}
    assert sweeps["forward 0"].reader_own == pytest.approx(
        steps * MACHINERY["machinery_loader"])
    assert sweeps["forward 0"].writer_own == pytest.approx(
        steps * MACHINERY["machinery_writer"])
    assert sweeps["backward 0"].writer_own == 0.0  # the first layer's backward stores nothing
    unmeasured = dataclasses.replace(profile, machinery_loader=0.0, machinery_writer=0.0)
    assert all(s.reader_own == s.writer_own == 0.0
               for s in predict(w, a, unmeasured).sweeps)


def test_the_profile_says_its_cores():
    class Profile:
        machine = {"cores": 2, "backend": "cpu"}
    assert HostCores.of(Profile()) == HostCores(2, True)
    Profile.machine = {"cores": 16, "backend": "gpu"}
    assert HostCores.of(Profile()) == HostCores(16, False)
    Profile.machine = {}
    assert HostCores.of(Profile()) is None


def test_the_engines_own_work_bounds_the_sweep():
    """The engine's own work for the steps (`Sweep.machinery`): the three threads' Python,
    which take turns on the interpreter, so the sweep takes no less than it; on the host's
    cores the kernels run after it, not beside it; it runs beside the bytes moved, on the
    cores the kernels leave."""
    two = HostCores(2, compute_on_host=True)
    narrow = Sweep("backward 3", 3, "backward", 0.05, 0.1, 0.1, (), machinery=0.5)
    assert narrow.seconds(0.5, 0.0, two) == pytest.approx(0.05 + 0.5)  # the steps alone
    assert narrow.engine_bound(two) == pytest.approx(0.55)
    busy = Sweep("forward 1", 1, "forward", 0.3, 0.4, 0.35, (), machinery=0.25)
    assert busy.seconds(0.5, 0.0, two) == pytest.approx(0.3 + (0.4 + 0.35 + 0.25) / 2)
    io_bound = Sweep("forward 1", 1, "forward", 0.1, 0.9, 0.1, (), machinery=0.3)
    assert io_bound.seconds(0.5, 0.0, two) == pytest.approx(0.1 + 0.9)  # the bytes hide it
    # on an accelerator the steps take no host core: the work is a lower bound only
    sixteen = HostCores(16, compute_on_host=False)
    assert narrow.engine_bound(sixteen) == pytest.approx(0.5)
    assert narrow.seconds(0.5, 0.0, sixteen) == pytest.approx(0.5)
    assert busy.seconds(0.5, 0.0, sixteen) == busy.seconds(0.5, 0.0, sixteen)
    assert Sweep("forward 1", 1, "forward", 0.3, 0.4, 0.1, ()).seconds(0.5, 0.0, sixteen) \
        == busy.seconds(0.5, 0.0, sixteen)
