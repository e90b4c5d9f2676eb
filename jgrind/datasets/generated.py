"""Generated graphs under dataset names, so ``jgrind train --dataset csbm`` needs no files.

Both generators take ``num_nodes`` and ``avg_degree`` from the run configuration; everything else
keeps the generator's defaults (see `jgrind.generators`).
"""

from __future__ import annotations

import inspect

from jgrind import generators
from jgrind.arguments import like_default
from jgrind.datasets.registry import _check_options, register


def csbm(num_nodes: int = 20_000, avg_degree: float = 10.0, seed: int = 0, **kwargs):
    _check_generator_options("csbm", generators.csbm, kwargs)
    return generators.csbm(num_nodes=num_nodes, avg_degree=avg_degree, seed=seed, **kwargs)


def rmat(num_nodes: int = 100_000, avg_degree: float = 10.0, seed: int = 0, **kwargs):
    _check_generator_options("rmat", generators.rmat, kwargs)
    # undirected R-MAT stores both directions, so the directed edge count must be even;
    # num_edges given outright (dataset_options=num_edges:...) wins over avg_degree
    kwargs.setdefault("num_edges", 2 * round(num_nodes * avg_degree / 2))
    return generators.rmat(num_nodes=num_nodes, seed=seed, **kwargs)


def _check_generator_options(name: str, generator, options: dict) -> None:
    """The generator's own options only, each of its default's kind: a clear error for a
    misspelt name or a word where a number goes (``dataset_options=homophily:high``), not a
    TypeError from inside the generator."""
    _check_options(generator, options, f"generated dataset {name!r}", given=0,
                   fixed=("num_nodes", "avg_degree", "seed"))
    params = inspect.signature(generator).parameters
    for key, value in options.items():
        like_default(value, params[key].default, key)


GENERATED = {
    "csbm": (csbm, "contextual stochastic block model (4 classes, 32 features, homophily 0.8, "
                   "60/20/20 split); size from num_nodes and avg_degree"),
    "rmat": (rmat, "R-MAT power-law graph (47 classes, 100 features, like ogbn-products); "
                   "size from num_nodes and avg_degree"),
}
for _name, (_fn, _description) in GENERATED.items():
    register(_name, _fn, _description)
