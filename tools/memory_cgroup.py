"""Run a command as on a machine with less RAM: in a memory cgroup of a given size.

    python tools/memory_cgroup.py 4.5GiB -- python tools/profile_ops.py --rmat 1000000 10000000 \\
        --policy ssd --parts 8 --host-budget 0 --overlapped
    python tools/memory_cgroup.py 3GiB -- jgrind plan --dataset rmat --set num_nodes=200000

The kernel charges a memory cgroup for its processes' anonymous memory *and* for the page cache
they fill. When the cap is reached it reclaims clean page cache first, so files larger than what
the cap leaves are read from the storage device again, as on a machine whose RAM they outgrow;
past what it can reclaim, its OOM killer stops the process. The page cache is dropped first
(the cgroup is charged only for pages its processes bring in), and the cgroup is removed
afterwards. Needs root on Linux (cgroup v2, or the v1 memory controller).
`tools/bench_out_of_core.py` uses the same functions for its ``--memory-limit``.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import time


def drop_caches() -> bool:
    """Flush dirty pages and drop the OS page cache; False if not permitted."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


@contextlib.contextmanager
def memory_cgroup(limit: int | None):
    """Yield the ``cgroup.procs`` file of a new memory cgroup capped at ``limit`` bytes (cgroup
    v2 ``memory.max``, else v1 ``memory.limit_in_bytes``): a process joins by writing its pid
    there. Yields None without a limit. The cgroup is removed afterwards."""
    if limit is None:
        yield None
        return
    root = pathlib.Path("/sys/fs/cgroup")
    v2 = (root / "cgroup.controllers").exists()
    base = (root if v2 else root / "memory") / f"jgrind-bench-{os.getpid()}"
    try:
        base.mkdir()
        (base / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
    except OSError as e:
        sys.exit(f"a memory cap needs a writable cgroup memory controller ({e}); run as root "
                 "on Linux")
    try:
        yield base / "cgroup.procs"
    finally:
        for _ in range(50):  # removable once its last process has exited
            try:
                base.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def joining(procs: pathlib.Path | None, command: list[str]) -> list[str]:
    """``command`` made to join the cgroup whose ``cgroup.procs`` is ``procs`` before it
    starts: a shell writes its own pid there, then becomes the command, so nothing the
    command allocates is charged elsewhere."""
    if procs is None:
        return list(command)
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs), *command]


def main() -> int:
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from jgrind.config import ConfigError, parse_bytes

    args = sys.argv[1:]
    if len(args) < 3 or args[1] != "--" or args[0] in ("-h", "--help"):
        print(__doc__.split("\n\n")[0] + "\n\nusage: python tools/memory_cgroup.py SIZE -- "
              "COMMAND [ARGS...]   (SIZE like 4.5GiB)", file=sys.stderr)
        return 2
    try:
        limit = parse_bytes(args[0])
    except ConfigError as err:
        print(f"memory_cgroup: {err}", file=sys.stderr)
        return 2
    drop_caches()
    with memory_cgroup(limit) as procs:
        return subprocess.call(joining(procs, args[2:]))


if __name__ == "__main__":
    sys.exit(main())
