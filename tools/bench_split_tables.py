"""What tables split between tiers cost the engine per partition step (docs/planner.md, the
engine's own work; `jgrind.engine.machinery`'s ``device_mix``).

    python tools/bench_split_tables.py --epochs 7

On the engine probe's workload (`jgrind.engine.machinery`: a 3-layer GCN over 64 partitions of
32 nodes, 8 wide, so that kernels and bytes are next to nothing), one engine per layout, every
activation and gradient table split the same way by partition (no aggregation kept): all in
host RAM, all on the device, device and host alternating, host and SSD alternating, all on
SSD, device, host and SSD in turn, and partition 0's blocks on the device with the rest in host
RAM. Their epochs are taken in turns (one that compiles, then ``--epochs`` timed), and each
sweep's median seconds per step is printed, with the mean over the sweeps.
"""

from __future__ import annotations

import argparse
import tempfile

import numpy as np

import harness

LAYOUTS = {  # name: the tiers partitions take in turn (by partition index)
    "host": ("host",),
    "device": ("device",),
    "device+host": ("device", "host"),
    "host+ssd": ("host", "ssd"),
    "ssd": ("ssd",),
    "device+host+ssd": ("device", "host", "ssd"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    harness.add_epochs(p, default=7, help="timed epochs of each engine, after the compiling one")
    args = p.parse_args()

    import optax

    from jgrind.engine.engine import OutOfCore
    from jgrind.engine.machinery import LAYERS, PARTS, ROWS, WIDTH, _Timed
    from jgrind.generators import csbm
    from jgrind.models.model import gcn
    from jgrind.plan.fates import AGGREGATION, Fate

    def split(tiers: tuple):
        fates = [Fate(t) for t in tiers]

        def policy(info):
            if info.name == AGGREGATION:
                return Fate.RECOMPUTE
            return fates[info.partition % len(fates)]
        return policy

    def one_on_device(info):
        if info.name == AGGREGATION:
            return Fate.RECOMPUTE
        return Fate.DEVICE if info.partition == 0 else Fate.HOST

    policies = {name: split(tiers) for name, tiers in LAYOUTS.items()}
    policies["1 device, 63 host"] = one_on_device
    graph = csbm(PARTS * ROWS, num_classes=WIDTH, num_features=WIDTH, avg_degree=10.0, seed=0)
    model = gcn(WIDTH, WIDTH, WIDTH, num_layers=LAYERS, dropout=0.5)
    print(f"# {harness.command()}\n# {harness.machine()}")
    with tempfile.TemporaryDirectory() as store:
        engines = {name: OutOfCore(graph, model, optax.sgd(0.0), policy=policy,
                                   num_parts=PARTS, store=store)
                   for name, policy in policies.items()}
        try:
            runs = {name: _Timed(engine, model) for name, engine in engines.items()}
            for epoch in range(args.epochs + 1):
                for run in runs.values():
                    run.epoch(timed=epoch > 0)
            measured = {name: run.per_step() for name, run in runs.items()}
        finally:
            for engine in engines.values():
                engine.close()
    labels = list(measured["host"])
    print("ms per step".ljust(20) + "".join(label.rjust(12) for label in labels) + "    mean")
    for name, steps in measured.items():
        values = [steps[label][0] * 1e3 for label in labels]
        print(name.ljust(20) + "".join(f"{v:12.2f}" for v in values)
              + f"{np.mean(values):8.2f}")


if __name__ == "__main__":
    main()
