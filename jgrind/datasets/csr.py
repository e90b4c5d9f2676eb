"""A CSR built from an edge list read in slices, in O(nodes) memory besides the result.

`jgrind.graph.from_edges` sorts the whole edge list at once: with its source and destination
arrays, the sort's order and the result, about 30 bytes per edge are in memory together (48 GB
for ogbn-papers100M's 1.6 billion edges). `csr_from_edge_chunks` reads the edges twice instead,
a slice at a time: the first pass counts each node's in-edges (the row pointers), the second
places every slice's sources at their rows' next free positions. Within a slice the placement
keeps the edges' order, and slices come in order, so the result is the one `from_edges` gives,
bit for bit: the same row pointers, and each row's sources in the order the file lists them.
An undirected graph (``symmetric=True``) is built the same way with every edge placed in both
directions, then sorted and deduplicated row block by row block in place.
"""

from __future__ import annotations

from typing import Callable, Iterator, Optional

import numpy as np
from tqdm import tqdm

from jgrind.datasets.errors import DatasetError
from jgrind.graph import index_dtype
from jgrind.transforms import _sorted_unique, row_blocks

EdgeChunks = Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]]


def csr_from_edge_chunks(chunks: EdgeChunks, num_nodes: int, *, what: str, hint: str,
                         symmetric: bool = False, block_edges: int = 1 << 24
                         ) -> tuple[np.ndarray, np.ndarray]:
    """``(indptr, indices)`` of the graph whose edges ``src -> dst`` ``chunks()`` yields (it is
    called twice, and must yield the same slices both times); rows are destinations, as in
    `jgrind.graph.Graph`.

    With ``symmetric``, the graph of every edge and its reverse, each pair once: the CSR that
    `jgrind.transforms.make_undirected` gives (each row's sources sorted, duplicates
    dropped), built here with both directions placed and then each block of rows of about
    ``block_edges`` edges sorted in place. It holds the placed indices (4 bytes each, 8 once
    there are 2^31 or more) plus about 32 bytes per edge of one block, where sorting every
    key at once (`make_undirected`) takes 16 bytes per directed edge and more.

    Raises `DatasetError` naming ``what`` for a node id outside ``[0, num_nodes)`` or a
    non-integer id, before anything of the size of the edges is allocated.
    """
    counts = np.zeros(num_nodes, np.int64)
    total = 0
    with _bar(f"counting edges of {what}") as bar:
        for src, dst in chunks():
            for ids, end in ((src, "source"), (dst, "destination")):
                _check_ids(ids, end, num_nodes, total // (1 + symmetric), what, hint)
            for ids in (dst, src) if symmetric else (dst,):
                _count(counts, ids)
                total += int(ids.size)
            bar.update(int(dst.size))
    idx_t = index_dtype(max(num_nodes, total))
    indptr = np.zeros(num_nodes + 1, idx_t)
    np.cumsum(counts, out=indptr[1:])
    del counts
    indices = np.empty(total, idx_t)
    cursor = indptr[:-1].astype(np.int64)  # each row's next free position
    placed = 0
    with _bar(f"placing edges of {what}", total=total) as bar:
        for src, dst in chunks():
            for rows, cols in ((dst, src), (src, dst)) if symmetric else ((dst, src),):
                placed += _place(indices, cursor, np.asarray(rows), np.asarray(cols), what,
                                 hint)
                bar.update(int(rows.size))
    # every row filled exactly: the second read gave what the first one counted
    if placed != total or not np.array_equal(cursor, indptr[1:]):
        raise _changed(what, hint)
    if symmetric:
        return _sort_rows_unique(indptr, indices, num_nodes, block_edges)
    return indptr, indices


def _count(counts: np.ndarray, rows: np.ndarray) -> None:
    if 4 * rows.size >= counts.size:
        counts += np.bincount(rows, minlength=counts.size)
    else:  # a slice much smaller than the graph: no pass over all nodes for it
        found, number = np.unique(rows, return_counts=True)
        counts[found] += number


def _place(indices, cursor, rows, cols, what, hint) -> int:
    """Put ``cols`` at their ``rows``' next free positions, in their order within each row."""
    if not rows.size:
        return 0
    order = np.argsort(rows, kind="stable")
    rows = rows[order]
    first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    length = np.diff(np.r_[first, rows.size])
    rank = np.arange(rows.size) - np.repeat(first, length)
    try:
        indices[cursor[rows] + rank] = cols[order]
    except IndexError:  # ids beyond what the first pass saw
        raise _changed(what, hint) from None
    cursor[rows[first]] += length
    return int(rows.size)


def _sort_rows_unique(indptr, indices, n: int, block_edges: int):
    """Each row's entries sorted with duplicates dropped, a block of rows at a time, written
    back into ``indices`` from its start (a row never moves right, so a block's output never
    overtakes the rows still to read); then the buffer is shrunk to what is kept, in the
    index dtype of the final edge count (as `make_undirected` chooses it)."""
    new_indptr = np.zeros(indptr.size, np.int64)
    written = 0
    with _bar("sorting rows", total=int(indptr[-1])) as bar:
        for row, stop in row_blocks(indptr, block_edges):
            lo, hi = int(indptr[row]), int(indptr[stop])
            local = np.repeat(np.arange(stop - row, dtype=np.int64),
                              np.diff(indptr[row:stop + 1]))
            keys = _sorted_unique(local * n + indices[lo:hi])  # by row, then by column
            key_rows, cols = np.divmod(keys, n)
            indices[written:written + keys.size] = cols
            new_indptr[row + 1:stop + 1] = written + np.cumsum(
                np.bincount(key_rows, minlength=stop - row))
            written += keys.size
            bar.update(hi - lo)
    indices.resize(written, refcheck=False)  # hands the dropped duplicates' tail back
    idx_t = index_dtype(max(n, written))
    return new_indptr.astype(idx_t), indices.astype(idx_t, copy=False)


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
