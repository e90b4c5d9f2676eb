"""RGATConv (Busbridge et al. 2019, "Relational Graph Attention Networks"): across-relation
attention (their ARGAT) with additive logits, multi-head, and a weight per relation:

    g_j^r = x_j W_r                                       (per head: [heads, out])
    e_ij^r = LeakyReLU(q_r . g_i^r + k_r . g_j^r)         for every edge j -> i of relation r
    alpha_ij^r = softmax over all in-edges of i, of every relation
    x'_i = concat_h (or mean_h) sum_r sum_j dropout(alpha_ij^r) g_j^r + x_i W_0 + b

``q_r`` and ``k_r`` are the paper's query and key kernels with one logit per head (its additive
self-attention). ``x_i W_0`` is a self-connection as in R-GCN (``self_loop``; the graph gets no
self-loop edges). Attention uses the block's edge list and relation ids (gather +
segment_sum), as `GATConv` does; attention dropout is keyed by the global ids of each edge's
endpoints, so it is independent of the partitioning. A graph without relations is one relation.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jgrind.models.block import Block
from jgrind.models.conv import LayerOptions, apply_wrapper, init_wrapper
from jgrind.models.dropout import dropout as hashed_dropout, edge_ids, fold_in
from jgrind.models.gat import segment_softmax
from jgrind.models.init import glorot, zeros
from jgrind.models.matmul import PRECISION, matmul


@dataclasses.dataclass(frozen=True)
class RGATConv:
    in_channels: int
    out_channels: int  # per head
    num_relations: int
    heads: int = 1
    concat: bool = True
    attention_dropout: float = 0.0
    negative_slope: float = 0.2
    self_loop: bool = True
    options: LayerOptions = LayerOptions()
    bias: bool = True
    aggregates = True

    def __post_init__(self):
        if self.num_relations < 1:
            raise ValueError(f"num_relations must be at least 1, got {self.num_relations}")

    @property
    def width(self) -> int:
        """Output width: heads * out_channels when concatenating, else out_channels."""
        return self.heads * self.out_channels if self.concat else self.out_channels

    @property
    def dense_products(self) -> int:
        """Dense products per input row (relations and self-connection), for pricing."""
        return self.num_relations + int(self.self_loop)

    def init(self, key: jax.Array) -> dict:
        k_w, k_q, k_k, k_root, k_wrap = jax.random.split(key, 5)
        r, h, c = self.num_relations, self.heads, self.out_channels
        params = {"weight": glorot(k_w, (r, self.in_channels, h * c)),
                  "att_dst": glorot(k_q, (r, h, c)),
                  "att_src": glorot(k_k, (r, h, c))}
        if self.self_loop:
            params["root"] = glorot(k_root, (self.in_channels, self.width))
        if self.bias:
            params["bias"] = zeros((self.width,))
        return {**params, **init_wrapper(k_wrap, self.in_channels, self.width, self.options)}

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        heads, c, n_out, r = self.heads, self.out_channels, block.num_out, self.num_relations
        src, dst = block.edge_src, block.edge_dst
        types = block.edge_type if block.edge_type is not None else jnp.zeros_like(src)
        if block.edge_type is None and r != 1:
            raise ValueError(f"a layer over {r} relations needs the relation of every edge; "
                             "build the graph with its edge types and relations")

        def transform(x):
            n_in = x.shape[0]
            g = jnp.einsum("ni,rio->rno", x, params["weight"], precision=PRECISION)
            g = g.reshape(r, n_in, heads, c)                                   # [R, n_in, H, C]
            a_src = jnp.sum(g * params["att_src"][:, None], -1)               # [R, n_in, H]
            a_dst = jnp.sum(g[:, :n_out] * params["att_dst"][:, None], -1)    # [R, n_out, H]
            e = jax.nn.leaky_relu(a_src[types, src] + a_dst[types, dst], self.negative_slope)
            alpha = segment_softmax(e, dst, n_out)                            # [E, H]
            if key is not None and self.attention_dropout > 0:
                ids = edge_ids(block.node_ids[dst], block.node_ids[src])
                alpha = hashed_dropout(alpha, self.attention_dropout,
                                       fold_in(key, 1), ids)
            messages = g.reshape(r * n_in, heads, c)[types * n_in + src]      # [E, H, C]
            out = jax.ops.segment_sum(alpha[..., None] * messages, dst, n_out)
            out = out.reshape(n_out, heads * c) if self.concat else out.mean(1)
            if self.self_loop:
                out = out + matmul(x[:n_out], params["root"])
            return out + params["bias"] if self.bias else out
        return apply_wrapper(transform, params, block, h, key, self.options)
