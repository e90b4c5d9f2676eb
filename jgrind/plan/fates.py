"""The four fates of a stored tensor, and the description a policy decides from.

Modelled on ``jax.checkpoint_policies``: the outcome is a small closed set and a policy is a
plain callable from a tensor's description to one of them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional


class Fate(enum.Enum):
    """Where a tensor block lives between its production and its last use.

    DEVICE: kept on the accelerator. HOST: offloaded to host RAM. SSD: offloaded to the
    memory-mapped store on disk. RECOMPUTE: dropped after its last forward use and recomputed
    (from the previous layer) before backward needs it; for an aggregation, not kept at all:
    the backward regathers the layer's input and recomputes it.
    """

    DEVICE = "device"
    HOST = "host"
    SSD = "ssd"
    RECOMPUTE = "recompute"


# Tier codes: a fate as a small integer, for NumPy arrays of fates (the cost model's
# `jgrind.plan.cost.Assignment`, the store's block tiers), in `Fate` order.
D, H, S, R = 0, 1, 2, 3
FATES = (Fate.DEVICE, Fate.HOST, Fate.SSD, Fate.RECOMPUTE)  # a code's fate: FATES[code]
CODES = {fate: code for code, fate in enumerate(FATES)}     # a fate's code: CODES[fate]


ACTIVATION = "activation"  # H_l: input rows of layer l (H_0 = node features)
GRADIENT = "gradient"      # G_l: gradient of the loss w.r.t. H_l, accumulated across partitions
# Z_l: layer l's aggregated input (`jgrind.models.conv.aggregation_split`), owned rows. Kept
# (DEVICE, HOST, SSD) from layer l's forward to its backward, it replaces regathering H_l and
# the second sparse product there; RECOMPUTE (the GriNNder scheme) keeps nothing and regathers.
AGGREGATION = "aggregation"
KINDS = (ACTIVATION, GRADIENT, AGGREGATION)


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One block of a stored tensor: the rows of one partition of one layer's tensor.

    Attributes:
      name: ACTIVATION, GRADIENT or AGGREGATION.
      layer: l for ``H_l`` / ``G_l`` / ``Z_l`` (the input of layer l, its gradient, and its
        aggregation).
      partition: the partition whose owned rows this block holds.
      shape: ``(rows, width)``.
      dtype: numpy dtype name.
      nbytes: bytes of the block.
      recompute_flops: cost to recompute the block from the previous layer (0 when it cannot
        be recomputed: the input features).
      produced: index of the sweep step that writes it (forward order; see `lifetime`).
      last_forward_use: the last forward sweep step that reads it.
      first_backward_use: the first backward sweep step that reads it.
    """

    name: str
    layer: int
    partition: int
    shape: tuple
    dtype: str
    nbytes: int
    recompute_flops: float = 0.0
    produced: int = 0
    last_forward_use: int = 0
    first_backward_use: int = 0
    num_layers: int = 0
    num_partitions: int = 1

    @property
    def recomputable(self) -> bool:
        return (self.name == ACTIVATION and self.layer > 0) or self.name == AGGREGATION


class PolicyError(ValueError):
    """A policy returned a fate that cannot work (e.g. recompute the input features)."""


def check_fate(info: TensorInfo, fate: Fate) -> Fate:
    if not isinstance(fate, Fate):
        raise PolicyError(f"a policy returned {fate!r} for {describe(info)}; "
                          f"return one of {[f.name for f in Fate]}")
    if fate is Fate.RECOMPUTE and not info.recomputable:
        what = "input features" if info.name == ACTIVATION else "gradient buffers"
        raise PolicyError(f"{describe(info)} cannot be recomputed ({what} have no producer to "
                          "rerun); choose DEVICE, HOST or SSD for it")
    return fate


def describe(info: TensorInfo, partition: Optional[bool] = True) -> str:
    where = f", partition {info.partition}" if partition else ""
    return f"{info.name} of layer {info.layer}{where}"
