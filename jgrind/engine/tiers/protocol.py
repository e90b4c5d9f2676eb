"""What a tier of the store is, and what it is given when it is made.

A `jgrind.engine.store.Table` keeps one ``[N, width]`` tensor in partition-major order, one block
per partition, and each block's fate names the tier that holds it. The table makes one tier
object per fate it uses and routes rows to it (`jgrind.engine.routes`); the tier holds its
blocks' rows, numbered ``0 .. rows-1`` in table order (`TierBlocks.start`), and moves them.
Everything a tier shares with the rest of the run (the accounts, the host cache, the buffer
pools, the run's folder) comes in `Shared`: a tier reaches nothing else. So adding a tier is one
class with the `Tier` methods and the constructor ``Tier(blocks, shared)``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
from typing import Callable, ContextManager, Optional, Protocol

import numpy as np

from jgrind.hostio.buffers import Recycler
from jgrind.hostio.codecs import FLOAT32, Codec
from jgrind.engine.cache import HostCache
from jgrind.engine.host_arrays import HostArrays
from jgrind.engine.routes import TierRows


@dataclasses.dataclass(frozen=True)
class Shared:
    """A run's resources, made once by the store and passed to every tier it makes.

    Attributes:
      charge: ``charge(device=0, host=0, ssd=0)`` changes the bytes the accounts hold per tier.
      count: ``count(host_read=..., ssd_written=..., ...)`` adds to the bytes moved
        (`jgrind.engine.store.Accounts`); called from the I/O threads, so it locks.
      host_arrays: host RAM for tables, handed from a freed table to the next (`HostArrays`),
        which charges the host account itself.
      buffers: the step inputs' buffers (`jgrind.hostio.buffers.Recycler`, or page-locked ones,
        `jgrind.hostio.transfers.PinnedStaging`): what reads fill.
      cache: the host cache in front of the SSD tier (capacity 0: off).
      run_dir: the run's private folder for files; None when the plan puts nothing on SSD.
      run_id: the run's 16-byte id, written into every file's header.
    """

    charge: Callable[..., None]
    count: Callable[..., None]
    host_arrays: HostArrays
    buffers: Recycler
    cache: HostCache
    run_dir: Optional[pathlib.Path]
    run_id: bytes


@dataclasses.dataclass(frozen=True)
class TierBlocks:
    """A table's blocks that one tier holds.

    Attributes:
      key: the table's ``(name, layer)``.
      width: floats per row.
      block_rows: ``[P]`` rows of every block of the table.
      members: ``[P]`` bool, the blocks this tier holds.
      start: ``[P]`` first row of each member block among the tier's rows (members in table
        order, so member block ``b`` is rows ``start[b] : start[b] + block_rows[b]``).
      reserve: the most host bytes of tables made while this one lives (`HostArrays.take`).
      codec: how the tier keeps the rows (`jgrind.hostio.codecs`): a tier holds
        ``codec.words(width)`` float32 words a row, the stored form; float32 keeps the values.
      generation: how many tables of this key the store made before this one: with the block
        and its write count, what seeds stochastic rounding (the same in every run that makes
        the same calls).
    """

    key: tuple
    width: int
    block_rows: np.ndarray
    members: np.ndarray
    start: np.ndarray
    reserve: Optional[int] = None
    codec: Codec = FLOAT32
    generation: int = 0

    @property
    def name(self) -> str:
        return self.key[0]

    @property
    def layer(self) -> int:
        return self.key[1]

    @property
    def blocks(self) -> np.ndarray:
        """The member blocks in table order (the tier's order)."""
        return np.flatnonzero(self.members)

    @property
    def offsets(self) -> np.ndarray:
        """``[members + 1]`` first row of every member block among the tier's rows, then the
        total."""
        return np.concatenate([[0], np.cumsum(self.block_rows[self.members])]).astype(np.int64)

    @property
    def rows(self) -> int:
        return int(self.block_rows[self.members].sum())

    @property
    def words(self) -> int:
        """float32 words of a stored row (``width`` for float32)."""
        return self.codec.words(self.width)

    @property
    def nbytes(self) -> int:
        """Bytes the tier holds: the stored form's."""
        return self.rows * self.words * 4

    def span(self, block: int) -> tuple[int, int]:
        """``(first row, rows)`` of member ``block`` among the tier's rows."""
        return int(self.start[block]), int(self.block_rows[block])


class BlockTier(Protocol):
    """Storage for whole blocks: what every tier does, the naive scheme's snapshots included."""

    def write_block(self, block: int, values) -> None:
        """Store ``block``'s rows: host rows, exactly the block's, in host memory, except for
        a tier `on_device`, which gets the padded step output as it is (its first rows)."""

    def read_block(self, block: int, into: Optional[np.ndarray] = None) -> np.ndarray:
        """``block``'s rows in host memory: a view of what the tier holds (not to be written
        to), a fresh array, or ``into`` (the caller's step input rows), filled in place."""

    def free(self) -> None:
        """Give back the storage and uncharge the accounts."""

    def close(self) -> None:
        """Close files (on error paths too); the storage is given back by `free`."""


class Tier(BlockTier, Protocol):
    """One tier's share of a table: whole blocks, and the rows of a partition's gathered input
    (its own block and halo) and of its scatter-added gradient.

    ``on_device``: whether the tier's rows are device memory. Such a tier also has the
    `DeviceTier` methods that keep rows on the device (``read_on_device``, ``take_on_device``,
    ``add_on_device``, ``add_taken_on_device``); the table uses them where a step's rows need
    not cross to the host.
    """

    on_device: bool

    def take_rows(self, rows: TierRows, out: np.ndarray) -> None:
        """``out[rows.dst] = self[rows.src]``: this tier's share of a gathered input."""

    def add_rows(self, rows: TierRows, values: np.ndarray) -> None:
        """``self[rows.src] += values[rows.dst]`` (``src`` unique): this tier's share of a
        scatter-add, from a step output in host memory."""

    def hold(self, blocks: tuple) -> ContextManager:
        """A context in which a gather reads ``blocks`` (its own block and halo owners in this
        tier): a cached tier keeps them from being evicted by each other."""


NOTHING_HELD = contextlib.nullcontext()  # `Tier.hold` of a tier with nothing to keep at hand


def padded_buffer(buffers: Recycler, used_rows: int, padded_rows: int,
                  width: int) -> np.ndarray:
    """A float32 ``[padded_rows, width]`` buffer whose first ``used_rows`` rows the caller fills:
    only the padding is zeroed (zero-filling it all would be one more pass over the rows).
    Aligned, so that XLA adopts it without a copy; from ``buffers``, so that the memory of a
    step input the step is done with serves a later one."""
    out = buffers.empty((padded_rows, width), np.float32)
    out[used_rows:] = 0.0
    return out
