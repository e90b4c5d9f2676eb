"""A CSR built from an edge list read in slices, in O(nodes) memory besides the result.

`jgrind.graph.from_edges` sorts the whole edge list at once: with its source and destination
arrays, the sort's order and the result, about 30 bytes per edge are in memory together (48 GB
for ogbn-papers100M's 1.6 billion edges). `csr_from_edge_chunks` reads the edges twice instead,
a slice at a time: the first pass counts each node's in-edges (the row pointers), the second
places every slice's sources at their rows' next free positions. Within a slice the placement
keeps the edges' order, and slices come in order, so the result is the one `from_edges` gives,
bit for bit: the same row pointers, and each row's sources in the order the file lists them.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import numpy as np
from tqdm import tqdm

from jgrind.datasets.errors import DatasetError
from jgrind.graph import index_dtype

EdgeChunks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]


def csr_from_edge_chunks(chunks: EdgeChunks, num_nodes: int, *, what: str, hint: str,
                         out: Optional[Callable[[int, np.dtype], np.ndarray]] = None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the graph whose edges ``src -> dst`` ``chunks()`` yields (it is
    called twice, and must yield the same slices both times); rows are destinations, as in
    `jgrind.graph.Graph`. ``out(num_edges, dtype)`` may supply the indices array (e.g. a
    ``.npy`` file opened with ``np.lib.format.open_memmap``); by default it is in memory.

    Raises `DatasetError` naming ``what`` for a node id outside ``[0, num_nodes)`` or a
    non-integer id, before anything of the size of the edges is allocated.
    """
    counts = np.zeros(num_nodes, np.int64)
    total = 0
    with _bar(f"counting edges of {what}") as bar:
        for src, dst in chunks():
            for ids, end in ((src, "source"), (dst, "destination")):
                _check_ids(ids, end, num_nodes, total, what, hint)
            if 4 * dst.size >= num_nodes:
                counts += np.bincount(dst, minlength=num_nodes)
            else:  # a slice much smaller than the graph: no pass over all nodes for it
                rows, found = np.unique(dst, return_counts=True)
                counts[rows] += found
            total += int(dst.size)
            bar.update(int(dst.size))
    idx_t = index_dtype(max(num_nodes, total))
    indptr = np.zeros(num_nodes + 1, idx_t)
    np.cumsum(counts, out=indptr[1:])
    del counts
    indices = np.empty(total, idx_t) if out is None else out(total, idx_t)
    cursor = indptr[:-1].astype(np.int64)  # each row's next free position
    placed = 0
    with _bar(f"placing edges of {what}", total=total) as bar:
        for src, dst in chunks():
            order = np.argsort(dst, kind="stable")
            rows = np.asarray(dst)[order]
            if rows.size:
                first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
                length = np.diff(np.r_[first, rows.size])
                rank = np.arange(rows.size) - np.repeat(first, length)
                try:
                    indices[cursor[rows] + rank] = np.asarray(src)[order]
                except IndexError:  # ids beyond what the first pass saw
                    raise _changed(what, hint) from None
                cursor[rows[first]] += length
            placed += int(rows.size)
            bar.update(int(rows.size))
    # every row filled exactly: the second read gave what the first one counted
    if placed != total or not np.array_equal(cursor, indptr[1:]):
        raise _changed(what, hint)
    return indptr, indices


def _changed(what: str, hint: str) -> DatasetError:
    return DatasetError(f"{what}: the edges read differently the second time (the file changed "
                        f"while it was read?); {hint}")


def _check_ids(ids: np.ndarray, end: str, n: int, before: int, what: str, hint: str) -> None:
    if ids.dtype == bool or not np.issubdtype(ids.dtype, np.integer):
        raise DatasetError(f"{what}: edge {end}s are {ids.dtype}; they must be integer node ids; "
                           f"{hint}")
    if ids.size and (ids.min() < 0 or ids.max() >= n):
        bad = np.flatnonzero((ids < 0) | (ids >= n))[0]
        raise DatasetError(f"{what}: edge {before + int(bad)} has {end} {int(ids[bad])}, out "
                           f"of range for {n} nodes (ids must lie in [0, {n})); {hint}")


def _bar(desc: str, total: Optional[int] = None):
    # shown on a terminal only (disable=None), so logs and tests stay clean
    return tqdm(total=total, desc=desc, unit=" edges", unit_scale=True, disable=None,
                leave=False)
