"""Host buffers that XLA's CPU client adopts without copying.

When a NumPy array is handed to JAX (``jax.device_put`` or a jitted function's argument) on the
CPU backend, XLA uses the array's memory in place if it is aligned to `ALIGNMENT` bytes, and
copies it into a freshly allocated buffer otherwise. NumPy's own allocations are aligned to 16
bytes only, so every partition step's gathered input used to be copied once more, into pages
that fault on first write. The store allocates the buffers it hands to the steps here.
On a GPU the transfer is a copy either way and alignment changes nothing.

An adopted buffer belongs to the JAX array from then on: it must not be written afterwards
(the store's buffers are filled once and handed over).
"""

from __future__ import annotations

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
