"""Checks of the arguments of jgrind's public functions: a bad value is a ValueError that
names the argument and what it must be, raised before any work, not an error from deep inside
NumPy or a jitted step later."""

from __future__ import annotations

import numbers
from typing import Optional


def whole_number(value, name: str, least: Optional[int] = 1) -> int:
    """``value`` if it is a whole number (not a bool, not a float) of at least ``least`` (None:
    any), else ValueError naming ``name``."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral)
            or (least is not None and value < least)):
        bound = "" if least is None else f", at least {least}"
        raise ValueError(f"{name} must be a whole number{bound}; got {value!r}")
    return int(value)


def number(value, name: str) -> float:
    """``value`` if it is a real number (not a bool: a string from a command line, say, is
    refused here rather than in a comparison further on), else ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number; got {value!r}")
    return value


def like_default(value, default, name: str) -> None:
    """ValueError naming ``name`` unless ``value`` is of the kind of ``default``, the keyword
    argument's default: true or false for a bool, a whole number for an int, a number for a
    float (whole numbers too); anything for other defaults."""
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be true or false; got {value!r}")
    elif isinstance(default, numbers.Integral):
        whole_number(value, name, least=None)
    elif isinstance(default, numbers.Real):
        number(value, name)
