"""Where jgrind keeps what it can reuse across runs, and the persistent XLA compilation cache.

Everything lives under one root, ``$JGRIND_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/jgrind``:
the compiled native kernels (``kernels/``), the hardware profile (``profile.json``) and, when
`compilation_cache` is in effect (``jgrind train`` runs in it), XLA's compiled executables
(``xla/``, one directory per CPU).

Why a compilation cache: an out-of-core run compiles every layer's forward and backward steps
for each padded partition shape, and a GPU also autotunes them: on an H100 the 1M-node
benchmark's first host-tier epoch took 83.7 s against 6.4-6.8 s for the later ones
(docs/results-history.md, section 8). Seeded trials in new processes and reruns of an experiment
compile the same programs again. JAX's persistent cache keys an executable by its program,
the compile options, the backend and the jax / jaxlib versions, so a stale entry is never
used; a rebuilt native kernel keeps its FFI target name, and a loaded program finds it by
that name when it runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import platform
import warnings
from typing import Iterator, Optional


def cache_root() -> pathlib.Path:
    """``$JGRIND_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/jgrind``."""
    root = os.environ.get("JGRIND_CACHE")
    if root:
        return pathlib.Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(xdg) / "jgrind"


def cpu_identity() -> str:
    """The machine and this CPU's model and ISA flags: what code compiled for the host CPU
    (``-march=native``, XLA's CPU backend) depends on."""
    ident = [platform.machine()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("flags", "model name", "Features", "CPU part"):
                    ident.append(line.strip())
                if line.strip() == "":
                    break  # first processor only
    except OSError:
        pass
    return "\n".join(ident)


def default_compilation_cache_dir() -> pathlib.Path:
    """``$JAX_COMPILATION_CACHE_DIR`` when set, else ``cache_root() / "xla" / <this CPU>``: a
    cache root shared by machines with different CPUs (a home directory on NFS) keeps their
    programs apart, since programs for the CPU backend are compiled for the host's ISA."""
    explicit = os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    tag = hashlib.sha256(cpu_identity().encode()).hexdigest()[:12]
    return cache_root() / "xla" / f"{platform.machine()}-{tag}"


@contextlib.contextmanager
def compilation_cache(directory: Optional[os.PathLike | str] = None,
                      min_compile_seconds: float = 0.0) -> Iterator[Optional[pathlib.Path]]:
    """Within the block, XLA's compiled executables are kept on disk and later processes load
    them instead of compiling again; yields the directory, or None when none can be used.
    JAX's settings are restored on exit, so the cache stays this block's business::

        with jgrind.compile_cache.compilation_cache():
            result = jgrind.train(key, graph, model, optimizer, policy=..., num_parts=16)

    Args:
      directory: where; default `default_compilation_cache_dir` (JAX's own
        ``$JAX_COMPILATION_CACHE_DIR`` when the user set it).
      min_compile_seconds: programs that compiled faster than this are not written (JAX's
        default is 1 s). jgrind's default, 0, keeps every partition step: most compile in
        well under a second each on a CPU, but a run compiles dozens of them.

    JAX does not bound the directory's size by default: a run's programs take ~0.4 MB on a
    CPU (52 of them, `tools/bench_compile_cache.py`). ``JAX_COMPILATION_CACHE_MAX_SIZE``
    (bytes; needs the ``filelock`` package) makes JAX evict the least recently used.

    An unwritable directory leaves the cache off (and says so with a warning) rather than
    failing the run: the cache only saves time. A damaged entry (truncated, overwritten) is
    the same: JAX warns and compiles that program again (`tests/test_compile_cache.py`).
    """
    import jax
    from jax.experimental.compilation_cache import compilation_cache as jax_cache

    path = pathlib.Path(directory or default_compilation_cache_dir()).expanduser()
    try:
        path.mkdir(parents=True, exist_ok=True)
        writable = os.access(path, os.W_OK | os.X_OK)
    except OSError:
        writable = False
    if not writable:
        warnings.warn(f"jgrind: the compilation cache directory {path} is not writable; "
                      "compiling without a persistent cache (set JGRIND_CACHE to move it)",
                      stacklevel=3)
        yield None
        return
    settings = {"jax_compilation_cache_dir": str(path),
                "jax_persistent_cache_min_compile_time_secs": float(min_compile_seconds)}
    before = {name: getattr(jax.config, name) for name in settings}
    for name, value in settings.items():
        jax.config.update(name, value)
    jax_cache.reset_cache()  # JAX opens its cache once per process: make it see the new one
    try:
        yield path
    finally:
        for name, value in before.items():
            jax.config.update(name, value)
        jax_cache.reset_cache()
