"""What every layer shares: pre-norm, dropout, the layer's own transform, activation, residual.

    h_out = skip(h[:n_out]) + act(transform(dropout(norm(h))))      (residual=True)
    h_out =                   act(transform(dropout(norm(h))))      (residual=False)

``transform`` maps all ``n_in`` input rows to the ``n_out`` output rows (a graph convolution, or
a node-wise linear map that just keeps the first ``n_out`` rows). Because norm, dropout and the
activation are per node and dropout is keyed by global node ids, a layer computes the same output
rows whether it sees the whole graph or one partition with its halo.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import jax

from jgrind.models.block import Block
from jgrind.models.dropout import dropout as hashed_dropout
from jgrind.models.init import glorot
from jgrind.models.matmul import matmul
from jgrind.models.norm import layer_norm, layer_norm_init

Activation = Optional[Callable[[jax.Array], jax.Array]]


@dataclasses.dataclass(frozen=True)
class LayerOptions:
    """Options shared by all layers.

    Attributes:
      dropout: rate applied to the layer input (after the norm) in training.
      activation: applied to the transform's output; None for the logits layer.
      layer_norm: pre-normalise the input with LayerNorm.
      residual: add the input (projected if the width changes) to the output.
    """

    dropout: float = 0.0
    activation: Activation = None
    layer_norm: bool = False
    residual: bool = False


# Activations whose derivative can be read off their output: relu'(z) = 1[z > 0] = 1[relu(z) > 0]
# (JAX's own relu derivative is 0 at 0, the same). For such a layer without a residual, the
# backward pass needs only the output's sign pattern, not the pre-activation, so an engine that
# keeps that pattern can skip recomputing the layer's output (see `jgrind.engine.steps`).
OUTPUT_DERIVATIVES: dict = {jax.nn.relu: lambda y: y > 0}


def derivative_from_output(layer) -> Optional[Callable[[jax.Array], jax.Array]]:
    """``y -> act'(z)`` as a boolean mask for ``layer`` when its output ``y = act(z)`` determines
    it, else None (no activation, an activation not in `OUTPUT_DERIVATIVES`, or a residual,
    which adds the input to the output and hides ``act(z)``)."""
    opts = getattr(layer, "options", None)
    if not isinstance(opts, LayerOptions) or opts.residual or opts.activation is None:
        return None
    return OUTPUT_DERIVATIVES.get(opts.activation)


def without_activation(layer):
    """The same layer computing the pre-activation ``z`` (same parameters)."""
    return dataclasses.replace(layer, options=dataclasses.replace(layer.options,
                                                                  activation=None))


def init_wrapper(key: jax.Array, in_channels: int, out_channels: int,
                 opts: LayerOptions) -> dict:
    params = {}
    if opts.layer_norm:
        params["norm"] = layer_norm_init(in_channels)
    if opts.residual and in_channels != out_channels:
        params["skip"] = glorot(key, (in_channels, out_channels))
    return params


def apply_wrapper(transform: Callable[[jax.Array], jax.Array], params: dict, block: Block,
                  h: jax.Array, key: Optional[jax.Array], opts: LayerOptions) -> jax.Array:
    x = layer_norm(params["norm"], h) if opts.layer_norm else h
    x = hashed_dropout(x, opts.dropout, key, block.node_ids)
    y = transform(x)
    if opts.activation is not None:
        y = opts.activation(y)
    if opts.residual:
        own = h[: block.num_out]
        y = y + (matmul(own, params["skip"]) if "skip" in params else own)
    return y


@dataclasses.dataclass(frozen=True)
class AggregationSplit:
    """A layer written as ``act(update(params, aggregate(block, h, key)))``.

    ``aggregate`` (dropout, then the sparse aggregation) is linear in ``h`` and touches no
    parameter; ``update`` maps its ``[num_out, width]`` result to the pre-activation. A layer's
    backward needs only ``z = aggregate(...)`` for the parameter gradient, and the transpose of
    ``aggregate`` (which needs no input values) for the input gradient: keep ``z`` and the
    backward needs neither the layer's gathered input nor a second sparse product.
    """

    layer: object
    width: int

    def aggregate(self, block: Block, h: jax.Array, key) -> jax.Array:
        x = hashed_dropout(h, self.layer.options.dropout, key, block.node_ids)
        return self.layer.aggregate(block, x)

    def update(self, params: dict, z: jax.Array) -> jax.Array:
        """The pre-activation from ``z``."""
        return self.layer.update(params, z)

    def activate(self, y: jax.Array) -> jax.Array:
        act = self.layer.options.activation
        return act(y) if act is not None else y


def aggregation_split(layer) -> Optional[AggregationSplit]:
    """The split of ``layer`` into aggregate and update, or None when it has none: the layer
    multiplies by a weight before aggregating (``in > out``, so the sparse product runs on the
    narrower side), or its output also depends on the input otherwise (LayerNorm before the
    aggregation, a residual), or it does not aggregate by a fixed sparse product (GAT)."""
    opts = getattr(layer, "options", None)
    width = getattr(layer, "aggregated_width", None)
    if not isinstance(opts, LayerOptions) or opts.layer_norm or opts.residual or width is None:
        return None
    return AggregationSplit(layer, int(width))
