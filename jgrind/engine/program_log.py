"""Which programs XLA compiles while a run goes on: each one's function name, argument types
and compile seconds, so that a count of programs can be read as where it comes from.

    with ProgramLog() as log:
        executor.step(params, opt_state, key)
    print(log.report())

JAX reports every backend compile (``/jax/core/compile/backend_compile_duration``, with the
function's name) and, on its ``jax._src.interpreters.pxla`` logger at DEBUG level, the
argument types of each program it lowers, just before compiling it on the same thread. The log
pairs the two per thread. An op run outside ``jit`` (a ``jnp`` call on arrays) is a program of
its own, named after its primitive (``jit(broadcast_in_dim)``...), once per new shape.

A program read from a persistent compile cache (`jgrind.compile_cache`) counts too: JAX times
the cache read as the compile.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import re
import threading
from typing import Optional

from jax import monitoring

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_LOWERING_LOGGER = "jax._src.interpreters.pxla"
_LOWERING_MESSAGE = "Compiling %s with global shapes and types %s."
# a dtype and shape in an aval's text, ``float32[8192,256]``: shortened to ``f32[8192,256]``
_AVAL = re.compile(r"\b(float|int|uint|bfloat|bool|key<\w+>)(\d*)(<\w+>)?(\[[^\]]*\])")


@dataclasses.dataclass(frozen=True)
class Program:
    """One compile: the function's name (``jit(forward)``), its arguments' types in short
    (``f32[8192,256] i32[8193] ...``; "?" where the lowering was not seen), whether any
    argument lives in ``pinned_host`` memory, and the compile's seconds."""

    name: str
    arguments: str
    pinned: bool
    seconds: float


class ProgramLog:
    """Records every program compiled while it is open (a context manager); `programs` in
    the order they compiled. `mark` splits them into phases (``"epoch 0"``...)."""

    def __init__(self):
        self.programs: list[Program] = []
        self.phases: list[tuple[str, int]] = []  # (label, index of its first program)
        self._lowered = threading.local()
        self._logger = logging.getLogger(_LOWERING_LOGGER)
        self._level: Optional[int] = None
        self._passing = logging.WARNING
        self._lock = threading.Lock()

    # -- recording ------------------------------------------------------------------------
    def __enter__(self) -> "ProgramLog":
        monitoring.register_event_duration_secs_listener(self._compiled)
        self._level = self._logger.level
        self._passing = self._logger.getEffectiveLevel()  # what passed before
        self._logger.setLevel(logging.DEBUG)
        self._logger.addFilter(self._lowering)
        return self

    def __exit__(self, *exc) -> None:
        monitoring.unregister_event_duration_listener(self._compiled)
        self._logger.removeFilter(self._lowering)
        self._logger.setLevel(self._level)

    def _lowering(self, record: logging.LogRecord) -> bool:
        """A logger filter: keeps the argument types of a lowering for the compile that
        follows on this thread. The DEBUG records this log switched on go no further; the
        others pass as before."""
        if str(record.msg).startswith(_LOWERING_MESSAGE) and len(record.args) >= 3:
            name, avals, shardings = record.args[:3]
            self._lowered.last = (str(name), _short(str(avals)),
                                  "pinned_host" in str(shardings))
        return record.levelno >= self._passing

    def _compiled(self, event: str, seconds: float, **kwargs) -> None:
        if event != COMPILE_EVENT:
            return
        name = str(kwargs.get("fun_name", "?"))
        last = getattr(self._lowered, "last", None)
        self._lowered.last = None
        arguments, pinned = ("?", False) if last is None else last[1:]
        with self._lock:
            self.programs.append(Program(name, arguments, pinned, seconds))

    def mark(self, label: str) -> None:
        """Programs compiled from now on belong to phase ``label``."""
        with self._lock:
            self.phases.append((label, len(self.programs)))

    # -- reading ----------------------------------------------------------------------------
    def phase(self, label: str) -> list[Program]:
        """The programs compiled in phase ``label`` (`mark`)."""
        for i, (name, start) in enumerate(self.phases):
            if name == label:
                end = self.phases[i + 1][1] if i + 1 < len(self.phases) else None
                return self.programs[start:end]
        raise KeyError(label)

    def seconds(self, programs: Optional[list] = None) -> float:
        return sum(p.seconds for p in (self.programs if programs is None else programs))

    def report(self, programs: Optional[list] = None, shapes: bool = True) -> str:
        """The programs grouped by function name, most first: count and seconds, and with
        ``shapes`` each program's argument types."""
        programs = self.programs if programs is None else programs
        return report(programs, shapes)


def group(programs: list[Program]) -> dict[str, list[Program]]:
    """``{function name: its programs}``, the names with most programs first."""
    by_name = collections.defaultdict(list)
    for p in programs:
        by_name[p.name].append(p)
    return dict(sorted(by_name.items(), key=lambda kv: (-len(kv[1]), kv[0])))


def report(programs: list[Program], shapes: bool = True, width: int = 150) -> str:
    lines = [f"{len(programs)} programs, {sum(p.seconds for p in programs):.2f} s"]
    for name, ps in group(programs).items():
        lines.append(f"  {len(ps):3d}  {name}  ({sum(p.seconds for p in ps):.2f} s)")
        if shapes:
            for p in ps:
                text = p.arguments + ("  [pinned_host]" if p.pinned else "")
                lines.append(f"         {text[:width]}")
    return "\n".join(lines)


def _short(avals: str) -> str:
    """An aval list's text shortened to dtypes and shapes: ``f32[8,4] i32[9]``."""
    found = _AVAL.findall(avals)
    if not found:
        return avals
    return " ".join(f"{_PREFIX.get(kind, kind)}{bits}{space}{dims}".replace(" ", "")
                    for kind, bits, space, dims in found)


_PREFIX = {"float": "f", "int": "i", "uint": "u", "bfloat": "bf", "bool": "bool"}
