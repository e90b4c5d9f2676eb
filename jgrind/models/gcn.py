"""GCNConv (Kipf & Welling 2017): ``X' = Â X W + b`` with ``Â = D^-1/2 (A + I) D^-1/2``.

``Â`` is computed once on the whole graph (`jgrind.transforms.gcn_norm`) and arrives in the
block's adjacency, so partitions use exactly the global coefficients.

Order of operations: ``(Â X) W`` and ``Â (X W)`` are equal; the sparse product costs
O(E * width), so it runs on the narrower side: before the matmul when ``in <= out``, after it
otherwise. (PyG always multiplies first; on a 128 -> 256 layer this halves the sparse work, and
the backward of ``(Â X) W`` w.r.t. ``W`` needs no sparse product at all when X is an input.)
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
class GCNConv:
    in_channels: int
    out_channels: int
    options: LayerOptions = LayerOptions()
    bias: bool = True
    aggregates = True

    def init(self, key: jax.Array) -> dict:
        k_w, k_wrap = jax.random.split(key)
        params = {"weight": glorot(k_w, (self.in_channels, self.out_channels))}
        if self.bias:
            params["bias"] = zeros((self.out_channels,))
        return {**params, **init_wrapper(k_wrap, self.in_channels, self.out_channels,
                                         self.options)}

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        def transform(x):
            w = params["weight"]
            if self.in_channels <= self.out_channels:
                y = matmul(spmm(block.adj, x), w)
            else:
                y = spmm(block.adj, matmul(x, w))
            return y + params["bias"] if self.bias else y
        return apply_wrapper(transform, params, block, h, key, self.options)

    # -- aggregate, then update (see `jgrind.models.conv.aggregation_split`) ----------------
    @property
    def aggregated_width(self):
        """Width of ``Â X`` when the layer aggregates before its matmul, else None."""
        return self.in_channels if self.in_channels <= self.out_channels else None

    def aggregate(self, block: Block, x: jax.Array) -> jax.Array:
        return spmm(block.adj, x)

    def update(self, params: dict, z: jax.Array) -> jax.Array:
        y = matmul(z, params["weight"])
        return y + params["bias"] if self.bias else y
