"""Test accuracy with lossy storage (issue 41): float32 against bfloat16 and int8, same seeds.

    python experiments/lossy_accuracy.py                          # every run below, 10 seeds
    python experiments/lossy_accuracy.py gcn_cora gcn_citeseer    # some of them
    python experiments/lossy_accuracy.py gcn_cora seeds=3 dtypes=float32,int8
    python experiments/lossy_accuracy.py gcn_tolokers seeds=3-5    # seeds 3, 4, 5 added to
                                                                     # the saved seeds 0-2

Each run trains out of core (``host_offload``, 4 partitions) with every block kept in host RAM
in the storage dtype (activations, aggregations and gradients alike; computation float32), with
the hyper-parameters of its in-memory experiment: ``gcn_cora`` and ``gcn_citeseer``
(experiments/gcn_planetoid.py), ``gat_cora`` (experiments/gat_planetoid.py) and
``gcn_tolokers`` (experiments/gcn_tolokers.py, split s with seed s, ROC-AUC), and
``gat_tolokers``: the same residual design and training with GAT layers (8 heads of 16, so the
same 128 hidden; attention dropout as the dropout), which has no in-memory experiment of its own.
Seed s is the same for every dtype. The target: bfloat16 and int8 within 0.5 points of float32's
mean.
Results go to experiments/results/lossy_<run>_<dtype>.json. ``seeds=N`` runs seeds 0 to N-1 and
replaces the saved results; ``seeds=A-B`` runs seeds A to B and adds them to the saved ones
(same configuration, other seeds), so a long run can be done a few seeds at a time.
"""

import sys

import jax
import optax

import jgrind
import gat_planetoid
import gcn_planetoid
import gcn_tolokers
from common import adam_l2, first_layer_only, report, timed
from jgrind.datasets import row_normalize_features
from jgrind.hostio import codecs
from jgrind.plan import policies
from jgrind.train import run_trials, train

PARTS = 4


def _policy(dtype: str):
    codec = codecs.by_name(dtype)
    return policies.with_storage(policies.host_offload(), codec, codec, codec)


def _planetoid(model_name: str, dataset: str):
    """``(graph, model, optimizer, train keyword arguments)`` of a Planetoid experiment."""
    graph = row_normalize_features(jgrind.datasets.load(dataset))
    if model_name == "gcn":
        cfg = gcn_planetoid.Config(dataset=dataset)
        model = jgrind.models.gcn(graph.num_features, cfg.hidden, graph.num_classes,
                                  dropout=cfg.dropout)
        return graph, model, adam_l2(cfg.lr, cfg.weight_decay, first_layer_only), \
            {"epochs": cfg.epochs}
    cfg = gat_planetoid.Config(dataset=dataset)
    model = jgrind.models.gat(graph.num_features, cfg.hidden, graph.num_classes,
                              heads=cfg.heads, dropout=cfg.dropout)
    return graph, model, adam_l2(cfg.lr, cfg.weight_decay), \
        {"epochs": cfg.epochs, "patience": cfg.patience}


GAT_HEADS = 8  # gat_tolokers: heads of hidden / GAT_HEADS each


def _tolokers(model_name: str = "gcn"):
    cfg = gcn_tolokers.Config()
    graph = jgrind.datasets.load("tolokers")
    design = dict(num_layers=cfg.layers, dropout=cfg.dropout, residual=True, layer_norm=True,
                  activation=jax.nn.gelu)
    if model_name == "gcn":
        model = jgrind.models.gcn(graph.num_features, cfg.hidden, graph.num_classes, **design)
    else:
        model = jgrind.models.gat(graph.num_features, cfg.hidden // GAT_HEADS,
                                  graph.num_classes, heads=GAT_HEADS, **design)
    return graph, model, optax.adam(cfg.lr), {"epochs": cfg.steps,
                                              "eval_every": cfg.eval_every}


RUNS = {"gcn_cora": lambda: _planetoid("gcn", "cora"),
        "gcn_citeseer": lambda: _planetoid("gcn", "citeseer"),
        "gat_cora": lambda: _planetoid("gat", "cora"),
        "gcn_tolokers": _tolokers,
        "gat_tolokers": lambda: _tolokers("gat")}


def run(name: str, seeds: tuple, dtypes: tuple, extend: bool = False) -> dict:
    graph, model, optimizer, kwargs = RUNS[name]()
    means = {}
    for dtype in dtypes:
        split = (lambda s: {"split": s}) if name.endswith("_tolokers") else (lambda s: {})
        trials, seconds = timed(lambda: run_trials(
            lambda s: train(jax.random.key(s), graph, model, optimizer, progress=False,
                            policy=_policy(dtype), num_parts=PARTS, **split(s), **kwargs),
            seeds))
        out = report(f"lossy_{name}_{dtype}", trials,
                     {"run": name, "dtype": dtype, "parts": PARTS, **kwargs}, seconds, extend)
        means[dtype] = out["test_mean"]
    base = means[dtypes[0]]
    print(f"{name}: " + ", ".join(f"{d} {100 * m:.2f} ({100 * (m - base):+.2f} points)"
                                  for d, m in means.items()))
    return means


if __name__ == "__main__":
    names = [a for a in sys.argv[1:] if "=" not in a] or list(RUNS)
    options = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    first, _, last = options.get("seeds", "10").partition("-")
    seeds = tuple(range(int(first), int(last) + 1)) if last else tuple(range(int(first)))
    dtypes = tuple(options.get("dtypes", "float32,bfloat16,int8").split(","))
    for name in names:
        run(name, seeds, dtypes, extend=bool(last))
