"""SIGTERM (a batch scheduler's time limit, `kill`) stops a run the way Ctrl-C does: as an
exception in the main thread, so that every ``finally`` runs and the engine removes its store
files.

A signal handler's exception is lost when the signal lands in a garbage-collection callback
or a ``__del__`` ("Exception ignored in ..."), and the run would go on. So the handler also
records the request, and the trainer and the engine's partition loops `check` it: the run
then stops at the next partition step at the latest.
"""

from __future__ import annotations

import signal
import threading

_requested = threading.Event()


class Terminated(BaseException):
    """The process was asked to terminate (SIGTERM)."""


def install() -> None:
    """Turn SIGTERM into `Terminated` (main thread only; the ``jgrind`` command does this)."""
    def terminate(signum, frame):
        _requested.set()
        raise Terminated()
    signal.signal(signal.SIGTERM, terminate)


def check() -> None:
    """Raise `Terminated` if SIGTERM arrived (and its first exception was lost)."""
    if _requested.is_set():
        raise Terminated()
