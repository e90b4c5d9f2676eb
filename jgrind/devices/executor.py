"""`Sharded`: one exact full-graph model run data-parallel over the nodes on several devices.

The partitions are placed on devices (`jgrind.plan.placement`); each device holds its nodes'
rows and a `Block` over them and its halo slots (`jgrind.devices.layout`), stacked with the
other devices' along a leading axis sharded over a 1-D `Mesh`. The model runs under
`jax.shard_map`: before every layer that aggregates, one `jax.lax.all_to_all` fills the halo
slots with the rows each device sends each other one; then the layer runs on the block, as on
one device. Each device differentiates its own weighted loss sum (the weights are global,
`jgrind.loss.node_weights`); the transpose of the all_to_all returns halo gradients to their
owners, so each device ends with its share of the gradient of the summed loss, and a `psum`
adds the shares (and the losses). The shard_map runs with ``check_vma=False`` and sums
explicitly: the native sparse kernel (an FFI call under a custom VJP) gives its results no
device-varying type, which ``check_vma=True``'s own summing of replicated parameters'
gradients needs. Dropout is hashed from global node ids, so every device drops what the
in-memory run drops.

Arrays are built with `jax.make_array_from_callback`, so a process builds only the shards of
the devices it drives: the code runs unchanged on a mesh spanning several processes.
"""

from __future__ import annotations

import functools
import json
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jgrind.datasets.saved_arrays import SavedGraph
from jgrind.devices.exchange import DeviceToDevice, one_route
from jgrind.devices.layout import DeviceData, device_data, device_shapes
from jgrind.graph import Graph
from jgrind.loss import node_weights, weighted_loss
from jgrind.models.block import Block
from jgrind.models.model import GNN, layer_key
from jgrind.partition import partition_graph
from jgrind.partition.partitioners import label_propagation
from jgrind.plan.exchange import ExchangePlan, epoch_exchange_bytes, exchange_plan
from jgrind.plan.placement import Placement, Rates, place

__all__ = ["AXIS", "Sharded", "resolve_devices"]

AXIS = "devices"  # the mesh's one axis


def resolve_devices(devices) -> list:
    """``devices`` as a list of `jax.Device`: an int K is the first K of ``jax.devices()``."""
    available = jax.devices()
    if isinstance(devices, (int, np.integer)) and not isinstance(devices, bool):
        k = int(devices)
        if k < 1:
            raise ValueError(f"devices must be 1 or more, got {k}")
        if k > len(available):
            kind = available[0].platform
            hint = (f"; on the CPU, set XLA_FLAGS=--xla_force_host_platform_device_count={k} "
                    "before JAX starts") if kind == "cpu" else ""
            raise ValueError(f"{k} devices asked for, but {len(available)} "
                             f"{kind} device{'' if len(available) == 1 else 's'} "
                             f"exist{'s' if len(available) == 1 else ''}{hint}")
        return list(available[:k])
    try:
        chosen = list(devices)
    except TypeError:
        raise TypeError(f"devices must be a number of devices or a sequence of jax.Device, "
                        f"got {devices!r}") from None
    if not chosen or not all(isinstance(d, jax.Device) for d in chosen):
        raise TypeError(f"devices must be a number of devices or a non-empty sequence of "
                        f"jax.Device, got {devices!r}")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"devices names a device twice: {chosen}")
    return chosen


