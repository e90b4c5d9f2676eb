"""Whether the process working in a folder is alive, where its pid cannot tell: an ``flock``.

jgrind marks the folders it works in with its pid: a stored graph's hidden working folders
(`jgrind.datasets.stored`) and the SSD store's run folders (`jgrind.hostio.disk_space`). After a
crash, a folder whose process is gone may be recovered or its space counted free. But a
process in another container that shares this machine's disk, and its host name, runs in
another pid namespace: its pid means nothing here, so by its pid it looks gone while it is
still writing. An ``flock`` is held by the open file whatever the namespace, and the kernel
drops it when the process exits, however it ends (SIGKILL included). So the process keeps a
file in its folder open and locked while it works, and a folder is taken for abandoned only
when its pid is gone *and* nobody holds that lock.

On a file system without ``flock`` (or off POSIX) taking the lock does nothing, and the pid
alone decides, as before.
"""

from __future__ import annotations

from pathlib import Path


def lock(fh, wait: bool = False) -> bool:
    """Take the open file ``fh``'s exclusive ``flock``. False if another open file holds it
    (a live owner) and ``wait`` is off; True if taken, or where the file system has no locks.
    The owner waits (``wait=True``): a check by another process holds the lock for a moment
    only, and the owner must not go on without it."""
    try:
        import fcntl
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    except (ImportError, OSError):  # no fcntl (not POSIX), or no locks on this file system
        return True
    return True


def held_by_another(path: Path) -> bool:
    """Whether a live process holds the lock of the file ``path`` (`lock`)."""
    try:
        with open(path, "rb") as fh:  # closing it drops a lock taken here
            return not lock(fh)
    except OSError:
        return False
