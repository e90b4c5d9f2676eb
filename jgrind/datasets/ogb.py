"""OGB node-property datasets (ogbn-arxiv, ogbn-products, ...) from the raw folder that the OGB
download unpacks, read without the ``ogb`` package:

  raw/edge.csv.gz            ``src,dst`` a line, 0-based, no header (directed as stored)
  raw/node-feat.csv.gz       ``[N, F]`` comma-separated floats
  raw/node-label.csv.gz      one class id a line; ``nan`` = unlabelled
  raw/num-node-list.csv.gz   optional: the node count
  split/<scheme>/{train,valid,test}.csv.gz   node ids, one a line

Heterogeneous (ogbn-mag) and multi-label (ogbn-proteins) datasets do not fit a `Graph` and are
refused with a `DatasetError`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jgrind.datasets.edgelist import as_labels, read_text_table
from jgrind.datasets.errors import DatasetError, require_file
from jgrind.graph import from_edges
from jgrind.transforms import make_undirected

_SPLIT_FLAG = "on the command line: --set dataset_options=split:NAME"
_HINT = "re-extract the OGB download (it needs raw/ and split/ as OGB ships them)"


def _read(path: Path, dtype, ncols=None) -> np.ndarray:
    require_file(path, "OGB file", _HINT)
    return read_text_table(path, ncols=ncols, dtype=dtype, delimiter=",", hint=_HINT)


def _split_dir(directory: Path, split) -> Path:
    base = directory / "split"
    if split is not None:
        path = base / split
        if not path.is_dir():
            have = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
            raise DatasetError(f"{directory}: no split folder {path} (found: "
                               f"{', '.join(have) or 'none'}); pass one of those as split= "
                               f"({_SPLIT_FLAG})")
        return path
    schemes = sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if len(schemes) != 1:
        raise DatasetError(f"{directory}: expected one folder under {base}, found "
                           f"{len(schemes)} ({', '.join(p.name for p in schemes) or 'none'}); "
                           f"pass split= to choose ({_SPLIT_FLAG}), or {_HINT}")
    return schemes[0]


def load_ogb_raw(directory, *, split=None, to_undirected: bool = False, name=None):
    """Load an OGB node-property dataset from its unpacked folder (the one holding ``raw/``).

    Edges are kept directed as stored (``src -> dst``; ogbn-arxiv is a directed citation graph)
    unless `to_undirected`, which adds the reverse of every edge and drops duplicates (self
    loops are kept either way: they are part of the stored graph). Labels ``nan`` -> -1. The
    split comes from the only folder under ``split/``, or the one named `split`; masks
    ``[1, N]``. The graph is named `name` or the folder's name (e.g. ``ogbn_arxiv``).
    """
    directory = Path(directory)
    if not directory.is_dir():
        problem = "is a file" if directory.exists() else "does not exist"
        raise DatasetError(f"OGB dataset folder {directory} {problem}; pass the folder "
                           "that holds raw/ and split/")
    raw = directory / "raw"
    if not (raw / "edge.csv.gz").exists() and (raw / "node-feat").is_dir():
        raise DatasetError(f"{directory} looks like a heterogeneous OGB dataset (raw/node-feat/ "
                           "is a folder); jgrind reads homogeneous node-property datasets only")
    if not (raw / "node-feat.csv.gz").exists() and (raw / "edge.csv.gz").exists():
        raise DatasetError(f"{directory} has no raw/node-feat.csv.gz; jgrind needs node "
                           "features and will not invent identity ones (e.g. ogbn-proteins "
                           "has none)")
    for f in ("edge.csv.gz", "node-feat.csv.gz", "node-label.csv.gz"):
        require_file(raw / f, "OGB file", _HINT)
    split_dir = _split_dir(directory, split)  # before the big reads, so mistakes fail fast
    edges = _read(raw / "edge.csv.gz", np.int64, ncols=2)
    features = _read(raw / "node-feat.csv.gz", np.float32)
    labels = _read(raw / "node-label.csv.gz", np.float64)
    if labels.shape[1] != 1:
        raise DatasetError(f"{raw / 'node-label.csv.gz'} has {labels.shape[1]} columns; jgrind "
                           "supports one class id per node (multi-label datasets such as "
                           "ogbn-proteins are not supported)")
    labels = as_labels(labels[:, 0], str(raw / "node-label.csv.gz"), _HINT)
    n = features.shape[0]
    if (raw / "num-node-list.csv.gz").exists():
        counts = _read(raw / "num-node-list.csv.gz", np.int64)
        if counts.size != 1:
            raise DatasetError(f"{raw / 'num-node-list.csv.gz'} lists {counts.size} graphs; a "
                               "node-property dataset has one")
        n = int(counts[0, 0])
    if features.shape[0] != n or labels.size != n:
        raise DatasetError(f"{directory}: {n} nodes, but node-feat has {features.shape[0]} rows "
                           f"and node-label {labels.size}; {_HINT}")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        bad = int(edges.min()) if edges.min() < 0 else int(edges.max())
        raise DatasetError(f"{raw / 'edge.csv.gz'}: node id {bad} is out of range for {n} nodes; "
                           f"{_HINT}")

    masks = np.zeros((3, 1, n), bool)
    for m, part in zip(masks, ("train", "valid", "test")):
        ids = _read(split_dir / f"{part}.csv.gz", np.int64, ncols=1)[:, 0]
        if ids.size and (ids.min() < 0 or ids.max() >= n):
            bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
            raise DatasetError(f"{split_dir / (part + '.csv.gz')}: node id {bad} is out of range "
                               f"for {n} nodes; {_HINT}")
        m[0, ids] = True
    num_classes = int(labels.max()) + 1 if (labels >= 0).any() else 1
    g = from_edges(edges[:, 0], edges[:, 1], features, labels, num_classes=num_classes,
                   train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                   name=name or directory.name)
    return make_undirected(g) if to_undirected else g
