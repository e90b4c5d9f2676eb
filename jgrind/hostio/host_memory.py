"""Host RAM this process may use: the machine's, or less inside a memory cgroup.

A container, a Slurm job (``--mem``) or a systemd slice runs a process in a memory cgroup,
and the kernel's OOM killer stops the process once the cgroup's usage reaches its limit,
while ``/proc/meminfo`` (and so ``psutil.virtual_memory()``) still shows the whole
machine's RAM. A planner that takes half the machine's free RAM as its host budget would then
plan for memory the process can never have: on a 512 GiB node, a job given 32 GiB would be
planned 200 GiB of host tables and be killed. `available` and `total` are the least of the
machine's figures and the limits of the process's cgroup and of every cgroup above it (a
parent's limit binds its children too), for cgroup v2 and the v1 memory controller.

The page cache a cgroup holds counts towards its usage, but the kernel reclaims it before
it kills anything, so it counts as available here, as it does in ``MemAvailable``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional

import psutil

# v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX pages, rounded); anything from
# here up is no limit
_UNLIMITED = 1 << 60


@dataclasses.dataclass(frozen=True)
class CgroupMemory:
    """The memory limits that bind this process, over its cgroup and the cgroups above it."""

    limit: int      # the least limit, bytes
    headroom: int   # the least of (limit - usage that is not page cache), bytes
    path: str       # the cgroup directory whose limit is the least (the RAM there is)


def _mounts(proc: pathlib.Path) -> list[tuple[str, str, str, str]]:
    """``(fstype, mount root, mount point, super options)`` of every cgroup mount."""
    out = []
    try:
        lines = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        out.append((tail[0], fields[3], fields[4], tail[2]))
    return out


def _membership(proc: pathlib.Path) -> dict[str, str]:
    """This process's cgroup paths: ``"v2"`` (the unified hierarchy) and ``"memory"`` (v1)."""
    paths = {}
    try:
        lines = (proc / "cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            paths["v2"] = path
        elif "memory" in controllers.split(","):
            paths["memory"] = path
    return paths


def _directory(mount_root: str, mount_point: str, path: str) -> pathlib.Path:
    """Where cgroup ``path`` (as /proc/self/cgroup names it) is on a mount of ``mount_root``.
    In a container the mount is often the container's own cgroup while the path names it from
    the host's root; then the mount point itself is the process's cgroup."""
    root = mount_root.rstrip("/")
    if path == root or path.startswith(root + "/"):
        return pathlib.Path(mount_point) / path[len(root):].lstrip("/")
    return pathlib.Path(mount_point)


def _read_int(path: pathlib.Path) -> Optional[int]:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return _UNLIMITED
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: pathlib.Path, *keys: str) -> int:
    """The first of ``keys`` found in a ``memory.stat`` file, else 0."""
    try:
        values = dict(line.split()[:2] for line in path.read_text().splitlines()
                      if len(line.split()) >= 2)
    except OSError:
        return 0
    for key in keys:
        if key in values:
            try:
                return int(values[key])
            except ValueError:
                return 0
    return 0


def _levels(directory: pathlib.Path, mount_point: str):
    """``directory`` and each directory above it, up to and including ``mount_point``."""
    top = pathlib.Path(mount_point)
    d = directory
    while True:
        yield d
        if d == top or d == d.parent or top not in d.parents:
            return
        d = d.parent


def cgroup_memory(proc: str | pathlib.Path = "/proc/self") -> Optional[CgroupMemory]:
    """The memory limits binding the process whose ``/proc/PID`` is ``proc``, or None when no
    cgroup above it has one (or there are no cgroups: not Linux, or not mounted)."""
    proc = pathlib.Path(proc)
    member = _membership(proc)
    levels = []  # (limit, headroom, directory) of every level with a limit
    for fstype, mount_root, mount_point, options in _mounts(proc):
        if fstype == "cgroup2" and "v2" in member:
            names = ("memory.max", "memory.current", ("file",))
            path = member["v2"]
        elif fstype == "cgroup" and "memory" in options.split(",") and "memory" in member:
            names = ("memory.limit_in_bytes", "memory.usage_in_bytes", ("total_cache", "cache"))
            path = member["memory"]
        else:
            continue
        limit_name, usage_name, cache_keys = names
        for d in _levels(_directory(mount_root, mount_point, path), mount_point):
            limit = _read_int(d / limit_name)
            if limit is None or limit >= _UNLIMITED:
                continue
            usage = _read_int(d / usage_name) or 0
            cache = _stat(d / "memory.stat", *cache_keys)
            levels.append((limit, max(0, limit - max(0, usage - cache)), str(d)))
    if not levels:
        return None
    limit, _, path = min(levels)
    return CgroupMemory(limit=limit, headroom=min(h for _, h, _ in levels), path=path)


def limiting_cgroup() -> Optional[str]:
    """The memory cgroup whose limit is this process's RAM (`total`), or None where the
    machine's RAM is the less."""
    limits = cgroup_memory()
    if limits is None or limits.limit > int(psutil.virtual_memory().total):
        return None
    return limits.path


def total() -> int:
    """Bytes of RAM this process may ever use: the machine's, or its cgroups' least limit."""
    machine = int(psutil.virtual_memory().total)
    limits = cgroup_memory()
    return machine if limits is None else min(machine, limits.limit)


def available() -> int:
    """Bytes of RAM this process can take now without swapping or being killed: the machine's
    available memory, or less where a cgroup's limit leaves less."""
    machine = int(psutil.virtual_memory().available)
    limits = cgroup_memory()
    return machine if limits is None else min(machine, limits.headroom)


def reset_peak_resident() -> bool:
    """Start a new window for `peak_resident`: the kernel's high-water mark of this process's
    resident memory (VmHWM) is set back to what it holds now, through ``/proc/self/clear_refs``
    (Linux 4.0+). False where that cannot be done; `peak_resident` then counts from the
    process's start."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_resident() -> int:
    """The most resident memory this process has held, in bytes, since `reset_peak_resident`
    (or since it started): VmHWM, else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource
    import sys
    scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
