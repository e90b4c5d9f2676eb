"""What the experiment scripts share: seeds, the results file, a one-line report."""

from __future__ import annotations

import json
import pathlib
import platform
import time

import jax
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


def report(name: str, trials: Trials, config: dict, seconds: float) -> dict:
    out = {
        "experiment": name, "metric": trials.metric, "seeds": list(trials.seeds),
        "test": [r.test for r in trials.results], "val": [r.val for r in trials.results],
        "best_epoch": [r.best_epoch for r in trials.results],
        "test_mean": trials.mean, "test_std": trials.std, "val_mean": trials.val_mean,
        "val_std": trials.val_std, "config": config,
        "seconds": seconds, "machine": f"{platform.machine()}, {jax.devices()[0].platform}",
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2, default=float))
    print(f"{name}: {trials.summary()}  (per seed: "
          f"{' '.join(f'{100 * t:.1f}' for t in trials.tests)}; {seconds:.0f} s)")
    return out


def timed(fn):
    t0 = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - t0
