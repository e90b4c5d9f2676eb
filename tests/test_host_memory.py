"""`jgrind.hostio.host_memory`: RAM within the limits of the process's memory cgroups."""

import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pytest

from jgrind.hostio import host_memory

GIB = 1 << 30


def _proc(tmp_path, mountinfo: str, cgroup: str) -> pathlib.Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(textwrap.dedent(mountinfo).strip() + "\n")
    (proc / "cgroup").write_text(textwrap.dedent(cgroup).strip() + "\n")
    return proc


def _cgroup(directory: pathlib.Path, **files: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name.replace("_", ".", 1)).write_text(text)


def test_v1_a_parents_limit_binds_and_page_cache_counts_as_available(tmp_path):
    """cgroup v1: the job's own cgroup has no limit, its parent (a Slurm job's, say) has 4
    GiB; 3 GiB are used, 1 GiB of it page cache, so 2 GiB are left."""
    mount = tmp_path / "memory"
    proc = _proc(tmp_path, f"""
        30 25 0:27 / {mount} rw,nosuid - cgroup cgroup rw,memory
        31 25 0:28 / {tmp_path}/cpu rw,nosuid - cgroup cgroup rw,cpu,cpuacct
        """, """
        5:cpu,cpuacct:/slurm/job1/step0
        4:memory:/slurm/job1/step0
        0::/
        """)
    unlimited = str(9223372036854771712)
    _cgroup(mount, memory_limit_in_bytes=unlimited, memory_usage_in_bytes=str(20 * GIB))
    _cgroup(mount / "slurm", memory_limit_in_bytes=unlimited)
    _cgroup(mount / "slurm" / "job1", memory_limit_in_bytes=str(4 * GIB),
            memory_usage_in_bytes=str(3 * GIB),
            memory_stat=f"cache 5\nrss {2 * GIB}\ntotal_cache {GIB}\ntotal_rss {2 * GIB}\n")
    _cgroup(mount / "slurm" / "job1" / "step0", memory_limit_in_bytes=unlimited,
            memory_usage_in_bytes=str(3 * GIB), memory_stat=f"total_cache {GIB}\n")
    limits = host_memory.cgroup_memory(proc)
    assert limits == host_memory.CgroupMemory(limit=4 * GIB, headroom=2 * GIB,
                                              path=str(mount / "slurm" / "job1"))


def test_v2_the_tightest_level_wins_and_max_is_no_limit(tmp_path):
    """cgroup v2: an 8 GiB slice holding a 6 GiB container, the process in a leaf with
    ``max``. The container's headroom is the least: 6 GiB - (5 - 2 GiB of file pages), against
    the slice's 8 - (5 - 2)."""
    mount = tmp_path / "cgroup"
    proc = _proc(tmp_path, f"""
        40 30 0:35 / {mount} rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate
        """, "0::/slice/container/leaf")
    _cgroup(mount / "slice", memory_max=str(8 * GIB), memory_current=str(5 * GIB),
            memory_stat=f"anon {3 * GIB}\nfile {2 * GIB}\n")
    _cgroup(mount / "slice" / "container", memory_max=str(6 * GIB),
            memory_current=str(5 * GIB), memory_stat=f"anon {3 * GIB}\nfile {2 * GIB}\n")
    _cgroup(mount / "slice" / "container" / "leaf", memory_max="max",
            memory_current=str(5 * GIB))
    limits = host_memory.cgroup_memory(proc)
    assert limits.limit == 6 * GIB and limits.headroom == 3 * GIB
    assert limits.path == str(mount / "slice" / "container")


def test_the_least_limit_and_the_least_headroom_may_be_at_different_levels(tmp_path):
    """A 2 GiB step inside a 4 GiB job whose other steps use most of it: the RAM is the
    step's 2 GiB, and what is free the job's 0.5 GiB (the step alone would leave 1.5)."""
    mount = tmp_path / "cgroup"
    proc = _proc(tmp_path, f"40 30 0:35 / {mount} rw - cgroup2 cgroup2 rw", "0::/job/step")
    _cgroup(mount / "job", memory_max=str(4 * GIB), memory_current=str(GIB * 7 // 2),
            memory_stat="file 0\n")
    _cgroup(mount / "job" / "step", memory_max=str(2 * GIB), memory_current=str(GIB // 2),
            memory_stat="file 0\n")
    assert host_memory.cgroup_memory(proc) == host_memory.CgroupMemory(
        limit=2 * GIB, headroom=GIB // 2, path=str(mount / "job" / "step"))


def test_a_container_sees_its_own_cgroup_at_the_mount_point(tmp_path):
    """With a cgroup namespace the mount's root is the container's cgroup; a path from the
    host's root that does not lie under it means the mount point itself."""
    mount = tmp_path / "cgroup"
    proc = _proc(tmp_path, f"""
        50 40 0:40 /docker/abc {mount} rw - cgroup2 cgroup2 rw
        """, "0::/kubepods/pod1/abc")
    _cgroup(mount, memory_max=str(2 * GIB), memory_current=str(GIB),
            memory_stat="file 0\n")
    assert host_memory.cgroup_memory(proc).headroom == GIB


def test_no_limit_or_no_cgroups_is_none(tmp_path):
    mount = tmp_path / "cgroup"
    proc = _proc(tmp_path, f"40 30 0:35 / {mount} rw - cgroup2 cgroup2 rw", "0::/a")
    _cgroup(mount / "a", memory_max="max", memory_current=str(GIB))
    assert host_memory.cgroup_memory(proc) is None
    bare = tmp_path / "bare"
    bare.mkdir()
    assert host_memory.cgroup_memory(bare) is None  # no /proc files at all


def _writable_memory_cgroup_root() -> pathlib.Path | None:
    root = pathlib.Path("/sys/fs/cgroup")
    for candidate, limit in ((root, "memory.max"), (root / "memory", "memory.limit_in_bytes")):
        if (candidate / limit).exists() or (candidate / "cgroup.controllers").exists() \
                and "memory" in (candidate / "cgroup.controllers").read_text().split():
            if os.access(candidate, os.W_OK):
                return candidate
    return None


@pytest.mark.skipif(sys.platform != "linux", reason="memory cgroups are Linux's")
def test_inside_a_real_memory_cgroup_the_profile_sees_its_limit(tmp_path):
    """A child process in a 1 GiB memory cgroup: `total` is the limit and `available` within
    it, and so are the hardware profile's RAM and the planner's free host memory."""
    root = _writable_memory_cgroup_root()
    if root is None:
        pytest.skip("no writable memory cgroup controller here (needs root on Linux)")
    group = root / f"jgrind-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as err:
        pytest.skip(f"cannot make a memory cgroup here: {err}")
    try:
        v2 = (root / "cgroup.controllers").exists()
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(GIB))
        script = ("from jgrind.hostio import host_memory; from jgrind.plan import profile; "
                  "m = profile.machine_fingerprint(); "
                  "print(host_memory.total(), host_memory.available(), m['ram_bytes'], "
                  "m['memory_cgroup'])")
        # the shell joins the cgroup, then becomes Python (no preexec_fn: forking a process
        # that runs JAX's threads is unsafe, and JAX warns)
        out = subprocess.run(
            ["sh", "-c", 'echo $$ > "$1" && exec "$2" -c "$3"', "sh",
             str(group / "cgroup.procs"), sys.executable, script],
            capture_output=True, text=True, check=True,
            env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=120).stdout
        *figures, where = out.split()
        total, available, ram = map(int, figures)
        assert total == GIB and ram == GIB and where == str(group)
        assert 0 < available < GIB
    finally:
        for _ in range(50):  # removable once the child has gone
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
