"""The run folders of processes other than 0 (`jgrind.devices.scratch`): a killed process's
folder is removed by the next one; a running process's is kept."""

import os
import subprocess
import sys

from jgrind.devices.scratch import remove_orphans, scratch_folder


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_dead_process_folder_goes_and_a_running_ones_stays(tmp_path):
    dead = tmp_path / f"jgrind-process1-{_dead_pid()}-abc"
    (dead / "checkpoints").mkdir(parents=True)
    (dead / "config.json").write_text("{}")
    alive = tmp_path / f"jgrind-process1-{os.getpid()}-def"
    alive.mkdir()
    unnamed = tmp_path / "jgrind-process1-xk9ls4ix"  # no process id in the name: left
    unnamed.mkdir()
    new = scratch_folder(2, parent=str(tmp_path))
    assert not dead.exists()
    assert alive.exists() and unnamed.exists()
    assert os.path.basename(new).startswith(f"jgrind-process2-{os.getpid()}-")
    assert remove_orphans(str(tmp_path)) == []  # the new folder's process is this one
