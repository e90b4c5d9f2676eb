"""One sweep over every partition: a layer's forward, or its backward in the variant the
schedule names (`jgrind.plan.schedule.Variant`).

A sweep loads each partition's step input through the `Pipeline` (ahead of the step, on the
loader thread), dispatches the jitted step, and stores the outputs on the writer thread into
the tables the schedule names. `jgrind.engine.runner.Runner` runs the sweeps in the
schedule's order.
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from jgrind.hostio import transfers
from jgrind.engine.build import Built, input_shape
from jgrind.engine.steps import PaddedPartition
from jgrind.engine.store import Snapshot, Table
from jgrind.engine.timing import SSD_RANK, SweepTiming, TierOf
from jgrind.models.dropout import SwitchedKey
from jgrind.models.model import layer_key
from jgrind.executed.moved_dropout import step_key
from jgrind.plan.schedule import Variant

# The step function each backward variant names, called alike: ``(steps, params, block, input,
# key, mask, output gradient or (labels, weights), accumulator, spare buffer)``. Returns the
# step's outputs: (loss term,) accumulator, input gradient, mask made; the bottom layer's
# variants only the accumulator.
_BACKWARD_STEPS = {
    Variant.TOP: lambda s, p, b, h, k, m, g, acc, spare: s.top(p, b, h, k, *g, acc, spare),
    Variant.BACKWARD: lambda s, p, b, h, k, m, g, acc, spare: s.backward(p, b, h, k, g, acc,
                                                                         spare),
    Variant.MASKED_BACKWARD: lambda s, p, b, h, k, m, g, acc, spare: s.masked_backward(
        p, b, h, k, m, g, acc, spare),
    Variant.BACKWARD_PARAMS: lambda s, p, b, h, k, m, g, acc, spare: (s.backward_params(
        p, b, h, k, g, acc),),
    Variant.MASKED_BACKWARD_PARAMS: lambda s, p, b, h, k, m, g, acc, spare: (
        s.masked_backward_params(p, b, h, k, m, g, acc),),
}
FROM_KEPT = frozenset({Variant.SAVED_BACKWARD, Variant.SAVED_BACKWARD_PARAMS})
_MASKED = frozenset({Variant.MASKED_BACKWARD, Variant.MASKED_BACKWARD_PARAMS})
_PARAMS_ONLY = frozenset({Variant.BACKWARD_PARAMS, Variant.MASKED_BACKWARD_PARAMS})


class Sweeps:
    """The sweeps of a `Built` engine. ``snapshots``: the naive scheme's saved step inputs
    per layer while they live (made and dropped by the runner). ``timing``: where the sweep
    that runs next records its parts (a `SweepTiming`, set by the runner), or None."""

    def __init__(self, built: Built):
        self.built = built
        self.snapshots: dict[int, Snapshot] = {}
        # partition -> its block structure as a device array that uses the host arrays in
        # place (the CPU backend): no device memory of its own, so it is kept
        self._adopted_blocks: dict = {}
        self._layer_keys: tuple = (None, ())  # (a step's key, its layers' keys): `layer_key`
        self._switches: Optional[tuple] = None  # device bools (off, on): `forward_key`
        self.timing: Optional[SweepTiming] = None
        self._tier_of = TierOf(built.parts)

    def layer_key(self, key, l: int):
        """Executed layer l's dropout key: its model layer's; for a layer that runs its
        consumer's dropout on its output (`DropsOutput`), that and the consumer's."""
        if key is None:
            return step_key(self.built.model.layers[l], None, None)
        return self._step_key(self._keys_of(key), l, lambda k: k)

    def forward_key(self, key, l: int):
        """Executed layer l's key for a forward step: `layer_key`'s, each key a `SwitchedKey`
        switched on; for evaluation (``key`` None) switched off, around the keys of the last
        epoch (or, before any, keys made once). Training's forward programs then serve
        evaluation too: the same argument types, where a None key would trace (and compile)
        every forward step again. The backward steps keep plain keys (training only)."""
        if self._switches is None:  # put once: a Python bool would be copied in every step
            self._switches = (jax.device_put(np.False_), jax.device_put(np.True_))
        if key is None:
            if not self._layer_keys[1]:
                self._layer_keys = (None, _evaluation_keys(self._key_count()))
            keys = self._layer_keys[1]
        else:
            keys = self._keys_of(key)
        switch = self._switches[key is not None]
        return self._step_key(keys, l, lambda k: SwitchedKey(k, switch))

    def _keys_of(self, key) -> tuple:
        """``key``'s layer keys (`layer_key`), folded in one program once a step: a fold_in
        per step with a Python int would copy the int to the device each time."""
        if self._layer_keys[0] is not key:
            self._layer_keys = (key, _fold_layer_keys(key, self._key_count()))
        return self._layer_keys[1]

    def _key_count(self) -> int:
        return max(self.built.executed.origin) + 1

    def _step_key(self, keys: tuple, l: int, wrap: Callable):
        """Executed layer l's step key from its model layers' ``keys``, each wrapped."""
        origin = self.built.executed.origin
        consumer = wrap(keys[origin[l + 1]]) if l + 1 < len(origin) else None
        return step_key(self.built.model.layers[l], wrap(keys[origin[l]]), consumer)

    def epoch_start(self, params, key) -> tuple:
        """Zero gradients shaped like ``params`` and a zero loss, made on the device, with
        ``key``'s layer keys kept for `layer_key`: one program, run once an epoch."""
        grads, loss, keys = _epoch_start(params, key, self._key_count())
        if key is not None:
            self._layer_keys = (key, keys)
        return grads, loss

    # -- the sweeps ---------------------------------------------------------------------------
    def forward(self, params, l: int, key, variant: Variant = Variant.FORWARD,
                evaluation: bool = False) -> None:
        """``H_{l+1}`` from ``H_l``, and ``Z_l`` too for `Variant.FORWARD_SAVING`. If an
        unfilled snapshot of layer l exists (the naive scheme), every partition's step input is
        also written to it. ``key`` None: dropout off, in training's programs (`forward_key`).
        ``evaluation``: a `Variant.FORWARD_SAVING` sweep runs training's saving step and drops
        its ``Z_l``, the kept aggregation, unstored (an epoch without dropout, ``key`` None
        too, stores it: its backward reads it)."""
        b = self.built
        src, dst = b.activations[l], b.activations[l + 1]
        dst.materialize()  # a recomputed layer's transient, outside an epoch (`predict`)
        steps, p_l, k_l = b.steps[l], params[l], self.forward_key(key, l)
        kept = b.aggregations[l] if variant is Variant.FORWARD_SAVING else None
        snap = self.snapshots.get(l)
        snap = snap if snap is not None and not snap.filled else None
        b.spares.plan([shape for p in b.parts for shape in
                       [(p.num_out, dst.width)] + ([(p.num_out, kept.width)]
                                                   if kept is not None else [])],
                      per_step=1 if kept is None else 2)
        # the naive scheme's snapshot is written from the loaded host rows: left unstaged,
        # they are not copied to the device and back (on a GPU)
        load = self._timed(self.input_loader(l, src, stage=snap is None, timing=self.timing))
        with b.pipeline.sweep(b.parts, load, stage=snap is None) as io:
            for part, h_in in self._inputs(io):
                if snap is not None:
                    self._queue(io, SSD_RANK, None, snap.write, part.index, h_in)
                spare = b.spares.take((part.num_out, dst.width))
                if kept is not None:
                    out, z = steps.forward_saving(p_l, self.device_block(part), h_in, k_l,
                                                  (spare, b.spares.take((part.num_out,
                                                                         kept.width))))
                    if evaluation:
                        b.spares.give(z)
                    else:
                        self._queue(io, self._tier(kept, part), self._ready(z, kept, part),
                                    self.stored, z, kept.write, part.index,
                                    self.for_the_store(z, kept, part.index))
                else:
                    out = steps.forward(p_l, self.step_block(part, l), h_in, k_l, spare)
                io.dispatched(out)
                self._queue(io, self._tier(dst, part), self._ready(out, dst, part),
                            self.stored, out, dst.write, part.index,
                            self.for_the_store(out, dst, part.index))
            self._finish(io)
        if snap is not None:
            snap.filled = True

    def backward(self, params, l: int, variant: Variant, key, upper: Optional[Table],
                 lower: Optional[Table], loss, acc, masks):
        """Layer l's backward sweep, running ``variant``'s step. ``masks``: its output masks
        per partition (from layer l+1's sweep) for a masked variant. Returns the loss, the
        accumulated parameter gradient, and the masks of layer l-1's output when this layer's
        steps make them, else None."""
        if variant in FROM_KEPT:
            return loss, self._backward_from_kept(params, l, key, variant, upper, lower, acc,
                                                  masks), None
        b = self.built
        steps, p_l, k_l = b.steps[l], params[l], self.layer_key(key, l)
        run = _BACKWARD_STEPS[variant]
        top, masked = variant is Variant.TOP, variant in _MASKED
        made = {} if steps.emits_mask else None
        snap = self.snapshots.get(l)
        store_input_gradient = self._store_input_gradient(l, lower)
        # the input gradients' buffers (the top step makes one even for a one-layer model)
        spared = variant not in _PARAMS_ONLY
        b.spares.plan([self.input_shape(p, l) for p in b.parts] if spared else [])
        load_input = self.input_loader(l, b.activations[l],
                                       snap if snap is not None and snap.filled else None,
                                       timing=self.timing)
        read_upper = self._reader(upper, halo=False) if not top else None
        # the output gradient is read with the input, off the main thread (`Pipeline`); the
        # top layer's labels and loss weights load with its input, as device arrays
        load = (lambda part: (load_input(part), (part.labels, part.weights))) if top else \
            (lambda part: (load_input(part), read_upper(part, part.num_out)))
        with b.pipeline.sweep(b.parts, self._timed(load)) as io:
            for part, (h_in, g_out) in self._inputs(io):
                spare = b.spares.take(self.input_shape(part, l)) if spared else None
                mask = masks.pop(part.index) if masked else None
                out = run(steps, p_l, self.step_block(part, l), h_in, k_l, mask, g_out, acc,
                          spare)
                if top:
                    loss = loss + out[0]
                    out = out[1:]
                acc = out[0]
                io.dispatched(acc)
                if not spared:  # the bottom layer: no input gradient
                    continue
                d_h = out[1]
                if made is not None:
                    made[part.index] = out[2]
                if lower is not None:
                    local = b.plan.local[l]
                    self._queue(io, self._tier(lower, part, halo=not local),
                                self._ready(d_h, lower, part, halo=not local),
                                self.stored, d_h, store_input_gradient, part,
                                self.for_the_store(d_h, lower, part.index,
                                                   None if local else part.halo_owner))
                else:  # a one-layer model's input gradient: nothing stores it
                    b.spares.give(d_h)
            self._finish(io)
        return loss, acc, made

    def _backward_from_kept(self, params, l, key, variant, upper, lower, acc, masks):
        """Layer l's backward sweep from its kept aggregation: no regather, no recompute of
        the sparse product. Makes no masks for layer l-1 (it does not see ``H_l``), so that
        layer recomputes its pre-activation (from its own kept ``Z``) or its output."""
        b = self.built
        steps, p_l, k_l = b.steps[l], params[l], self.layer_key(key, l)
        kept, width = b.aggregations[l], b.plan.widths[l]
        params_only = variant is Variant.SAVED_BACKWARD_PARAMS
        b.spares.plan([(p.num_in, width) for p in b.parts] if not params_only else [])
        accumulate = functools.partial(lower.accumulate,
                                       keep_device_rows=b.transfers.keep_device_rows) \
            if lower is not None else None
        read_kept, read_upper = self._reader(kept, halo=False), self._reader(upper, halo=False)
        load = self._timed(lambda part: (read_kept(part, part.num_out),
                                         read_upper(part, part.num_out)))
        with b.pipeline.sweep(b.parts, load) as io:
            for part, (z, g_out) in self._inputs(io):
                block = self.device_block(part)
                mask = masks.pop(part.index) if masks is not None else None
                if params_only:
                    acc = steps.saved_backward_params(p_l, block, z, k_l, mask, g_out, acc)
                    io.dispatched(acc)
                    continue
                acc, d_h = steps.saved_backward(p_l, block, z, k_l, mask, g_out, acc,
                                                b.spares.take((part.num_in, width)))
                io.dispatched(acc)
                self._queue(io, self._tier(lower, part, halo=True),
                            self._ready(d_h, lower, part, halo=True),
                            self.stored, d_h, accumulate, part.index, part.halo_owner,
                            part.halo_row, self.for_the_store(d_h, lower, part.index,
                                                              part.halo_owner))
            self._finish(io)
        return acc

    # -- a step's inputs ----------------------------------------------------------------------
    def input_loader(self, l: int, table: Table, snapshot: Optional[Snapshot] = None,
                     stage: bool = True, timing: Optional[SweepTiming] = None) -> Callable:
        """``part -> layer l's step input``: the partition's own block of ``table`` for a
        node-wise layer, else its own and halo rows gathered; read back from ``snapshot``
        instead when one is given (the naive scheme's backward). A gather to ``stage`` leaves
        the rows that are on the device there, where the device is not host RAM
        (`jgrind.engine.store.DeviceRows`, put together by the pipeline). With ``timing``,
        each read's seconds are added to its tier's (`SweepTiming.read`)."""
        local = self.built.plan.local[l]
        if snapshot is not None:
            rows = (lambda part: part.num_out) if local else (lambda part: part.num_in)
            if timing is not None:
                return lambda part: timing.read(SSD_RANK, snapshot.read, part.index,
                                                rows(part))
            return lambda part: snapshot.read(part.index, rows(part))
        if local:
            read = self._reader(table, halo=False, timing=timing)
            return lambda part: read(part, part.num_out)
        keep = stage and self.built.transfers.keep_device_rows
        gather = lambda part: table.gather(part.index, part.halo_owner,  # noqa: E731
                                           part.halo_row, part.num_in, keep_device_rows=keep)
        if timing is None:
            return gather
        tiers = self._tier_of.of(table, halo=True)
        return lambda part: timing.read(tiers[part.index], gather, part)

    def input_shape(self, part: PaddedPartition, l: int) -> tuple:
        return input_shape(part, l, self.built.plan.local, self.built.plan.widths)

    def device_block(self, part: PaddedPartition):
        """``part``'s block structure on the device: kept there, or sent for this step. Where
        the device adopts the host arrays without a copy (the CPU backend, aligned arrays:
        `jgrind.engine.steps.pad_partition`), the put is made once and kept: it holds no
        memory beside the host structure, and putting it again in every step cost 0.5-1.1
        ms a step on CPU-2 (seven arrays, copied: unaligned), more than many steps'
        compute."""
        cached = self.built.blocks.get(part.index)
        if cached is None:
            cached = self._adopted_blocks.get(part.index)
        if cached is not None:
            return cached
        self.built.store.count(to_device=part.nbytes())
        block = jax.device_put(part.block)
        if adopted(part.block, block):
            self._adopted_blocks[part.index] = block
        return block

    def step_block(self, part: PaddedPartition, l: int):
        """The block layer l's steps run on: without halo rows for a node-wise layer."""
        if self.built.plan.local[l]:
            return self.built.local_blocks[part.index]
        return self.device_block(part)

    # -- the parts of a sweep's time (`SweepTiming`) -------------------------------------------
    def _reader(self, table: Table, halo: bool, timing: Optional[SweepTiming] = None):
        """``(part, padded_rows) -> table.read(part.index, padded_rows)``, timed in its tier
        when the sweep is (``timing``, default this sweep's)."""
        timing = timing if timing is not None else self.timing
        if timing is None:
            return lambda part, rows: table.read(part.index, rows)
        tiers = self._tier_of.of(table, halo)
        return lambda part, rows: timing.read(tiers[part.index], table.read, part.index, rows)

    def _timed(self, load: Callable) -> Callable:
        return load if self.timing is None else self.timing.loader(load)

    def _inputs(self, io):
        return io if self.timing is None else self.timing.inputs(io)

    def _tier(self, table: Table, part, halo: bool = False) -> int:
        """The tier a store into ``table`` for ``part`` counts in (0 when not timed)."""
        if self.timing is None:
            return 0
        return self._tier_of.of(table, halo)[part.index]

    def _ready(self, output, table: Table, part, halo: bool = False):
        """What a timed store waits for before its seconds start: ``output``, where the store
        reads it on the host (the wait is the step's compute); None where it stays on the
        device (the store only queues device work)."""
        if self.timing is None:
            return None
        return output if table.stored_on_host(part.index, part.halo_owner if halo else None) \
            else None

    def _queue(self, io, tier: int, ready, fn: Callable, *args) -> None:
        """``io.write(fn, *args)``; when the sweep is timed, the store's seconds counted in
        ``tier`` and the main thread's wait on the writer in ``write_wait``."""
        if self.timing is None:
            io.write(fn, *args)
        else:
            self.timing.write(io, self.timing.store, tier, ready, fn, *args)

    def _finish(self, io) -> None:
        if self.timing is None:
            io.finish()
        else:
            self.timing.finish(io)

    # -- a step's outputs ---------------------------------------------------------------------
    def for_the_store(self, output: jax.Array, table: Table, block: int,
                      halo_owner: Optional[np.ndarray] = None):
        """What the writer thread stores of a dispatched step's output into ``table``: where
        the store reads it in host memory only (`Table.held_on_host`) and ``pinned_host`` is
        set, a copy in page-locked host memory, started now (the GPU's copy engine writes it
        as soon as the step ends, and the store reads it in place); else the output itself,
        with its host copy started when the store reads it on the host and
        ``early_host_copies`` is on (`TransferSettings`). Outputs kept on the device are not
        copied."""
        if not table.stored_on_host(block, halo_owner):
            return output
        self.built.store.count(to_host=output.nbytes)
        settings = self.built.transfers
        if settings.pinned_host is not None and table.held_on_host(block, halo_owner):
            return transfers.to_host(output, settings.pinned_host)
        if settings.early_host_copies:
            output.copy_to_host_async()
        return output

    def stored(self, output: jax.Array, store: Callable, *args) -> None:
        """``store(*args)``, whose last argument is ``output`` or its host copy, then hand
        ``output`` to `spares` for a later step: it is read no more."""
        store(*args)
        self.built.spares.give(output)

    def _store_input_gradient(self, l: int, lower: Optional[Table]) -> Callable:
        """How layer l's backward stores a partition's input gradient into ``G_l``: its own
        block written whole for a node-wise layer, else own and halo rows scatter-added."""
        if lower is not None and self.built.plan.local[l]:
            return lambda part, d_h: lower.write(part.index, d_h)
        keep = self.built.transfers.keep_device_rows
        return lambda part, d_h: lower.accumulate(part.index, part.halo_owner, part.halo_row,
                                                  d_h, keep_device_rows=keep)


