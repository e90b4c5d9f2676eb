"""What a non-editable install gets: the wheel must carry the native kernels' sources, which
`jgrind._kernels.build` compiles on first use; without them every kernel falls back to its
slower NumPy path (as a wheel built before the package data was declared did)."""

import fnmatch
import importlib.util
import shutil
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest

from jgrind._kernels import build

ROOT = Path(__file__).resolve().parents[1]


def test_pyproject_declares_every_kernel_source_as_package_data():
    config = pytest.importorskip("setuptools.config.pyprojecttoml")
    with warnings.catch_warnings():  # setuptools < 68 calls this configuration "beta"
        warnings.simplefilter("ignore")
        setuptools_table = config.read_configuration(ROOT / "pyproject.toml")["tool"]["setuptools"]
    declared = setuptools_table.get("package-data", {}).get("jgrind._kernels", [])
    missing = [s.name for s in build.SOURCES
               if not any(fnmatch.fnmatch(s.name, pattern) for pattern in declared)]
    assert not missing, f"pyproject's package-data lacks {missing}"


def _can_build_wheels() -> bool:
    import setuptools
    major, minor = (int(x) for x in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


def test_the_wheel_carries_every_kernel_source(tmp_path):
    pytest.importorskip("setuptools")
    if not _can_build_wheels():  # a fresh venv's setuptools 65 needs the `wheel` package
        pytest.skip("this environment's setuptools cannot build wheels without `wheel`")
    # a clean copy: setuptools would reuse a checkout's build/ folder from an earlier wheel
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "jgrind", source / "jgrind",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(tmp_path), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("jgrind-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [s.name for s in build.SOURCES if f"jgrind/_kernels/{s.name}" not in names]
    assert not missing, f"the wheel lacks {missing}: declare them in pyproject's package-data"
