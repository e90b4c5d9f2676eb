"""What the experiment scripts share: seeds, the results file, a one-line report."""

from __future__ import annotations

import json
import pathlib
import platform
import time

import jax
import numpy as np
import optax

from jgrind.train import Trials

RESULTS = pathlib.Path(__file__).parent / "results"


def adam_l2(lr: float, weight_decay: float, decay_mask=None) -> optax.GradientTransformation:
    """Adam with L2 added to the gradient (PyTorch ``Adam(weight_decay=)``), as the GCN and GAT
    reference code regularise. ``decay_mask``: a pytree of bools, or a function of the params."""
    return optax.chain(optax.add_decayed_weights(weight_decay, mask=decay_mask),
                       optax.adam(lr))


def first_layer_only(params):
    """Kipf & Welling apply weight decay to the first layer only."""
    return tuple(jax.tree.map(lambda _: i == 0, p) for i, p in enumerate(params))


def report(name: str, trials: Trials, config: dict, seconds: float,
           extend: bool = False) -> dict:
    """Write ``results/NAME.json`` and print one line. ``extend``: add these seeds to the
    seeds already in that file (same configuration, none of its seeds again), so a long
    experiment can be run a few seeds at a time."""
    out = {
        "experiment": name, "metric": trials.metric, "seeds": list(trials.seeds),
        "test": [r.test for r in trials.results], "val": [r.val for r in trials.results],
        "best_epoch": [r.best_epoch for r in trials.results],
        "test_mean": trials.mean, "test_std": trials.std, "val_mean": trials.val_mean,
        "val_std": trials.val_std, "config": config,
        "seconds": seconds, "machine": f"{platform.machine()}, {jax.devices()[0].platform}",
        "date": time.strftime("%Y-%m-%d"),
    }
    if extend and (RESULTS / f"{name}.json").exists():
        out = _extended(json.loads((RESULTS / f"{name}.json").read_text()), out)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2, default=float))
    seeds = len(out["seeds"])
    print(f"{name}: test {out['metric']}: {100 * out['test_mean']:.2f} +- "
          f"{100 * out['test_std']:.2f} % over {seeds} seed{'' if seeds == 1 else 's'}  "
          f"(per seed: {' '.join(f'{100 * t:.1f}' for t in out['test'])}; "
          f"{out['seconds']:.0f} s)")
    return out


def _extended(old: dict, new: dict) -> dict:
    """``old`` results with ``new``'s seeds added; ValueError if they are of another
    configuration or share a seed."""
    config = json.loads(json.dumps(new["config"], default=float))  # as it was saved
    if old["config"] != config or old["metric"] != new["metric"]:
        raise ValueError(f"{old['experiment']}: the saved results are of another configuration "
                         f"({old['config']}); run without extending, or with the same settings")
    again = sorted(set(old["seeds"]) & set(new["seeds"]))
    if again:
        raise ValueError(f"{old['experiment']}: seeds {again} are already in the saved results; "
                         "extend with other seeds")
    out = {**new, **{k: old[k] + new[k] for k in ("seeds", "test", "val", "best_epoch")}}
    for kind in ("test", "val"):
        values = np.asarray(out[kind], dtype=float)
        out[f"{kind}_mean"] = float(values.mean())
        out[f"{kind}_std"] = float(values.std(ddof=1)) if values.size > 1 else 0.0
    out["seconds"] = old["seconds"] + new["seconds"]
    out["date"] = f"{old['date']} to {new['date']}" if old["date"] != new["date"] else new["date"]
    return out


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0