@functools.partial(jax.jit, static_argnums=1)
def _fold_layer_keys(key: jax.Array, count: int) -> tuple:
    """``layer_key(key, i)`` for the model's layers ``0 .. count-1``, in one program."""
    return tuple(layer_key(key, i) for i in range(count))


@functools.partial(jax.jit, static_argnums=0)
def _evaluation_keys(count: int) -> tuple:
    """Layer keys for an evaluation before any epoch (`Sweeps.forward_key`; switched off,
    their values are unused), typed as `jax.random.key` types an epoch's, in one program."""
    return tuple(layer_key(jax.random.key(0), i) for i in range(count))


@functools.partial(jax.jit, static_argnums=2)
def _epoch_start(params, key, count: int) -> tuple:
    """Zeros shaped like ``params``, a zero loss (made on the device: op by op, a Python zero
    would be copied there), and `_fold_layer_keys` of ``key`` (None: none)."""
    keys = () if key is None else tuple(layer_key(key, i) for i in range(count))
    return jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32), keys


def adopted(host, device) -> bool:
    """Whether every array of ``device`` (``jax.device_put(host)``) uses the memory of its
    NumPy counterpart in ``host`` in place, rather than a copy."""
    pairs = list(zip(jax.tree.leaves(host), jax.tree.leaves(device)))
    return bool(pairs) and all(
        isinstance(h, np.ndarray) and h.size > 0 and d.unsafe_buffer_pointer() == h.ctypes.data
        for h, d in pairs)
