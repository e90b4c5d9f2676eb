"""The host's cores in a sweep's price (`jgrind.plan.cost.HostCores`): a write-heavy sweep
with short steps runs its reader and writer threads side by side; a sweep whose steps keep the
cores busy does not get that."""

import pytest

from jgrind.plan.cost import HostCores, Sweep


def _sweep(compute, reads, writes):
    return Sweep("backward 1", 1, "backward", compute, reads, writes, ())


def test_short_steps_leave_the_cores_to_the_two_threads():
    two = HostCores(2, compute_on_host=True)
    s = _sweep(compute=0.5, reads=4.0, writes=7.0)
    assert s.io_seconds(0.0) == pytest.approx(11.0)  # the threads' time, one after the other
    # each thread on a core: the writes, plus the step's share of the cores
    assert s.io_seconds(0.0, two) == pytest.approx(max(7.0, 11.0 / 2 + 0.5))
    assert s.seconds(0.5, 0.0, two) < s.seconds(0.5, 0.0)


def test_steps_that_keep_the_cores_busy_leave_the_measured_share():
    two = HostCores(2, compute_on_host=True)
    s = _sweep(compute=6.0, reads=3.0, writes=3.0)  # a step as long as the I/O, as measured
    assert s.io_seconds(0.3, two) == pytest.approx(s.io_seconds(0.3))
    assert s.io_seconds(0.3, two) == pytest.approx(6.0 - 0.3 * 3.0)


def test_an_accelerators_steps_take_no_host_core():
    s = _sweep(compute=6.0, reads=3.0, writes=5.0)
    assert s.io_seconds(0.0, HostCores(16, compute_on_host=False)) == pytest.approx(5.0)
    assert s.io_seconds(0.0, HostCores(16, compute_on_host=True)) == pytest.approx(8 / 16 + 6.0)
    assert s.io_seconds(0.0, HostCores(1, compute_on_host=False)) == pytest.approx(8.0)


def test_the_profile_says_its_cores():
    class Profile:
        machine = {"cores": 2, "backend": "cpu"}
    assert HostCores.of(Profile()) == HostCores(2, True)
    Profile.machine = {"cores": 16, "backend": "gpu"}
    assert HostCores.of(Profile()) == HostCores(16, False)
    Profile.machine = {}
    assert HostCores.of(Profile()) is None
