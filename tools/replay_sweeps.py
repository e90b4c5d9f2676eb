"""Replay sweep prices on recorded runs: each fixed policy's epoch under forms of a sweep's
price, from the model's own compute, reads and writes per sweep that
``tools/bench_planner.py accuracy --json FILE`` records for every timed epoch.

    python tools/replay_sweeps.py experiments/results/planner/accuracy-2026-11-29-run-a{j,k,l}.json
    python tools/replay_sweeps.py FILE... --engine-step 1.6,2.35,2.46,1.65,0.37

Forms (`jgrind.plan.cost.Sweep.seconds`):

* ``threads``: the form the planner used on the host until e09f96d: ``c + io - overlap
  min(c, io)``, with ``io = r + w - io_parallel min(r, w)`` capped by the cores at
  ``max(r, w, (r + w) / cores + c)`` (which counted the steps twice);
* ``cores``: the host form from e09f96d, ``max(c, r, w, (r + w) / cores + c)``;
* ``alone``: the current host form (`jgrind.plan.cost.HostCores`), the kernels on every
  core and the rest around them: ``c + max(e, r + r_own, w + w_own, (e + r + w) / cores)``,
  with the I/O threads' own seconds where the recording has them (0 before profile
  version 27);
* ``engine``: the host form from 399c209 until ``alone``, with the engine's own work for the
  steps ``e``: ``max(c + e, r, w, (r + w) / cores + c)``: the steps'
  kernels after the engine's work, not beside it. A run recorded with it keeps its ``e`` per
  sweep; for an older recording, ``--engine-step`` gives the figures in ms (forward, top,
  backward, first layer's backward, per SSD call: the profile's ``machinery_*``), ``e`` is
  worked out per sweep (every table counted as an SSD call where the sweep's measured I/O
  touched the SSD tier) and the recorded compute loses the ``sweep_step`` per step that ``e``
  replaces;
* ``beside``: the host form until run AJ, the kernels beside the engine's work:
  ``max(c, r, w, e, (r + w) / cores + c)``;
* ``contended``: ``max(e, c + max(r, w))``, the steps and the I/O threads slowing each other
  down fully while both run (on two cores, each op split over both waits for its shard on the
  core an I/O thread shares). Not the planner's form: replayed on runs AE-AH it put fewer runs
  within 25 % than ``beside`` (docs/results-history.md, "One form for every sweep?").
* ``main_adds_all``: ``max(c + e, r, w, (r + w) / cores + c + e)``, ``e`` in the cores'
  share too; ``half``: ``max(c + e / cores, r, w, e, (r + w + e) / cores + c)``. Not the
  planner's forms (docs/results-history.md, "Run AJ, and auto's plans sweep by sweep").

Each run's epoch is its recorded prediction less its recorded sweeps plus the replayed ones,
held against its fastest timed epoch (the sweeps replayed are that epoch's). Recordings since
run AJ keep ``auto``'s sweeps too: each round's first plan (the epochs held against the plan's
own prediction) and, where it re-planned, its last plan, replayed as rows of their own. Prints
one line per run and, per form, how many runs fall within 25 % and the mean absolute error.
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
    c, r, w = parts["compute"], parts["reads"], parts["writes"]
    return max(c, r, w, (r + w) / cores + c)


def _engine(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    c, r, w, e = parts["compute"], parts["reads"], parts["writes"], parts.get("machinery", 0.0)
    return max(c + e, r, w, (r + w) / cores + c)


def _alone(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    sweep = Sweep("", 0, "", parts["compute"], parts["reads"], parts["writes"], (),
                  machinery=parts.get("machinery", 0.0),
                  reader_own=parts.get("reader_own", 0.0),
                  writer_own=parts.get("writer_own", 0.0))
    return sweep.seconds(overlap, parallel, HostCores(cores, compute_on_host=True))


def _contended(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    c, r, w = parts["compute"], parts["reads"], parts["writes"]
    return max(parts.get("machinery", 0.0), c + max(r, w))


def _beside(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    c, r, w, e = parts["compute"], parts["reads"], parts["writes"], parts.get("machinery", 0.0)
    return max(c, r, w, e, (r + w) / cores + c)


def _main_adds_all(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    c, r, w, e = parts["compute"], parts["reads"], parts["writes"], parts.get("machinery", 0.0)
    return max(c + e, r, w, (r + w) / cores + c + e)


def _half(parts: dict, overlap: float, parallel: float, cores: int) -> float:
    c, r, w, e = parts["compute"], parts["reads"], parts["writes"], parts.get("machinery", 0.0)
    return max(c + e / cores, r, w, e, (r + w + e) / cores + c)


FORMS = {"threads": _threads, "cores": _cores, "beside": _beside, "engine": _engine,
         "contended": _contended, "main_adds_all": _main_adds_all, "half": _half,
         "alone": _alone}
KINDS = ("forward", "top", "backward", "params")
TABLES = {"forward": 2, "top": 2, "backward": 3, "params": 2}  # a 3-layer GCN's step's calls


def _with_engine_step(row: list, steps: int, layers: int, sweep_step: float,
                      figures: dict) -> dict:
    """A recorded sweep's predicted parts with the engine's own work ``e``, worked out from
    ``figures`` where the recording has none."""
    parts = dict(row[3]["predicted"])
    if "machinery" in parts or not figures:
        return parts
    kind, layer = row[0].split()
    kind = "forward" if kind != "backward" else \
        "top" if int(layer) == layers - 1 else "backward" if int(layer) >= 1 else "params"
    on_ssd = any("ssd" in row[3]["measured"][side] for side in ("reads", "writes"))
    calls = TABLES[kind] if on_ssd else 0
    parts["machinery"] = steps * (figures[kind] + calls * figures["ssd_call"])
    parts["compute"] = max(0.0, parts["compute"] - steps * sweep_step)
    return parts


def _recorded(runs: dict):
    """``(policy, run, measured, sweeps, predicted)`` of every recorded run's fastest epoch:
    a fixed policy's, and each round of ``auto``'s (its first plan's, and its last plan's
    where it re-planned) where the recording has them (`bench_planner.train_auto`)."""
    for policy, run in runs.items():
        if policy == "auto":
            for i, rnd in enumerate(run.get("rounds", [])):
                plans = [("first plan", rnd.get("sweeps_first"), rnd["predicted_first"])]
                if rnd.get("replanned"):
                    plans.append(("re-planned", rnd.get("sweeps"), rnd["predicted"]))
                for which, epochs, predicted in plans:
                    if epochs:
                        fastest = min(epochs, key=lambda e: e["seconds"])
                        yield (f"auto {i + 1} {which}", rnd, fastest["seconds"],
                               fastest["sweeps"], predicted)
        elif run.get("sweeps"):
            measured = min(run["times"])
            yield (policy, run, measured, run["sweeps"][run["times"].index(measured)],
                   run["predicted"])


def replay(paths: list, figures: dict = None) -> dict:
    errors = {form: [] for form in FORMS}
    for path in paths:
        with open(path) as f:
            configs = json.load(f)
        for cfg in configs:
            profile = cfg["profile"]
            overlap, parallel = profile["overlap"], profile["io_parallel"]
            cores = int(profile.get("machine", {}).get("cores") or 1)
            for policy, run, measured, sweeps, predicted in _recorded(cfg["runs"]):
                rest = predicted - sum(row[1] for row in sweeps)
                line = f"{cfg['config']['name']:<13} {policy:<22} measured {measured:7.3f} s"
                steps = run.get("num_parts") or cfg["plan"]["num_parts"]
                engine = [_with_engine_step(row, steps, cfg["config"]["layers"],
                                            profile["sweep_step"], figures or {})
                          for row in sweeps]
                for form, price in FORMS.items():
                    epoch = rest + sum(price(parts if form not in ("threads", "cores")
                                             else row[3]["predicted"],
                                             overlap, parallel, cores)
                                       for row, parts in zip(sweeps, engine))
                    errors[form].append(epoch / measured - 1)
                    line += f"  {form} {epoch:7.3f} s ({100 * (epoch / measured - 1):+4.0f} %)"
                print(line)
    for form, e in errors.items():
        e = np.abs(np.array(e))
        print(f"{form:<9} {int(np.sum(e <= MARGIN))} of {e.size} within {100 * MARGIN:.0f} %, "
              f"mean error {100 * e.mean():.1f} %, largest {100 * e.max():.0f} %")
    return errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", nargs="+", help="bench_planner.py accuracy --json files")
    parser.add_argument("--engine-step", help="for recordings without the engine's own work "
                        "per step: forward,top,backward,params,ssd_call in ms")
    args = parser.parse_args()
    figures = None
    if args.engine_step:
        values = [float(v) / 1e3 for v in args.engine_step.split(",")]
        if len(values) != 5:
            parser.error("--engine-step takes five figures: forward,top,backward,params,"
                         "ssd_call (ms)")
        figures = dict(zip(KINDS + ("ssd_call",), values))
    replay(args.json, figures)


if __name__ == "__main__":
    main()
