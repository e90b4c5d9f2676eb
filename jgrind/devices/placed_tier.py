"""The device tier over several devices: each stored block on the device of its partition.

`jgrind.devices.ShardedOutOfCore` serves `Fate.DEVICE` with `PlacedDeviceTier` (through the
store's ``tiers``): a table's device blocks are kept in one JAX array per device, each
holding the blocks of the partitions placed there. A step's own rows are then on its device;
its halo rows owned by partitions of other devices move by the route of their layer
(`jgrind.devices.exchange`):

* `DeviceToDevice`: the rows are taken on the owner's device and put on the reader's by
  `jax.device_put` (on GPUs of one process, a peer copy; on CPU devices, a copy in memory);
  an input gradient's halo rows go the same way back and are added at their owner's device.
* `ThroughHost`: the rows are read into host memory and put on the reader's device from
  there (and input gradients the same way back): FlexGNN's G2H, with the blocks on devices.

The tier counts what it moves between devices per route (`DeviceTiers.moved`) and the bytes
it holds per device (`DeviceTiers.held`, ``peak``); the store's device account holds their sum.

Over several processes each process's tier holds only its own devices' blocks: it is made
through `jgrind.devices.across_processes.ProcessTiers.wrapping`, which gives it this
process's blocks and keeps the halo rows of other processes' device blocks itself (they cross
by the processes' collective, whatever the layer's route: the routes move rows between
devices of one process).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jgrind.engine.routes import TierRows
from jgrind.engine.tiers.device import (bucket_len, padded_rows, table_add as _add,
                                         table_add_taken as _add_taken, table_set as _set,
                                         table_take as _take)
from jgrind.engine.tiers.protocol import NOTHING_HELD, Shared, TierBlocks
from jgrind.plan.fates import ACTIVATION, GRADIENT
from jgrind.plan.sharded import DeviceToDevice, ThroughHost

__all__ = ["DeviceTiers", "PlacedDeviceTier"]

DEVICE_TO_DEVICE, THROUGH_HOST = str(DeviceToDevice()), str(ThroughHost())


class DeviceTiers:
    """What every `PlacedDeviceTier` of a run shares: the device of every block, the route of
    every executed layer, and the counts.

    Args:
      devices: the run's devices.
      device_of_block: ``[P]`` index into ``devices`` of every partition (block).

    Attributes:
      routes: ``{executed layer: DeviceToDevice() or ThroughHost()}`` for the layers whose
        halo rows the tier moves (set by the executor once its plan is known; a layer not
        named goes through host memory).
      moved: bytes of rows moved between devices per route (``DEVICE_TO_DEVICE``,
        ``THROUGH_HOST``), halo rows and halo gradients, since the last `reset`.
      held, peak: ``[K]`` bytes the device tiers hold on each device now, and at most.
    """

    def __init__(self, devices: Sequence[jax.Device], device_of_block: np.ndarray):
        self.devices = list(devices)
        self.device_of_block = np.asarray(device_of_block, np.int64)
        self.routes: dict = {}
        self.moved = {DEVICE_TO_DEVICE: 0, THROUGH_HOST: 0}
        self.held = np.zeros(len(self.devices), np.int64)
        self.peak = np.zeros(len(self.devices), np.int64)
        self._lock = threading.Lock()
        self._reader = threading.local()

    def tier_class(self) -> type:
        """`PlacedDeviceTier` bound to this run: what the store's ``tiers`` maps
        `Fate.DEVICE` to (its constructor is a tier's, ``(TierBlocks, Shared)``)."""
        return type("PlacedDeviceTier", (PlacedDeviceTier,), {"run": self})

    def reset(self) -> None:
        with self._lock:
            self.moved = {DEVICE_TO_DEVICE: 0, THROUGH_HOST: 0}

    @contextlib.contextmanager
    def reading_for(self, device: jax.Device):
        """Gathers on this thread are for a step on ``device`` (the loader's partition's)."""
        before = getattr(self._reader, "device", None)
        self._reader.device = device
        try:
            yield
        finally:
            self._reader.device = before

    @property
    def reader(self) -> Optional[jax.Device]:
        return getattr(self._reader, "device", None)

    def route(self, key: tuple):
        """The route of table ``key``'s halo rows: its layer's for an activation or gradient
        table (a kept aggregation is read by its own partition only)."""
        name, layer = key
        if name in (ACTIVATION, GRADIENT):
            return self.routes.get(layer, ThroughHost())
        return ThroughHost()

    def charge(self, device: int, nbytes: int) -> None:
        with self._lock:
            self.held[device] += nbytes
            self.peak[device] = max(self.peak[device], self.held[device])

    def count(self, route: str, nbytes: int) -> None:
        with self._lock:
            self.moved[route] += int(nbytes)


def _on(array, device: jax.Device) -> jax.Array:
    if isinstance(array, jax.Array) and array.devices() == {device}:
        return array
    return jax.device_put(array, device)


class PlacedDeviceTier:
    """A table's device blocks, each on its partition's device: one ``[rows, width]``
    float32 array per device that holds some (see the module docstring). ``run`` (the
    `DeviceTiers`) is set by `DeviceTiers.tier_class`."""

    on_device = True
    run: DeviceTiers

    def __init__(self, blocks: TierBlocks, shared: Shared):
        run = self.run
        self.blocks, self.width = blocks, blocks.width
        members = blocks.blocks
        self._device_of_row = np.empty(blocks.rows, np.int64)  # by the tier's row
        self._local_row = np.empty(blocks.rows, np.int64)  # the row in its device's array
        counts = np.zeros(len(run.devices), np.int64)
        self._block_start = {}  # member block -> its first row in its device's array
        for b in members:
            start, rows = blocks.span(int(b))
            d = int(run.device_of_block[b])
            self._device_of_row[start:start + rows] = d
            self._local_row[start:start + rows] = np.arange(counts[d], counts[d] + rows)
            self._block_start[int(b)] = int(counts[d])
            counts[d] += rows
        away = [run.devices[d] for d, n in enumerate(counts)
                if n and run.devices[d].process_index != jax.process_index()]
        if away:  # over several processes the tier is made for this process's blocks only
            raise RuntimeError(f"{blocks.name} {blocks.layer}: a device tier of this process "
                               f"was given blocks of {away[0]}, another process's device "
                               "(make it through ProcessTiers.wrapping)")
        self.arrays: dict[int, jax.Array] = {
            d: jnp.zeros((int(n), self.width), jnp.float32, device=run.devices[d])
            for d, n in enumerate(counts) if n}
        self._charge = shared.charge
        self._charge(device=blocks.nbytes)
        for d, n in enumerate(counts):
            run.charge(d, int(n) * self.width * 4)
        self._lock = threading.Lock()

    # -- where rows are ----------------------------------------------------------------------
    def _device_of(self, block: int) -> int:
        return int(self.run.device_of_block[block])

    def _local_range(self, block: int) -> np.ndarray:
        start = self._block_start[int(block)]
        return np.arange(start, start + int(self.blocks.block_rows[block]), dtype=np.int64)

    def _groups(self, src: np.ndarray):
        """``(device, positions in src)`` for every device holding some of rows ``src``."""
        src = np.asarray(src, np.int64)
        on = self._device_of_row[src]
        for d in np.unique(on):
            yield int(d), np.flatnonzero(on == d)

    def _index(self, rows: np.ndarray, length: int, fill: int, device: int) -> jax.Array:
        return jax.device_put(padded_rows(rows, length, fill), self.run.devices[device])

    def _move(self, values: jax.Array, rows: int, to: int) -> jax.Array:
        """``values`` (``rows`` of them real, the rest padding) on device ``to``, by the
        table's route."""
        nbytes = rows * self.width * 4
        # looked up now: a table made before the executor chose the routes takes them too
        if isinstance(self.run.route(self.blocks.key), DeviceToDevice):
            self.run.count(DEVICE_TO_DEVICE, nbytes)
            return jax.device_put(values, self.run.devices[to])
        self.run.count(THROUGH_HOST, nbytes)
        return jax.device_put(np.asarray(jax.device_get(values)), self.run.devices[to])

    def _take_local(self, d: int, local: np.ndarray, length: int) -> jax.Array:
        array = self.arrays[d]
        return _take(array, self._index(local, length, array.shape[0], d))

    # -- the `Tier` methods -------------------------------------------------------------------
    def write_block(self, block: int, values) -> None:
        d = self._device_of(block)
        values = _on(values, self.run.devices[d])
        with self._lock:
            array = self.arrays[d]
            idx = self._index(self._local_range(block), values.shape[0], array.shape[0], d)
            self.arrays[d] = _set(array, idx, values)

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        d, start = self._device_of(block), self._block_start[int(block)]
        rows = int(self.blocks.block_rows[block])
        return np.asarray(jax.device_get(self.arrays[d][start:start + rows]))

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        """Rows read into host memory (a table whose halo rows are on several tiers)."""
        reader = self.run.reader
        for d, pos in self._groups(rows.src):
            got = self._take_local(d, self._local_row[rows.src[pos]], bucket_len(pos.size))
            if reader is not None and self.run.devices[d] != reader:
                self.run.count(THROUGH_HOST, pos.size * self.width * 4)
            out[rows.dst[pos]] = np.asarray(jax.device_get(got))[: pos.size]

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        for d, pos in self._groups(rows.src):
            n = bucket_len(pos.size)
            part = np.zeros((n, self.width), np.float32)
            part[: pos.size] = values[rows.dst[pos]]
            with self._lock:
                array = self.arrays[d]
                self.arrays[d] = _add(array, self._index(self._local_row[rows.src[pos]], n,
                                                         array.shape[0], d),
                                      jax.device_put(part, self.run.devices[d]))

    def hold(self, blocks: tuple):
        return NOTHING_HELD

    def free(self) -> None:
        if self.arrays:
            self._charge(device=-self.blocks.nbytes)
            for d, array in self.arrays.items():
                self.run.charge(d, -int(array.size) * 4)
            self.arrays = {}

    def close(self) -> None:
        pass

    # -- rows that stay on the devices -----------------------------------------------------------
    def read_on_device(self, block: int, length: int) -> jax.Array:
        """``block`` padded with zero rows to ``length`` rows, on its device."""
        return self._take_local(self._device_of(block), self._local_range(block), length)

    def take_on_device(self, src: np.ndarray, length: int) -> jax.Array:
        """Rows ``src`` as a ``[length, width]`` array on the reading step's device (that of
        the first row where no loader named one), zero rows after them: each device's rows
        taken there, and moved to the reader by the table's route."""
        src = np.asarray(src, np.int64)
        reader = self.run.reader
        to = (self.run.devices.index(reader) if reader is not None else
              int(self._device_of_row[src[0]]) if src.size else 0)
        groups = list(self._groups(src))
        if len(groups) == 1 and groups[0][0] == to:
            return self._take_local(to, self._local_row[src], length)
        out = jnp.zeros((length, self.width), jnp.float32, device=self.run.devices[to])
        for d, pos in groups:
            n = bucket_len(pos.size)
            got = self._take_local(d, self._local_row[src[pos]], n)
            if d != to:
                got = self._move(got, pos.size, to)
            out = _set(out, self._index(pos, n, length, to), got)
        return out

    def add_on_device(self, src: np.ndarray, values: jax.Array) -> None:
        """``self[src] += values[:src.size]``: a step output's rows added at their owners'
        devices, moved there by the table's route."""
        self._add_from(np.asarray(src, np.int64), np.arange(len(src)), values)

    def add_taken_on_device(self, rows: TierRows, values: jax.Array) -> None:
        """``self[rows.src] += values[rows.dst]``."""
        self._add_from(np.asarray(rows.src, np.int64), np.asarray(rows.dst, np.int64),
                       values)

    def _add_from(self, src: np.ndarray, positions: np.ndarray, values: jax.Array) -> None:
        devices = self.run.devices
        here = devices.index(next(iter(values.devices())))
        for d, pos in self._groups(src):
            n = bucket_len(pos.size)
            at = positions[pos]
            if d == here:
                with self._lock:
                    array = self.arrays[d]
                    self.arrays[d] = _add_taken(
                        array, self._index(self._local_row[src[pos]], n, array.shape[0], d),
                        values, self._index(at, n, values.shape[0], d))
                continue
            taken = _take(values, self._index(at, n, values.shape[0], here))
            moved = self._move(taken, pos.size, d)
            with self._lock:
                array = self.arrays[d]
                self.arrays[d] = _add(array, self._index(self._local_row[src[pos]], n,
                                                         array.shape[0], d), moved)
