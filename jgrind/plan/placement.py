"""Placement: which device runs which partitions, balanced by predicted time and memory.

Every partition gets a weight, the predicted seconds of its forward steps through all layers
(`jgrind.plan.cost.layer_seconds` on its rows, halo rows and edges, with a profile's rates),
and a size, the bytes of its rows and halo at the model's widest layer. `place` assigns the
partitions longest first, each to the device with the least predicted time so far; among
devices within `TIME_SLACK` of that least time, to the one holding the fewest bytes. Partition
counts need not divide the device count, and a device may get no partition.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from jgrind.plan.cost import ITEMSIZE, layer_seconds
from jgrind.plan.inventory import layer_widths

__all__ = ["NOMINAL_RATES", "Placement", "Rates", "partition_costs", "place",
           "place_partitions"]

# Devices whose predicted time is within this share of the mean load of the least loaded one
# count as tied on time, and the one with fewer bytes takes the partition.
TIME_SLACK = 0.05


@dataclasses.dataclass(frozen=True)
class Rates:
    """The rates `partition_costs` prices steps with: the fields of a
    `jgrind.plan.profile.Profile` that `jgrind.plan.cost.layer_seconds` reads."""

    matmul_flops: float
    spmm_rate: float
    contraction_bw: float
    gather_bw: float
    copy_bw: float

    @classmethod
    def of(cls, profile) -> "Rates":
        return cls(**{f.name: float(getattr(profile, f.name))
                      for f in dataclasses.fields(cls)})


# Used when no profile is given. Only their ratios matter to a balance; these are of the order
# `jgrind profile` measures on a 2-core CPU.
NOMINAL_RATES = Rates(matmul_flops=2.5e10, spmm_rate=3.2e8, contraction_bw=7.4e8,
                      gather_bw=1.2e9, copy_bw=3.3e9)


@dataclasses.dataclass(frozen=True, eq=False)
class Placement:
    """Partitions assigned to devices.

    Attributes:
      num_devices: K.
      device_of: ``[P]`` int32 device of every partition.
      seconds: ``[P]`` predicted forward seconds of every partition (its weight).
      nbytes: ``[P]`` bytes of every partition's rows and halo at the widest layer.
    """

    num_devices: int
    device_of: np.ndarray
    seconds: np.ndarray
    nbytes: np.ndarray

    def partitions_of(self, device: int) -> list[int]:
        return [int(p) for p in np.flatnonzero(self.device_of == device)]

    @property
    def device_seconds(self) -> np.ndarray:
        """``[K]`` predicted seconds per device (the sum of its partitions' weights)."""
        return np.bincount(self.device_of, self.seconds, minlength=self.num_devices)

    @property
    def device_bytes(self) -> np.ndarray:
        """``[K]`` bytes per device (the sum of its partitions' sizes)."""
        return np.bincount(self.device_of, self.nbytes, minlength=self.num_devices)

    def format(self) -> str:
        """One line per device: its partitions, predicted seconds and bytes."""
        lines = []
        for d, (s, b) in enumerate(zip(self.device_seconds, self.device_bytes)):
            parts = ", ".join(map(str, self.partitions_of(d))) or "none"
            lines.append(f"device {d}: partitions {parts}; predicted {s * 1e3:.2f} ms "
                         f"forward, {b / 2**20:.2f} MiB of rows and halo")
        return "\n".join(lines)


def partition_costs(pg, model, num_features: int, rates: Optional[Rates] = None
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(seconds [P], nbytes [P])``: every partition's predicted forward seconds through all
    layers of ``model`` and the bytes of its rows and halo at the widest layer."""
    rates = NOMINAL_RATES if rates is None else rates
    rows = np.array([p.num_owned for p in pg.partitions], np.float64)
    halo = np.array([p.num_halo for p in pg.partitions], np.float64)
    edges = np.array([p.num_edges for p in pg.partitions], np.float64)
    widths = layer_widths(model, num_features)
    seconds = np.zeros(len(rows))
    for l, layer in enumerate(model.layers):
        reads = layer.aggregates
        seconds += layer_seconds(layer, widths[l], widths[l + 1], rows,
                                 rows + halo if reads else rows, edges if reads else 0.0,
                                 rates)
    seconds = np.where(rows > 0, seconds, 0.0)
    nbytes = ((rows + halo) * max(widths) * ITEMSIZE).astype(np.int64)
    return seconds, nbytes


def place_partitions(seconds, nbytes, num_devices: int) -> np.ndarray:
    """``[P]`` device of every partition: longest first, to the device with the least time so
    far; among devices within `TIME_SLACK` of it, the one with the fewest bytes."""
    seconds = np.asarray(seconds, np.float64)
    nbytes = np.asarray(nbytes, np.float64)
    k = int(num_devices)
    if k < 1:
        raise ValueError(f"num_devices must be 1 or more, got {num_devices}")
    load = np.zeros(k)
    held = np.zeros(k)
    device_of = np.zeros(seconds.size, np.int32)
    slack = TIME_SLACK * seconds.sum() / k
    for p in sorted(range(seconds.size), key=lambda p: (-seconds[p], -nbytes[p], p)):
        tied = np.flatnonzero(load <= load.min() + slack)
        d = int(tied[np.argmin(held[tied])])
        device_of[p] = d
        load[d] += seconds[p]
        held[d] += nbytes[p]
    return device_of


def place(pg, model, num_features: int, num_devices: int,
          rates: Optional[Rates] = None) -> Placement:
    """The `Placement` of ``pg``'s partitions on ``num_devices`` devices for ``model``."""
    seconds, nbytes = partition_costs(pg, model, num_features, rates)
    return Placement(num_devices=int(num_devices),
                     device_of=place_partitions(seconds, nbytes, num_devices),
                     seconds=seconds, nbytes=nbytes)
