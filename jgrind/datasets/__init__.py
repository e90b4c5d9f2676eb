"""Real graph datasets as `jgrind.graph.Graph` values.

``load(name)`` for the built-in names (see ``available()``), or the format loaders directly.
Files are read from ``$JGRIND_DATA`` or a ``shared/datasets`` folder beside the repository
(`data_root`); a missing or damaged file raises `DatasetError` saying what to do.
"""

from jgrind.datasets.edgelist import load_edge_list
from jgrind.datasets.errors import DatasetError
from jgrind.datasets.features import row_normalize_features
from jgrind.datasets.gnn_benchmark import load_gnn_benchmark
from jgrind.datasets.heterophilous import load_heterophilous
from jgrind.datasets.ogb import load_ogb_raw
from jgrind.datasets.paths import data_root
from jgrind.datasets.planetoid import load_planetoid
from jgrind.datasets.registry import DatasetInfo, available, load, register, split_per_seed
from jgrind.datasets.stored import load_saved, save_graph
from jgrind.datasets import generated  # noqa: E402,F401 - registers "csbm" and "rmat"

__all__ = [
    "DatasetError", "DatasetInfo", "available", "data_root", "load", "load_edge_list",
    "load_gnn_benchmark", "load_heterophilous", "load_ogb_raw", "load_planetoid", "load_saved",
    "register", "row_normalize_features", "save_graph", "split_per_seed",
]
