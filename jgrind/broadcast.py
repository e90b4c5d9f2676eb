"""Process 0's bytes in every process of a `jax.distributed` run: what one process read or
decided (a restored checkpoint, the hardware profile a plan is made with) handed to the others
through JAX's own collective, so that every process goes on from the same thing."""

from __future__ import annotations

from typing import Optional

__all__ = ["broadcast_bytes"]


def broadcast_bytes(data: Optional[bytes]) -> bytes:
    """Process 0's ``data``, in every process (the others pass None): its length, then its
    bytes, each with `jax.experimental.multihost_utils.broadcast_one_to_all` (exact for
    integers). Every process must call it at the same point."""
    import numpy as np
    from jax.experimental import multihost_utils
    source = data is not None
    # the length in two int32 (JAX's integers without x64), 2**30 each: up to 2**61 bytes
    high, low = divmod(len(data), 2**30) if source else (0, 0)
    high, low = (int(v) for v in multihost_utils.broadcast_one_to_all(
        np.array([high, low], np.int32)))
    size = high * 2**30 + low
    if size == 0:
        return b""
    buffer = np.frombuffer(data, np.uint8) if source else np.zeros(size, np.uint8)
    return np.asarray(multihost_utils.broadcast_one_to_all(buffer), np.uint8).tobytes()
