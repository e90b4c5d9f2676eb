"""A node-wise linear layer (input/output projections): it needs no neighbours, so the engine
never gathers a halo for it."""

from __future__ import annotations

import dataclasses

import jax

from jgrind.models.block import Block
from jgrind.models.conv import LayerOptions, apply_wrapper, init_wrapper
from jgrind.models.init import glorot, zeros
from jgrind.models.matmul import matmul


@dataclasses.dataclass(frozen=True)
class Linear:
    """``y = act(dropout(norm(x)) W + b)`` per node."""

    in_channels: int
    out_channels: int
    options: LayerOptions = LayerOptions()
    bias: bool = True
    aggregates = False  # class constant: reads only the output nodes' own rows

    def init(self, key: jax.Array) -> dict:
        k_w, k_wrap = jax.random.split(key)
        params = {"weight": glorot(k_w, (self.in_channels, self.out_channels))}
        if self.bias:
            params["bias"] = zeros((self.out_channels,))
        return {**params, **init_wrapper(k_wrap, self.in_channels, self.out_channels,
                                         self.options)}

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        def transform(x):
            y = matmul(x[: block.num_out], params["weight"])
            return y + params["bias"] if self.bias else y
        return apply_wrapper(transform, params, block, h, key, self.options)
