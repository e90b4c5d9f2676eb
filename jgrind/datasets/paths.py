"""Where the real dataset files live: ``$JGRIND_DATA`` or a ``shared/datasets`` folder nearby.

The data files are never copied into the repository; they sit beside it (see
``shared/datasets/README.md``), so every path here is looked up at call time.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from jgrind.datasets.errors import DatasetError

ENV_VAR = "JGRIND_DATA"


def candidate_roots() -> list[Path]:
    """The folders `data_root` tries when ``$JGRIND_DATA`` is unset, in order."""
    repo = Path(__file__).resolve().parents[2]  # jgrind/datasets/paths.py -> repository root
    cwd = Path.cwd()
    return [repo.parent / "shared" / "datasets", cwd / "shared" / "datasets",
            cwd.parent / "shared" / "datasets"]


def data_root() -> Optional[Path]:
    """``$JGRIND_DATA`` if set (even if it does not exist, so that a typo is reported rather
    than silently replaced by another folder), else the first existing `candidate_roots`
    folder, else None."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser()
    for path in candidate_roots():
        if path.is_dir():
            return path
    return None


def require_root(root=None) -> Path:
    """`root` (or `data_root()` when None) as an existing folder, else `DatasetError` saying
    where it looked and how to fix it."""
    if root is None:
        root = data_root()
        if root is None:
            looked = ", ".join(str(p) for p in candidate_roots())
            raise DatasetError(f"no dataset folder found (${ENV_VAR} is unset; looked in "
                               f"{looked}); set {ENV_VAR} to the folder holding planetoid/, "
                               "heterophilous/, gnn-benchmark/")
        origin = f" (from ${ENV_VAR})" if os.environ.get(ENV_VAR) else ""
    else:
        origin = ""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetError(f"dataset folder {root}{origin} does not exist or is not a folder; "
                           f"set {ENV_VAR} (or pass root=) to the folder holding the datasets")
    return root
