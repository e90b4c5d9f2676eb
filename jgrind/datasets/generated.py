"""Generated graphs under dataset names, so ``jgrind train --dataset csbm`` needs no files.

Both generators take ``num_nodes`` and ``avg_degree`` from the run configuration; everything else
keeps the generator's defaults (see `jgrind.generators`).
"""

from __future__ import annotations

from jgrind import generators
from jgrind.datasets.registry import register


def csbm(num_nodes: int = 20_000, avg_degree: float = 10.0, seed: int = 0, **kwargs):
    return generators.csbm(num_nodes=num_nodes, avg_degree=avg_degree, seed=seed, **kwargs)


def rmat(num_nodes: int = 100_000, avg_degree: float = 10.0, seed: int = 0, **kwargs):
    # undirected R-MAT stores both directions, so the directed edge count must be even;
    # num_edges given outright (dataset_options=num_edges:...) wins over avg_degree
    kwargs.setdefault("num_edges", 2 * round(num_nodes * avg_degree / 2))
    return generators.rmat(num_nodes=num_nodes, seed=seed, **kwargs)


GENERATED = {
    "csbm": (csbm, "contextual stochastic block model (4 classes, 32 features, homophily 0.8, "
                   "60/20/20 split); size from num_nodes and avg_degree"),
    "rmat": (rmat, "R-MAT power-law graph (47 classes, 100 features, like ogbn-products); "
                   "size from num_nodes and avg_degree"),
}
for _name, (_fn, _description) in GENERATED.items():
    register(_name, _fn, _description)
