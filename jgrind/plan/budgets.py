"""Memory budgets: bytes a run may hold on the device and in host RAM.

A budget is a whole number of bytes, or None for no limit. Code that compares or adds budgets
stands `UNLIMITED` in for None: a number no real budget reaches, that stays exact as an
integer and far from overflowing int64 when a few are added.
"""

from __future__ import annotations

import numbers
from typing import Optional

from jgrind.plan.fates import PolicyError

UNLIMITED = 1 << 62


def check_budget(value, name: str) -> Optional[int]:
    """``value`` as bytes (None: unlimited), or PolicyError: a budget is a whole number of
    bytes, 0 or more, e.g. ``2 << 30`` for 2 GiB (the command line reads "2GiB")."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise PolicyError(f"{name} must be a whole number of bytes, 0 or more (None: "
                          f"unlimited), e.g. 2 << 30 for 2 GiB; got {value!r}")
    return int(value)


def smaller(own: Optional[int], run: Optional[int]) -> Optional[int]:
    """The tighter of a policy's own budget and the run's (None: no limit)."""
    return run if own is None else own if run is None else min(own, run)
