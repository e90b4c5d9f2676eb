"""The out-of-core engine: the store's tiers and the partition-wise executor, `OutOfCore`,
a front over its two parts: building (`jgrind.engine.build`) and running
(`jgrind.engine.runner`, `sweeps`, `pipeline`)."""

from jgrind.engine.engine import OutOfCore
from jgrind.engine.ssd import StoreCorruptedError, StoreError, StoreFullError, StoreIOError
from jgrind.engine.store import BudgetError, Store

__all__ = ["BudgetError", "OutOfCore", "Store", "StoreCorruptedError", "StoreError",
           "StoreFullError", "StoreIOError"]
