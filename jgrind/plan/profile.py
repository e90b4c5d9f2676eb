"""A measured hardware profile: the figures the planner predicts epoch time from, kept as a file.

The planner chooses where each tensor lives by comparing what moving it costs (bytes over a
measured bandwidth) with what keeping or recomputing it costs (flops over a measured rate).
A `Profile` holds those figures (`jgrind.plan.hardware`, re-exported here), measured on this
machine by `jgrind.plan.measure`; `save` keeps one as JSON (by default in
``~/.cache/jgrind/profile.json``, see `default_path`) so that it is measured once, not every
run.

A profile describes one machine and one software setup; `Profile.stale_reason` says when it no
longer does (another CPU, another accelerator, another JAX, an older profile format), and
`load_or_measure` re-measures then. ``jgrind profile`` does the same from the command line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import tempfile
from typing import Callable, Optional

from jgrind.hostio import host_memory
from jgrind.compile_cache import cache_root
from jgrind.plan import measure as measuring
from jgrind.plan.hardware import (PROFILE_VERSION, OlderProfileError, Profile, ProfileError,
                                  machine_fingerprint, why_stale)

__all__ = ["PROFILE_VERSION", "OlderProfileError", "Profile", "ProfileError", "default_path",
           "load", "load_current", "load_or_measure", "machine_fingerprint", "measure", "save",
           "use_machinery",
           "with_current_free_memory"]

_ADVICE = "run `jgrind profile` to re-measure"


def default_path(directory: str | os.PathLike | None = None) -> pathlib.Path:
    """``$JGRIND_PROFILE``, else ``$JGRIND_CACHE/profile.json``, else
    ``${XDG_CACHE_HOME:-~/.cache}/jgrind/profile.json`` (beside the compiled kernels).

    With a store ``directory`` (and no ``$JGRIND_PROFILE``), a file of that directory's own,
    ``profile-<hash of its path>.json`` beside it: the SSD figures belong to one disk, so
    runs that alternate between two stores keep a profile for each instead of re-measuring
    and overwriting one (the compute figures are measured again for each, 10-30 s once)."""
    explicit = os.environ.get("JGRIND_PROFILE")
    if explicit:
        return pathlib.Path(explicit).expanduser()
    if directory is None:
        return cache_root() / "profile.json"
    digest = hashlib.sha256(_where(directory).encode()).hexdigest()[:12]
    return cache_root() / f"profile-{digest}.json"


def save(profile: Profile, path: str | os.PathLike | None = None) -> pathlib.Path:
    """Write ``profile`` to ``path`` (default `default_path`) atomically: a reader sees the old
    file or the new one, never half of one. Creates the parent directories."""
    path = pathlib.Path(path) if path is not None else default_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(profile.to_json(), f, indent=2)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(path: str | os.PathLike | None = None) -> Profile:
    """The profile saved at ``path`` (default `default_path`). ProfileError if the file is not
    a valid profile; FileNotFoundError if there is none."""
    path = pathlib.Path(path) if path is not None else default_path()
    try:
        return _read(path)
    except ProfileError as err:
        raise type(err)(f"{err}; {_ADVICE}") from None


def _read(path: pathlib.Path) -> Profile:
    if path.is_dir():
        raise ProfileError(f"profile {path} is a folder; pass the path of a profile file")
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfileError(f"profile {path} is not valid JSON ({err})") from None
    try:
        return Profile.from_json(data)
    except ProfileError as err:
        version = data.get("version") if isinstance(data, dict) else None
        if isinstance(version, int) and version != PROFILE_VERSION:
            # another version of the format has other fields: that is age, not damage
            raise OlderProfileError(f"profile {path} is version {version}; this jgrind writes "
                                    f"version {PROFILE_VERSION} ({err})") from None
        raise ProfileError(f"profile {path} is malformed: {err}") from None


def load_or_measure(path: str | os.PathLike | None = None,
                    directory: str | os.PathLike | None = None, *, remeasure: bool = False,
                    log: Optional[Callable[[str], None]] = None) -> Profile:
    """The saved profile if it is current (with today's free memory,
    `with_current_free_memory`), else a fresh measurement (saved for next time).

    Re-measures when asked (``remeasure``), when there is no readable profile at ``path``, when
    it is stale (`Profile.stale_reason`), or when ``directory`` is given and is not where the
    saved SSD figures were measured (another disk may be much slower). ``log`` gets one line
    saying why. A file at ``path`` that is not a readable profile is a ProfileError, left as it
    is; at the default path (no ``path`` given) it is renamed to ``NAME.unreadable`` and a new
    profile measured. A fresh profile that cannot be saved (read-only cache) is still
    returned.
    """
    explicit = path is not None
    path = pathlib.Path(path) if explicit else default_path(directory)
    why = None
    if remeasure:
        why = f"re-measuring the hardware profile as asked (saving to {path})"
    else:
        try:
            profile = _read(path)
        except FileNotFoundError:
            why = f"no hardware profile at {path}; measuring one"
        except OlderProfileError as err:
            why = f"{err}; re-measuring"  # a profile, just an old one: replaced
        except ProfileError as err:
            if explicit:  # a file the user named, perhaps another file by mistake: not ours
                raise ProfileError(f"{err}; pass a hardware profile file, or a path where "
                                   "there is none to measure one there") from None
            # the default profile, unreadable: keep it next to the new one, not overwritten
            kept = _set_aside(path)
            why = f"{err}; re-measuring (the old file is kept as {kept})"
        else:
            stale = why_stale(profile)
            if stale is not None:
                why = f"profile {path} {stale}; re-measuring"
            elif directory is not None and _where(directory) != profile.directory:
                why = (f"profile {path} measured the SSD in {profile.directory}, not in "
                       f"{_where(directory)}; re-measuring")
            else:
                return with_current_free_memory(profile)
    if log is not None:
        log(why)
    profile = measure(directory)
    try:
        save(profile, path)
    except OSError as err:
        if log is not None:
            log(f"could not save the hardware profile to {path} ({err}); using it for this "
                "run only")
    return profile


def load_current(directory: str | os.PathLike | None = None) -> Optional[Profile]:
    """The saved profile `load_or_measure` would use for a store in ``directory`` (else the
    machine's default file) if it is current, with today's free memory; None when there is
    none or it is stale. Measures nothing: a run with a fixed policy holds its epochs against
    a prediction only when a profile is at hand (`jgrind.plan.check.engine_prediction`)."""
    paths = [default_path(directory)]
    if directory is not None and not os.environ.get("JGRIND_PROFILE"):
        paths.append(default_path())  # the machine's: its SSD figures may be another disk's
    for path in paths:
        try:
            profile = _read(path)
        except (OSError, ProfileError):
            continue
        if why_stale(profile) is None:
            return with_current_free_memory(profile)
    return None


def with_current_free_memory(profile: Profile) -> Profile:
    """``profile`` with the host RAM free *now* (`jgrind.hostio.host_memory`), not when it was
    measured: other processes, or a job's smaller memory limit, may have taken some since, and
    budgets default to half of it. On the CPU backend the device's free memory is that RAM."""
    free = host_memory.available()
    device = free if profile.machine.get("backend") == "cpu" else profile.device_free
    return dataclasses.replace(profile, host_free=free, device_free=device)


def _set_aside(path: pathlib.Path) -> pathlib.Path:
    """Rename an unreadable profile file to ``NAME.unreadable[.N]`` so nothing is lost."""
    for n in range(1000):
        kept = path.with_name(path.name + ".unreadable" + (f".{n}" if n else ""))
        if not kept.exists():
            try:
                path.rename(kept)
            except OSError as err:
                raise ProfileError(f"{path} is not a readable profile and cannot be moved "
                                   f"aside ({err.strerror}); pass another profile path")
            return kept
    raise ProfileError(f"{path} is not a readable profile; remove it or pass another path")


def _where(directory: str | os.PathLike) -> str:
    return str(pathlib.Path(directory).expanduser().resolve())


def measure(directory: str | os.PathLike | None = None, *, quick: bool = False,
            progress: bool = False) -> Profile:
    """A fresh profile of this machine (`jgrind.plan.measure.measure`, which see); the SSD
    figures on the disk that holds ``directory``, the engine's own cost per step by the
    probe `use_machinery` installed."""
    return measuring.measure(directory, quick=quick, progress=progress,
                             machinery=_machinery_probe)


# The engine's probe of its own cost per partition step (`jgrind.engine.machinery.measure`).
# This layer cannot import the engine, which imports it: the package installs the probe
# when it is imported (``jgrind/__init__.py``), as the engine's own measurement of itself.
_machinery_probe: Optional[Callable] = None


def use_machinery(probe: Optional[Callable]) -> None:
    """Measure the engine's own cost per partition step with ``probe`` (``directory ->
    figures``, see `jgrind.plan.measure.measure`) in every profile measured from now on;
    None: leave it unmeasured (the cost model then charges the trivial pipeline's
    `sweep_step`)."""
    global _machinery_probe
    _machinery_probe = probe
