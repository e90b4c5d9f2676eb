"""Every device budget from the stated minimum up: does the engine take it?

    python tools/scan_budget_minimums.py            # 3 graphs x 2 part counts x 3 host budgets
    python tools/scan_budget_minimums.py --points 50 --ratio 2

For small generated graphs, the `grinnder` policy (as the command line builds it: the run's
budgets), no store, and host budgets of 0, 50 kB and 200 kB: build the out-of-core executor at a
device budget far too small, read the minimum its `BudgetError` states, then build it again at
``--points`` device budgets from that minimum to ``--ratio`` times it. The packing and the
engine's budget check run at each (nothing trains: the check is what refused budgets above a
stated minimum before issue 36). Prints each case's minimum and any budget refused above it;
exits 1 if one is. `tests/test_faults_budgets.py` trains at a few of these budgets.
"""

from __future__ import annotations

import argparse
import re
import sys

import numpy as np
import optax

from jgrind import generators, models
from jgrind.config import parse_bytes
from jgrind.engine import BudgetError
from jgrind.partition import contiguous
from jgrind.plan import policies
from jgrind.plan.budgets import UNLIMITED
from jgrind.train import make_executor

GRAPHS = {
    "csbm": lambda: generators.csbm(num_nodes=600, num_features=12, avg_degree=6, seed=3),
    "rmat": lambda: generators.rmat(num_nodes=512, num_edges=4096, num_features=12,
                                    num_classes=5, seed=3),
    "csbm, 12 classes": lambda: generators.csbm(num_nodes=480, num_classes=12,
                                                num_features=12, avg_degree=10, seed=5),
}


def stated_device_budget(error: BudgetError) -> int:
    found = re.search(r"(?:device budget (?:of |to )?|raise it to )at least ([\d.]+) "
                      r"([KMG]iB|bytes)", str(error))
    if found is None:
        raise SystemExit(f"no device budget stated in: {error}")
    return parse_bytes(" ".join(found.groups()))


def refusal(graph, model, parts: int, device: int, host: int):
    """The engine's BudgetError at these budgets, or None if it takes them."""
    try:
        make_executor(graph, model, optax.sgd(0.1), policy=policies.grinnder(UNLIMITED, UNLIMITED),
                      num_parts=parts, device_budget=device, host_budget=host,
                      partitioner=contiguous).close()
    except BudgetError as err:
        return err
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=250)
    parser.add_argument("--ratio", type=float, default=3.0)
    args = parser.parse_args()
    refused = tried = 0
    for name, make in GRAPHS.items():
        graph = make()
        model = models.gcn(graph.num_features, 32, graph.num_classes, num_layers=3)
        for parts in (8, 16):
            for host in (0, 50_000, 200_000):
                error = refusal(graph, model, parts, 1000, host)
                if error is None:
                    continue
                least = stated_device_budget(error)
                first_refused = None
                for device in np.unique(np.linspace(least, args.ratio * least,
                                                    args.points).astype(np.int64)):
                    tried += 1
                    error = refusal(graph, model, parts, int(device), host)
                    if error is not None:
                        first_refused = (int(device), str(error))
                        break
                refused += first_refused is not None
                print(f"{name}, {parts} parts, host {host:,} B: stated minimum {least:,} B; "
                      + ("every budget up to "
                         f"{args.ratio:g}x taken" if first_refused is None else
                         f"REFUSED at {first_refused[0]:,} B: {first_refused[1]}"), flush=True)
    print(f"{tried} budgets tried, {refused} case(s) with a budget refused above its minimum")
    sys.exit(1 if refused else 0)


if __name__ == "__main__":
    main()
