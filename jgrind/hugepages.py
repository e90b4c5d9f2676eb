"""Transparent huge pages for the process heap: why jgrind asks glibc for them, and how.

XLA's CPU runtime and NumPy allocate every large buffer with ``malloc``. glibc serves a request
above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and gives it back with
``munmap`` on ``free``, so every new buffer is faulted in again, one 4 KiB page at a time, the
first time it is written. Every jitted step allocates its outputs and temporaries afresh, so a
run pays the faults on every step: a serial 1M-node partitioned epoch spent about as much time
in the kernel as in user code, and huge pages cut the in-memory epoch by a third and a
partitioned one by more (docs/results.md, section 4).

Where the kernel's transparent huge pages are in ``madvise`` mode (the default of Debian and
Ubuntu, among others), glibc 2.35 and later advise huge pages for the memory it maps when the
environment variable ``GLIBC_TUNABLES`` holds ``glibc.malloc.hugetlb=1``: one fault per 2 MiB
instead of per 4 KiB. glibc reads tunables once, when the process starts, so the setting has to
be in the environment before the interpreter runs:

* the ``jgrind`` command re-executes itself with it (`relaunch_with_huge_pages`), unless
  ``JGRIND_HUGE_PAGES=0``;
* a script can call `relaunch_with_huge_pages()` as its first statement, or be started with
  ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python script.py``.

The cost: memory is mapped in 2 MiB steps, so a process's resident size can grow by up to 2 MiB
per live large buffer. Nothing changes where the kernel's mode is ``always`` (huge pages
already) or ``never`` (the administrator's choice), on other C libraries, or off Linux.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, MutableMapping, Optional, Sequence

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_OUT = "JGRIND_HUGE_PAGES"          # "0": never relaunch
_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
_MIN_GLIBC = (2, 35)


def kernel_mode(path: str = _THP_MODE) -> Optional[str]:
    """The kernel's transparent-huge-page mode ("always", "madvise" or "never"), or None where
    there is no such setting (not Linux, or a kernel built without THP)."""
    try:
        with open(path, encoding="ascii") as f:
            text = f.read()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def glibc_version() -> Optional[tuple[int, int]]:
    """(major, minor) of the C library this interpreter runs on if it is glibc, else None."""
    try:
        name, version = os.confstr("CS_GNU_LIBC_VERSION").split()
        major, minor = version.split(".")[:2]
        return (int(major), int(minor)) if name == "glibc" else None
    except (AttributeError, ValueError, OSError):
        return None


def can_help() -> bool:
    """Whether asking glibc for huge pages changes anything on this machine: Linux with THP in
    ``madvise`` mode and glibc >= 2.35."""
    version = glibc_version()
    return kernel_mode() == "madvise" and version is not None and version >= _MIN_GLIBC


def requested(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether ``environ`` asks glibc for huge pages."""
    return TUNABLE in environ.get("GLIBC_TUNABLES", "").split(":")


def with_huge_pages(environ: Mapping[str, str] = os.environ) -> dict:
    """A copy of ``environ`` that asks glibc for huge pages (other tunables are kept)."""
    env = dict(environ)
    if not requested(env):
        tunables = [t for t in env.get("GLIBC_TUNABLES", "").split(":")
                    if t and not t.startswith("glibc.malloc.hugetlb=")]
        env["GLIBC_TUNABLES"] = ":".join(tunables + [TUNABLE])
    return env


def active() -> bool:
    """Whether this process runs with glibc's huge pages: requested at start where they help."""
    return can_help() and requested()


def relaunch_with_huge_pages(argv: Optional[Sequence[str]] = None) -> None:
    """Re-execute this interpreter with huge pages requested, when they would help and are not
    already on. Call it first thing, before any work: the process is replaced (same pid, same
    command line, ``argv`` or else `sys.orig_argv`), so nothing done before the call survives. Does nothing when ``JGRIND_HUGE_PAGES``
    is ``0``, when the setting is already there, or when it would not help; if the exec fails,
    the process goes on as it is."""
    if os.environ.get(OPT_OUT) == "0" or requested() or not can_help():
        return
    args = list(sys.orig_argv if argv is None else argv)
    if not args:
        return
    # the first word is the name the interpreter was started as; exec the interpreter's own path
    args[0] = sys.executable
    env: MutableMapping[str, str] = with_huge_pages()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, args, env)
    except OSError:
        return
