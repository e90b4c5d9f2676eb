"""SIGTERM (a batch scheduler's time limit, `kill`) stops a run the way Ctrl-C does: as an
exception in the main thread, so that every ``finally`` runs and the engine removes its store
files.

A signal handler's exception is lost when the signal lands in a garbage-collection callback
or a ``__del__`` ("Exception ignored in ..."; seen with XLA's GC callback), and the run would
go on. So the handlers also record the request, and the trainer and the engine's partition
loops `check` it: the run then stops at the next partition step out of core, at the next
epoch in memory. Ctrl-C
(SIGINT) is handled the same way, as KeyboardInterrupt.
"""

from __future__ import annotations

import signal
from typing import Optional

_requested: Optional[BaseException] = None  # the exception a signal asked for, once one came


class Terminated(BaseException):
    """The process was asked to terminate (SIGTERM)."""


def install() -> None:
    """Turn SIGTERM into `Terminated` and SIGINT into KeyboardInterrupt, recorded for `check`
    too (main thread only; the ``jgrind`` command does this)."""
    def handler(kind):
        def handle(signum, frame):
            global _requested
            _requested = kind()
            raise kind()
        return handle
    signal.signal(signal.SIGTERM, handler(Terminated))
    signal.signal(signal.SIGINT, handler(KeyboardInterrupt))


def check() -> None:
    """Raise what a signal asked for if one came (and its first exception may have been
    lost)."""
    if _requested is not None:
        raise type(_requested)()
