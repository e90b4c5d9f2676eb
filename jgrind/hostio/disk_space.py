"""Free space in a store directory that several runs share.

A run's SSD files are sparse: the disk's free space shows only what the run has written so far,
not what its plan will write. So each run records what it will write in its folder
(``reserved.json``), and a run starting beside it counts what the others have not written yet as
taken (`free_bytes`). `reserve` checks and records under a lock on the directory, so that two
runs starting at the same moment cannot both claim the same space.

Runs are told apart by their folder, ``jgrind-run-<pid>-<id>``, and the reservation names the
process (its pid and start time, and the machine: `machine_id`), so a folder whose process is
gone, or whose pid another process has taken since, promises nothing, and one of this
machine's may be removed (`abandoned_here`). A run also holds its reservation file locked while
it lives (`jgrind.hostio.owner_locks`), so a run in another container on this machine, whose pid
means nothing here, still counts. A run on another machine sharing the disk cannot be seen
from here (unless the file system carries its lock) and is not counted.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
from typing import IO, Callable, Iterator, Optional

from jgrind.hostio.owner_locks import held_by_another, lock

RESERVATION = "reserved.json"  # in a run's folder: the SSD bytes its plan writes
RUN_GLOB = "jgrind-run-*-*"


def process_start(pid: int) -> Optional[int]:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``), or None
    where it cannot be read: with the pid, it names one process, since pids are reused."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])  # field 22, after "(comm)"
    except (OSError, ValueError, IndexError):
        return None


def machine_id() -> Optional[str]:
    """This kernel's boot id and this process's pid namespace, or None where ``/proc`` does
    not tell. Processes with the same id see the same pids: to one of them, another's pid and
    start time tell whether it still runs. (A host name does not: containers share it, and a
    shared disk is seen from several machines.)"""
    try:
        boot = pathlib.Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot} {namespace}" if boot else None


def abandoned_here(folder: pathlib.Path) -> bool:
    """Whether the run folder ``folder`` provably belongs to a process of this machine
    (its reservation records this `machine_id`) that has ended: no pid alive with its start
    time, nobody holding its lock. Such a folder may be removed; any other (an older run's
    without a record, another machine's, another container's) may not."""
    try:
        reservation = json.loads((folder / RESERVATION).read_text())
    except (OSError, ValueError):
        return False
    here = machine_id()
    return here is not None and isinstance(reservation, dict) \
        and reservation.get("machine") == here and not owner_running(folder, reservation)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def owner_running(folder: pathlib.Path, reservation: Optional[dict] = None) -> bool:
    """Whether the process that made the run folder ``folder`` (``jgrind-run-<pid>-<id>``)
    still runs on this machine: its pid is alive and, where its reservation records one, has
    the same start time (else the pid was reused by another process); or a process holds
    its reservation's lock (a run whose pid this process cannot see)."""
    return _pid_running(folder, reservation) or held_by_another(folder / RESERVATION)


def _pid_running(folder: pathlib.Path, reservation: Optional[dict]) -> bool:
    pid = folder.name.split("-")[2]
    if not pid.isdigit() or not alive(int(pid)):
        return False
    if reservation is None:
        try:
            reservation = json.loads((folder / RESERVATION).read_text())
        except (OSError, ValueError):
            return True  # an older run's folder: the pid is all there is to go by
    started = reservation.get("started") if isinstance(reservation, dict) else None
    return started is None or process_start(int(pid)) in (None, started)


def promised(root: pathlib.Path) -> list[tuple[pathlib.Path, int]]:
    """``(folder, bytes)`` for every running run in the store directory ``root`` whose plan will
    write more than its files hold on disk yet (allocated blocks, not sizes: the files are
    sparse): the space each still needs."""
    found = []
    for path in sorted(pathlib.Path(root).glob(RUN_GLOB)):
        try:
            reservation = json.loads((path / RESERVATION).read_text())
            reserved = int(reservation["bytes"])
            if not owner_running(path, reservation):
                continue
            on_disk = sum(f.stat().st_blocks * 512 for f in path.iterdir()
                          if f.is_file() and f.name != RESERVATION)
        except (OSError, ValueError, KeyError, TypeError):  # older runs, or removed meanwhile
            continue
        if reserved > on_disk:
            found.append((path, reserved - on_disk))
    return found


def free_bytes(root: pathlib.Path) -> int:
    """The disk's free space at ``root`` less what running runs there will still write."""
    return shutil.disk_usage(root).free - sum(b for _, b in promised(pathlib.Path(root)))


@contextlib.contextmanager
def _locked(root: pathlib.Path) -> Iterator[None]:
    """An exclusive lock on the store directory (``flock`` on the directory itself: no lock
    file is left in it), where the file system has one; without, the check and the record are
    merely close together."""
    try:
        import fcntl
        fd = os.open(root, os.O_RDONLY)
    except (ImportError, OSError):
        fd = None
    if fd is None:  # outside the except: an error of the caller's is not "during" this one
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            pass  # a file system without locks: as above
        yield
    finally:
        os.close(fd)  # closing releases the lock


_HELD: dict[pathlib.Path, IO] = {}  # this process's run folders: their locked reservations


def reserve(root: pathlib.Path, folder: pathlib.Path, needed_bytes: int,
            check: Callable[[int, list], None]) -> None:
    """Under the directory's lock: call ``check(free, promised)`` (free: the disk's free bytes;
    promised: `promised`'s list), which raises if ``needed_bytes`` does not fit, then make
    ``folder`` and record ``needed_bytes`` in it (written whole: a temporary file renamed),
    and hold the record locked until `release`. On any error nothing is left behind."""
    with _locked(root):
        check(shutil.disk_usage(root).free, promised(root))
        folder.mkdir()
        try:
            record = {"bytes": int(needed_bytes), "pid": os.getpid(),
                      "started": process_start(os.getpid()), "machine": machine_id()}
            partial = folder / f".{RESERVATION}.partial"
            partial.write_text(json.dumps(record))
            partial.rename(folder / RESERVATION)
            fh = open(folder / RESERVATION, "rb")
            lock(fh, wait=True)  # still under the directory's lock: no run sees it unlocked
            _HELD[pathlib.Path(folder)] = fh
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise


def release(folder: pathlib.Path) -> None:
    """Drop the lock `reserve` holds for ``folder`` (before the run removes it)."""
    fh = _HELD.pop(pathlib.Path(folder), None)
    if fh is not None:
        fh.close()
