"""RGCNConv (Schlichtkrull et al. 2018): a weight per relation, plus a self-connection.

    x'_i = x_i W_0 + sum_r sum_{j in N_r(i)} c_{i,r}^-1 x_j W_r + b

``c_{i,r}`` is the number of in-neighbours of ``i`` in relation ``r``: the per-relation mean,
computed once on the whole graph (`jgrind.transforms.relation_mean_norm`) and carried in the
edge weights, so partitions use exactly the global coefficients.

Weights, as in the paper:
  * one ``[in, out]`` matrix per relation (the default);
  * ``num_bases`` B: ``W_r = sum_b a_{r,b} V_b``, B shared bases and a coefficient per relation
    and basis;
  * ``num_blocks`` K: ``W_r`` block-diagonal, K blocks of ``[in / K, out / K]``.

Order of operations: one sparse product with the block's relation rows (`jgrind.models.block`:
row ``i * R + r`` holds output i's in-edges of relation r) aggregates every relation at the
input width, ``[num_out, R, in]``; then each output row's aggregates are multiplied by the
relation weights. The dense work is ``num_out * R`` products of ``[in, out]`` and the largest
temporary is ``[num_out, R, in]``: computing ``x W_r`` on every input row first would cost
``num_in * R`` products and a ``[R, num_in, out]`` temporary, and a partition's halo makes num_in
many times num_out (`mag-like:0.01`, 349 classes, 4 partitions: the planner's minimum working
set fell from 429 MiB to 85 MiB with this order).

A heterogeneous graph's features have one width for every node type (narrower types are
zero-padded to the widest when the graph is built, `jgrind.hetero`), so the layer has one
input width; a graph without relations is one relation.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp

from jgrind.models.block import Block
from jgrind.models.conv import LayerOptions, apply_wrapper, init_wrapper
from jgrind.models.init import glorot, zeros
from jgrind.models.matmul import PRECISION, matmul
from jgrind.sparse import Adjacency, spmm


def relation_adjacency(block: Block, num_relations: int) -> Adjacency:
    """The block's relation rows ``[num_out * R, num_in]``; a block of a graph without
    relations has the plain adjacency, which is those rows for one relation."""
    adj = block.relation_adj if block.relation_adj is not None else block.adj
    if adj is None or adj.shape != (block.num_out * num_relations, block.num_in):
        have = "no adjacency" if adj is None else f"an adjacency of shape {adj.shape}"
        raise ValueError(f"a layer over {num_relations} relations needs a block whose "
                         f"adjacency has a row per output and relation ({block.num_out} x "
                         f"{num_relations} rows); it has {have}: build the graph with its "
                         "edge types and relations")
    return adj


def check_decomposition(in_channels: int, out_channels: int, num_relations: int,
                        num_bases: Optional[int], num_blocks: Optional[int]) -> None:
    """ValueError naming the argument that does not fit."""
    if num_relations < 1:
        raise ValueError(f"num_relations must be at least 1, got {num_relations}")
    if num_bases and num_blocks:
        raise ValueError("num_bases and num_blocks are two alternative decompositions of the "
                         "relation weights; give one of them")
    if num_bases is not None and num_bases < 0:
        raise ValueError(f"num_bases must be positive, got {num_bases}")
    if num_blocks:
        if num_blocks < 0 or in_channels % num_blocks or out_channels % num_blocks:
            raise ValueError(f"num_blocks={num_blocks} must divide both widths of the layer "
                             f"({in_channels} -> {out_channels})")


@dataclasses.dataclass(frozen=True)
class RGCNConv:
    in_channels: int
    out_channels: int
    num_relations: int
    num_bases: Optional[int] = None
    num_blocks: Optional[int] = None
    self_loop: bool = True
    options: LayerOptions = LayerOptions()
    bias: bool = True
    aggregates = True
    aggregated_width = None  # no aggregation split: the aggregates are per relation

    def __post_init__(self):
        check_decomposition(self.in_channels, self.out_channels, self.num_relations,
                            self.num_bases, self.num_blocks)

    @property
    def dense_products(self) -> int:
        """Dense ``[in, out]`` products per input row (the relations and the self-connection),
        for pricing a recompute."""
        return self.num_relations + int(self.self_loop)

    def init(self, key: jax.Array) -> dict:
        k_w, k_coef, k_root, k_wrap = jax.random.split(key, 4)
        r, i, o = self.num_relations, self.in_channels, self.out_channels
        if self.num_bases:
            params = {"bases": glorot(k_w, (self.num_bases, i, o)),
                      "coefficients": glorot(k_coef, (r, self.num_bases))}
        elif self.num_blocks:
            k = self.num_blocks
            params = {"blocks": glorot(k_w, (r, k, i // k, o // k))}
        else:
            params = {"weight": glorot(k_w, (r, i, o))}
        if self.self_loop:
            params["root"] = glorot(k_root, (i, o))
        if self.bias:
            params["bias"] = zeros((o,))
        return {**params, **init_wrapper(k_wrap, i, o, self.options)}

    def relation_weights(self, params: dict) -> jax.Array:
        """``[R, in, out]``: every relation's dense weight (the decompositions expanded)."""
        if self.num_bases:
            return jnp.einsum("rb,bio->rio", params["coefficients"], params["bases"],
                              precision=PRECISION)
        if self.num_blocks:
            blocks = params["blocks"]  # [R, K, in/K, out/K] -> block-diagonal [R, in, out]
            k = self.num_blocks
            eye = jnp.eye(k, dtype=blocks.dtype)
            dense = jnp.einsum("rkio,kl->rkilo", blocks, eye)
            return dense.reshape(self.num_relations, self.in_channels, self.out_channels)
        return params["weight"]

    def combine(self, params: dict, aggregates: jax.Array) -> jax.Array:
        """``[n, out]``: ``sum_r aggregates[:, r] W_r`` for ``aggregates`` ``[n, R, in]``."""
        if self.num_bases:
            per_basis = jnp.einsum("nri,rb->nbi", aggregates, params["coefficients"],
                                   precision=PRECISION)
            return jnp.einsum("nbi,bio->no", per_basis, params["bases"], precision=PRECISION)
        if self.num_blocks:
            k = self.num_blocks
            split = aggregates.reshape(*aggregates.shape[:2], k, self.in_channels // k)
            y = jnp.einsum("nrki,rkio->nko", split, params["blocks"], precision=PRECISION)
            return y.reshape(aggregates.shape[0], self.out_channels)
        return jnp.einsum("nri,rio->no", aggregates, params["weight"], precision=PRECISION)

    def __call__(self, params: dict, block: Block, h: jax.Array, key=None) -> jax.Array:
        adj = relation_adjacency(block, self.num_relations)

        def transform(x):
            aggregates = spmm(adj, x).reshape(block.num_out, self.num_relations, -1)
            y = self.combine(params, aggregates)
            if self.self_loop:
                y = y + matmul(x[: block.num_out], params["root"])
            return y + params["bias"] if self.bias else y
        return apply_wrapper(transform, params, block, h, key, self.options)
