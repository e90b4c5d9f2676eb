"""Replay sweep prices on recorded runs: each fixed policy's epoch under two forms of a sweep's
price, from the model's own compute, reads and writes per sweep that
``tools/bench_planner.py accuracy --json FILE`` records for every timed epoch.

    python tools/replay_sweeps.py experiments/results/planner/accuracy-2026-11-28-run-ac.json

Forms (`jgrind.plan.cost.Sweep.seconds`):

* ``threads``: the form the planner used on the host until e09f96d: ``c + io - overlap
  min(c, io)``, with ``io = r + w - io_parallel min(r, w)`` capped by the cores at
  ``max(r, w, (r + w) / cores + c)`` (which counted the steps twice);
* ``cores``: the current host form, ``max(c, r, w, (r + w) / cores + c)``
  (`jgrind.plan.cost.HostCores`).

Each run's epoch is its recorded prediction less its recorded sweeps plus the replayed ones,
held against its fastest timed epoch (the sweeps replayed are that epoch's). Prints one line per
run and, per form, how many runs fall within 25 % and the mean absolute error.
"""

import argparse
import json

import numpy as np

from jgrind.plan.cost import HostCores, Sweep

MARGIN = 0.25


def _threads(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    c, r, w = parts["compute"], parts["reads"], parts["writes"]
    io = r + w - parallel * min(r, w)
    if cores >= 2:
        io = min(io, max(r, w, (r + w) / cores + c))
    return c + io - overlap * min(c, io)


def _cores(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    sweep = Sweep("", 0, "", parts["compute"], parts["reads"], parts["writes"], ())
    return sweep.seconds(overlap, parallel, HostCores(cores, compute_on_host=True))


FORMS = {"threads": _threads, "cores": _cores}


def replay(paths: list) -> dict:
    errors = {form: [] for form in FORMS}
    for path in paths:
        with open(path) as f:
            configs = json.load(f)
        for cfg in configs:
            profile = cfg["profile"]
            overlap, parallel = profile["overlap"], profile["io_parallel"]
            cores = int(profile.get("machine", {}).get("cores") or 1)
            for policy, run in cfg["runs"].items():
                if not run.get("sweeps"):
                    continue
                measured = min(run["times"])
                sweeps = run["sweeps"][run["times"].index(measured)]
                rest = run["predicted"] - sum(row[1] for row in sweeps)
                line = f"{cfg['config']['name']:<13} {policy:<13} measured {measured:7.3f} s"
                for form, price in FORMS.items():
                    epoch = rest + sum(price(row[3]["predicted"], overlap, parallel, cores)
                                       for row in sweeps)
                    errors[form].append(epoch / measured - 1)
                    line += f"  {form} {epoch:7.3f} s ({100 * (epoch / measured - 1):+4.0f} %)"
                print(line)
    for form, e in errors.items():
        e = np.abs(np.array(e))
        print(f"{form:<8} {int(np.sum(e <= MARGIN))} of {e.size} within {100 * MARGIN:.0f} %, "
              f"mean error {100 * e.mean():.1f} %, largest {100 * e.max():.0f} %")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="bench_planner.py accuracy --json files")
    replay(parser.parse_args().json)


if __name__ == "__main__":
    main()
