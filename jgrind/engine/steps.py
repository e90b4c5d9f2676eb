"""The jitted per-partition steps of one layer, and the padded blocks they run on.

Per layer there are these functions, each compiled once per bucketed block shape:

* ``forward(params, block, h_in, key) -> h_out``
* ``backward(params, block, h_in, key, g_out, acc) -> (acc + dparams, dh_in)``: *regather and
  recompute*: the layer's forward is rerun inside ``jax.vjp`` from the regathered inputs, so no
  per-partition snapshot is kept between the sweeps. ``backward_params`` skips ``dh_in`` for the
  first layer (the features need no gradient).
* ``top(params, block, h_in, key, labels, weights, acc) -> (loss, acc + dparams, dh_in)``: the
  last layer fused with the loss, so the logits are never stored.
* ``masked_backward(params, block, h_in, key, mask, g_out, acc)`` (and
  ``masked_backward_params``), for layers whose activation derivative is a function of their
  output (ReLU without a residual, `jgrind.models.conv.derivative_from_output`): ``mask`` is
  ``act'(z)`` of the partition's output rows, bit-packed. The vjp then runs on the
  pre-activation with cotangent ``mask * g_out``; the recomputed output is unused, so XLA drops
  the forward's last product (for ``(A X) W`` the matmul, for ``A (X W)`` all of it). Same
  gradients, less recomputation.

Where the mask comes from: the rows of ``H_{l+1}`` a partition owns are the first rows of the
input layer l+1's backward step regathers for it. With ``input_mask`` (the rule of the layer
below), ``top`` and ``backward`` of layer l+1 also return that pattern, bit-packed
(``[num_out, ceil(width / 8)]`` uint8: 1/32 of the rows' bytes), for layer l's backward.

*Saved aggregations* (`jgrind.models.conv.aggregation_split`): a layer written as
``act(update(params, aggregate(block, h, key)))`` whose aggregation ``z`` the policy keeps
(the ``aggregation`` tensor, see `jgrind.plan.fates`) runs

* ``forward_saving(params, block, h_in, key) -> (h_out, z)``, and in backward
* ``saved_backward(params, block, z, key, mask, g_out, acc) -> (acc + dparams, dh_in)`` (and
  ``saved_backward_params``): the vjp of ``update`` at the kept ``z`` gives the parameter
  gradient and ``dz``; the input gradient is the transpose of ``aggregate`` applied to ``dz``
  (it is linear in ``h`` and needs no input values: the vjp is taken at zeros and XLA drops
  its forward). No regathered input, no second sparse product. ``mask`` is the output mask
  as above, or None to recompute the pre-activation from ``z`` (one matmul).

*Spares*: every step with a large output (``forward``, ``forward_saving``, ``backward``,
``masked_backward``, ``top``, ``saved_backward``) takes one more argument, ``spare``: arrays
shaped like some of its outputs (the output rows; the input gradient, shaped like ``h_in``),
*donated*, so that XLA writes those outputs into them instead of allocating new ones
(`jgrind.engine.spares`: why, and where they come from). Its values are never read.

``remat_policy`` (a ``jax.checkpoint_policies`` policy) decides which intermediates *inside* a
layer step (aggregations, attention coefficients, pre-activations) are saved for that step's own
backward and which are recomputed: recomputation within a partition step is also a choice.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jgrind.engine.compile_effort import FULL, CompileEffort
from jgrind.hostio.buffers import ALIGNMENT, aligned_empty
from jgrind.loss import weighted_loss
from jgrind.models.block import Block, make_block
from jgrind.models.conv import aggregation_split, derivative_from_output, without_activation
from jgrind.executed.moved_dropout import (drop_output, output_rate, output_scale, split_key,
                                         unwrap)


def _tree_add(a, b):
    return jax.tree.map(lambda x, y: x + y, a, b)


@dataclasses.dataclass(frozen=True)
class LayerSteps:
    forward: Callable
    backward: Callable
    backward_params: Callable
    top: Callable
    masked_backward: Optional[Callable] = None         # None: the layer cannot use a mask
    masked_backward_params: Optional[Callable] = None
    emits_mask: bool = False                           # top/backward also return a mask
    forward_saving: Optional[Callable] = None          # None: the layer has no aggregation split
    saved_backward: Optional[Callable] = None
    saved_backward_params: Optional[Callable] = None


def pack_mask(keep: jax.Array) -> jax.Array:
    """``[R, W]`` bool -> ``[R, ceil(W / 8)]`` uint8."""
    return jnp.packbits(keep, axis=1)


def masked_cotangent(mask: jax.Array, g_out: jax.Array, scale: float = 1.0) -> jax.Array:
    """The pre-activation's cotangent from the output mask: ``g_out`` where the mask is set
    (times ``scale``: the output dropout's ``1 / (1 - rate)``, `jgrind.executed.moved_dropout`),
    else 0."""
    keep = jnp.unpackbits(mask, axis=1, count=g_out.shape[1]).astype(bool)
    kept = g_out if scale == 1.0 else g_out * jnp.asarray(scale, g_out.dtype)
    return jnp.where(keep, kept, jnp.zeros((), g_out.dtype))


def _jit(fn, effort: CompileEffort, **kwargs):
    """``jax.jit(fn, **kwargs)`` compiled with ``effort``'s XLA options."""
    return jax.jit(fn, compiler_options=effort.compiler_options(), **kwargs)


def _spared(fn, effort: CompileEffort, donated: tuple = ()):
    """``jit(fn)`` taking one more trailing argument, ``spare``, donated with ``donated``.
    ``keep_unused``: jit drops unused arguments, and a dropped argument is not donated."""
    count = fn.__code__.co_argcount

    def with_spare(*args):
        return fn(*args[:count])

    # the name only (profilers label steps by it): functools.wraps would also make jit read
    # fn's signature, which has no ``spare``
    with_spare.__name__ = with_spare.__qualname__ = fn.__name__
    # what the arguments are, by name, for callers that take one out by name
    # (`jgrind.devices.out_of_core` keeps each device's accumulator ``acc``)
    with_spare.argument_names = (*fn.__code__.co_varnames[:count], "spare")
    return _jit(with_spare, effort, donate_argnums=(*donated, count), keep_unused=True)


@functools.lru_cache(maxsize=256)
def layer_steps(layer, remat_policy: Optional[Callable] = None,
                input_mask: Optional[Callable] = None,
                node_loss: Optional[Callable] = None,
                effort: CompileEffort = FULL) -> LayerSteps:
    """The jitted steps of ``layer``. Layers are frozen dataclasses, so equal layers share one
    set of jitted functions and their compiled shapes across engines (cached).

    ``input_mask``: the layer below's `derivative_from_output` rule; when given, ``top`` and
    ``backward`` also return it applied to the owned rows of their input, bit-packed.
    ``node_loss``: the per-node loss ``top`` sums (`jgrind.loss.weighted_loss`; None: cross
    entropy). ``effort``: how hard XLA works on each step (`jgrind.engine.compile_effort`)."""
    emit = functools.partial(_emit, input_mask)
    dropout = _OutputDropout(output_rate(layer), output_scale(layer))
    masked = masked_params = None
    if derivative_from_output(layer) is not None:
        masked, masked_params = _masked_steps(layer, remat_policy, emit, dropout, effort)
    saving = saved = saved_params = None
    split = aggregation_split(unwrap(layer))
    if split is not None:
        saving, saved, saved_params = _saved_steps(unwrap(layer), split, dropout, effort)
    return LayerSteps(**_plain_steps(_checkpointed(layer, remat_policy), emit, node_loss,
                                     effort),
                      masked_backward=masked, masked_backward_params=masked_params,
                      emits_mask=input_mask is not None, forward_saving=saving,
                      saved_backward=saved, saved_backward_params=saved_params)


def _checkpointed(fn: Callable, remat_policy: Optional[Callable]) -> Callable:
    """``fn(params, block, h, key)``, inside ``jax.checkpoint`` with ``remat_policy`` if one
    is given."""
    def apply(params, block, h, key):
        return fn(params, block, h, key)
    return jax.checkpoint(apply, policy=remat_policy) if remat_policy is not None else apply


def _emit(input_mask: Optional[Callable], block, h, *outs) -> tuple:
    """A step's outputs, and the bit-packed mask of its input's owned rows when the layer
    below takes one (``input_mask``)."""
    if input_mask is None:
        return outs
    return (*outs, pack_mask(input_mask(h[: block.num_out])))


@dataclasses.dataclass(frozen=True)
class _OutputDropout:
    """A layer that also runs its consumer's dropout on its output (`DropsOutput`) takes a pair
    of keys; its pre-activation and aggregation are the wrapped layer's, keyed by the first.
    ``rate`` 0: a plain layer and key."""

    rate: float
    scale: float

    def finish(self, block, y, key):
        """The output from the activation's output: the consumer's dropout, if it moved here."""
        return drop_output(y, self.rate, split_key(key)[1], block) if self.rate else y

    def own_key(self, key):
        return split_key(key)[0] if self.rate else key

    def cot_scale(self, key) -> float:
        """The output dropout's scale of kept entries; 1 without a key (nothing dropped). The
        key's presence is static: jit traces the two cases apart."""
        return self.scale if self.rate and split_key(key)[1] is not None else 1.0


def _plain_steps(apply: Callable, emit: Callable, node_loss: Optional[Callable],
                 effort: CompileEffort) -> dict:
    """``forward``, ``backward`` (regather and recompute), ``backward_params`` and ``top``.
    The gradient accumulator is donated: it is replaced by the returned sum."""
    def forward(params, block, h, key):
        return apply(params, block, h, key)

    def backward(params, block, h, key, g_out, acc):
        _, vjp = jax.vjp(lambda p, x: apply(p, block, x, key), params, h)
        d_params, d_h = vjp(g_out)
        return emit(block, h, _tree_add(acc, d_params), d_h)

    def backward_params(params, block, h, key, g_out, acc):
        _, vjp = jax.vjp(lambda p: apply(p, block, h, key), params)
        (d_params,) = vjp(g_out)
        return _tree_add(acc, d_params)

    def top(params, block, h, key, labels, weights, acc):
        def loss(p, x):
            return weighted_loss(node_loss, apply(p, block, x, key), labels, weights)
        value, (d_params, d_h) = jax.value_and_grad(loss, argnums=(0, 1))(params, h)
        return emit(block, h, value, _tree_add(acc, d_params), d_h)

    return dict(forward=_spared(forward, effort), backward=_spared(backward, effort, (5,)),
                backward_params=_jit(backward_params, effort, donate_argnums=5),
                top=_spared(top, effort, (6,)))


def _masked_steps(layer, remat_policy: Optional[Callable], emit: Callable,
                  dropout: _OutputDropout, effort: CompileEffort) -> tuple:
    """``masked_backward`` and ``masked_backward_params``: the vjp of the pre-activation with
    the output mask's cotangent."""
    pre_layer = _checkpointed(without_activation(unwrap(layer)), remat_policy)

    def pre(params, block, h, key):
        return pre_layer(params, block, h, dropout.own_key(key))

    def masked_backward(params, block, h, key, mask, g_out, acc):
        _, vjp = jax.vjp(lambda p, x: pre(p, block, x, key), params, h)
        d_params, d_h = vjp(masked_cotangent(mask, g_out, dropout.cot_scale(key)))
        return emit(block, h, _tree_add(acc, d_params), d_h)

    def masked_backward_params(params, block, h, key, mask, g_out, acc):
        _, vjp = jax.vjp(lambda p: pre(p, block, h, key), params)
        (d_params,) = vjp(masked_cotangent(mask, g_out, dropout.cot_scale(key)))
        return _tree_add(acc, d_params)

    return (_spared(masked_backward, effort, (6,)),
            _jit(masked_backward_params, effort, donate_argnums=6))


def _saved_steps(inner, split, dropout: _OutputDropout, effort: CompileEffort) -> tuple:
    """``forward_saving``, ``saved_backward`` and ``saved_backward_params`` of a layer whose
    aggregation ``split`` (`aggregation_split`) keeps ``z``; ``inner``: the layer without a
    moved dropout."""
    def forward_saving(params, block, h, key):
        z = split.aggregate(block, h, dropout.own_key(key))
        return dropout.finish(block, split.activate(split.update(params, z)), key), z

    def params_vjp(params, block, key, z, mask, g_out, wrt_z):
        if mask is None:  # no mask: recompute the pre-activation from z
            def f(p, zz):
                return dropout.finish(block, split.activate(split.update(p, zz)), key)
            cot = g_out
        else:
            f, cot = split.update, masked_cotangent(mask, g_out, dropout.cot_scale(key))
        if wrt_z:
            _, vjp = jax.vjp(f, params, z)
            return vjp(cot)
        _, vjp = jax.vjp(lambda p: f(p, z), params)
        return vjp(cot)[0], None

    def saved_backward(params, block, z, key, mask, g_out, acc):
        d_params, d_z = params_vjp(params, block, key, z, mask, g_out, True)
        zeros = jnp.zeros((block.num_in, inner.in_channels), z.dtype)
        _, transpose = jax.vjp(lambda h: split.aggregate(block, h, dropout.own_key(key)),
                               zeros)
        (d_h,) = transpose(d_z)
        return _tree_add(acc, d_params), d_h

    def saved_backward_params(params, block, z, key, mask, g_out, acc):
        return _tree_add(acc, params_vjp(params, block, key, z, mask, g_out, False)[0])

    return (_spared(forward_saving, effort), _spared(saved_backward, effort, (6,)),
            _jit(saved_backward_params, effort, donate_argnums=6))


@dataclasses.dataclass(frozen=True)
class PaddedPartition:
    """One partition's block padded to bucketed sizes, plus what its loss needs.

    Padding (sizes from `shape_groups`): more output and input rows than real ones, so at least
    one padded row exists, and more edges than real ones; padded edges (weight 0) run from the last padded input
    row to the last padded output row. Padded rows read zeros, carry zero loss weight, and their
    outputs and input gradients are dropped, so padding changes no real value.
    """

    index: int
    block: Block                 # host arrays; moved to the device per step
    num_owned: int
    num_inputs: int
    halo_owner: np.ndarray
    halo_row: np.ndarray
    labels: np.ndarray           # [num_out] int32 (multi-label: [num_out, T] int8), -1 on padding
    weights: np.ndarray          # [num_out] float32 loss weights, 0 on padding
    owned: np.ndarray            # [num_owned] global ids

    @property
    def num_out(self) -> int:
        return self.block.num_out

    @property
    def num_in(self) -> int:
        return self.block.num_in

    def nbytes(self) -> int:
        return int(sum(np.asarray(a).nbytes for a in jax.tree.leaves(self.block)))


def _aligned(array: np.ndarray) -> np.ndarray:
    """``array``, or a copy of it starting on an `ALIGNMENT`-byte boundary."""
    if array.ctypes.data % ALIGNMENT == 0:
        return array
    out = aligned_empty(array.shape, array.dtype)
    out[...] = array
    return out


def pad_partition(part, shape: tuple, *, labels: np.ndarray, weights: np.ndarray,
                  needs_edges: bool, needs_adjacency: bool) -> PaddedPartition:
    n_own, n_in, nnz = part.num_owned, part.num_inputs, part.num_edges
    n_out_pad, n_in_pad, nnz_pad = shape
    extra = nnz_pad - nnz
    indptr = np.empty(n_out_pad + 1, np.int64)
    indptr[: n_own + 1] = part.indptr
    indptr[n_own + 1:] = nnz
    indptr[-1] = nnz + extra                      # padded edges sit in the last padded row
    indices = np.concatenate([part.indices, np.full(extra, n_in_pad - 1)]).astype(np.int32)
    weight = part.weight if part.weight is not None else np.ones(nnz, np.float32)
    weight = np.concatenate([weight, np.zeros(extra, np.float32)])
    ids = np.zeros(n_in_pad, np.int32)
    ids[:n_in] = part.input_ids
    edge_type = getattr(part, "edge_type", None)
    if edge_type is not None:  # padded edges are relation 0 (their weight is 0)
        edge_type = np.concatenate([edge_type, np.zeros(extra, edge_type.dtype)])
    block = make_block(indptr.astype(np.int32), indices, weight, ids, num_out=n_out_pad,
                       needs_edges=needs_edges, needs_adjacency=needs_adjacency,
                       edge_type=edge_type, num_relations=getattr(part, "num_relations", 1))
    # aligned, the CPU backend adopts the structure's arrays without a copy, so the engine
    # puts each block once instead of copying it in every step (`Sweeps.device_block`)
    block = jax.tree.map(_aligned, block)
    lab = np.full((n_out_pad, *labels.shape[1:]), -1, labels.dtype)  # [n] ids or [n, T] targets
    lab[:n_own] = labels[part.owned]
    w = np.zeros(n_out_pad, np.float32)
    w[:n_own] = weights[part.owned]
    return PaddedPartition(index=part.index, block=block, num_owned=n_own, num_inputs=n_in,
                           halo_owner=np.asarray(part.halo_owner, np.int64),
                           halo_row=np.asarray(part.halo_row, np.int64), labels=lab,
                           weights=w, owned=np.asarray(part.owned))
