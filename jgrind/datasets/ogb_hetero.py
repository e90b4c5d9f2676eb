"""OGB heterogeneous node-property datasets (ogbn-mag) from the raw folder OGB unpacks, read
without the ``ogb`` package (the layout of OGB's ``read_csv_heterograph_raw``):

  raw/num-node-dict.csv.gz       a header of node type names, then one row of their counts
  raw/triplet-type-list.csv.gz   ``head,relation,tail`` a line, no header
  raw/relations/<head>___<relation>___<tail>/edge.csv.gz
                                 ``src,dst`` a line (head id, tail id), 0-based per type
  raw/relations/.../num-edge-list.csv.gz   the relation's edge count
  raw/node-feat/<type>/node-feat.csv.gz    optional ``[n_t, F_t]`` features (ogbn-mag: paper)
  raw/node-label/<type>/node-label.csv.gz  one class id a line, ``nan`` = unlabelled
  split/<scheme>/<type>/{train,valid,test}.csv.gz   node ids of the labelled type

Node types and relations are taken in sorted order, as OGB numbers them. Other files in these
folders (``node_year``, ``edge_reltype``) are not read.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from jgrind.datasets.edgelist import as_labels, read_text_table
from jgrind.datasets.errors import DatasetError, require_file
from jgrind.graph import GraphError
from jgrind.hetero import HeteroGraph, relation_csr

_HINT = "re-extract the OGB download (it needs raw/ and split/ as OGB ships them)"
_SPLIT_FLAG = "on the command line: --set dataset_options=split:NAME"


def is_hetero_folder(directory: Path) -> bool:
    """Whether an OGB folder holds a heterogeneous dataset (it has num-node-dict.csv.gz)."""
    return (Path(directory) / "raw" / "num-node-dict.csv.gz").exists()


def _lines(path: Path) -> list[list[str]]:
    """The comma-separated fields of every non-blank line of a small text file."""
    require_file(path, "OGB file", _HINT)
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            return [[v.strip() for v in line.split(",")] for line in f if line.strip()]
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as e:
        raise DatasetError(f"cannot read {path}: {type(e).__name__}: {e}; {_HINT}") from None


def _table(path: Path, dtype, ncols=None) -> np.ndarray:
    require_file(path, "OGB file", _HINT)
    return read_text_table(path, ncols=ncols, dtype=dtype, delimiter=",", hint=_HINT)


def _node_counts(raw: Path) -> dict[str, int]:
    path = raw / "num-node-dict.csv.gz"
    rows = _lines(path)
    if len(rows) != 2 or len(rows[0]) != len(rows[1]):
        raise DatasetError(f"{path}: expected a header of node types and one row of counts "
                           f"(one graph), found {len(rows)} lines; {_HINT}")
    try:
        counts = {t: int(c) for t, c in zip(rows[0], rows[1])}
    except ValueError:
        raise DatasetError(f"{path}: the counts {rows[1]} are not whole numbers; "
                           f"{_HINT}") from None
    return {t: counts[t] for t in sorted(counts)}


def _ids(ids: np.ndarray, n: int, node_type: str, path: Path) -> np.ndarray:
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = int(ids.min()) if ids.min() < 0 else int(ids.max())
        raise DatasetError(f"{path}: id {bad} is outside {node_type}'s ids [0, {n}); {_HINT}")
    return ids


def read_ogb_hetero(directory, *, split=None, name=None, num_classes=None) -> HeteroGraph:
    """The `HeteroGraph` of a heterogeneous OGB folder (see the module docstring).

    The target is the one type with a ``raw/node-label/<type>/`` folder; the split is the only
    folder under ``split/``, or the one named ``split``; masks ``[1, n_target]``. The graph is
    named ``name`` or the folder's name. Relations are as stored (ogbn-mag's four, directed):
    `HeteroGraph.with_inverses` adds the reverses.
    """
    directory = Path(directory)
    raw = directory / "raw"
    counts = _node_counts(raw)
    name = name or directory.name
    triplet_file = raw / "triplet-type-list.csv.gz"
    triplets = []
    for fields in _lines(triplet_file):
        if len(fields) != 3:
            raise DatasetError(f"{triplet_file}: line {fields} is not head,relation,tail; "
                               f"{_HINT}")
        triplets.append(tuple(fields))
    labelled = sorted(p.name for p in (raw / "node-label").iterdir() if p.is_dir()) \
        if (raw / "node-label").is_dir() else []
    if len(labelled) != 1:
        raise DatasetError(f"{directory}: expected labels for one node type under "
                           f"{raw / 'node-label'}, found {len(labelled)} "
                           f"({', '.join(labelled) or 'none'}); {_HINT}")
    target = labelled[0]
    split_dir = _split_dir(directory, split) / target  # small files and mistakes first
    for t in {h for h, _, _ in triplets} | {t for _, _, t in triplets} | {target}:
        if t not in counts:
            raise DatasetError(f"{directory}: node type {t!r} (in {triplet_file.name} or "
                               f"node-label/) is not in num-node-dict.csv.gz (types: "
                               f"{', '.join(counts)}); {_HINT}")
    n_target = counts[target]
    masks = np.zeros((3, 1, n_target), bool)
    for m, part in zip(masks, ("train", "valid", "test")):
        path = split_dir / f"{part}.csv.gz"
        m[0, _ids(_table(path, np.int64, ncols=1)[:, 0], n_target, target, path)] = True
    label_file = raw / "node-label" / target / "node-label.csv.gz"
    labels = as_labels(_table(label_file, np.float64, ncols=1), str(label_file), _HINT)
    if labels.shape != (n_target,):
        raise DatasetError(f"{label_file}: {labels.shape[0]} labels for the {n_target} "
                           f"{target} nodes; {_HINT}")

    relations = {}
    for head, rel, tail in sorted(triplets):
        folder = raw / "relations" / f"{head}___{rel}___{tail}"
        edge_file = folder / "edge.csv.gz"
        edges = _table(edge_file, np.int64, ncols=2)
        count_file = folder / "num-edge-list.csv.gz"
        if count_file.exists():
            stated = _table(count_file, np.int64)
            if stated.size != 1 or int(stated[0, 0]) != edges.shape[0]:
                raise DatasetError(f"{count_file} states {stated.reshape(-1).tolist()} edges, "
                                   f"but {edge_file.name} has {edges.shape[0]}; {_HINT}")
        src = _ids(edges[:, 0], counts[head], head, edge_file)
        dst = _ids(edges[:, 1], counts[tail], tail, edge_file)
        relations[(head, rel, tail)] = relation_csr(src, dst, counts[tail])
        del edges, src, dst
    features = {}
    for t in counts:
        path = raw / "node-feat" / t / "node-feat.csv.gz"
        if path.exists():
            features[t] = _table(path, np.float32)
    try:
        return HeteroGraph(node_types=tuple(counts.items()), relations=relations,
                           features=features, target=target, labels=labels,
                           train_mask=masks[0], val_mask=masks[1], test_mask=masks[2],
                           num_classes=num_classes, name=name)
    except GraphError as e:
        raise DatasetError(f"{directory}: {e}") from None


def load_ogb_hetero(directory, *, split=None, name=None, num_classes=None, inverses=True):
    """`read_ogb_hetero` as the homogeneous `jgrind.graph.Graph` of `HeteroGraph.to_graph`,
    with the inverse of every relation added first (``inverses``; R-GCN set-ups on ogbn-mag
    add them, so that authors, institutions and fields of study receive messages)."""
    if not isinstance(inverses, bool):
        raise DatasetError(f"inverses={inverses!r}: use true or false")
    graph = read_ogb_hetero(directory, split=split, name=name, num_classes=num_classes)
    return (graph.with_inverses() if inverses else graph).to_graph()


def _split_dir(directory: Path, split) -> Path:
    base = directory / "split"
    schemes = sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []
    if split is not None:
        if split not in schemes:
            raise DatasetError(f"{directory}: no split folder {base / str(split)} (found: "
                               f"{', '.join(schemes) or 'none'}); pass one of those as split= "
                               f"({_SPLIT_FLAG})")
        return base / split
    if len(schemes) != 1:
        raise DatasetError(f"{directory}: expected one folder under {base}, found "
                           f"{len(schemes)} ({', '.join(schemes) or 'none'}); pass split= to "
                           f"choose ({_SPLIT_FLAG}), or {_HINT}")
    return base / schemes[0]
