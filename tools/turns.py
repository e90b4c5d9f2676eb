"""Several runs' epochs taken by turns, so that they are compared under the same machine.

This machine's speed drifts by a third within minutes and by 2x within hours
(docs/results-history.md, "Where the first plans' time goes"): runs measured one after another
compare the hours they ran in as much as themselves. Here every run is built and compiled
first, then each round takes one epoch of each, the order rotated from round to round so that
no run always follows the same one. Two runs are compared by the median over rounds of their
epochs' ratio within a round: a drift slower than a round moves both alike.

tools/ is not a package: a script imports this as ``turns`` (see harness.py).
"""

from __future__ import annotations

import statistics
from typing import Mapping, Sequence


def by_turns(trainings: Mapping[str, object], rounds: int, seed: int = 1) -> dict[str, list]:
    """``{name: [seconds of its epoch in each round]}`` of ``trainings`` (`harness.Training`
    by name) after one compiling epoch each; round ``r`` starts at the ``r``-th run (cyclic).
    Every run's epoch ``e`` uses the same key, so runs that differ only in where tensors live
    do the same work."""
    import jax
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    key = jax.random.key(seed)
    names = list(trainings)
    for name in names:  # compiles, and touches each run's memory once
        trainings[name].epoch(jax.random.fold_in(key, 0))
    times: dict[str, list] = {name: [] for name in names}
    for r in range(rounds):
        start = r % len(names)
        for name in names[start:] + names[:start]:
            times[name].append(trainings[name].epoch(jax.random.fold_in(key, r + 1))[0])
    return times


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """The median over rounds of ``a``'s epoch over ``b``'s in the same round."""
    if not a or len(a) != len(b):
        raise ValueError(f"two runs' rounds to pair: {len(a)} and {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b))


def against_best(times: Mapping[str, Sequence[float]], name: str,
                 others: Sequence[str]) -> tuple[float, str, dict]:
    """``name`` against the others by paired ratios: ``(ratio, which, ratios)`` where
    ``ratios`` has ``name``'s paired ratio to each of ``others`` and ``ratio`` is the largest,
    its ratio to the one it did worst against (``which``): at most 1.05 means within 5 % of
    the best of them; below 1 means faster than each."""
    ratios = {o: paired_ratio(times[name], times[o]) for o in others}
    if not ratios:
        raise ValueError("nothing to compare against")
    which = max(ratios, key=ratios.get)
    return ratios[which], which, ratios
