"""Each process's share of a plan's host memory, when its partitions run in several processes.

Over several processes (`jgrind.devices.ShardedOutOfCore` under `jax.distributed`) every
process builds the same plan over every partition, runs only the steps of the partitions on
its own devices, and its host tier holds its own partitions' host blocks (at the plan's
fates, two gradient layers at a time, as `jgrind.plan.cost.memory` accounts them) and, of the
other processes' blocks, the float32 rows its partitions read as halo, while a sweep needs
them, whatever the blocks' tiers (`jgrind.devices.across_processes`: a device table's arrive
in host memory too; `halo_bytes`). The host budget holds each process's share, not the
whole plan's host bytes: the planner constrains every process's share (`jgrind.plan.planner`),
the engine checks this process's and sizes its host cache by what the share leaves
(`jgrind.engine.build`), and ``jgrind plan --num-processes P`` prints them.
"""

from __future__ import annotations

import dataclasses
import hashlib
from typing import Optional

import numpy as np

from jgrind.plan.cost import ITEMSIZE, Assignment, Memory, Workload, memory

__all__ = ["ProcessSplit", "host_shares", "halo_bytes", "halo_floats", "halo_rows_read",
           "own_memory", "plan_fingerprint", "process_split"]


@dataclasses.dataclass(frozen=True, eq=False)
class ProcessSplit:
    """The partitions of a plan split among processes.

    Attributes:
      process_of_device: ``[K]`` the process driving each device.
      process_of: ``[P]`` the process of each partition (its device's).
      halo: ``[Q, P]`` distinct rows of block ``p`` that process ``q``'s partitions read as
        halo, 0 where ``p`` is ``q``'s own (`halo_rows_read`).
    """

    process_of_device: np.ndarray
    process_of: np.ndarray
    halo: np.ndarray

    @property
    def num_processes(self) -> int:
        return int(self.halo.shape[0])

    def own(self, q: int) -> np.ndarray:
        """``[P]`` bool: the partitions of process ``q``."""
        return self.process_of == q


def process_split(pg, device_of: np.ndarray, process_of_device) -> ProcessSplit:
    """The `ProcessSplit` of partitioned graph ``pg`` whose partitions are on devices
    ``device_of`` (``[P]``), each device driven by process ``process_of_device[d]``."""
    process_of_device = np.asarray(process_of_device, np.int64)
    process_of = process_of_device[np.asarray(device_of, np.int64)]
    q = int(process_of_device.max(initial=0)) + 1
    halo = np.stack([halo_rows_read(pg, process_of == p) for p in range(q)])
    return ProcessSplit(process_of_device, process_of, halo)


def halo_rows_read(pg, own: np.ndarray) -> np.ndarray:
    """``[P]`` the distinct rows of every block not in ``own`` (``[P]`` bool) that the
    partitions in ``own`` read as halo; 0 for the blocks in ``own``."""
    own = np.asarray(own, bool)
    sizes = np.array([p.num_owned for p in pg.partitions], np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    keys = [offsets[np.asarray(p.halo_owner, np.int64)] + np.asarray(p.halo_row, np.int64)
            for p in pg.partitions if own[p.index]]
    flat = np.unique(np.concatenate(keys)) if keys else np.zeros(0, np.int64)
    owner = np.searchsorted(offsets, flat, side="right") - 1
    return np.bincount(owner[~own[owner]], minlength=len(pg.partitions)).astype(np.int64)


def own_memory(w: Workload, a: Assignment, own: np.ndarray) -> Memory:
    """`jgrind.plan.cost.memory` of the blocks of partitions ``own`` (``[P]`` bool) alone."""
    mine = dataclasses.replace(w, owned=np.where(own, w.owned, 0), device_of=None)
    return memory(mine, a)


def halo_floats(w: Workload) -> int:
    """Floats per halo row that a process keeps at most of other processes' blocks at once:
    the features' (read from the graph once, kept all run), and above them one layer's input
    (brought before the sweep that gathers it, freed after) beside one layer's gradient (its
    rows add up during a backward sweep, and are freed once sent to their owner). A kept
    aggregation is never gathered across partitions: none of its rows are kept."""
    above = max((w.widths[l] for l in range(1, w.num_layers)), default=0)
    return int(w.widths[0] + 2 * above)


def halo_bytes(w: Workload, rows: np.ndarray) -> int:
    """Host bytes of the halo rows ``rows`` (``[P]``, `halo_rows_read`) that a process keeps
    of other processes' blocks, in float32 (`halo_floats` per row), whatever the tiers of
    their blocks: a device table's halo rows from other processes are kept in host memory
    too, where the collective brings them."""
    return ITEMSIZE * int(rows.sum()) * halo_floats(w)


def host_shares(w: Workload, a: Assignment, split: ProcessSplit) -> tuple:
    """``((blocks, halo), ...)`` the host bytes of every process of ``split`` at assignment
    ``a``: its own partitions' blocks (`own_memory`'s host bytes) and the halo rows it keeps
    of the others' (`halo_bytes`). The host budget holds each one's sum."""
    return tuple((int(own_memory(w, a, split.own(q)).host), halo_bytes(w, split.halo[q]))
                 for q in range(split.num_processes))


def plan_fingerprint(plan) -> str:
    """A digest of what every process must agree on to run a plan together: the partitions
    and their devices, every block's fate, the storage dtypes and the host cache mode
    (not the store folder, each process's own)."""
    h = hashlib.sha256()
    h.update(repr((plan.num_parts, plan.in_memory, plan.cache_bytes > 0,
                   plan.storage.describe())).encode())
    placement: Optional[object] = getattr(plan, "placement", None)
    if placement is not None:
        h.update(np.ascontiguousarray(placement.device_of, np.int64).tobytes())
    if plan.partitioned is not None:
        h.update(np.ascontiguousarray(plan.partitioned.assignment, np.int64).tobytes())
    for key, fate in sorted(plan.fates().items()):
        h.update(f"{key}:{fate.value};".encode())
    return h.hexdigest()
