"""The full-graph loss: summed over training nodes, divided by the *global* training count.

Each training node carries weight ``1 / n_train`` (zero elsewhere), so a partition's share of
the loss is its own weighted sum and the shares add up to the full-graph mean exactly; the
gradient does not depend on the number of partitions.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def node_weights(train_mask: np.ndarray) -> np.ndarray:
    """``[N]`` float32: ``1 / n_train`` on training nodes, 0 elsewhere."""
    n_train = int(train_mask.sum())
    if n_train == 0:
        raise ValueError("the training mask is empty: there is nothing to train on")
    return (train_mask / n_train).astype(np.float32)


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """``sum_i weights[i] * CE(logits[i], labels[i])``; rows with weight 0 (e.g. label -1)
    contribute nothing."""
    safe = jnp.where(labels >= 0, labels, 0)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, safe[:, None], axis=-1)[:, 0]
    return jnp.sum(jnp.where(weights > 0, nll * weights, 0.0))
