"""Planning: the fates of stored tensors and the policies that choose them."""

from jgrind.plan.fates import ACTIVATION, GRADIENT, Fate, PolicyError, TensorInfo
from jgrind.plan import policies

__all__ = ["ACTIVATION", "GRADIENT", "Fate", "PolicyError", "TensorInfo", "policies"]
