"""Host RAM for the store's tables, handed from a freed table to the next one.

Every epoch makes its gradient tables anew (``G_l`` lives from layer l's backward sweep to layer
l-1's) and, under recomputation, its transient activation tables. A new NumPy array of that size
is fresh memory: its pages fault and are zeroed by the kernel the first time they are written,
which is inside the writer thread's scatter-adds and block writes, while XLA's steps run on the
same cores. Keeping the freed arrays, and zeroing one in a single pass when the next table needs
it, took the median ``host_offload`` epoch of a 1M-node GCN (8 partitions, 2.3 GiB of gradient
tables) from 17.0 s to 15.4 s on the 2-core test machine, in an interleaved A/B
(docs/results-history.md, section 4, "Host tables hand their memory on"). The SSD tier keeps its
gradient *files* for the same reason (`jgrind.engine.store.Store.drop`).

A kept array is resident memory, so it is counted: `HostArrays.resident` is every array the pool
holds, in use or kept, and the store's host account charges exactly that. Kept arrays are given
back to the C allocator (least recently freed first) before a new array would take the total
past ``limit``, the plan's peak of stored host bytes; with ``limit`` 0 nothing is kept. A table
takes a kept array of its own size, or a larger one (its rows a view of the array's start, the
whole array still counted) where the caller says which tables will be made while it lives and
they still fit (`HostArrays._kept_for`). The engine says so for gradient tables: their
lives are nested, so a 47-wide ``G_3`` can take a 256-wide array that ``G_1`` takes back
after ``G_3`` is freed.

The store's accounts never pass the plan's peak, but the process's resident memory can: kept
arrays stay resident through the forward sweep, next to XLA's buffers, where freed ones were
not (docs/engine.md, "Host tables hand their memory on").
"""

from __future__ import annotations

import collections
import threading
from typing import Callable, Optional

import numpy as np


class HostArrays:
    """Zeroed float32 host tables, from kept arrays where one serves (`_kept_for`).

    Args:
      limit: keep freed arrays while every array held, in use and kept, stays within this many
        bytes (the plan's peak of stored host bytes).
      on_change: called with the change of `resident` in bytes (the store charges its host
        account with it).
    """

    def __init__(self, limit: int, on_change: Callable[[int], None] = lambda delta: None):
        self.limit = max(int(limit), 0)
        self.resident = 0   # bytes of every array held: handed out or kept
        self.made = 0       # arrays allocated (for tests and reports)
        self.reused = 0     # tables served from a kept array
        self._kept: collections.OrderedDict[int, np.ndarray] = collections.OrderedDict()
        self._in_use: dict[int, np.ndarray] = {}  # id -> every array handed out (as a view)
        self._on_change = on_change
        self._lock = threading.Lock()

    @property
    def kept_bytes(self) -> int:
        with self._lock:
            return sum(a.nbytes for a in self._kept.values())

    def take(self, rows: int, width: int, reserve: Optional[int] = None) -> np.ndarray:
        """A zeroed ``[rows, width]`` float32 array: a kept array (see `_kept_for`) if one
        serves, else a new one (kept arrays are given back first, least recently freed first,
        while the total would pass the limit).

        ``reserve``: the most bytes of tables that will be made while this one lives. Given,
        a larger kept array may serve (its tail unused) where that still leaves room for them;
        None: only an array of exactly this size."""
        need = int(rows) * int(width)
        delta = 0
        with self._lock:
            whole = self._kept_for(need, reserve)
            fresh = whole is None
            if fresh:
                for key in list(self._kept):
                    if self.resident + delta + need * 4 <= self.limit:
                        break
                    delta -= self._kept.pop(key).nbytes
                # np.zeros: the kernel's zero pages, faulted in as they are first written
                whole = np.zeros(need, np.float32)
                delta += whole.nbytes
                self.made += 1
            else:
                self.reused += 1
            self.resident += delta
            self._in_use[id(whole)] = whole
        view = whole[:need].reshape(int(rows), int(width))  # its .base is ``whole``
        if not fresh:
            view.fill(0.0)  # one pass, here, instead of page faults in the writer thread
        if delta:
            self._on_change(delta)
        return view

    def _kept_for(self, need: int, reserve: Optional[int]):
        """The kept array for a table of ``need`` floats, or None: the last freed of exactly
        that size, else (with a ``reserve``) the smallest larger one whose whole size, with
        the arrays in use and ``reserve``, is within the limit.

        A larger array's unused tail cannot be given back while its table lives, so a table
        made during that life could take the total past the limit with nothing kept left to
        give back. Checking the tables to come (``reserve``) rules that out; without it, only
        an exact size is safe (a narrower recomputed layer in a wider array went 20 % over the
        plan's peak)."""
        for key in reversed(self._kept):
            if self._kept[key].size == need:
                return self._kept.pop(key)
        if reserve is None:
            return None
        larger = [(a.size, key) for key, a in self._kept.items() if a.size > need]
        if not larger:
            return None
        size, key = min(larger)
        in_use = self.resident - sum(a.nbytes for a in self._kept.values())
        if in_use + size * 4 + reserve > self.limit:
            return None
        return self._kept.pop(key)

    def give(self, view: np.ndarray) -> None:
        """Hand back an array from `take`: kept for the next `take` if the limit allows, else
        given back to the C allocator."""
        with self._lock:
            whole = self._in_use.pop(id(view.base))
            if self.resident <= self.limit:
                self._kept[id(whole)] = whole
                return
            self.resident -= whole.nbytes
        self._on_change(-whole.nbytes)

    def clear(self) -> None:
        """Give every kept array back to the C allocator."""
        with self._lock:
            freed = sum(a.nbytes for a in self._kept.values())
            self._kept.clear()
            self.resident -= freed
        if freed:
            self._on_change(-freed)
