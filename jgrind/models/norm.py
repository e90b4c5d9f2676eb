"""LayerNorm over the feature axis: per node, so it does not depend on the partitioning.

(BatchNorm is deliberately absent: its statistics span all nodes, which partition-wise execution
would have to compute in a second pass.)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def layer_norm_init(dim: int) -> dict:
    return {"scale": jnp.ones((dim,), jnp.float32), "offset": jnp.zeros((dim,), jnp.float32)}


def layer_norm(params: dict, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * params["scale"] + params["offset"]
