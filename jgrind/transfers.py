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

from typing import Optional

import jax
import numpy as np


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
