"""How the process's C allocator hands out memory: glibc settings asked for at process start.

XLA's CPU runtime allocates every jitted step's outputs and temporaries with ``malloc``, and
NumPy its arrays. glibc serves a request above its mmap threshold (at most 32 MiB) with a fresh
``mmap`` and gives it back with ``munmap`` on ``free``. So every large buffer is new memory to
the kernel: each page faults on its first write, and the kernel zeroes it. An out-of-core epoch
allocates and frees many such buffers, a partition at a time: on the 2-core test machine a
``host_offload`` epoch of a 1M-node GCN took 4.1M page faults and as much system time as user
time, against 1.4M faults for the whole-graph step (docs/results-history.md, section 4).

Two settings change that. Both are glibc *tunables* (``GLIBC_TUNABLES``), which glibc reads once,
when the process starts: a setting has to be in the environment before the interpreter runs,
so jgrind re-executes the interpreter with it (`relaunch`).

* `HUGE_PAGES` (``JGRIND_HUGE_PAGES=1``): glibc advises transparent huge pages for the memory it
  maps (``glibc.malloc.hugetlb=1``, glibc 2.35+, kernel THP in ``madvise`` mode, the default of
  Debian and Ubuntu): one fault per 2 MiB instead of per 4 KiB. The pages are still new and
  still zeroed. Resident memory grows a little (memory is mapped in 2 MiB steps).
* `HEAP_REUSE` (``JGRIND_REUSE_HEAP=1``): glibc keeps freed memory and hands it out again. Large
  requests come from the heap instead of their own mappings (``mmap_max=0``), one heap serves
  every thread (``arena_max=1``: another thread's arena would map its large blocks anyway), and
  the heap is never trimmed back to the kernel (``trim_threshold``). Once the heap has grown to
  what an epoch needs (two to three epochs), an epoch takes almost no page faults. The price is
  resident memory: the heap holds the most the process ever needed *plus fragmentation*, and
  nothing is given back until the process ends.

Both are **opt-in**:
* they pay where buffers are large; the planner's small-partition graphs run the same;
* the planner's cost model is calibrated without them (a profile records whether they were on,
  and one measured the other way is measured again);
* `HEAP_REUSE` can raise peak resident memory, which budgets do not cover: on the 1M-node GCN
  the whole-graph step peaked at 7.05 GiB in one run and 17.9 GiB in another (against 6.97
  without it), ``host_offload`` at 8.7-9.1 GiB (against 7.6-7.7) (docs/results-history.md,
  section 4). Leave it off where resident memory is what limits you.

Nothing changes off glibc, and huge pages change nothing where the kernel's mode is ``always``
(already on) or ``never`` (the administrator's choice).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable, Iterable, Mapping, MutableMapping, Optional, Sequence

_THP_MODE = "/sys/kernel/mm/transparent_hugepage/enabled"
_MIN_GLIBC_HUGETLB = (2, 35)
_MIN_GLIBC_TUNABLES = (2, 26)


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


def _glibc_at_least(version: tuple[int, int]) -> bool:
    found = glibc_version()
    return found is not None and found >= version


def _tunable_name(tunable: str) -> str:
    return tunable.split("=", 1)[0]


@dataclasses.dataclass(frozen=True)
class Setting:
    """One allocator setting: the glibc tunables it sets, the environment variable that asks
    for it, and whether it changes anything on this machine."""

    name: str
    opt_in: str                          # environment variable: "1" asks for the setting
    tunables: tuple[str, ...]            # "glibc.malloc.<name>=<value>"
    helps: Callable[[], bool]            # whether it changes anything here

    def can_help(self) -> bool:
        return self.helps()

    def requested(self, environ: Mapping[str, str] = os.environ) -> bool:
        """Whether ``environ`` holds every tunable of the setting, with its value."""
        present = environ.get("GLIBC_TUNABLES", "").split(":")
        return all(t in present for t in self.tunables)

    def active(self) -> bool:
        """Whether this process runs with the setting: requested at start where it helps."""
        return self.can_help() and self.requested()

    def wanted(self, environ: Mapping[str, str] = os.environ) -> bool:
        """Whether the user asked for it (``1``; ``true``, ``yes`` and ``on`` work too)."""
        return environ.get(self.opt_in, "").strip().lower() in ("1", "true", "yes", "on")


HUGE_PAGES = Setting(
    "glibc huge pages", "JGRIND_HUGE_PAGES", ("glibc.malloc.hugetlb=1",),
    helps=lambda: kernel_mode() == "madvise" and _glibc_at_least(_MIN_GLIBC_HUGETLB))

# 1 TiB: never reached, so the heap is never trimmed
HEAP_REUSE = Setting(
    "heap reuse", "JGRIND_REUSE_HEAP",
    ("glibc.malloc.mmap_max=0", "glibc.malloc.arena_max=1",
     "glibc.malloc.trim_threshold=1099511627776"),
    helps=lambda: _glibc_at_least(_MIN_GLIBC_TUNABLES))

SETTINGS = (HUGE_PAGES, HEAP_REUSE)


def with_settings(settings: Iterable[Setting], environ: Mapping[str, str] = os.environ) -> dict:
    """A copy of ``environ`` whose ``GLIBC_TUNABLES`` holds every tunable of ``settings``
    (replacing other values of the same tunables, keeping unrelated ones)."""
    env = dict(environ)
    wanted = [t for s in settings for t in s.tunables]
    names = {_tunable_name(t) for t in wanted}
    kept = [t for t in env.get("GLIBC_TUNABLES", "").split(":")
            if t and _tunable_name(t) not in names]
    if wanted:
        env["GLIBC_TUNABLES"] = ":".join(kept + wanted)
    return env


def summary() -> str:
    """One line for benchmark reports: which settings this process runs with."""
    return ", ".join(f"{s.name} {'on' if s.active() else 'off'}" for s in SETTINGS)


def relaunch_if_wanted(environ: Mapping[str, str] = os.environ) -> None:
    """`relaunch` with the settings the user asked for (their ``JGRIND_*`` variables): what the
    ``jgrind`` command and the benchmarks in ``tools/`` call before any work."""
    chosen = [s for s in SETTINGS if s.wanted(environ)]
    if chosen:
        relaunch(chosen)


def relaunch_with_huge_pages(argv: Optional[Sequence[str]] = None) -> None:
    """`relaunch` with `HUGE_PAGES` (the entry point scripts used before heap reuse existed)."""
    relaunch([HUGE_PAGES], argv)


def relaunch(settings: Iterable[Setting], argv: Optional[Sequence[str]] = None) -> None:
    """Re-execute this interpreter with ``settings``, those that would help and are not already
    on. Call it first thing, before any work: the process is replaced (same pid, same command
    line, ``argv`` or else `sys.orig_argv`), so nothing done before the call survives. Does
    nothing when every setting is already there or would not help; if the exec fails, the
    process goes on as it is."""
    missing = [s for s in settings if s.can_help() and not s.requested()]
    if not missing:
        return
    args = list(sys.orig_argv if argv is None else argv)
    if not args:
        return
    # the first word is the name the interpreter was started as; exec the interpreter's own path
    args[0] = sys.executable
    env: MutableMapping[str, str] = with_settings(missing)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, args, env)
    except OSError:
        return
