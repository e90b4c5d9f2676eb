"""Dropout whose mask depends on (key, global row id, column) only.

Full-graph training run partition by partition must drop exactly the same entries as the
in-memory run. A per-call ``jax.random.bernoulli`` mask depends on the shape and order of the
rows it is drawn for, so it would change with the partitioning. Instead every entry's keep bit is
a counter-based hash of the key, the row's *global* id and the column: the mask of node 17 is
the same whether node 17 sits in partition 0, in partition 3's halo, or in the whole graph.

A key is None (evaluation: nothing dropped), a JAX key (training), or a `SwitchedKey`: a key
with a traced switch. The out-of-core engine passes the last to its forward steps, switched on
in training and off in evaluation, so that one compiled program serves both: a None key is a
different trace, and evaluation would compile every forward step again.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

# a NumPy scalar, not a jnp one: a jnp constant at import would start JAX's backend when jgrind
# is imported (on a GPU, reserving most of its memory before the user could configure JAX)
_GOLDEN = np.uint32(0x9E3779B9)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SwitchedKey:
    """A dropout key and a switch, both traced (pytree leaves): ``on`` a device bool scalar,
    True to drop as ``key`` says, False to drop nothing. Dropout with it computes the dropped
    values and selects them or the input, so a step jitted once runs training (on) and
    evaluation (off) alike; with ``on`` True its values are those of ``key`` alone, bit for
    bit (a select copies them)."""

    key: jax.Array
    on: jax.Array


def fold_in(key, data: int):
    """``jax.random.fold_in(key, data)`` for a dropout key: None stays None, a `SwitchedKey`
    keeps its switch."""
    if key is None:
        return None
    if isinstance(key, SwitchedKey):
        return SwitchedKey(jax.random.fold_in(key.key, data), key.on)
    return jax.random.fold_in(key, data)


def _fmix32(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a bijection on uint32 with good avalanche."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def _seed_words(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    data = jax.random.key_data(key) if jnp.issubdtype(key.dtype, jax.dtypes.prng_key) else key
    data = data.reshape(-1).astype(jnp.uint32)
    return data[0], data[-1]


def keep_mask(key: jax.Array, row_ids: jax.Array, num_cols: int, rate: float) -> jax.Array:
    """``[len(row_ids), num_cols]`` bool: True where the entry is kept (probability 1 - rate)."""
    s0, s1 = _seed_words(key)
    rows = _fmix32(row_ids.astype(jnp.uint32) ^ s0)[:, None]
    cols = jnp.arange(num_cols, dtype=jnp.uint32)[None, :] * _GOLDEN
    bits = _fmix32(_fmix32(rows + cols) ^ s1)
    threshold = jnp.uint32(min(int(rate * 2.0**32), 2**32 - 1))
    return bits >= threshold


def dropout(x: jax.Array, rate: float, key: jax.Array | None, row_ids: jax.Array) -> jax.Array:
    """Inverted dropout of ``x [R, ...]`` keyed by global row ids; identity if key is None
    or a `SwitchedKey` switched off."""
    if key is None or rate == 0.0:
        return x
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"dropout rate must be in [0, 1), got {rate}")
    if isinstance(key, SwitchedKey):
        # a select, not a cond: the step stays one straight-line program with no branch to
        # choose at run time; evaluation computes a mask it does not use
        return jnp.where(key.on, dropout(x, rate, key.key, row_ids), x)
    flat = x.reshape(x.shape[0], -1)
    keep = keep_mask(key, row_ids, flat.shape[1], rate)
    out = jnp.where(keep, flat / (1.0 - rate), jnp.zeros((), x.dtype))
    return out.reshape(x.shape)


def edge_ids(dst_global: jax.Array, src_global: jax.Array) -> jax.Array:
    """A per-edge id from its global endpoints, for dropout on edge quantities (attention)."""
    return _fmix32(dst_global.astype(jnp.uint32)) ^ (src_global.astype(jnp.uint32) * _GOLDEN)
