"""Dropout moved from a layer's input to the output of the layer below, as the engine runs it.

Every layer of a GNN with dropout drops its input: layer ``l`` computes ``dropout(H_l)`` over
every row it reads. Run partition by partition, those are a partition's *input* rows, halo
included (1.67x the nodes of a 1M-node graph cut in 8), and the engine runs the dropout in the
forward step, again in the backward step's recompute, and once more on the input gradient. The
entries dropped depend only on the key, the row's global node id and the column
(`jgrind.models.dropout`), so the layer below can drop its own output rows instead, once per
node: it stores ``D_l = dropout(H_l)``, and layer ``l`` reads ``D_l`` and drops nothing. The
function is the same, and so are the gradients:

* forward: layer ``l`` sees the same values, and nothing else reads ``H_l``;
* backward: the producer's vjp runs through its output dropout. Where it runs from an output
  mask instead (ReLU, `jgrind.models.conv.derivative_from_output`), the mask of ``D_l`` is the
  derivative: ``D_l > 0`` exactly where ``relu'(z) = 1`` and the entry is kept, and the kept
  entries' gradient is scaled by ``1 / (1 - rate)`` (`output_scale`).

A layer's dropout moves when it drops its raw input: no LayerNorm before it (the norm reads the
rows undropped) and no residual (the skip path adds the undropped input). The first layer's
input, the features, has no producer and keeps its dropout. `DropsOutput` wraps the producer;
its output dropout is keyed by the consumer's key, so it takes a pair of keys
(`step_key`). The in-memory path runs the model as written.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax

from jgrind.models.block import Block
from jgrind.models.conv import LayerOptions
from jgrind.models.dropout import dropout as hashed_dropout


@dataclasses.dataclass(frozen=True)
class DropsOutput:
    """``layer`` followed by the dropout its consumer used to apply to its input.

    Called with a pair of keys ``(layer's own key, consumer's key)`` (either may be None: no
    dropout). Every other attribute (widths, options, ``init``, ``aggregates``...) is the
    wrapped layer's: the parameters and the pre-activation are the same."""

    layer: object
    rate: float

    def __getattr__(self, name: str):
        # only reached for attributes the wrapper lacks; never for its own fields (which would
        # recurse while a copy is being built)
        if name in ("layer", "rate") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.layer, name)

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        own, consumer = split_key(key)
        return drop_output(self.layer(params, block, h, own), self.rate, consumer, block)


def drop_output(y: jax.Array, rate: float, key: Optional[jax.Array], block: Block) -> jax.Array:
    """The consumer's dropout on a layer's output rows (the block's first ``len(y)`` node ids:
    owned rows come first among a block's inputs)."""
    return hashed_dropout(y, rate, key, block.node_ids[: y.shape[0]])


def split_key(key) -> tuple:
    """``(own, consumer)`` from a `DropsOutput`'s key argument (None: evaluation)."""
    return (None, None) if key is None else key


def unwrap(layer):
    """The layer whose parameters and products a (possibly wrapped) layer runs."""
    return layer.layer if isinstance(layer, DropsOutput) else layer


def output_rate(layer) -> float:
    return layer.rate if isinstance(layer, DropsOutput) else 0.0


def output_scale(layer) -> float:
    """What a kept entry of the output is multiplied by after the activation (1 without)."""
    return 1.0 / (1.0 - output_rate(layer))


def drops_input(layer) -> bool:
    """Whether ``layer`` drops its input rows itself (its dropout did not move, or cannot)."""
    opts = getattr(unwrap(layer), "options", None)
    return isinstance(opts, LayerOptions) and opts.dropout > 0.0


def movable(layer) -> bool:
    """Whether ``layer``'s input dropout can run in the layer below instead."""
    if isinstance(layer, DropsOutput):  # already a producer: the executed model as built
        return False
    opts = getattr(layer, "options", None)
    return (isinstance(opts, LayerOptions) and opts.dropout > 0.0 and not opts.layer_norm
            and not opts.residual)


def move_dropout(layers) -> tuple:
    """``layers`` with every movable input dropout (but the first layer's) moved to the layer
    below's output. Idempotent: a moved dropout leaves a consumer with rate 0."""
    out = list(layers)
    for l in range(1, len(out)):
        if movable(out[l]):
            opts = out[l].options
            out[l - 1] = DropsOutput(out[l - 1], opts.dropout)
            out[l] = dataclasses.replace(out[l], options=dataclasses.replace(opts, dropout=0.0))
    return tuple(out)


def step_key(layer, own: Optional[jax.Array], consumer: Optional[jax.Array]):
    """The key argument of ``layer``: ``own`` for a plain layer, the pair for `DropsOutput`."""
    return (own, consumer) if isinstance(layer, DropsOutput) else own
