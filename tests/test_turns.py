"""`tools/turns.py`: runs timed by turns, epoch by epoch, and compared by paired ratios that a
machine's drift does not move; and the planner benchmark's comparison built on it."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))

import turns  # noqa: E402


class _Clock:
    """A machine whose speed drifts: each epoch taken costs ``work * speed``, and the speed
    doubles every ``every`` epochs taken (of any run)."""

    def __init__(self, every: int):
        self.taken, self.every, self.log = 0, every, []

    def run(self, name: str, work: float):
        clock = self

        class Run:
            def epoch(self, key):
                clock.log.append(name)
                seconds = work * 2.0 ** (clock.taken // clock.every)
                clock.taken += 1
                return seconds, None
        return Run()


def test_each_round_takes_one_epoch_of_each_run_in_rotated_order_after_compiling():
    clock = _Clock(every=10 ** 6)
    runs = {n: clock.run(n, 1.0) for n in ("a", "b", "c")}
    times = turns.by_turns(runs, rounds=4)
    assert clock.log[:3] == ["a", "b", "c"]  # the compiling epochs, not timed
    assert clock.log[3:] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {n: len(t) for n, t in times.items()} == {"a": 4, "b": 4, "c": 4}
    with pytest.raises(ValueError):
        turns.by_turns(runs, rounds=0)


def test_paired_ratios_see_through_a_drift_that_one_run_after_another_does_not():
    """Run ``auto`` does 0.9 of ``fixed``'s work. The machine halves its speed every 3 epochs:
    taken one run after the other (as the rounds of `run_config` take them), ``auto``'s
    epochs come later and look slower; by turns the paired ratio is the true 0.9."""
    clock = _Clock(every=3)
    after = {"fixed": clock.run("fixed", 1.0), "auto": clock.run("auto", 0.9)}
    sequential = {n: [after[n].epoch(None)[0] for _ in range(3)] for n in after}
    assert min(sequential["auto"]) / min(sequential["fixed"]) == pytest.approx(1.8)
    clock = _Clock(every=3)
    times = turns.by_turns({"auto": clock.run("auto", 0.9), "fixed": clock.run("fixed", 1.0)},
                           rounds=6)
    assert turns.paired_ratio(times["auto"], times["fixed"]) == pytest.approx(0.9)
    worst, which, ratios = turns.against_best(
        {"auto": [1.0, 1.0], "a": [2.0, 2.0], "b": [0.5, 1.0]}, "auto", ["a", "b"])
    assert (worst, which) == (1.5, "b") and ratios["a"] == 0.5
    with pytest.raises(ValueError):
        turns.paired_ratio([1.0], [1.0, 2.0])
