"""`ShardedOutOfCore`: the out-of-core engine with its partitions' steps spread over devices.

One `jgrind.engine.OutOfCore` engine is built as on one device: its plan, its schedule, its
store (the process's host and SSD tiers) and its sweeps. The partitions are then placed on
devices (`jgrind.plan.placement`), and each partition's steps run on its device: its step
inputs are put there, its block structure too, and the jitted steps run where their inputs
are. Every stored tensor is written to the host or SSD tier it is planned for, and a step
gathers its halo rows from there, whichever device produced them: for rows made on another
device, that is the exchange through host memory (`jgrind.devices.exchange.ThroughHost`,
FlexGNN's G2H). Halo input gradients are added into their owner's rows at the host, as on
one device.

Each device keeps its own weight-gradient sum (and loss sum) over its partitions; at the end
of the epoch a ``psum`` under `jax.shard_map` over the devices' mesh adds them, and the
engine's optimizer update runs once on the sum: the update of in-memory training.

Why this design: the engine already places every stored tensor on the host, the SSD or
recompute, regathers and scatter-adds halo rows, and orders the sweeps so a layer's rows are
complete before the next layer reads them. Giving each partition a device needs only the
steps to run there and the gradient sums to stay per device: no tier, schedule or sweep is
copied. The price is that the devices take their partitions' steps in the sweep's order,
one dispatch thread for all of them: the devices overlap only as far as JAX's asynchronous
dispatch lets them.

Still refused: a plan that keeps a stored tensor on the device (`Fate.DEVICE`; the store's
device tier is one device's memory: use `jgrind.devices.Sharded`, which keeps every row on
its device and exchanges device to device), the naive policy's snapshots (one more tier of
step inputs), and several processes (each process's tiers would hold only its partitions'
rows, and halo rows of another process's partitions would have to cross between the
processes).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jgrind.devices.exchange import ThroughHost, one_route
from jgrind.devices.executor import AXIS, resolve_devices
from jgrind.engine.engine import OutOfCore
from jgrind.engine.sweeps import FROM_KEPT, Sweeps, adopted
from jgrind.plan.cost import ITEMSIZE
from jgrind.plan.exchange import exchange_plan
from jgrind.plan.fates import Fate
from jgrind.plan.placement import Placement, Rates, place
from jgrind.plan.schedule import BACKWARD, FORWARD, RECOMPUTE, Variant

__all__ = ["PerDevice", "ShardedOutOfCore"]

# the argument each backward step takes its weight-gradient accumulator in (it returns it
# alone, or first, after the loss term for ``top``); the steps of `_SPARED` take a spare
# buffer last
_ACCUMULATOR = {"backward": 5, "backward_params": 5, "top": 6, "masked_backward": 6,
                "masked_backward_params": 6, "saved_backward": 6, "saved_backward_params": 6}
_SPARED = frozenset({"forward", "forward_saving", "backward", "top", "masked_backward",
                     "saved_backward"})
_STEPS = frozenset({"forward", "forward_saving", *_ACCUMULATOR})
_PARAMS_ONLY = frozenset({Variant.BACKWARD_PARAMS, Variant.MASKED_BACKWARD_PARAMS,
                          Variant.SAVED_BACKWARD_PARAMS})


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True)
class PerDevice:
    """One value per device (a tree on each), added device by device: the weight-gradient
    sums and the loss sums of an epoch before the collective adds them up."""

    values: dict  # jax.Device -> tree on that device

    def tree_flatten(self):
        devices = tuple(self.values)
        return tuple(self.values[d] for d in devices), devices

    @classmethod
    def tree_unflatten(cls, devices, children):
        return cls(dict(zip(devices, children)))

    def __add__(self, other):
        if not isinstance(other, PerDevice):
            other = _on_first(other, self)
        merged = dict(self.values)
        for device, value in other.values.items():
            merged[device] = value if device not in merged else \
                jax.tree.map(jnp.add, merged[device], value)
        return PerDevice(merged)

    __radd__ = __add__


def _on_first(value, like: PerDevice) -> PerDevice:
    """A plain value (the runner's zero start) as a `PerDevice` on ``like``'s first device."""
    device = next(iter(like.values))
    return PerDevice({device: jax.device_put(value, device)})


def _device_of(tree) -> Optional[jax.Device]:
    for leaf in jax.tree.leaves(tree):
        if isinstance(leaf, jax.Array):
            return next(iter(leaf.devices()))
    return None


def _on(tree, device: jax.Device):
    """``tree``'s arrays on ``device`` (those there already are kept; None stays None)."""
    return jax.tree.map(lambda a: a if isinstance(a, jax.Array) and a.devices() == {device}
                        else jax.device_put(a, device), tree)


def _replaced(sums: PerDevice, device, value) -> PerDevice:
    """``sums`` with ``device``'s value replaced, that one first: the pipeline waits on a
    step's first output leaf to know it has finished."""
    return PerDevice({device: value, **{d: v for d, v in sums.values.items() if d != device}})


class _PlacedSteps:
    """A layer's `jgrind.engine.steps.LayerSteps`, run on the device of the block they are
    given, with the weight-gradient accumulator kept per device (`PerDevice`)."""

    def __init__(self, steps, owner: "ShardedOutOfCore"):
        self._steps, self._owner = steps, owner

    def __getattr__(self, name):
        value = getattr(self._steps, name)
        if name not in _STEPS or value is None:
            return value
        return functools.partial(self._call, name, value)

    def _call(self, name, step, *args):
        args = list(args)
        device = _device_of(args[1])  # the block: put on the partition's device
        if name in _SPARED and _device_of(args[-1]) not in (device, None):
            args[-1] = None  # a spare of another device: the step allocates its own
        position = _ACCUMULATOR.get(name)
        sums = None
        if position is not None:
            sums = args[position]
            if not isinstance(sums, PerDevice):  # the runner's zeros, first step of a sweep
                sums = PerDevice({device: _on(sums, device)})
            args[position] = sums.values.get(device)
            if args[position] is None:
                args[position] = jax.tree.map(
                    lambda a: jnp.zeros(a.shape, a.dtype, device=device),
                    next(iter(sums.values.values())))
        args[0] = self._owner._params_on(args[0], device)
        args = [a if i == position else _on(a, device) for i, a in enumerate(args)]
        out = step(*args)
        if position is None:
            return out
        if not isinstance(out, tuple):  # the accumulator alone
            return _replaced(sums, device, out)
        at = 1 if name == "top" else 0
        out = list(out)
        out[at] = _replaced(sums, device, out[at])
        if name == "top":
            out[0] = PerDevice({device: out[0]})
        return tuple(out)


class _PlacedSweeps(Sweeps):
    """The engine's sweeps, with each partition's step inputs and block structure put on its
    device (the steps then run there: `_PlacedSteps`)."""

    def __init__(self, built, device_of_part: dict):
        super().__init__(built)
        self.device_of_part = device_of_part
        self._blocks: dict = {}
        # the engine keeps every block's structure on the (first) device when it fits: here
        # each is kept on its own partition's device instead
        self._keep_blocks = bool(built.blocks)
        built.blocks.clear()

    def _timed(self, load):
        load = super()._timed(load)

        def placed(part):
            device = self.device_of_part[part.index]
            loaded = load(part)
            # counted as the pipeline counts what it puts
            self.built.store.count(to_device=sum(a.nbytes for a in jax.tree.leaves(loaded)
                                                 if isinstance(a, np.ndarray)))
            return _on(loaded, device)
        return placed

    def device_block(self, part):
        return self._placed(("block", part.index), part.block, part)

    def step_block(self, part, l: int):
        if self.built.plan.local[l]:
            return self._placed(("local", part.index), self.built.local_blocks[part.index],
                                part)
        return self.device_block(part)

    def _placed(self, name, block, part):
        cached = self._blocks.get(name)
        if cached is not None:
            return cached
        device = self.device_of_part[part.index]
        if name[0] == "block":
            self.built.store.count(to_device=part.nbytes())
        placed = jax.device_put(block, device)
        # kept where it holds no device memory of its own (the CPU backend adopts aligned
        # host arrays), where the engine would keep every block on the device, and for the
        # node-wise layers' blocks (the engine keeps them all on the device)
        if name[0] == "local" or self._keep_blocks or adopted(block, placed):
            self._blocks[name] = placed
        return placed


class ShardedOutOfCore:
    """The out-of-core engine over several devices of this process (see the module
    docstring). Arguments are `jgrind.engine.OutOfCore`'s, and

      devices: a number K (the first K of ``jax.devices()``) or a sequence of ``jax.Device``.
      exchange: `ThroughHost()` (the only route this executor runs), for every layer or one
        per layer; None: through host.
      rates: the placement's cost rates (`jgrind.plan.placement.Rates`).

    ``device_budget`` is per device: each device runs one partition step at a time, and the
    engine holds every step's working set to it.

    Attributes: ``engine`` (the `OutOfCore` engine; its attributes, such as ``store``,
    ``fates`` and ``memory``, are readable here too), ``devices``, ``mesh``, ``placement``,
    ``exchanges`` (one route per layer), ``exchange_bytes_per_epoch`` (bytes of halo rows from
    partitions on other devices that the epoch's steps read through host memory, and halo
    gradients they send back), ``exchange_minimum_per_epoch`` (the least any exchange moves:
    the distinct (row, reading device) pairs of every aggregating layer, forward and back);
    both at the widths of the layers the engine runs (`jgrind.executed.split`).
    """

    def __init__(self, graph, model, optimizer=None, *, devices=None, policy=None,
                 num_parts: Optional[int] = None, exchange=None,
                 rates: Optional[Rates] = None, **engine_arguments):
        self.devices = resolve_devices(len(jax.devices()) if devices is None else devices)
        k = len(self.devices)
        if any(d.process_index != jax.process_index() for d in self.devices) \
                or jax.process_count() > 1:
            raise ValueError("out-of-core training over several devices runs in one process "
                             "for now: each process's host and SSD tiers would hold only its "
                             "own partitions' rows; run one process, or drop the out-of-core "
                             "arguments (policy, store, budgets) to keep every row on its "
                             "device")
        self.exchanges = one_route(exchange, len(model.layers), ThroughHost(),
                                   "out-of-core training over several devices",
                                   "jgrind.devices.Sharded")
        if getattr(policy, "io", None) is not None:
            raise ValueError("the naive policy (snapshots of step inputs) is not run over "
                             "devices; train it without devices=")
        self.engine = OutOfCore(graph, model, optimizer, policy=policy,
                                num_parts=k if num_parts is None else num_parts,
                                **engine_arguments)
        try:
            self._place(graph, model, rates)
        except BaseException:
            self.engine.close()
            raise

    def _place(self, graph, model, rates) -> None:
        built = self.engine.built
        on_device = sorted(key for key, fate in built.plan.fates.items()
                           if fate is Fate.DEVICE)
        if len(self.devices) > 1 and on_device:
            name, layer, _ = on_device[0]
            raise ValueError(f"the plan keeps {len(on_device)} stored block(s) on the device "
                             f"(first: {name} of layer {layer}); with several devices the "
                             "engine stores them on the host or the SSD: choose such a "
                             "policy (host_offload, ssd_offload, recompute_activations), or "
                             "drop the out-of-core arguments to keep every row on its device")
        k = len(self.devices)
        self.mesh = Mesh(np.array(self.devices), (AXIS,))
        self.placement: Placement = place(built.pg, model, graph.num_features, k, rates)
        self._device_of_part = {p: self.devices[int(d)]
                                for p, d in enumerate(self.placement.device_of)}
        for l, steps in enumerate(built.steps):
            built.steps[l] = _PlacedSteps(steps, self)
        self.engine.runner.sweeps = _PlacedSweeps(built, self._device_of_part)
        # host copies go to the host memory of the device the output is on, not the first's
        built.transfers.pinned_host = None
        built.transfers.keep_device_rows = False
        self._params: dict = {}
        self._sum = _all_reduce(self.mesh)
        self._count_exchange(model, graph)

    def _count_exchange(self, model, graph) -> None:
        """``exchange_bytes_per_epoch`` from the schedule the engine runs, and the minimum."""
        built, pg = self.engine.built, self.engine.built.pg
        device_of_node = self.placement.device_of[pg.assignment]
        crossing = 0  # halo rows a step reads from partitions on another device
        for part in pg.partitions:
            owners = np.asarray(part.halo_owner, np.int64)
            crossing += int(np.count_nonzero(self.placement.device_of[owners]
                                             != self.placement.device_of[part.index]))
        normalized = model.normalize(graph)
        distinct = int(exchange_plan(normalized.indptr, normalized.indices, device_of_node,
                                     len(self.devices)).counts.sum())
        widths, local = built.plan.widths, built.plan.local
        moved = minimum = 0
        for sweep in built.plan.schedule.sweeps:
            l = sweep.layer
            if local[l]:
                continue
            if sweep.kind in (FORWARD, RECOMPUTE):  # a recomputation gathers again
                moved += crossing * widths[l]
                minimum += distinct * widths[l] if sweep.kind == FORWARD else 0
            elif sweep.kind == BACKWARD:
                back = sweep.variant not in _PARAMS_ONLY  # halo gradients go back
                moved += crossing * widths[l] * ((sweep.variant not in FROM_KEPT) + back)
                minimum += distinct * widths[l] * back
        # the executed model's widths (a GCN layer aggregates its narrower side,
        # `jgrind.executed.split`): the rows this executor moves
        self.exchange_bytes_per_epoch = ITEMSIZE * moved
        self.exchange_minimum_per_epoch = ITEMSIZE * minimum

    # -- running ------------------------------------------------------------------------------
    def _params_on(self, params, device):
        """``params`` (one layer's) on ``device``, put there once an epoch."""
        key = (id(params), device)
        held = self._params.get(key)
        if held is None or held[0] is not params:
            held = (params, _on(params, device))
            self._params[key] = held
        return held[1]

    def loss_and_grad(self, params, key):
        """``(grads, loss)`` of the full-graph loss: every device's partitions' sums, added
        by the devices' collective."""
        executed = self.engine.built.executed
        self._params.clear()
        try:
            grads, loss = self.engine.runner.loss_and_grad(executed.split_params(params), key)
        finally:
            self._params.clear()
        grads = tuple(self._total(g) for g in grads)
        return executed.merge_params(grads), self._total(loss)

    def _total(self, sums):
        """The sum over devices of a `PerDevice` (a ``psum`` on the mesh), on the first
        device; a plain value (no step added to it) as it is."""
        if not isinstance(sums, PerDevice):
            return jax.device_put(sums, self.devices[0])
        like = next(iter(sums.values.values()))
        parts = [sums.values.get(d) if d in sums.values else
                 jax.tree.map(lambda a, d=d: jnp.zeros(a.shape, a.dtype, device=d), like)
                 for d in self.devices]
        sharding = NamedSharding(self.mesh, P(AXIS))
        stacked = jax.tree.map(
            lambda *leaves: jax.make_array_from_single_device_arrays(
                (len(leaves), *leaves[0].shape), sharding, [a[None] for a in leaves]),
            *parts)
        return jax.device_put(self._sum(stacked), self.devices[0])

    def step(self, params, opt_state, key):
        if self.engine.optimizer is None:
            raise ValueError("this executor was made without an optimizer, for predictions "
                             "only; pass one (e.g. optax.adam(0.01)) to train with it")
        grads, loss = self.loss_and_grad(params, key)
        params, opt_state = jax.device_put((params, opt_state), self.devices[0])
        params, opt_state = self.engine.built.update(params, opt_state, grads, loss)
        return params, opt_state, loss

    def predict(self, params) -> np.ndarray:
        self._params.clear()
        return self.engine.predict(params)

    def embed(self, params, layer: int) -> np.ndarray:
        self._params.clear()
        return self.engine.embed(params, layer)

    def close(self) -> None:
        self.engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __getattr__(self, name):
        if name == "engine":  # not yet built
            raise AttributeError(name)
        return getattr(self.engine, name)


def _all_reduce(mesh: Mesh):
    """``stacked -> sum over the mesh's devices``: a ``psum`` under `jax.shard_map`."""
    def total(stacked):
        return jax.tree.map(lambda a: jax.lax.psum(a[0], AXIS), stacked)
    return jax.jit(jax.shard_map(total, mesh=mesh, in_specs=P(AXIS), out_specs=P(),
                                 check_vma=False))
