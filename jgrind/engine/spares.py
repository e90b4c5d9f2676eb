"""`Spares`: step outputs handed back, so that the next step of the same shape writes into them.

Every partition step allocates its large outputs anew: the layer's output rows in forward, the
input gradient in backward. On the CPU backend XLA allocates them with ``malloc``, and glibc
serves a buffer this large (above its mmap threshold, at most 32 MiB) from a fresh mapping and
unmaps it on ``free``: every page of every step's output faults on its first write and is
zeroed by the kernel (`jgrind.hostio.allocator`). The whole-graph step pays that once per epoch; the
engine pays it for every partition of every sweep, although its steps run on a handful of
padded shapes again and again.

So once an output has been stored (written to its table, or scatter-added), the engine hands
it back here, and a later step with an output of the same shape and dtype receives it as a
*donated* argument: XLA then writes that output into the donated buffer instead of allocating
one (`jgrind.engine.steps`: every step with a large output takes a trailing ``spare``).

Safety rests on JAX's donation rules: a donated array is deleted, so nothing that still holds
it can read the new values by mistake (it fails loudly), and an array with a live NumPy view
(anything the store kept a view of) is not reused in place (XLA allocates as before).

Memory: a stored output is kept only for the next step the sweep (`plan`) runs, and only when
that step takes its shape. It then lives from its write to the end of that step, where the
step's own buffer would have lived from the step's start: one more output is alive, which the
engine allows only when the device budget holds it beside the plan. (Kept by shape, up to
three or one of each, with partitions in index order, the peak RSS of the 1M-node benchmark's
host epoch rose by 0.46 and 0.41 GiB, against 0.25 GiB so: an output of one padded shape
waited while steps of another ran; docs/results-history.md, section 4.) The engine runs the
partitions of one shape one after another.
"""

from __future__ import annotations

import threading
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jgrind.hostio.buffers import aligned_empty

# When the engine dispatches step i+1, step i-1's outputs have been stored and handed back (it
# waits for those writes before queuing step i's, `MAX_PENDING_STEPS`): kept for step i+1, a
# buffer waits no longer than a step. Kept for step i+2 as well, it would wait while step
# i+1, of another shape, runs.
LOOKAHEAD = 1


# Placeholders made on the device as off the CPU backend (a zeros program per shape), also on
# it: tools set it to count the programs a GPU compiles on a CPU (tools/trace_epoch.py
# --gpu-paths).
DEVICE_PLACEHOLDERS_ON_CPU = False


def placeholder(shape: tuple, dtype=np.float32):
    """An argument of ``shape`` for a step's ``spare`` when no output can be reused. On the
    CPU it is untouched host memory adopted without a copy (no page is ever touched: XLA
    cannot write into memory it did not allocate, so it allocates the output as usual); on
    another device an array made there (cheap, and donated in place; the first of each shape
    compiles a program)."""
    if jax.default_backend() == "cpu" and not DEVICE_PLACEHOLDERS_ON_CPU:
        return jax.device_put(aligned_empty(shape, dtype))
    return jnp.zeros(shape, dtype)


class Spares:
    """Stored step outputs, by shape and dtype, kept for the steps about to take them. `give`
    may be called from another thread (the engine's writer)."""

    def __init__(self, enabled: bool = True, lookahead: int = LOOKAHEAD):
        self.enabled = enabled
        self.lookahead = lookahead
        self._free: dict[tuple, list] = {}
        self._plan: list[tuple] = []
        self._next = 0  # index in `_plan` of the next take
        self._per_step = 1
        self._lock = threading.Lock()
        self.reused = 0  # outputs written into a reused buffer, and buffers made (for tests)
        self.made = 0

    @staticmethod
    def _key(shape, dtype=np.float32) -> tuple:
        return tuple(int(n) for n in shape), np.dtype(dtype).name

    def plan(self, shapes: Sequence[tuple], per_step: int = 1, dtype=np.float32) -> None:
        """The shapes the sweep about to run takes, in order (``per_step`` takes per step).
        Kept buffers that its first steps do not take are dropped (freed once nothing else
        holds them)."""
        with self._lock:
            self._plan = [self._key(s, dtype) for s in shapes] if self.enabled else []
            self._next, self._per_step = 0, per_step
            free, self._free = self._free, {}
            for key, arrays in free.items():
                for a in arrays:
                    self._keep(key, a)

    def _window(self) -> list:
        return self._plan[self._next:self._next + self.lookahead * self._per_step]

    def _keep(self, key: tuple, array) -> None:
        """Keep ``array`` if a take in the window needs its shape and none kept is there for
        it. Called with the lock held."""
        free = self._free.setdefault(key, [])
        if len(free) < self._window().count(key):
            free.append(array)

    def take(self, shape: tuple, dtype=np.float32):
        """A kept output of this shape to donate, else a `placeholder`."""
        key = self._key(shape, dtype)
        with self._lock:
            self._next += 1
            free = self._free.get(key)
            if free:
                self.reused += 1
                return free.pop()
        self.made += 1
        return placeholder(key[0], dtype)

    def give(self, *arrays) -> None:
        """Hand back outputs that have been stored and are read no more."""
        with self._lock:
            for a in arrays:
                if isinstance(a, jax.Array) and not a.is_deleted():
                    self._keep(self._key(a.shape, a.dtype), a)
