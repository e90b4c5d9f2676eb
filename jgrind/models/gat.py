"""GATConv (Velickovic et al. 2018), multi-head, as PyG's ``GATConv``:

    z_j = x_j W                                   (per head: [heads, out])
    e_ij = LeakyReLU(a_dst . z_i + a_src . z_j)   for every edge j -> i (self loops included)
    alpha_ij = softmax_j(e_ij)                    over the in-edges of i
    x'_i = concat_h (or mean_h) sum_j dropout(alpha_ij) z_j + b

Attention weights depend on the parameters, so aggregation uses the block's edge list
(gather + segment_sum) rather than a fixed sparse matrix. Attention dropout is keyed by the
global ids of the edge's endpoints, so it too is independent of the partitioning.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jgrind.models.block import Block
from jgrind.models.conv import LayerOptions, apply_wrapper, init_wrapper
from jgrind.models.dropout import dropout as hashed_dropout, edge_ids, fold_in
from jgrind.models.init import glorot, zeros
from jgrind.models.matmul import matmul


def segment_softmax(scores: jax.Array, segment_ids: jax.Array, num_segments: int) -> jax.Array:
    """Softmax of ``scores [E, H]`` within each segment (the in-edges of one node)."""
    seg_max = jax.ops.segment_max(scores, segment_ids, num_segments)
    # The max only stabilises the exponent; its gradient cancels exactly, so stop it.
    shifted = jnp.exp(scores - jax.lax.stop_gradient(seg_max)[segment_ids])
    denom = jax.ops.segment_sum(shifted, segment_ids, num_segments)
    return shifted / denom[segment_ids]


@dataclasses.dataclass(frozen=True)
class GATConv:
    in_channels: int
    out_channels: int  # per head
    heads: int = 1
    concat: bool = True
    attention_dropout: float = 0.0
    negative_slope: float = 0.2
    options: LayerOptions = LayerOptions()
    bias: bool = True
    aggregates = True

    @property
    def width(self) -> int:
        """Output width: heads * out_channels when concatenating, else out_channels."""
        return self.heads * self.out_channels if self.concat else self.out_channels

    def init(self, key: jax.Array) -> dict:
        k_w, k_src, k_dst, k_wrap = jax.random.split(key, 4)
        h, c = self.heads, self.out_channels
        params = {"weight": glorot(k_w, (self.in_channels, h * c)),
                  "att_src": glorot(k_src, (1, h, c))[0],
                  "att_dst": glorot(k_dst, (1, h, c))[0]}
        if self.bias:
            params["bias"] = zeros((self.width,))
        return {**params, **init_wrapper(k_wrap, self.in_channels, self.width, self.options)}

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        heads, c, n_out = self.heads, self.out_channels, block.num_out
        src, dst = block.edge_src, block.edge_dst

        def transform(x):
            z = matmul(x, params["weight"]).reshape(x.shape[0], heads, c)    # [n_in, H, C]
            a_src = jnp.sum(z * params["att_src"], -1)                        # [n_in, H]
            a_dst = jnp.sum(z[:n_out] * params["att_dst"], -1)                # [n_out, H]
            e = jax.nn.leaky_relu(a_src[src] + a_dst[dst], self.negative_slope)
            alpha = segment_softmax(e, dst, n_out)                            # [E, H]
            if key is not None and self.attention_dropout > 0:
                ids = edge_ids(block.node_ids[dst], block.node_ids[src])
                alpha = hashed_dropout(alpha, self.attention_dropout,
                                       fold_in(key, 1), ids)
            out = jax.ops.segment_sum(alpha[..., None] * z[src], dst, n_out)  # [n_out, H, C]
            out = out.reshape(n_out, heads * c) if self.concat else out.mean(1)
            return out + params["bias"] if self.bias else out
        return apply_wrapper(transform, params, block, h, key, self.options)
