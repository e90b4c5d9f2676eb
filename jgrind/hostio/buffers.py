"""Host buffers that XLA's CPU client adopts without copying.

When a NumPy array is handed to JAX (``jax.device_put`` or a jitted function's argument) on the
CPU backend, XLA uses the array's memory in place if it is aligned to `ALIGNMENT` bytes, and
copies it into a freshly allocated buffer otherwise. NumPy's own allocations are aligned to 16
bytes only, so every partition step's gathered input used to be copied once more, into pages
that fault on first write. The store allocates the buffers it hands to the steps here.
On a GPU the transfer is a copy either way and alignment changes nothing.

An adopted buffer belongs to the JAX array from then on: it must not be written while that
array lives. The store fills each buffer once and hands it over; `Recycler` fills a buffer
again only once nothing references it any more, the adopting JAX array included.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

ALIGNMENT = 64  # XLA's minimum alignment for buffers it uses in place (cache-line size)


def aligned_empty(shape, dtype=np.float32) -> np.ndarray:
    """An uninitialised array of ``shape`` whose data starts on an `ALIGNMENT`-byte boundary."""
    dtype = np.dtype(dtype)
    shape = tuple(int(n) for n in np.atleast_1d(shape)) if not isinstance(shape, tuple) \
        else tuple(int(n) for n in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def aligned_zeros(shape, dtype=np.float32) -> np.ndarray:
    out = aligned_empty(shape, dtype)
    out.fill(0)
    return out


def _aligned_view(raw: np.ndarray, shape: tuple, dtype) -> np.ndarray:
    """The first ``prod(shape)`` items of ``raw`` (an `aligned_empty`-style uint8 block) from its
    first `ALIGNMENT`-byte boundary, as an array of ``shape``."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    start = (-raw.ctypes.data) % ALIGNMENT
    return raw[start:start + nbytes].view(dtype).reshape(shape)


class Recycler:
    """Aligned buffers made again and again in a few shapes (a partition step's inputs), handed
    out again once nothing holds them.

    A buffer this large (hundreds of MB: a partition's gathered rows) is a fresh ``mmap`` on
    every allocation and an ``munmap`` on every free, so the kernel maps and zeroes its pages
    again for every step: in an ad-hoc check on the 2-core test machine, gathering 200k rows
    of 256 floats took 27-29 ms into fresh memory and 19-20 ms into a reused buffer. The
    recycler keeps the blocks it made, up to ``max_bytes`` in all, and serves a request from
    the smallest kept block at least as large that nothing holds any more.

    "Nothing holds it" is read from the block's reference count: every array handed out is a
    view of the block (NumPy views keep their base alive), a JAX array that adopted it without a
    copy keeps it referenced until XLA is done with the memory (PJRT's contract for zero-copy
    host buffers), and a pending write keeps its argument. So users just drop their arrays, as
    with any NumPy array; a block still referenced anywhere is never handed out twice.

    The kept blocks stay resident between uses: a caller sizes ``max_bytes`` to what its
    budget holds beside its plan (0 turns recycling off). `made` and `reused` count requests.

    The store's tables have a pool of their own (`jgrind.engine.host_arrays.HostArrays`):
    a table is freed explicitly, and its memory is counted in the host account. A step input
    has no such moment (its last holder may be XLA, the writer thread or a view), hence the
    reference counts here.
    """

    def __init__(self, max_bytes: int = 0):
        self.max_bytes = int(max_bytes)
        self._blocks: list[np.ndarray] = []  # raw uint8 blocks, kept by this list only
        self._lock = threading.Lock()
        self.made = 0
        self.reused = 0
        self._unheld = self._references_when_unheld()

    def _references(self, i: int) -> int:
        return sys.getrefcount(self._blocks[i])

    def _references_when_unheld(self) -> int:
        """The reference count `_references` sees for a block only this list holds (measured,
        not assumed: it differs between Python versions)."""
        self._blocks.append(np.empty(ALIGNMENT, np.uint8))
        try:
            return self._references(len(self._blocks) - 1)
        finally:
            self._blocks.pop()

    @property
    def kept_bytes(self) -> int:
        return sum(b.size for b in self._blocks)

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """An uninitialised aligned array of ``shape``, like `aligned_empty`, in a kept block
        when one is free (its old contents are still there: the caller fills it)."""
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        need = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize + ALIGNMENT
        with self._lock:
            free = [i for i in range(len(self._blocks))
                    if self._blocks[i].size >= need and self._references(i) == self._unheld]
            if free:
                self.reused += 1
                best = min(free, key=lambda i: self._blocks[i].size)
                return _aligned_view(self._blocks[best], shape, dtype)
            self.made += 1
            raw = np.empty(need, np.uint8)
            if need <= self.max_bytes:
                self._make_room(need)
                if self.kept_bytes + need <= self.max_bytes:
                    self._blocks.append(raw)
            return _aligned_view(raw, shape, dtype)

    def _make_room(self, need: int) -> None:
        """Forget free blocks, smallest first, until ``need`` more bytes fit (blocks in use stay:
        their users free them as usual)."""
        kept, forget = self.kept_bytes, set()
        for i in sorted(range(len(self._blocks)), key=lambda i: self._blocks[i].size):
            if kept + need <= self.max_bytes:
                break
            if self._references(i) == self._unheld:
                forget.add(i)
                kept -= self._blocks[i].size
        self._blocks = [b for i, b in enumerate(self._blocks) if i not in forget]

    def clear(self) -> None:
        """Forget every kept block (freed once their users drop them)."""
        with self._lock:
            self._blocks = []
