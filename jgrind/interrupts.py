"""SIGTERM (a batch scheduler's time limit, `kill`) stops a run the way Ctrl-C does: as an
exception in the main thread, so that every ``finally`` runs and the engine removes its store
files.

A signal handler's exception is lost when the signal lands in a garbage-collection callback
or a ``__del__`` ("Exception ignored in ..."; seen with XLA's GC callback), and the run would
go on. So the handlers also record the request, and the trainer and the engine's partition
loops `check` it: the run then stops at the next partition step out of core, at the next
epoch in memory. Ctrl-C
(SIGINT) is handled the same way, as KeyboardInterrupt.

Only the first signal raises. A second one, often a few milliseconds later (Ctrl-C pressed
twice, a scheduler's SIGTERM after SIGINT), would otherwise abort the cleanup the first one
started, halfway through removing the store's files, or raise in an ``except`` clause (a
traceback instead of one line); it is recorded and raises nothing. And work that must not be
cut in half (a checkpoint being written) runs `deferred`: a signal then waits for its end.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from typing import Iterator, Optional

_requested: Optional[BaseException] = None  # the exception a signal asked for, once one came
_raised = False  # a signal's exception was raised: later signals are only recorded
_deferring = 0  # depth of `deferred` sections now running


class Terminated(BaseException):
    """The process was asked to terminate (SIGTERM)."""


def install() -> None:
    """Turn SIGTERM into `Terminated` and SIGINT into KeyboardInterrupt, recorded for `check`
    too (main thread only; the ``jgrind`` command does this)."""
    def handler(kind):
        def handle(signum, frame):
            global _requested, _raised
            if _requested is None:
                _requested = kind()
            if _raised or _deferring:
                return
            _raised = True
            raise kind()
        return handle
    signal.signal(signal.SIGTERM, handler(Terminated))
    signal.signal(signal.SIGINT, handler(KeyboardInterrupt))
    previous = sys.unraisablehook

    def unraisable(info):
        # a signal's exception lost in a callback (XLA's garbage-collection one) would print
        # "Exception ignored in ..." with a traceback; the request is recorded, and `check`
        # raises it at the next partition step or epoch
        if _requested is not None and isinstance(info.exc_value, (KeyboardInterrupt, Terminated)):
            return
        previous(info)
    sys.unraisablehook = unraisable


def check() -> None:
    """Raise what a signal asked for if one came (and its first exception may have been
    lost)."""
    global _raised
    if _requested is not None:
        _raised = True
        raise type(_requested)()


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Run the body whole: a signal that comes meanwhile is recorded and raised at its end
    (unless the body raised, or a signal's exception already did)."""
    global _deferring, _raised
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
    if not _deferring and _requested is not None and not _raised:
        _raised = True
        raise type(_requested)()
