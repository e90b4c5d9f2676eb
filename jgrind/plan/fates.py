"""The four fates of a stored tensor, and the description a policy decides from.

Modelled on ``jax.checkpoint_policies``: the outcome is a small closed set and a policy is a
plain callable from a tensor's description to one of them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional, Protocol, runtime_checkable

from jgrind.hostio.codecs import FLOAT32, Codec


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


@dataclasses.dataclass(frozen=True)
class Storage:
    """The storage dtype of each kind of stored tensor in the host and SSD tiers
    (`jgrind.hostio.codecs`): blocks are converted when written there and read back, while
    device blocks and computation stay float32. All float32 (exact) by default.

    A policy carries one as ``storage`` (`ChoosesStorage`; ``jgrind.policies.with_storage``).
    """

    activations: Codec = FLOAT32
    aggregations: Codec = FLOAT32
    gradients: Codec = FLOAT32

    def __post_init__(self):
        for kind in ("activations", "aggregations", "gradients"):
            if not isinstance(getattr(self, kind), Codec):
                raise PolicyError(f"storage of {kind} must be a codec of jgrind.hostio.codecs "
                                  f"(float32(), bfloat16(), float16(), int8()), got "
                                  f"{getattr(self, kind)!r}")

    def codec(self, name: str) -> Codec:
        """The codec of tensors of kind ``name`` (ACTIVATION, GRADIENT, AGGREGATION)."""
        return {ACTIVATION: self.activations, GRADIENT: self.gradients,
                AGGREGATION: self.aggregations}.get(name, FLOAT32)

    @property
    def lossy(self) -> bool:
        return any(c.lossy for c in (self.activations, self.aggregations, self.gradients))

    def describe(self) -> str:
        """``float32``, or e.g. ``activations bfloat16, aggregations float32, gradients int8``."""
        names = (self.activations.name, self.aggregations.name, self.gradients.name)
        if len(set(names)) == 1:
            return names[0]
        return ", ".join(f"{k} {n}" for k, n in zip(("activations", "aggregations",
                                                     "gradients"), names))


EXACT = Storage()


@runtime_checkable
class ChoosesStorage(Protocol):
    """A policy that keeps host and SSD blocks in a storage dtype (`Storage`)."""

    storage: Storage


def storage_of(policy) -> Storage:
    """The `Storage` a policy chooses (`ChoosesStorage`), else float32 everywhere."""
    if isinstance(policy, ChoosesStorage) and isinstance(policy.storage, Storage):
        return policy.storage
    return EXACT
