"""Checks of the arguments of jgrind's public functions: a bad value is a ValueError that
names the argument and what it must be, raised before any work, not an error from deep inside
NumPy or a jitted step later."""

from __future__ import annotations

import numbers


def whole_number(value, name: str, least: int = 1) -> int:
    """``value`` if it is a whole number (not a bool, not a float) of at least ``least``, else
    ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be a whole number, at least {least}; got {value!r}")
    return int(value)
