"""The out-of-core engine: the store's tiers and the partition-wise executor."""

from jgrind.engine.engine import OutOfCore
from jgrind.engine.ssd import StoreCorruptedError, StoreFullError
from jgrind.engine.store import BudgetError, Store, StoreError

__all__ = ["BudgetError", "OutOfCore", "Store", "StoreCorruptedError", "StoreError",
           "StoreFullError"]
