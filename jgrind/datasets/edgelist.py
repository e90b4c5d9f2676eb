"""Graphs from plain files: a text edge list plus ``.npy`` features and labels.

Also home of `read_text_table`, the chunked text-number reader that the OGB loader shares: it
parses tens of millions of lines at C speed (``np.fromstring``) and still reports a bad line by
number.
"""

from __future__ import annotations

import gzip
import re
import zlib
from pathlib import Path

import numpy as np

from jgrind.datasets.errors import (DatasetError, check_count, npy_problem, read_npz,
                                    require_file)
from jgrind.graph import class_count, from_edges
from jgrind.transforms import make_undirected

SPLIT_FRACTIONS = (0.6, 0.2)  # train, val; the rest is test (used when no masks are given)
SPLIT_SEED = 0

_WS = np.zeros(256, bool)
_WS[[9, 10, 11, 12, 13, 32]] = True  # the bytes np.fromstring(sep=" ") skips as whitespace
_INT32_MAX = np.iinfo(np.int32).max


# -- text tables ---------------------------------------------------------------------------------
def read_text_table(path, *, ncols=None, dtype=np.int64, delimiter=None, comment=None,
                    hint="fix the file", chunk_bytes=32 << 20) -> np.ndarray:
    """All numbers of a text table, ``[rows, ncols]`` of `dtype` (``.gz`` read transparently).

    One row a line; `delimiter` None means runs of whitespace, else a single character (e.g.
    ","). Blank lines are skipped, and so is everything from `comment` to the end of a line.
    `ncols` None takes the count of the first data line. Integer tables come back as int32 when
    every value fits (half the memory for edge lists). Floats accept ``nan`` and ``inf``.

    Raises `DatasetError` naming the file and line for a row with the wrong number of values or
    a value that does not parse, and naming the file for an unreadable or truncated archive.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    if opener is gzip.open and path.is_file() and path.stat().st_size == 0:
        # gzip reads 0 bytes as an empty table; gzip itself writes a header even for no lines
        raise DatasetError(f"cannot read {path}: the file is empty (0 bytes), not gzip data; "
                           f"{hint}")
    parts, line0, tail = [], 0, b""
    try:
        with opener(path, "rb") as f:
            while True:
                data = f.read(chunk_bytes)
                block = tail + data
                if data:  # parse whole lines only; the partial last one waits for more bytes
                    cut = block.rfind(b"\n") + 1
                    block, tail = block[:cut], block[cut:]
                    if not block:
                        continue
                elif not block:
                    break
                elif not block.endswith(b"\n"):
                    block += b"\n"
                arr, ncols, lines = _parse_block(block, line0, path, ncols, dtype, delimiter,
                                                 comment, hint)
                parts.append(arr)
                line0 += lines
                if not data:
                    break
    except (OSError, EOFError, zlib.error) as e:
        raise DatasetError(f"cannot read {path}: file is truncated or not readable "
                           f"({type(e).__name__}: {e}); {hint}") from e
    if not parts:
        return np.zeros((0, ncols or 1), dtype)
    return np.concatenate(parts) if len(parts) > 1 else parts[0]


def _parse_block(block: bytes, line0: int, path: Path, ncols, dtype, delimiter, comment, hint):
    """Parse complete lines (`block` ends in a newline; `line0` lines came before it).

    Returns ``(values [rows, ncols], ncols, lines in block)``. The layout is checked exactly
    (every data line has `ncols` values; with a delimiter, every field holds one value), so a
    short line next to a long one cannot pair up wrongly."""
    if comment:
        block = re.sub(re.escape(comment.encode()) + rb"[^\n]*", b"", block)
    b = np.frombuffer(block, np.uint8)
    is_nl = b == 10
    newlines = np.flatnonzero(is_nl)  # line k ends at newlines[k]
    ws = _WS[b]
    is_sep = None
    if delimiter is not None and not delimiter.isspace():
        if len(delimiter.encode()) != 1:
            raise ValueError(f"delimiter must be one character or None, got {delimiter!r}")
        is_sep = b == delimiter.encode()[0]
        ws |= is_sep
        block = block.replace(delimiter.encode(), b" ")  # np.fromstring splits on whitespace
    token_start = ~ws
    token_start[1:] &= ws[:-1]
    tokens = np.flatnonzero(token_start)
    if tokens.size == 0:  # np.fromstring would read a lone 0 out of pure whitespace
        return np.zeros((0, ncols or 1), dtype), ncols, newlines.size
    if ncols is None:  # the number of values on the first data line
        first = np.searchsorted(newlines, tokens[0])
        ncols = int(np.searchsorted(tokens, newlines[first]))
    k = _bad_line(token_start, tokens, is_nl, newlines, is_sep, ncols)
    if k is not None:
        sep = "whitespace" if is_sep is None else repr(delimiter)
        raise DatasetError(f"{path}:{line0 + k + 1}: expected {ncols} values separated by {sep}, "
                           f"found {_line(block, newlines, k)!r}; {hint}")
    try:
        values = np.fromstring(block, dtype=dtype, sep=" ")
    except ValueError:
        values = None
    if values is None or values.size != tokens.size:
        k = _first_unparsable(block, newlines, dtype)
        kind = "integers" if np.issubdtype(dtype, np.integer) else "numbers"
        raise DatasetError(f"{path}:{line0 + k + 1}: expected {kind}, found "
                           f"{_line(block, newlines, k)!r}; {hint}")
    if np.issubdtype(dtype, np.integer):
        # np.fromstring saturates a number too large for the type to the type's limit
        limits = np.iinfo(dtype)
        clipped = np.flatnonzero((values == limits.max) | (values == limits.min))
        if clipped.size:
            k = int(np.searchsorted(newlines, tokens[clipped[0]]))
            raise DatasetError(f"{path}:{line0 + k + 1}: a number does not fit a "
                               f"{limits.bits}-bit integer, found {_line(block, newlines, k)!r}; "
                               f"{hint}")
    if np.issubdtype(dtype, np.integer) and values.min() >= -_INT32_MAX and \
            values.max() <= _INT32_MAX:
        values = values.astype(np.int32)
    return values.reshape(-1, ncols), ncols, newlines.size


def _bad_line(token_start, tokens, is_nl, newlines, is_sep, ncols):
    """Index of the first line whose layout is wrong, or None.

    Fast path (no blank lines): with exactly ``lines * ncols`` values, line k's first value
    after its start and its last before its end means ncols values on every line; with a
    delimiter, each value strictly between consecutive separators means one value per field.
    Otherwise an exact per-line count, which also allows blank lines."""
    n_lines = newlines.size
    if tokens.size == n_lines * ncols:
        grid = tokens.reshape(n_lines, ncols)
        ok = bool((grid[1:, 0] > newlines[:-1]).all() and (grid[:, -1] < newlines).all())
        if ok and is_sep is not None:
            seps = np.flatnonzero(is_sep | is_nl)
            ok = seps.size == tokens.size and bool((tokens < seps).all()
                                                   and (tokens[1:] > seps[:-1]).all())
        if ok:
            return None
    running = np.cumsum(token_start, dtype=np.int64)
    per_line = np.diff(running[newlines], prepend=0)
    bad = (per_line > 0) & (per_line != ncols)
    if is_sep is not None:  # every field one value, except a whole blank line
        seps = np.flatnonzero(is_sep | is_nl)
        per_field = np.diff(running[seps], prepend=0)
        blank = is_nl[seps] & np.concatenate(([True], is_nl[seps[:-1]]))
        field_bad = (per_field > 1) | ((per_field == 0) & ~blank)
        if field_bad.any():
            bad[np.searchsorted(newlines, seps[np.argmax(field_bad)])] = True
    return int(np.argmax(bad)) if bad.any() else None


def _line(block: bytes, newlines: np.ndarray, k: int) -> str:
    start = int(newlines[k - 1]) + 1 if k else 0
    return block[start:int(newlines[k])].decode("utf-8", "replace").strip()[:80]


def _first_unparsable(block, newlines, dtype) -> int:
    """Index of the first line np.fromstring cannot read (slow path, errors only)."""
    start = 0
    for k, end in enumerate(newlines.tolist()):
        line = block[start:end]
        if line.strip():
            try:
                ok = np.fromstring(line, dtype=dtype, sep=" ").size == len(line.split())
            except ValueError:
                ok = False
            if not ok:
                return k
        start = end + 1
    return 0


# -- arrays --------------------------------------------------------------------------------------
def read_npy(path, what: str, hint: str) -> np.ndarray:
    """A ``.npy`` array (no pickles), or `DatasetError` naming the file."""
    path = require_file(path, what, hint)
    try:
        with open(path, "rb") as fh:
            array = np.load(fh, allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise DatasetError(f"cannot read {what} {path}: {npy_problem(path, e)}; {hint}") from e
    if not isinstance(array, np.ndarray):  # np.load opens an .npz under any name
        raise DatasetError(f"cannot read {what} {path}: it is an .npz archive, not a .npy "
                           f"array (save it with numpy.save); {hint}")
    return array


def as_labels(values: np.ndarray, where: str, hint: str) -> np.ndarray:
    """``[N]`` int labels from ints, or from floats that are whole numbers or NaN (NaN -> -1,
    unlabelled, as OGB stores it). A ``[N, T]`` array (T >= 2) is a multi-label task's binary
    targets and is returned as it is (`jgrind.Graph` checks its values)."""
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim == 2:
        return values
    if values.ndim != 1:
        raise DatasetError(f"{where}: labels must be one class id per node ([N]) or a row of "
                           f"binary targets per node ([N, T]), found shape {values.shape}; "
                           f"{hint}")
    if np.issubdtype(values.dtype, np.integer):
        return values
    if not np.issubdtype(values.dtype, np.floating):
        raise DatasetError(f"{where}: labels must be numbers, found dtype {values.dtype}; {hint}")
    nan = np.isnan(values)
    whole = np.where(nan, 0, values)
    if np.any(whole != np.round(whole)):
        bad = values[~nan & (whole != np.round(whole))][0]
        raise DatasetError(f"{where}: label {bad} is not a class id (labels must be whole "
                           f"numbers, NaN for unlabelled); {hint}")
    return np.where(nan, -1, whole).astype(np.int64)


def random_split(labels: np.ndarray, fractions=SPLIT_FRACTIONS, seed: int = SPLIT_SEED):
    """One random split of the labelled nodes: ``(train, val, test)`` masks, each ``[1, N]``.

    A seeded permutation of the labelled nodes; the first ``round(f_train * n)`` train, the
    next ``round(f_val * n)`` val, the rest test."""
    known = np.asarray(labels) >= 0
    labelled = np.flatnonzero(known.any(axis=1) if known.ndim == 2 else known)
    perm = np.random.default_rng(seed).permutation(labelled)
    n_train = int(round(fractions[0] * perm.size))
    n_val = int(round(fractions[1] * perm.size))
    masks = np.zeros((3, 1, np.asarray(labels).shape[0]), bool)
    for m, ids in zip(masks, np.split(perm, [n_train, n_train + n_val])):
        m[0, ids] = True
    return masks[0], masks[1], masks[2]


_MASK_KEYS = {"train": ("train", "train_mask", "train_masks", "train_idx", "idx_train"),
              "val": ("val", "val_mask", "val_masks", "val_idx", "idx_val", "valid",
                      "valid_mask", "valid_idx"),
              "test": ("test", "test_mask", "test_masks", "test_idx", "idx_test")}


def read_masks(path, n: int):
    """``(train, val, test)`` masks, each ``[S, N]`` bool, from an ``.npz``.

    Keys ``train/val/test`` (or ``*_mask``, ``*_masks``, ``*_idx``, ``valid``). Each array is a
    bool mask ``[N]`` or ``[S, N]``, or an integer index array ``[k]`` or ``[S, k]`` (integers
    always mean node ids, never 0/1 flags). A single split broadcasts against S splits."""
    hint = "store train/val/test as bool [N] / [S, N] masks or int index arrays"
    every = [k for keys in _MASK_KEYS.values() for k in keys]
    d = read_npz(path, (), hint, optional=every)
    out = []
    for role, keys in _MASK_KEYS.items():
        key = next((k for k in keys if k in d), None)
        if key is None:
            raise DatasetError(f"{path} has no {role} mask (looked for {', '.join(keys)}; it has "
                               f"{', '.join(d) or 'none of them'}); {hint}")
        a = d[key]
        if a.dtype == bool:
            m = a[None] if a.ndim == 1 else a
            if m.ndim != 2 or m.shape[1] != n:
                raise DatasetError(f"{path}: mask {key!r} has shape {a.shape}, expected [{n}] or "
                                   f"[S, {n}] for {n} nodes; {hint}")
        elif np.issubdtype(a.dtype, np.integer) and a.ndim in (1, 2):
            idx = a[None] if a.ndim == 1 else a
            if idx.size and (idx.min() < 0 or idx.max() >= n):
                bad = int(idx.min()) if idx.min() < 0 else int(idx.max())
                raise DatasetError(f"{path}: {key!r} holds node id {bad}, out of range for {n} "
                                   f"nodes; {hint}")
            m = np.zeros((idx.shape[0], n), bool)
            m[np.arange(idx.shape[0])[:, None], idx] = True
        else:
            raise DatasetError(f"{path}: {key!r} is {a.dtype} {a.shape}, neither a bool mask nor "
                               f"an integer index array; {hint}")
        out.append(m)
    splits = max(m.shape[0] for m in out)
    if any(m.shape[0] not in (1, splits) for m in out):
        raise DatasetError(f"{path}: train/val/test have {[m.shape[0] for m in out]} splits; "
                           f"they must agree (or be a single split); {hint}")
    return tuple(np.broadcast_to(m, (splits, n)) for m in out)


# -- the loader ----------------------------------------------------------------------------------
FEATURES_FILE, LABELS_FILE, MASKS_FILE = "features.npy", "labels.npy", "masks.npz"


def draws_random_splits(edges_path) -> bool:
    """Whether ``load_edge_list(edges_path)`` (masks beside it, if any) draws random splits:
    no masks file lies beside the edge list."""
    return not (Path(edges_path).parent / MASKS_FILE).exists()


def load_edge_list(edges_path, features_path=None, labels_path=None, *, masks_path=None,
                   undirected=True, delimiter=None, comment="#", name=None,
                   num_classes=None, seed=None, splits=None):
    """A `Graph` from an edge list (``src dst`` a line, 0-based), ``[N, F]`` features ``.npy``
    and ``[N]`` labels ``.npy`` (ints, -1 or NaN = unlabelled).

    Without `features_path` and `labels_path`, the files beside the edge list are used:
    ``features.npy``, ``labels.npy`` and, if it is there, ``masks.npz``. That is what
    ``load("edgelist:/dir/edges.txt")`` and the command line (``--dataset edgelist:...``), which
    cannot pass paths, read.

    `undirected`: add the reverse of every edge and drop duplicates and self loops; otherwise the
    edges are kept exactly as listed (``src -> dst``). Masks come from `masks_path` (see
    `read_masks`); without it, `splits` random 60/20/20 splits of the labelled nodes
    (`random_split`), seeded ``seed + s`` (default: one split, seed 0; a run of several seeds
    on the command line passes its seeds, so that each trains on its own split). The graph is
    named `name` or the edge file's stem.
    """
    edges_path = Path(edges_path)
    hint = "pass the right path"
    if features_path is None and labels_path is None:
        folder = edges_path.parent
        features_path, labels_path = folder / FEATURES_FILE, folder / LABELS_FILE
        hint = (f"put {FEATURES_FILE} and {LABELS_FILE} (and optionally {MASKS_FILE}) beside "
                f"the edge list, or pass features_path= and labels_path= from Python")
        # exists, not is_file: a folder in its place is an error, not a silent random split
        if masks_path is None and (folder / MASKS_FILE).exists():
            masks_path = folder / MASKS_FILE
    elif features_path is None or labels_path is None:
        raise DatasetError(f"edge list {edges_path}: pass both features_path and labels_path, "
                           f"or neither (then {FEATURES_FILE} and {LABELS_FILE} beside it are "
                           "read)")
    require_file(edges_path, "edge list", hint)
    features = read_npy(features_path, "features file", hint)
    if features.ndim != 2 or not (np.issubdtype(features.dtype, np.number)
                                  or features.dtype == bool):
        raise DatasetError(f"features file {features_path} holds {features.dtype} "
                           f"{features.shape}; expected a numeric [N, F] array")
    n = features.shape[0]
    labels = as_labels(read_npy(labels_path, "labels file", hint), str(labels_path), hint)
    if labels.shape[0] != n:
        raise DatasetError(f"labels file {labels_path} has {labels.shape[0]} rows but features "
                           f"file {features_path} has {n} rows; they must match")
    edges = read_text_table(edges_path, ncols=2, dtype=np.int64, delimiter=delimiter,
                            comment=comment, hint="fix the line, or pass delimiter=/comment= "
                            "to match the file")
    if edges.size and (edges.min() < 0 or edges.max() >= n):
        row = int(np.argmax((edges < 0).any(1) | (edges >= n).any(1)))
        bad = int(edges[row][(edges[row] < 0) | (edges[row] >= n)][0])
        raise DatasetError(f"{edges_path}: node id {bad} (edge {row + 1} of the file) is out of "
                           f"range for the {n} nodes of {features_path}; ids must be 0-based "
                           f"and below {n}")
    if masks_path is None:
        first = check_count(SPLIT_SEED if seed is None else seed, "seed", least=0)
        drawn = [random_split(labels, seed=first + s)
                 for s in range(check_count(1 if splits is None else splits, "splits", 1))]
        train, val, test = (np.concatenate(masks) for masks in zip(*drawn))
    elif seed is not None or splits is not None:
        raise DatasetError(f"edge list {edges_path} has fixed splits ({masks_path}); the "
                           "options seed and splits draw random ones for an edge list without "
                           "masks: leave them out")
    else:
        train, val, test = read_masks(masks_path, n)
    src, dst = edges[:, 0], edges[:, 1]
    if undirected:
        keep = src != dst
        src, dst = src[keep], dst[keep]
    g = from_edges(src, dst, features, labels,
                   num_classes=class_count(labels, num_classes, str(labels_path)), train_mask=train,
                   val_mask=val, test_mask=test, name=name or edges_path.stem)
    return make_undirected(g) if undirected else g
