"""A model's layers as the out-of-core engine runs them: narrowing GCN layers transform first.

A GCN layer that narrows (``in > out``, e.g. the 256 -> 47 logits layer) computes
``act(Â (dropout(X) W) + b)``: the matmul runs before the sparse product, on the narrow side.
Run partition by partition as one step, every partition multiplies its *halo* rows too (each
node's row once per partition that reads it: 1.67x the nodes on a 1M-node graph in 8 parts),
and gathers, regathers and scatter-adds ``in``-wide rows. `as_executed` splits such a layer
into two engine layers:

* the transform ``U = dropout(X) W``: node-wise (`Linear`, no bias), so each partition reads
  and multiplies its own rows only, and its input gradient is written, not scatter-added;
* the propagation ``act(Â U + b)`` (`Propagate`): it gathers ``out``-wide rows of ``U``.

The function is the same (dropout is keyed by global node ids, so the transform drops the same
entries wherever a row sits); `Executed` maps parameters (and gradients) between the model's
layers and the executed ones, and gives every executed layer its model layer's dropout key.
The in-memory path runs the model as written.
"""

from __future__ import annotations

import dataclasses

import jax

from jgrind.models.block import Block
from jgrind.models.conv import LayerOptions, apply_wrapper
from jgrind.models.gcn import GCNConv
from jgrind.models.init import zeros
from jgrind.models.linear import Linear
from jgrind.executed.moved_dropout import move_dropout
from jgrind.sparse import spmm


@dataclasses.dataclass(frozen=True)
class Propagate:
    """``act(Â u + b)`` over a partition's input rows: the aggregation half of a split GCN
    layer. Its only parameter is the bias; ``options`` carries the activation (no dropout,
    norm or residual: those belong to the transform half, or rule the split out)."""

    width: int
    options: LayerOptions = LayerOptions()
    bias: bool = True
    aggregates = True
    aggregated_width = None  # no aggregation split: the sparse product is the whole layer

    @property
    def in_channels(self) -> int:
        return self.width

    @property
    def out_channels(self) -> int:
        return self.width

    def init(self, key: jax.Array) -> dict:
        return {"bias": zeros((self.width,))} if self.bias else {}

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        def transform(u):
            y = spmm(block.adj, u)
            return y + params["bias"] if self.bias else y
        return apply_wrapper(transform, params, block, h, key, self.options)


def splits(layer) -> bool:
    """Whether the engine runs ``layer`` as transform + propagation: a GCN layer that
    multiplies before aggregating, with nothing else reading its input (no norm before the
    aggregation, no residual)."""
    opts = getattr(layer, "options", None)
    return (isinstance(layer, GCNConv) and layer.in_channels > layer.out_channels
            and isinstance(opts, LayerOptions) and not opts.layer_norm and not opts.residual)


@dataclasses.dataclass(frozen=True)
class Executed:
    """The executed layers of a model and how they map back to its layers.

    Attributes:
      layers: the layers the engine runs, in order.
      origin: for each executed layer, the index of the model layer it comes from (its
        dropout key is that layer's, `jgrind.models.model.layer_key`).
      keys: for each executed layer, the parameter names it takes from that model layer.
    """

    layers: tuple
    origin: tuple
    keys: tuple

    @property
    def is_split(self) -> bool:
        return len(self.layers) != len(set(self.origin))

    def split_params(self, params) -> tuple:
        """Model parameters (one dict per model layer) -> one dict per executed layer."""
        if not self.is_split:
            return tuple(params)
        return tuple({k: params[o][k] for k in keys} if keys is not None else params[o]
                     for o, keys in zip(self.origin, self.keys))

    def merge_params(self, executed) -> tuple:
        """One dict per executed layer -> one dict per model layer (e.g. gradients)."""
        if not self.is_split:
            return tuple(executed)
        merged: dict[int, dict] = {}
        for o, p in zip(self.origin, executed):
            merged.setdefault(o, {}).update(p)
        return tuple(merged[o] for o in range(len(merged)))


def as_executed(model):
    """``model`` with its narrowing GCN layers split (see the module docstring) and its input
    dropouts moved to the layers below (`jgrind.executed.moved_dropout`), and the map between
    the two (`Executed`). Idempotent: the executed model splits and moves nothing further."""
    layers, origin, keys = [], [], []
    for i, layer in enumerate(model.layers):
        if splits(layer):
            opts = layer.options
            layers.append(Linear(layer.in_channels, layer.out_channels,
                                 LayerOptions(dropout=opts.dropout), bias=False))
            layers.append(Propagate(layer.out_channels, LayerOptions(activation=opts.activation),
                                    bias=layer.bias))
            origin += [i, i]
            keys += [("weight",), ("bias",) if layer.bias else ()]
        else:
            layers.append(layer)
            origin.append(i)
            keys.append(None)
    # then every movable input dropout runs in the layer below (jgrind.executed.moved_dropout)
    layers = move_dropout(layers)
    executed = Executed(tuple(layers), tuple(origin), tuple(keys))
    if executed.layers == tuple(model.layers):
        return model, executed
    return dataclasses.replace(model, layers=executed.layers), executed
