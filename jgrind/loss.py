"""The full-graph loss: summed over training nodes, divided by the *global* training count.
(Softmax cross entropy for class ids; for multi-label targets, binary cross entropy.)

Each training node carries weight ``1 / n_train`` (zero elsewhere), so a partition's share of
the loss is its own weighted sum and the shares add up to the full-graph mean exactly; the
gradient does not depend on the number of partitions.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np


def node_weights(train_mask: np.ndarray) -> np.ndarray:
    """``[N]`` float32: ``1 / n_train`` on training nodes, 0 elsewhere."""
    n_train = int(train_mask.sum())
    if n_train == 0:
        raise ValueError("the training mask is empty: there is nothing to train on")
    return (train_mask / n_train).astype(np.float32)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """``[n]``: every node's softmax cross-entropy, the default node loss."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]


def binary_cross_entropy(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """``[n]``: every node's sigmoid binary cross-entropy, averaged over its known targets; the
    default node loss of a multi-label task (``targets [n, T]`` in 1 / 0, -1 unknown).

    With every target known, the mean of these over the training nodes is the mean over all
    node-target pairs, as ``torch.nn.BCEWithLogitsLoss`` in OGB's ogbn-proteins examples. A
    node with no known target has loss 0."""
    per_target, known = _known_target_losses(logits, targets)
    count = jnp.sum(known, axis=-1)
    return jnp.sum(per_target, axis=-1) / jnp.maximum(count, 1).astype(logits.dtype)


def _known_target_losses(logits: jax.Array, targets: jax.Array, pos_weight=None):
    """``([n, T] sigmoid cross entropy of every known target, 0 for unknown ones, [n, T]
    known)``; ``pos_weight`` (``[T]``) scales each task's positive term, as torch's."""
    known = targets >= 0
    y = jnp.where(known, targets, 0).astype(logits.dtype)
    if pos_weight is None:
        # log(1 + exp(-|x|)) + max(x, 0) - x y: finite for any logit
        per_target = jnp.maximum(logits, 0) - logits * y + jnp.log1p(jnp.exp(-jnp.abs(logits)))
    else:
        # p y softplus(-x) + (1 - y) softplus(x): sums of non-negative terms, no cancellation
        # (torch's (1 - y) x + (1 + (p - 1) y) softplus(-x) loses digits of small losses)
        p = jnp.asarray(pos_weight, logits.dtype)
        tail = jnp.log1p(jnp.exp(-jnp.abs(logits)))
        per_target = (p * y * (jnp.maximum(-logits, 0) + tail)
                      + (1 - y) * (jnp.maximum(logits, 0) + tail))
    return jnp.where(known, per_target, 0.0), known


@dataclasses.dataclass(frozen=True)
class WeightedBinaryCrossEntropy:
    """`binary_cross_entropy` with every task's positive term weighted: ``pos_weight[t]``
    times the loss of a positive target of task ``t``, as ``torch.nn.BCEWithLogitsLoss(
    pos_weight=...)``, for tasks whose positives are rare. Build it with `positive_weights`
    (negatives per positive among the training targets) or give the weights yourself."""

    pos_weight: tuple

    def __post_init__(self):
        object.__setattr__(self, "pos_weight", _check_pos_weight(self.pos_weight))

    def __call__(self, logits: jax.Array, targets: jax.Array) -> jax.Array:
        per_target, known = _known_target_losses(logits, targets, self.pos_weight)
        count = jnp.sum(known, axis=-1)
        return jnp.sum(per_target, axis=-1) / jnp.maximum(count, 1).astype(logits.dtype)


def _check_pos_weight(pos_weight) -> tuple:
    """``pos_weight`` as a tuple of floats (hashable: equal losses share compiled steps),
    each finite and above 0."""
    weights = tuple(float(p) for p in np.ravel(pos_weight))
    if not weights or not all(np.isfinite(p) and p > 0 for p in weights):
        raise ValueError(f"pos_weight must be one finite number above 0 per task, got "
                         f"{pos_weight!r}")
    return weights


def positive_weights(graph, split: int = 0) -> tuple:
    """Every task's negatives per positive among the known targets of ``split``'s training
    nodes (the ``pos_weight`` torch's documentation suggests); 1.0 for a task without a
    positive or a negative there."""
    if graph.labels.ndim != 2:
        raise ValueError(f"{graph.name} has one class per node; positive weights are for "
                         "multi-label targets [N, T]")
    targets = np.asarray(graph.labels[graph.train_mask[split]])
    positives = np.sum(targets == 1, axis=0)
    negatives = np.sum(targets == 0, axis=0)
    ratio = np.where((positives > 0) & (negatives > 0),
                     negatives / np.maximum(positives, 1), 1.0)
    return tuple(float(r) for r in ratio)


@dataclasses.dataclass(frozen=True)
class PairMeanBinaryCrossEntropy:
    """Binary cross entropy averaged over the training set's known (node, target) pairs, not
    node by node: ``torch.nn.BCEWithLogitsLoss`` on the known entries, as OGB and PyG scripts
    compute it when some targets are unknown. (With every target known it equals
    `binary_cross_entropy`.) A node's loss is its known targets' summed loss times ``scale``,
    the training nodes per known training pair, so that the trainer's division by the number
    of training nodes gives the pair mean; build it with `pair_mean_binary_cross_entropy`.
    Its ``val_loss`` is the mean over validation nodes of that same per-node value."""

    scale: float
    pos_weight: Optional[tuple] = None  # as in `WeightedBinaryCrossEntropy`

    def __post_init__(self):
        if self.pos_weight is not None:
            object.__setattr__(self, "pos_weight", _check_pos_weight(self.pos_weight))

    def __call__(self, logits: jax.Array, targets: jax.Array) -> jax.Array:
        per_target = _known_target_losses(logits, targets, self.pos_weight)[0]
        return self.scale * jnp.sum(per_target, axis=-1)


def pair_mean_binary_cross_entropy(graph, split: int = 0,
                                   pos_weight=None) -> PairMeanBinaryCrossEntropy:
    """`PairMeanBinaryCrossEntropy` for ``graph``'s multi-label targets and the training mask
    of ``split``: build it for the split you train (another split's scale is off)."""
    if graph.labels.ndim != 2:
        raise ValueError(f"{graph.name} has one class per node; the pair mean is for "
                         "multi-label targets [N, T]")
    train = graph.train_mask[split]
    pairs = int(np.sum(graph.labels[train] >= 0))
    if pairs == 0:
        raise ValueError(f"{graph.name}: no known target among the training nodes of split "
                         f"{split}")
    return PairMeanBinaryCrossEntropy(float(train.sum()) / pairs, pos_weight)


@dataclasses.dataclass(frozen=True)
class SmoothedCrossEntropy:
    """Cross entropy against targets smoothed toward uniform: ``(1 - smoothing)`` on the label,
    ``smoothing / C`` on every class (``torch.nn.CrossEntropyLoss(label_smoothing=)``). A frozen
    dataclass: equal losses share their compiled steps."""

    smoothing: float

    def __call__(self, logits: jax.Array, labels: jax.Array) -> jax.Array:
        logp = jax.nn.log_softmax(logits, axis=-1)
        num_classes = logits.shape[-1]
        on_label = jnp.take_along_axis(logp, labels[:, None], axis=-1)[:, 0]
        return -((1 - self.smoothing) * on_label
                 + self.smoothing / num_classes * jnp.sum(logp, axis=-1))


def weighted_loss(node_loss: Optional[Callable], logits: jax.Array, labels: jax.Array,
                  weights: jax.Array) -> jax.Array:
    """``sum_i weights[i] * node_loss(logits, labels)[i]``; rows with weight 0 (e.g. label -1)
    contribute nothing.

    ``node_loss(logits [n, C], labels [n] int) -> [n]`` is any per-node loss written in JAX
    (default `cross_entropy`): label smoothing, class weights, a focal loss. Summed over nodes
    with global weights it keeps the gradient independent of the partitioning. Unlabelled
    nodes reach it with label 0 and weight 0. Multi-label targets (``labels [n, T]``) reach it
    as they are, -1 for an unknown target (default `binary_cross_entropy`)."""
    if labels.ndim == 2:
        per_node = (node_loss or binary_cross_entropy)(logits, labels)
    else:
        per_node = (node_loss or cross_entropy)(logits, jnp.where(labels >= 0, labels, 0))
    return jnp.sum(jnp.where(weights > 0, per_node * weights, 0.0))


def weighted_cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> jax.Array:
    """`weighted_loss` with `cross_entropy`."""
    return weighted_loss(cross_entropy, logits, labels, weights)
