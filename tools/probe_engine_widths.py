"""The engine probe's own workload made wider: does a sweep take its kernels plus the engine's
own work for its steps, or the larger of the two?

    python tools/probe_engine_widths.py                       # GCN, widths 8, 64, 128, 256
    python tools/probe_engine_widths.py --model sage --widths 128,256

`jgrind.engine.machinery` measures the engine's own cost per partition step on partitions
with next to no data (`Sweep.machinery`, ``e``). Here the same kind of graph (CSBM, 64
partitions, 3 layers, host blocks) runs with ``--rows`` nodes per partition and features and
hidden layers ``--widths`` wide, so that the kernels (``c``) are as long as the engine's work
or longer. For every sweep it prints the measured time per step (the median over the timed
epochs) beside the cost model's kernels, reads, writes and engine work per step and its price
(`jgrind.plan.cost.Sweep`, under the saved hardware profile), and ``c + e``.
"""

from __future__ import annotations

import argparse
import statistics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=("gcn", "sage"), default="gcn")
    p.add_argument("--widths", default="8,64,128,256", help="comma-separated widths")
    p.add_argument("--rows", type=int, default=600, help="nodes per partition")
    p.add_argument("--parts", type=int, default=64)
    p.add_argument("--epochs", type=int, default=5, help="timed epochs, after one compiling")
    args = p.parse_args()

    import jax
    import optax

    from jgrind.engine.engine import OutOfCore
    from jgrind.generators import csbm
    from jgrind.models import model as models
    from jgrind.plan import policies
    from jgrind.plan import profile as hardware
    from jgrind.plan.check import engine_prediction
    from jgrind.plan.inventory import layer_widths
    from jgrind.plan.planner import dense_parameter_count

    profile = hardware.load_or_measure(log=print)
    build = getattr(models, args.model)
    print(f"{args.model}, {args.parts} partitions of {args.rows} nodes, host blocks; ms a step")
    print(f"{'width':>5} {'sweep':<11} {'measured':>8} {'c':>6} {'r':>6} {'w':>6} {'e':>6} "
          f"{'price':>6} {'c + e':>6}")
    for width in (int(v) for v in args.widths.split(",")):
        graph = csbm(args.parts * args.rows, num_classes=8, num_features=width,
                     avg_degree=10.0, seed=0)
        model = build(width, width, 8, num_layers=3, dropout=0.5)
        with OutOfCore(graph, model, optax.sgd(0.0), policy=policies.host_offload(),
                       num_parts=args.parts) as ex:
            pred = engine_prediction(ex, dense_parameter_count(layer_widths(model, width)),
                                     profile)
            params = model.init(jax.random.key(0))
            seconds: dict = {}
            for epoch in range(args.epochs + 1):
                ex.loss_and_grad(params, jax.random.key(epoch))
                if epoch:  # the first compiles
                    for label, s in ex.sweep_seconds:
                        seconds.setdefault(label, []).append(s)
            per = 1e3 / args.parts
            for s in pred.sweeps:
                measured = statistics.median(seconds[s.label])
                print(f"{width:>5} {s.label:<11} {measured * per:>8.2f} {s.compute * per:>6.2f} "
                      f"{s.reads * per:>6.2f} {s.writes * per:>6.2f} {s.machinery * per:>6.2f} "
                      f"{pred.sweep_seconds(s) * per:>6.2f} "
                      f"{(s.compute + s.machinery) * per:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
