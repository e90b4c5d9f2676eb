"""A saved graph folder (`jgrind.datasets.stored`) read a slice of rows at a time.

`jgrind.datasets.stored.load_saved` builds a whole `Graph`, whose construction reads every
file once to validate it. A process that trains only some of the nodes (several processes,
`jgrind.devices.Sharded`) reads only what those nodes need instead: `SavedArrays` opens each
file memory-mapped for one read, copies the rows asked for, and lets the map go, so the pages
of the rows it did not ask for are never read and the ones it did stop counting in its
resident memory once copied. It counts what it read (`SavedArrays.read`), so tests can check
that a process read its own rows only.

`SavedGraph` is the `Graph` such a process hands to `jgrind.train.train`: the saved graph's
sizes, labels and masks (``N`` values each, what evaluation scores), with no edges and
zero-filled features in memory (untouched zero pages, never resident); the executor
(`jgrind.devices.Sharded`) reads the rows it needs from `SavedGraph.saved`. Only
`jgrind.devices.Sharded` may train on it: any other executor would see no edges.
"""

from __future__ import annotations

import functools
import zlib
from pathlib import Path
from typing import Optional

import numpy as np

from jgrind.datasets.errors import DatasetError, require_file
from jgrind.datasets.stored import META, _HINT, _read_array, _read_meta
from jgrind.graph import _CHECKED_FEATURES, Graph

__all__ = ["SavedArrays", "SavedGraph", "saved_assignment", "load_assignment"]

_CRC_BYTES = 1 << 26  # bytes the fingerprint reads at once


