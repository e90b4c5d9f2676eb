"""Planning: the fates of stored tensors and the policies that choose them.

`fates` and `protocols` say what a fate and a policy are, `budgets` what a budget is;
`policies` holds the fixed policies (``jgrind.policies``). `inventory` lists an epoch's
blocks and `schedule` its steps; `cost` prices an epoch, `planner` finds the cheapest fates,
`auto` makes the planner a policy and `report` shows a plan. `execution` decides between the
in-memory fast path and the out-of-core engine. `hardware`, `measure` and `profile` are the
measured machine the cost model reads.
"""

from jgrind.plan.fates import ACTIVATION, GRADIENT, Fate, PolicyError, TensorInfo
from jgrind.plan import policies

__all__ = ["ACTIVATION", "GRADIENT", "Fate", "PolicyError", "TensorInfo", "policies"]
