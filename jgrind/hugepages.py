"""Transparent huge pages for the process heap: why jgrind asks glibc for them, and how.

XLA's CPU runtime allocates its buffers with ``malloc`` (NumPy already advises huge pages for
its own large arrays). glibc serves a request above its mmap threshold (at most 32 MiB) with a
fresh ``mmap`` and gives it back with ``munmap`` on ``free``, so every new buffer is faulted in
again, one 4 KiB page at a time, the first time it is written. Every jitted step allocates its
outputs and temporaries afresh, so a run pays the faults on every step: a serial 1M-node
partitioned epoch spent about as much time in the kernel as in user code (docs/results.md,
section 4).

Where the kernel's transparent huge pages are in ``madvise`` mode (the default of Debian and
Ubuntu, among others), glibc 2.35 and later advise huge pages for the memory it maps when the
environment variable ``GLIBC_TUNABLES`` holds ``glibc.malloc.hugetlb=1``: one fault per 2 MiB
instead of per 4 KiB. glibc reads tunables once, when the process starts, so the setting has to
be in the environment before the interpreter runs.

It is **opt-in**, because it pays only where buffers are large. Measured on the 2-core test
machine (docs/results.md, section 4): a 1M-node graph trains 1.37x faster with it in memory and
1.42x faster with host offload in 8 partitions; the planner benchmark's graphs, cut into
64-128 small partitions, run the same either way. And the planner's cost model is calibrated
without it: a profile measured with huge pages has faster compute and transfer rates than small
partitions get, so its predictions for them come out too short. To turn it on:

* ``JGRIND_HUGE_PAGES=1 jgrind ...``: the command re-executes itself with the setting
  (`relaunch_if_wanted`); so do the benchmarks in ``tools/``;
* a script calls `relaunch_with_huge_pages()` as its first statement, or is started with
  ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1 python script.py``.

Hardware profiles record whether it was on (`jgrind.plan.profile`); one measured the other way
is measured again. The cost: memory is mapped in 2 MiB steps, so resident memory grows a little
(0.16 GiB in the 3M-node memory-wall run). Nothing changes where the kernel's mode is ``always``
(huge pages already) or ``never`` (the administrator's choice), on other C libraries, or off
Linux.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, MutableMapping, Optional, Sequence

TUNABLE = "glibc.malloc.hugetlb=1"
OPT_IN = "JGRIND_HUGE_PAGES"           # "1": the jgrind command and the tools relaunch
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


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the user asked for huge pages (``JGRIND_HUGE_PAGES=1``; ``true``, ``yes`` and
    ``on`` work too, in any case)."""
    return environ.get(OPT_IN, "").strip().lower() in ("1", "true", "yes", "on")


def relaunch_if_wanted() -> None:
    """`relaunch_with_huge_pages` if the user asked for it: what the ``jgrind`` command and the
    benchmarks in ``tools/`` call before any work."""
    if wanted():
        relaunch_with_huge_pages()


def relaunch_with_huge_pages(argv: Optional[Sequence[str]] = None) -> None:
    """Re-execute this interpreter with huge pages requested, when they would help and are not
    already on. Call it first thing, before any work: the process is replaced (same pid, same
    command line, ``argv`` or else `sys.orig_argv`), so nothing done before the call survives.
    Does nothing when the setting is already there or would not help; if the exec fails, the
    process goes on as it is."""
    if requested() or not can_help():
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
