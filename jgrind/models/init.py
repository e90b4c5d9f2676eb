"""Parameter initialisers (the ones PyG and the original papers use)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def glorot(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Glorot/Xavier uniform over the last two axes, as PyG's ``glorot``."""
    fan_in, fan_out = shape[-2], shape[-1]
    limit = jnp.sqrt(6.0 / (fan_in + fan_out))
    return jax.random.uniform(key, shape, jnp.float32, -limit, limit)


def zeros(shape: tuple[int, ...]) -> jax.Array:
    return jnp.zeros(shape, jnp.float32)
