"""The layers' dense products, at full float32 precision on every backend.

On NVIDIA GPUs since Ampere, JAX multiplies float32 matrices on the TF32 tensor cores by
default: each input is rounded to 10 mantissa bits first. The partitioned engine and the
in-memory step multiply the same rows, but a value that differs in its last float32 bit between
the two (the sparse product sums in another order) can round to a different TF32 value, so the
two computations would agree to about 1e-3 instead of float32 tolerance, and exactness is what
jgrind promises. PyTorch (and so PyG) also multiplies float32 at full precision by default
(``torch.backends.cuda.matmul.allow_tf32`` is False). A GNN epoch's time is mostly sparse
products and memory traffic, so the slower dense product costs little; on a CPU the precision
changes nothing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

PRECISION = jax.lax.Precision.HIGHEST


def matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """``a @ b`` in float32 (its backward's products inherit the precision)."""
    return jnp.matmul(a, b, precision=PRECISION)