class SavedArrays:
    """The arrays of the saved graph in ``folder``, read on demand.

    Attributes:
      folder: the folder; meta: its ``graph.json``.
      num_nodes, num_edges, num_features, num_classes, name: from ``graph.json``.
      indptr: ``[N + 1]`` int64, read whole (small next to the edges and features).
      read: ``{array name: rows (node arrays) or entries (edge arrays) read so far}``.
    """

    def __init__(self, folder):
        self.folder = Path(folder).expanduser().absolute()
        if not self.folder.is_dir():
            raise DatasetError(f"saved graph folder {self.folder} does not exist or is not a "
                               "folder; write one with jgrind.datasets.save_graph or "
                               "`jgrind convert`")
        self.meta = _read_meta(require_file(self.folder / META, "saved graph description",
                                            f"{self.folder} is not a saved graph; {_HINT}"))
        self.num_nodes = int(self.meta["num_nodes"])
        self.num_edges = int(self.meta["num_edges"])
        self.num_features = int(self.meta["num_features"])
        self.num_classes = int(self.meta["num_classes"])
        self.name = str(self.meta["name"])
        self.relations = tuple(self.meta.get("relations", ()))
        self.read: dict[str, int] = {}
        self.indptr = self.whole("indptr").astype(np.int64, copy=False)
        if self.indptr.size != self.num_nodes + 1 or self.indptr[0] != 0 \
                or int(self.indptr[-1]) != self.num_edges:
            raise DatasetError(f"{self.folder / 'indptr.npy'} does not describe "
                               f"{self.num_edges} edges of {self.num_nodes} nodes; {_HINT}")

    def has(self, key: str) -> bool:
        return key in self.meta["arrays"]

    def _open(self, key: str) -> np.ndarray:
        return _read_array(self.folder / f"{key}.npy", self.meta["arrays"][key], True)

    def _count(self, key: str, n: int) -> None:
        self.read[key] = self.read.get(key, 0) + int(n)

    def whole(self, key: str) -> np.ndarray:
        """Array ``key`` read into memory."""
        a = np.array(self._open(key))
        self._count(key, a.shape[-1] if key.endswith("_mask") else a.shape[0])
        return a

    def node_rows(self, key: str, rows: np.ndarray) -> np.ndarray:
        """Rows ``rows`` (ascending global node ids) of the node array ``key`` (features,
        labels), copied into memory."""
        rows = np.asarray(rows, np.int64)
        out = np.array(self._open(key)[rows])
        self._count(key, rows.size)
        return out

    def edges_of(self, rows: np.ndarray) -> tuple:
        """``(indptr [n + 1], indices, edge_weight or None, edge_type or None)``: the saved
        in-edges of ``rows`` (ascending global node ids), a CSR over them, in the saved
        order within every row."""
        rows = np.asarray(rows, np.int64)
        starts = self.indptr[rows]
        degree = self.indptr[rows + 1] - starts
        indptr = np.zeros(rows.size + 1, np.int64)
        np.cumsum(degree, out=indptr[1:])
        nnz = int(indptr[-1])
        # every edge's position in the file: each row's start, then consecutive
        edge = np.repeat(starts - indptr[:-1], degree) + np.arange(nnz)
        out = [indptr]
        for key in ("indices", "edge_weight", "edge_type"):
            if key == "indices" or self.has(key):
                out.append(np.array(self._open(key)[edge]))
                self._count(key, nnz)
            else:
                out.append(None)
        return tuple(out)

    def fingerprint(self) -> dict:
        """`Graph.fingerprint` of the saved graph, from its files, a slice at a time (a save
        writes a `Graph`'s arrays as they are, so the bytes are the same)."""
        def crc(*keys) -> int:
            value = 0
            for key in keys:
                if not self.has(key):
                    continue
                a = self._open(key)
                value = zlib.crc32(f"{a.dtype.str}{a.shape}".encode(), value)
                if a.size:
                    flat = a.reshape(a.shape[0], -1) if a.ndim else a.reshape(1)
                    step = max(1, _CRC_BYTES // max(flat[:1].nbytes, 1))
                    for start in range(0, flat.shape[0], step):
                        value = zlib.crc32(np.ascontiguousarray(flat[start:start + step]),
                                           value)
            return value
        return {"nodes": self.num_nodes, "edges": self.num_edges,
                "features": self.num_features, "classes": self.num_classes,
                "multilabel": len(self.meta["arrays"]["labels"]["shape"]) == 2,
                "edges_crc": crc("indptr", "indices", "edge_weight", "edge_type"),
                "features_crc": crc("features"), "labels_crc": crc("labels"),
                "masks_crc": crc("train_mask", "val_mask", "test_mask")}

    def nbytes(self) -> int:
        """Bytes of the saved arrays (what `Graph.nbytes` counts of the whole graph)."""
        return int(sum(np.dtype(s["dtype"]).itemsize * int(np.prod(s["shape"]))
                       for s in self.meta["arrays"].values()))


class SavedGraph(Graph):
    """A saved graph's sizes, labels and masks, for a process that reads only its own rows
    (see the module docstring). ``saved``: the `SavedArrays` the rows come from."""

    @classmethod
    def open(cls, folder, *, name: Optional[str] = None) -> "SavedGraph":
        saved = SavedArrays(folder)
        if saved.relations:
            raise DatasetError(f"{saved.folder} is a heterogeneous graph; each process "
                               "reading only its own rows supports gcn, sage and gat on a "
                               "homogeneous graph")
        n, f = saved.num_nodes, saved.num_features
        # untouched zero pages: nothing resident, and nothing to scan for NaN
        features = np.zeros((n, f), np.float32)
        features.flags.writeable = False
        token = _CHECKED_FEATURES.set(features)
        try:
            graph = cls(indptr=np.zeros(n + 1, np.int64), indices=np.zeros(0, np.int64),
                        features=features, labels=saved.whole("labels"),
                        train_mask=saved.whole("train_mask"), val_mask=saved.whole("val_mask"),
                        test_mask=saved.whole("test_mask"), num_classes=saved.num_classes,
                        name=saved.name if name is None else name)
        finally:
            _CHECKED_FEATURES.reset(token)
        object.__setattr__(graph, "saved", saved)
        return graph

    @property
    def num_edges(self) -> int:
        return self.saved.num_edges

    def in_degree(self) -> np.ndarray:
        return np.diff(self.saved.indptr)

    def nbytes(self) -> int:
        return self.saved.nbytes()

    @functools.cached_property
    def _fingerprint(self) -> dict:
        return self.saved.fingerprint()

    def replace(self, **changes):
        raise TypeError("a SavedGraph holds no edges or features: transform the saved graph "
                        "before saving it (jgrind.datasets.save_graph)")

    def __repr__(self) -> str:
        return f"SavedGraph({self.saved.folder}, nodes={self.num_nodes:,}, " \
               f"edges={self.num_edges:,}, features={self.num_features})"


def load_assignment(path, num_nodes: Optional[int] = None) -> np.ndarray:
    """``[N]`` int32 partition of every node, saved by ``jgrind partition --out FILE.npy``."""
    path = Path(path).expanduser()
    require_file(path, "saved partition assignment",
                 "write one with `jgrind partition ... --out FILE.npy`")
    try:
        a = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"cannot read the partition assignment {path}: {e}") from e
    if not isinstance(a, np.ndarray) or a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise DatasetError(f"{path} is not a partition assignment (a [N] integer array, "
                           "from `jgrind partition ... --out FILE.npy`)")
    if num_nodes is not None and a.size != num_nodes:
        raise DatasetError(f"the partition assignment {path} has {a.size} nodes but the graph "
                           f"has {num_nodes}: it was saved for another graph")
    if a.size and a.min() < 0:
        raise DatasetError(f"the partition assignment {path} holds a negative partition")
    return a.astype(np.int32)


def saved_assignment(path):
    """A partitioner (``fn(graph, num_parts, seed=0) -> [N] int32``) that returns the
    assignment saved at ``path``, whatever the graph; ``fn.path`` and ``fn.num_parts`` say
    which and how many partitions."""
    path = Path(path).expanduser().absolute()
    parts = int(load_assignment(path).max(initial=-1)) + 1

    def fn(graph, num_parts: int, *, seed: int = 0) -> np.ndarray:
        assignment = load_assignment(path, graph.num_nodes)
        if num_parts is not None and int(num_parts) != parts:
            raise DatasetError(f"the partition assignment {path} has {parts} partitions, "
                               f"not {num_parts}: set --parts {parts}")
        return assignment
    fn.path, fn.num_parts, fn.__name__ = path, parts, f"saved:{path}"
    return fn
