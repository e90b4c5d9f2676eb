"""SAGEConv with mean aggregation (Hamilton et al. 2017, as PyG's ``SAGEConv``):

    x'_i = W_1 x_i + W_2 mean_{j in N(i)} x_j + b

The mean is a sparse product with ``D^-1 A`` (`jgrind.transforms.mean_norm`, computed on the
whole graph). As in `GCNConv`, the sparse product runs on the narrower side of ``W_2``.
"""

from __future__ import annotations

import dataclasses

import jax

from jgrind.models.block import Block
from jgrind.models.conv import LayerOptions, apply_wrapper, init_wrapper
from jgrind.models.init import glorot, zeros
from jgrind.models.matmul import matmul
from jgrind.sparse import spmm


@dataclasses.dataclass(frozen=True)
class SAGEConv:
    in_channels: int
    out_channels: int
    options: LayerOptions = LayerOptions()
    bias: bool = True
    aggregates = True

    def init(self, key: jax.Array) -> dict:
        k_root, k_nbr, k_wrap = jax.random.split(key, 3)
        shape = (self.in_channels, self.out_channels)
        params = {"root_weight": glorot(k_root, shape), "neighbor_weight": glorot(k_nbr, shape)}
        if self.bias:
            params["bias"] = zeros((self.out_channels,))
        return {**params, **init_wrapper(k_wrap, self.in_channels, self.out_channels,
                                         self.options)}

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        def transform(x):
            w_nbr = params["neighbor_weight"]
            if self.in_channels <= self.out_channels:
                nbr = matmul(spmm(block.adj, x), w_nbr)
            else:
                nbr = spmm(block.adj, matmul(x, w_nbr))
            y = matmul(x[: block.num_out], params["root_weight"]) + nbr
            return y + params["bias"] if self.bias else y
        return apply_wrapper(transform, params, block, h, key, self.options)

    # -- aggregate, then update (see `jgrind.models.conv.aggregation_split`) ----------------
    @property
    def aggregated_width(self):
        """Width of ``[x_i | mean_j x_j]`` when the layer aggregates before its matmuls."""
        return 2 * self.in_channels if self.in_channels <= self.out_channels else None

    def aggregate(self, block: Block, x: jax.Array) -> jax.Array:
        return jax.numpy.concatenate([x[: block.num_out], spmm(block.adj, x)], axis=1)

    def update(self, params: dict, z: jax.Array) -> jax.Array:
        own, nbr = z[:, : self.in_channels], z[:, self.in_channels:]
        y = matmul(own, params["root_weight"]) + matmul(nbr, params["neighbor_weight"])
        return y + params["bias"] if self.bias else y