class Sharded:
    """The executor of a model data-parallel over devices (see the module docstring).

    Attributes (besides the `jgrind.train.Executor` methods):
      devices, mesh: the devices, in mesh order, and the 1-D mesh over them.
      partitioned: the `jgrind.partition.PartitionedGraph` of the normalised graph (None
        when built from a `SavedGraph`: each process then reads only its own rows).
      process_local: whether it was (`from_saved`, `jgrind.devices.local`).
      placement: the `Placement` of the partitions on the devices.
      exchange: the `ExchangePlan` (rows per device, rows sent per pair).
      exchanges: the route of every layer's exchange: `DeviceToDevice` (the ``exchange``
        argument; `jgrind.devices.exchange`).
      exchange_bytes_per_epoch: bytes one training step moves between devices, padding
        included: the all_to_all before every aggregating layer, and its transpose in the
        backward pass (which the first layer skips: features need no gradient).
      exchange_minimum_per_epoch: the same count of the distinct (row, reading device) pairs.
    """

    def __init__(self, graph: Graph, model: GNN,
                 optimizer: Optional[optax.GradientTransformation] = None, *,
                 devices=None, num_parts: Optional[int] = None,
                 partitioner: Callable = label_propagation, partitioned=None, split: int = 0,
                 loss: Optional[Callable] = None, rates: Optional[Rates] = None, seed: int = 0,
                 exchange=None):
        self.exchanges = one_route(exchange, len(model.layers), DeviceToDevice(),
                                   "Sharded (every layer's rows kept on the devices)",
                                   "jgrind.devices.ShardedOutOfCore")
        self.devices = resolve_devices(len(jax.devices()) if devices is None else devices)
        k = len(self.devices)
        self.model, self.optimizer, self.graph = model, optimizer, graph
        self.mesh = Mesh(np.array(self.devices), (AXIS,))
        self._stacked = NamedSharding(self.mesh, P(AXIS))
        self._replicated = NamedSharding(self.mesh, P())
        if isinstance(graph, SavedGraph):
            self._init_local(graph, partitioner, num_parts, split, rates)
            self._build_functions(loss)
            return
        self.process_local = False
        if jax.process_count() > 1:
            # every process reads the whole graph and builds its own devices' shards from it:
            # another graph in one (another file under the same name) would be trained on
            # silently, so the graphs' fingerprints are compared first
            from jgrind.devices import processes
            processes.agree(json.dumps(graph.fingerprint(), sort_keys=True), "graph data")
        if getattr(partitioner, "num_parts", None) is not None and num_parts is None:
            num_parts = partitioner.num_parts  # a saved assignment's own count
        normalized = model.normalize(graph)
        if partitioned is None:
            parts = k if num_parts is None else int(num_parts)
            partitioned = partition_graph(normalized, partitioner(normalized, parts, seed=seed),
                                          num_parts=parts)
        self.partitioned = partitioned
        self.placement: Placement = place(partitioned, model, graph.num_features, k, rates)
        device_of_node = self.placement.device_of[partitioned.assignment]
        self.exchange: ExchangePlan = exchange_plan(normalized.indptr, normalized.indices,
                                                    device_of_node, k)
        self.shapes = device_shapes(self.exchange, normalized.indptr)
        self.exchange_bytes_per_epoch, self.exchange_minimum_per_epoch = \
            epoch_exchange_bytes(self.exchange, model, graph.num_features)

        loss_weights = node_weights(graph.train_mask[split])
        local = functools.cache(lambda d: device_data(
            d, self.exchange, self.shapes, normalized, loss_weights,
            needs_edges=model.needs_edges, needs_adjacency=model.needs_adjacency))
        self.arrays = self._stack(local)
        self._build_functions(loss)

    @classmethod
    def from_saved(cls, folder, model: GNN, optimizer=None, **kwargs) -> "Sharded":
        """The executor over the graph saved in ``folder`` (`jgrind.datasets.save_graph`),
        every process reading only its own devices' rows (`jgrind.devices.local`); the
        ``partitioner`` must be `contiguous` (the default here) or a saved assignment
        (`jgrind.datasets.saved_arrays.saved_assignment`). ``executor.graph`` is the
        `SavedGraph` to pass to `jgrind.train.train` beside it."""
        from jgrind.partition.partitioners import contiguous
        kwargs.setdefault("partitioner", contiguous)
        return cls(SavedGraph.open(folder), model, optimizer, **kwargs)

    def _init_local(self, graph: SavedGraph, partitioner, num_parts, split, rates) -> None:
        """`__init__` of a process that reads only its own rows of a saved graph."""
        from jgrind.devices import local as local_rows
        from jgrind.devices import processes
        k, model = len(self.devices), self.model
        self.process_local = True
        assignment = local_rows.local_assignment(graph.saved, partitioner, num_parts, k)
        processes.agree(local_rows.fingerprint(graph.saved, assignment),
                        "saved graph or partition assignment")
        self.partitioned = None  # no process holds the whole partitioned graph
        self.placement, self.exchange, self.shapes, rows = local_rows.local_layout(
            graph.saved, model, self.devices, assignment, graph.labels, rates)
        self.exchange_bytes_per_epoch, self.exchange_minimum_per_epoch = \
            epoch_exchange_bytes(self.exchange, model, graph.num_features)
        loss_weights = node_weights(graph.train_mask[split])
        self.arrays = self._stack(functools.cache(lambda d: device_data(
            d, self.exchange, self.shapes, rows, loss_weights,
            needs_edges=model.needs_edges, needs_adjacency=model.needs_adjacency)))

    # -- arrays ----------------------------------------------------------------------------
    def _stack(self, local: Callable[[int], DeviceData]) -> DeviceData:
        """The devices' `DeviceData` as global arrays with a leading device axis; each process
        builds only its own devices' shards."""
        mine = [d for d, dev in enumerate(self.devices)
                if dev.process_index == jax.process_index()]
        if not mine:
            raise ValueError(f"process {jax.process_index()} drives none of the devices "
                             f"{self.devices}; every process must hold some of the mesh")
        treedef = jax.tree.structure(local(mine[0]))
        leaves = {d: jax.tree.leaves(local(d)) for d in mine}
        stacked = []
        for i, like in enumerate(leaves[mine[0]]):
            shape = (len(self.devices), *np.shape(like))
            stacked.append(jax.make_array_from_callback(
                shape, self._stacked,
                lambda index, i=i: leaves[index[0].start or 0][i][None]))
        return jax.tree.unflatten(treedef, stacked)

    def _replicate(self, tree):
        """``tree``'s arrays replicated on the mesh (those already so are kept)."""
        def put(a):
            if isinstance(a, jax.Array) and a.sharding == self._replicated:
                return a
            if isinstance(a, jax.Array) and jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
                data = self._replicate(jax.random.key_data(a))
                return jax.random.wrap_key_data(data, impl=jax.random.key_impl(a))
            host = np.asarray(a)
            return jax.make_array_from_callback(host.shape, self._replicated,
                                                lambda index: host[index])
        return jax.tree.map(put, tree)

    # -- the sharded model -------------------------------------------------------------------
    def _build_functions(self, node_loss) -> None:
        model, k, slots = self.model, len(self.devices), self.shapes.slot_rows

        def exchange(h, send):
            # [K readers, S, w] rows out; [K owners, S, w] rows in, of which the halo slots
            # keep the other devices' chunks, in `halo_chunk`'s order: a device's chunk to
            # itself is padding, and its rows would only widen every aggregating layer
            out = h[send]
            received = jax.lax.all_to_all(out, AXIS, 0, 0, tiled=False)
            others = (jax.lax.axis_index(AXIS) + 1 + jnp.arange(k - 1)) % k
            return received[others].reshape((k - 1) * slots, h.shape[1])

        def forward(params, data: DeviceData, key, stop: int):
            block = data.block
            node_block = Block(adj=None, edge_src=None, edge_dst=None,
                               node_ids=block.node_ids[: block.num_out],
                               num_out=block.num_out)
            h = data.x
            for i, (layer, p) in enumerate(zip(model.layers[:stop], params)):
                if layer.aggregates:
                    inputs = jnp.concatenate([h, exchange(h, data.send)]) if slots and k > 1 \
                        else h
                    h = layer(p, block, inputs, layer_key(key, i))
                else:
                    h = layer(p, node_block, h, layer_key(key, i))
            return h

        def unstack(data):
            return jax.tree.map(lambda a: a[0], data)

        def local_loss_and_grad(params, data, key):
            data = unstack(data)

            def own_loss(params):
                logits = forward(params, data, key, len(model.layers))
                return weighted_loss(node_loss, logits, data.labels, data.weights)
            # Every device seeds its own loss; the backward all_to_all carries the halo
            # cotangents to their owners, so each device ends with its parameter copy's share
            # of the gradient of the summed loss, and the psum adds the shares.
            loss, grads = jax.value_and_grad(own_loss)(params)
            return jax.lax.psum(loss, AXIS), jax.lax.psum(grads, AXIS)

        def loss_and_grad(params, data, key):
            return jax.shard_map(local_loss_and_grad, mesh=self.mesh,
                                 in_specs=(P(), P(AXIS), P()), out_specs=(P(), P()),
                                 check_vma=False)(params, data, key)

        def sharded_forward(params, data, stop):
            run = lambda p, d: forward(p, unstack(d), None, stop)[None]  # noqa: E731
            return jax.shard_map(run, mesh=self.mesh, in_specs=(P(), P(AXIS)),
                                 out_specs=P(AXIS), check_vma=False)(params, data)

        optimizer = self.optimizer

        def step(params, opt_state, data, key):
            loss, grads = loss_and_grad(params, data, key)
            updates, opt_state = optax.with_extra_args_support(optimizer).update(
                grads, opt_state, params, value=loss)
            return optax.apply_updates(params, updates), opt_state, loss

        self._step = jax.jit(step, donate_argnums=(0, 1)) if optimizer is not None else None
        self._loss_and_grad = jax.jit(loss_and_grad)
        self._forward = jax.jit(sharded_forward, static_argnums=2)

    # -- the Executor methods --------------------------------------------------------------
    def step(self, params, opt_state, key):
        if self._step is None:
            raise ValueError("this executor was made without an optimizer, for predictions "
                             "only; pass one (e.g. optax.adam(0.01)) to train with it")
        params, opt_state, key = self._replicate((params, opt_state, key))
        return self._step(params, opt_state, self.arrays, key)

    def loss_and_grad(self, params, key):
        """Loss and gradient without an update (tests compare them with `InMemory`'s)."""
        params, key = self._replicate((params, key))
        return self._loss_and_grad(params, self.arrays, key)

    def embed(self, params, layer: int) -> np.ndarray:
        stop = self.model.check_layer(layer)
        out = self._forward(self._replicate(params), self.arrays, stop)
        return self._node_order(out)

    def predict(self, params) -> np.ndarray:
        return self.embed(params, len(self.model.layers))

    def _node_order(self, stacked: jax.Array) -> np.ndarray:
        """``[K, R, w]`` device rows as ``[N, w]`` on the host, in the graph's node order."""
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            stacked = multihost_utils.process_allgather(stacked, tiled=True)
        host = np.asarray(stacked)
        out = np.empty((self.graph.num_nodes, host.shape[-1]), host.dtype)
        for d, rows in enumerate(self.exchange.rows):
            out[rows] = host[d, : rows.size]
        return out

    def format(self) -> str:
        """The placement and the exchange's bytes per epoch, for logs."""
        ratio = (self.exchange_bytes_per_epoch / self.exchange_minimum_per_epoch
                 if self.exchange_minimum_per_epoch else 1.0)
        return (f"{self.placement.format()}\nexchange per epoch: "
                f"{self.exchange_bytes_per_epoch / 2**20:.2f} MiB moved, minimum "
                f"{self.exchange_minimum_per_epoch / 2**20:.2f} MiB ({ratio:.2f}x)")
