"""Lazy, cached, race-free compilation of the native kernels with the system C++ compiler.

The shared object is keyed by a hash of everything that changes the machine code: the source,
the jax / jaxlib versions (the FFI headers come from jaxlib), the compiler and its version, the
flags, and the CPU (``-march=native``). It lives in ``$JGRIND_CACHE/kernels`` (default
``${XDG_CACHE_HOME:-~/.cache}/jgrind/kernels``); an unwritable cache falls back to a private
temporary directory. Compilation writes a temporary file next to the target and renames it into
place, so parallel processes (pytest-xdist, several trainers) never see a half-written library;
an advisory file lock makes the others wait for the first compiler instead of compiling too.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
import time
from dataclasses import dataclass
from pathlib import Path

from jgrind.compile_cache import cache_root, cpu_identity

# compiled together into one shared library
SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("csr_spmm.cc", "rows.cc", "spans.cc", "checksum.cc",
                             "labels.cc", "bisection.cc"))
BASE_FLAGS = ("-O3", "-march=native", "-shared", "-fPIC", "-std=c++17", "-pthread")
COMPILE_TIMEOUT_S = 300


class BuildError(RuntimeError):
    """The kernel could not be compiled or loaded; the message says why."""


@dataclass(frozen=True)
class BuildResult:
    path: Path
    compiled: bool  # False: taken from the cache
    seconds: float  # compile time (0 when cached)
    private: bool = False  # built in a temporary folder of this process's, to remove once loaded


def cache_dir() -> Path:
    return cache_root() / "kernels"


def compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    path = shutil.which(cxx)
    if path is None:
        raise BuildError(f"no C++ compiler: {cxx!r} is not on PATH (set CXX, or install g++)")
    return path


def _flags(include_dir: str) -> list[str]:
    return [*BASE_FLAGS, f"-I{include_dir}"]


def library_path(cxx: str, include_dir: str) -> Path:
    import jax
    import jaxlib

    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise BuildError(f"cannot run the C++ compiler {cxx}: {e}") from e
    h = hashlib.sha256()
    for part in (*(src.read_bytes() for src in SOURCES), jax.__version__.encode(),
                 jaxlib.__version__.encode(),
                 cxx.encode(), version.encode(), " ".join(BASE_FLAGS).encode(),
                 cpu_identity().encode()):
        h.update(part)
        h.update(b"\0")
    return cache_dir() / f"kernels-{h.hexdigest()[:24]}.so"


def _remove_stale_temporaries(d: Path, max_age_s: float = 3600.0) -> None:
    """Temporaries left by compilers that were killed half-way (never by a live build)."""
    now = time.time()
    for p in d.glob("*.tmp"):
        try:
            if now - p.stat().st_mtime > max_age_s:
                p.unlink()
        except OSError:
            pass


def _compile(cxx: str, include_dir: str, target: Path) -> float:
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=target.name + ".", suffix=".tmp", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *_flags(include_dir), *map(str, SOURCES), "-o", tmp]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout)[-4000:]
            raise BuildError(f"compilation failed ({' '.join(cmd)}):\n{tail}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)  # atomic on POSIX: readers see the old name or the full file
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"compilation timed out after {COMPILE_TIMEOUT_S} s") from e
    except OSError as e:
        raise BuildError(f"compilation failed: {e}") from e
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return time.perf_counter() - t0


def _usable(d: Path) -> bool:
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(d, os.W_OK | os.X_OK)


def build() -> BuildResult:
    """The path of the compiled kernel library, compiling it if it is not cached yet."""
    import jax

    cxx = compiler()
    include_dir = jax.ffi.include_dir()
    if not os.path.isfile(os.path.join(include_dir, "xla", "ffi", "api", "ffi.h")):
        raise BuildError(f"jaxlib ships no XLA FFI headers under {include_dir}")
    target = library_path(cxx, include_dir)
    if target.is_file():
        return BuildResult(target, compiled=False, seconds=0.0)
    private = not _usable(target.parent)
    if private:
        # Unwritable cache (read-only home, sandbox): build privately for this process.
        warnings.warn(f"the kernel cache {target.parent} is not writable: compiling jgrind's "
                      "kernels for this process only (set JGRIND_CACHE to a writable folder "
                      "to keep them)", stacklevel=2)
        target = Path(tempfile.mkdtemp(prefix="jgrind-kernels-")) / target.name
    with _exclusive(target.with_suffix(".lock")):
        # Another process may have built it while this one waited for the lock.
        if target.is_file():
            return BuildResult(target, compiled=False, seconds=0.0)
        seconds = _compile(cxx, include_dir, target)
    return BuildResult(target, compiled=True, seconds=seconds, private=private)


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    """An advisory inter-process lock, so that parallel processes compile once; correctness
    does not depend on it (the rename is atomic), so any failure to lock is ignored."""
    try:
        import fcntl

        f = open(lock_path, "a")
    except (ImportError, OSError):
        yield
        return
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        f.close()  # releases the lock
