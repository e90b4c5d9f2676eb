"""The run folder of a process other than process 0 when several train one model.

Process 0 writes ``--out``; the others write their run's files to a temporary folder that
`jgrind train` removes when it ends. A process killed outright (SIGKILL, the machine's OOM
killer) cannot remove its own, so each folder is named after its process id, and every new one
first removes the folders whose process is gone.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from typing import Optional

PREFIX = "jgrind-process"


def scratch_folder(process_index: int, parent: Optional[str] = None) -> str:
    """A new folder for process ``process_index``'s files, named
    ``jgrind-process{index}-{pid}-*`` under ``parent`` (the system's temporary folder by
    default), after removing the folders there of processes no longer running."""
    parent = tempfile.gettempdir() if parent is None else parent
    remove_orphans(parent)
    return tempfile.mkdtemp(prefix=f"{PREFIX}{process_index}-{os.getpid()}-", dir=parent)


def remove_orphans(parent: str) -> list[str]:
    """Remove the ``jgrind-process{index}-{pid}-*`` folders under ``parent`` whose process is
    not running; the folders removed. Folders whose name holds no process id are left."""
    removed = []
    for folder in pathlib.Path(parent).glob(f"{PREFIX}*-*-*"):
        pid = _pid_of(folder.name)
        if pid is None or not folder.is_dir() or _running(pid):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(str(folder))
    return removed


def _pid_of(name: str) -> Optional[int]:
    parts = name[len(PREFIX):].split("-")
    if len(parts) < 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[1])


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True
