"""Feature preprocessing that papers apply outside the loader.

Loaders return features exactly as stored; experiments opt in to these, so a reported result
says which preprocessing it used.
"""

from __future__ import annotations

import numpy as np

from jgrind.graph import Graph


def row_normalize_features(graph: Graph) -> Graph:
    """Divide every row of the ``[N, F]`` features by its sum, as Kipf & Welling's GCN code does
    for Planetoid (``D^-1 X``). Rows summing to 0 (e.g. CiteSeer's padded test nodes) stay 0."""
    x = graph.features
    rowsum = x.sum(axis=1, dtype=np.float32, keepdims=True)
    out = np.divide(x, rowsum, out=np.zeros_like(x), where=rowsum != 0)
    return graph.replace(features=out)
