"""How arrays cross between host memory and the device: the engine's way, in one place, so
that the hardware profile times the very path the engine takes.

Off the CPU backend, host memory that the device's copy engines read and write directly is
JAX's page-locked ``pinned_host`` memory kind. A device array copied there by `jax.device_put`
moved at 42 GB/s on an H200, and NumPy reads it in place (`host_view`); copied into pageable
NumPy memory (``np.asarray``, ``copy_to_host_async``) it moved at 1.1 GB/s
(tools/bench_transfers.py, docs/results-history.md section 8). On the CPU backend a device array's
buffer is host memory already: its host view is the buffer, and nothing is copied.
"""

from __future__ import annotations

import ctypes
import math
import sys
import threading
from typing import Optional

import jax
import numpy as np

from jgrind.hostio import buffers


def pinned_host() -> Optional[jax.sharding.Sharding]:
    """The default device's page-locked host memory, where its backend has one."""
    device = jax.devices()[0]
    if "pinned_host" not in {m.kind for m in device.addressable_memories()}:
        return None
    return jax.sharding.SingleDeviceSharding(device, memory_kind="pinned_host")


def host_copies() -> Optional[jax.sharding.Sharding]:
    """Where the engine copies step outputs it stores in host memory: `pinned_host` off the
    CPU backend, None on it (the output's buffer is its host view)."""
    return pinned_host() if jax.default_backend() != "cpu" else None


def host_view(values) -> np.ndarray:
    """``values`` (a device array, its ``pinned_host`` copy, or NumPy rows) as a NumPy array:
    a JAX array is fetched by `jax.device_get`, an explicit transfer that is a view, without a
    copy, of a CPU backend's buffer or a ``pinned_host`` array."""
    return jax.device_get(values) if isinstance(values, jax.Array) else np.asarray(values)


def to_host(values: jax.Array, where: Optional[jax.sharding.Sharding]) -> jax.Array:
    """Start copying a device array to ``where`` (`host_copies`), or return it as it is when
    ``where`` is None; `host_view` of the result reads it on the host."""
    return values if where is None else jax.device_put(values, where)


class PinnedStaging:
    """Page-locked host buffers that step inputs are filled into, each sent to the device
    without the runtime's staging copy.

    A `jax.device_put` of pageable NumPy memory first copies the bytes into a page-locked
    transfer buffer on one of the runtime's threads. On an H200 those copies took 1.79 s of a
    2.7 s `host_offload` epoch, against 0.19 s over the link (docs/results-history.md,
    section 8). A buffer here is a ``pinned_host`` JAX array whose host memory is filled in
    place through a NumPy view (`empty`); `to_device` then puts the JAX array itself, which
    the copy engine reads directly.

    The NumPy view writes into memory a JAX array owns, which JAX otherwise treats as
    immutable. That is safe under two rules kept here: a buffer is filled again only once no
    view of it is referenced (the reference count of its flat view, as in
    `jgrind.hostio.buffers.Recycler`), and its last transfer to the device has finished.

    Buffers are kept per (shape, dtype), at most ``per_shape`` each (a step input comes in a
    handful of padded shapes); a request beyond them gets ``fallback``'s memory (ordinary
    aligned memory by default), which `to_device` does not claim. It has the same `empty` as
    `jgrind.hostio.buffers.Recycler`, so a store can take either as its buffers; with ``enabled``
    False every request goes to ``fallback``, so a switched-off pool changes nothing.
    """

    def __init__(self, host: jax.sharding.Sharding, device: jax.sharding.Sharding,
                 per_shape: int = 3, fallback=None, enabled: bool = True):
        self.host, self.device, self.per_shape = host, device, int(per_shape)
        self.fallback, self.enabled = fallback, bool(enabled)
        self._kept: dict[tuple, list[_PinnedBuffer]] = {}
        self._by_address: dict[int, _PinnedBuffer] = {}
        self._lock = threading.Lock()
        self.made = 0
        self.reused = 0
        self.unpinned = 0  # requests served with ordinary memory

    @property
    def kept_bytes(self) -> int:
        return sum(b.array.nbytes for bufs in self._kept.values() for b in bufs)

    def empty(self, shape, dtype=np.float32) -> np.ndarray:
        """An uninitialised array of ``shape`` in a page-locked buffer when one is free or may
        be made, else in ordinary aligned memory."""
        if not self.enabled:
            return self._ordinary(shape, dtype)
        dtype = np.dtype(dtype)
        shape = tuple(int(n) for n in shape)
        key = (shape, dtype.str)
        with self._lock:
            kept = self._kept.setdefault(key, [])
            for buf in kept:
                if buf.free():
                    self.reused += 1
                    return buf.flat.reshape(shape)
            if len(kept) < self.per_shape and math.prod(shape) > 0:
                buf = _PinnedBuffer(
                    jax.device_put(np.zeros(shape, dtype), self.host), dtype)
                kept.append(buf)
                self._by_address[buf.address] = buf
                self.made += 1
                return buf.flat.reshape(shape)
        self.unpinned += 1
        return self._ordinary(shape, dtype)

    def _ordinary(self, shape, dtype) -> np.ndarray:
        if self.fallback is not None:
            return self.fallback.empty(shape, dtype)
        return buffers.aligned_empty(shape, dtype)

    def to_device(self, values: np.ndarray) -> Optional[jax.Array]:
        """``values`` on the device, put from its page-locked buffer, if it is a whole buffer
        `empty` gave; else None (the caller puts it as any NumPy array)."""
        if not isinstance(values, np.ndarray) or values.size == 0:
            return None
        buf = self._by_address.get(values.ctypes.data)
        if buf is None or values.shape != buf.array.shape or values.dtype != buf.dtype:
            return None
        out = jax.device_put(buf.array, self.device)
        buf.last_transfer = out
        return out

    def clear(self) -> None:
        """Forget every buffer (freed once their views and transfers are done with them)."""
        with self._lock:
            self._kept, self._by_address = {}, {}
        if self.fallback is not None:
            self.fallback.clear()


class _PinnedBuffer:
    """A ``pinned_host`` array and a writeable flat NumPy view of its memory."""

    def __init__(self, array: jax.Array, dtype: np.dtype):
        self.array, self.dtype = array, dtype
        self.address = array.unsafe_buffer_pointer()
        raw = (ctypes.c_char * array.nbytes).from_address(self.address)
        self.flat = np.frombuffer(raw, dtype=dtype)
        self._unheld = sys.getrefcount(self.flat)
        self.last_transfer: Optional[jax.Array] = None

    def free(self) -> bool:
        """No view of the buffer is referenced and its last transfer has finished."""
        if sys.getrefcount(self.flat) > self._unheld:
            return False
        return self.last_transfer is None or self.last_transfer.is_ready()


def pinned_staging(per_shape: int = 3, fallback=None,
                   enabled: bool = True) -> Optional[PinnedStaging]:
    """Page-locked staging for the default device, where its backend has ``pinned_host``
    memory (`PinnedStaging`'s arguments)."""
    host = pinned_host()
    if host is None:
        return None
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0], memory_kind="device")
    return PinnedStaging(host, device, per_shape, fallback, enabled)
