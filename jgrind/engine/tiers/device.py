"""The device tier: a table's device blocks in one JAX array, with the gathers and
scatter-adds that keep rows on the device.

Index arrays are padded to bucketed lengths with an out-of-range index, which the ``drop`` and
``fill`` modes ignore, so a handful of shapes are compiled.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from jgrind.hostio.buffers import aligned_zeros
from jgrind.engine.routes import TierRows
from jgrind.engine.tiers.protocol import NOTHING_HELD, Shared, TierBlocks


def _explicit(fn):
    """``fn`` with its NumPy arguments (the store's row indices, host rows bound for device
    blocks) handed to the device by `jax.device_put` first: the transfers are meant, and a
    transfer guard (``jax_transfer_guard="disallow"``) then tells them from accidental ones."""
    @functools.wraps(fn)
    def call(*args):
        return fn(*(jax.device_put(a) if isinstance(a, np.ndarray) else a for a in args))
    return call


# made on the device: op by op, jnp.zeros would copy its Python zero there first
@functools.partial(jax.jit, static_argnums=0)
def _device_zeros(shape: tuple):
    return jnp.zeros(shape, jnp.float32)


# The table operations, jitted once: `jgrind.devices.placed_tier` runs them on several devices.
# Named functions, so that a list of compiled programs (`jgrind.engine.program_log`) names them.
def _table_take(table, rows):
    """``table[rows]``, zero rows where ``rows`` is out of range (its padding)."""
    return jnp.take(table, rows, axis=0, mode="fill", fill_value=0)


def _table_set(table, rows, values):
    """``table[rows] = values``, padding rows dropped."""
    return table.at[rows].set(values, mode="drop")


def _table_add(table, rows, values):
    """``table[rows] += values``, padding rows dropped."""
    return table.at[rows].add(values, mode="drop")


def _table_add_taken(table, rows, values, src):
    """``table[rows] += values[src]``: a scatter-add's rows that land on the device, taken from
    the step output where it is (`DeviceTier.add_taken_on_device`)."""
    return table.at[rows].add(jnp.take(values, src, axis=0, mode="fill", fill_value=0),
                              mode="drop")


table_take = jax.jit(_table_take)
table_set = jax.jit(_table_set, donate_argnums=0)
table_add = jax.jit(_table_add, donate_argnums=0)
table_add_taken = jax.jit(_table_add_taken, donate_argnums=0)
_device_take, _device_set = _explicit(table_take), _explicit(table_set)
_device_add, _device_add_taken = _explicit(table_add), _explicit(table_add_taken)
# ``gathered[rows] = values``, the device's rows set into a gathered input sent from the host:
# the same program as a table's set
_device_merge = _device_set


@dataclasses.dataclass(frozen=True)
class DeviceRows:
    """A gathered input whose rows are partly on the device (`Table.gather` with
    ``keep_device_rows``): ``host`` holds every other row, and ``values`` (a device array) the
    rows that go to positions ``rows`` (padded with an out-of-range position). `to_device`
    sends ``host`` and sets those rows there, so the device's rows never cross to the host and
    back."""

    host: np.ndarray
    rows: np.ndarray
    values: jax.Array

    def to_device(self) -> jax.Array:
        return _device_merge(jax.device_put(self.host), self.rows, self.values)


def padded_rows(rows: np.ndarray, length: int, fill: int) -> np.ndarray:
    """``rows`` as int32, padded to ``length`` with ``fill`` (an out-of-range index)."""
    out = np.full(length, fill, np.int32)
    out[: rows.size] = rows
    return out


def bucket_len(n: int) -> int:
    """Round index-array lengths up to a power of two so device gathers compile few shapes."""
    return 1 << max(int(n - 1).bit_length(), 3)


def _pad_to(values: np.ndarray, n: int) -> np.ndarray:
    out = aligned_zeros((n,) + values.shape[1:], values.dtype)
    out[: values.shape[0]] = values
    return out


class DeviceTier:
    """A table's device blocks: one ``[rows, width]`` float32 JAX array (on CPU, host memory
    that JAX owns), charged to the device account. Updates replace the array (donated), under
    a lock: the writer thread adds while the main thread writes."""

    on_device = True

    def __init__(self, blocks: TierBlocks, shared: Shared):
        self.blocks = blocks
        self.array: Optional[jax.Array] = _device_zeros((blocks.rows, blocks.width))
        self._charge = shared.charge
        self._charge(device=blocks.nbytes)
        self._lock = threading.Lock()

    def _range(self, block: int) -> np.ndarray:
        start, rows = self.blocks.span(block)
        return np.arange(start, start + rows, dtype=np.int32)

    # -- the `Tier` methods -------------------------------------------------------------------
    def write_block(self, block: int, values) -> None:
        idx = padded_rows(self._range(block), values.shape[0], self.array.shape[0])
        with self._lock:
            self.array = _device_set(self.array, idx, values)

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        # a take of a bucketed length, as `take_rows`'s: the programs of their lengths serve
        # both (a slice outside jit compiled a program for every table and block size)
        rows = self.blocks.span(block)[1]
        return jax.device_get(self.take_on_device(self._range(block), bucket_len(rows)))[:rows]

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        got = self.take_on_device(rows.src, bucket_len(rows.size))
        out[rows.dst] = jax.device_get(got)[: rows.size]

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        n = bucket_len(rows.size)
        with self._lock:
            to = padded_rows(rows.src, n, self.array.shape[0])
            self.array = _device_add(self.array, to, _pad_to(values[rows.dst], n))

    def hold(self, blocks: tuple):
        return NOTHING_HELD

    def free(self) -> None:
        if self.array is not None:
            self._charge(device=-int(self.array.size) * 4)
            self.array = None

    def close(self) -> None:
        pass

    # -- rows that stay on the device -----------------------------------------------------------
    def read_on_device(self, block: int, length: int) -> jax.Array:
        """``block`` padded with zero rows to ``length`` rows, as a device array."""
        return self.take_on_device(self._range(block), length)

    def take_on_device(self, src: np.ndarray, length: int) -> jax.Array:
        """Rows ``src`` as a ``[length, width]`` device array, zero rows after them."""
        return _device_take(self.array, padded_rows(src, length, self.array.shape[0]))

    def add_on_device(self, src: np.ndarray, values: jax.Array) -> None:
        """``self[src] += values[:src.size]``: a step output whose rows all land here."""
        idx = padded_rows(src, values.shape[0], self.array.shape[0])
        with self._lock:
            self.array = _device_add(self.array, idx, values)

    def add_taken_on_device(self, rows: TierRows, values: jax.Array) -> None:
        """``self[rows.src] += values[rows.dst]``, taken from the step output where it is. The
        indices are as long as the output, not a bucket of the rows' count: one program per
        table and output shape, rather than per table, output shape and bucket."""
        n = values.shape[0]
        with self._lock:
            to = padded_rows(rows.src, n, self.array.shape[0])
            self.array = _device_add_taken(self.array, to, values,
                                           padded_rows(rows.dst, n, values.shape[0]))
