"""`DatasetError`: the user pointed a loader at something it cannot read.

It subclasses `GraphError` so that callers can catch every "bad input graph" problem with one
``except GraphError``; a `GraphError` that is *not* a `DatasetError` means the file was read but
the graph it holds is invalid (NaN features, out-of-range ids, ...).

Also here: the two checked openers every loader uses, so that a missing or damaged file never
surfaces as a bare OSError / KeyError / BadZipFile.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import numpy as np

from jgrind.graph import GraphError


class DatasetError(GraphError):
    """A dataset file or folder is missing, truncated or malformed, or a name is unknown.

    The message is one line: what is wrong (naming the file, and the line where it helps) and
    what to do about it.
    """


def require_file(path: Path, what: str, hint: str) -> Path:
    """Return `path` if it is a readable file, else raise `DatasetError` naming it.

    `what` says what the file is ("the Cora edge file"); `hint` what to do if it is missing.
    """
    path = Path(path)
    if not path.is_file():
        problem = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise DatasetError(f"{what} {path} {problem}; {hint}")
    return path


def read_npz(path: Path, keys, hint: str, optional=()) -> dict:
    """The arrays `keys` (all required) and `optional` (those present) of an ``.npz`` file,
    loaded without pickles. Raises `DatasetError` naming the file for a missing file, an
    unreadable or truncated archive, or missing keys (listing the keys it has)."""
    path = require_file(path, "dataset file", hint)
    problem = not_npz_problem(path)
    if problem:
        raise DatasetError(f"cannot read {path}: {problem}; {hint}")
    try:  # open the file here: np.load leaks its own handle when the archive is damaged
        with open(path, "rb") as fh, np.load(fh, allow_pickle=False) as z:
            missing = [k for k in keys if k not in z.files]
            if missing:
                raise DatasetError(f"{path} lacks the key(s) {', '.join(missing)} (it has "
                                   f"{', '.join(z.files) or 'none'}); {hint}")
            out = {}
            for key in (k for k in (*keys, *optional) if k in z.files):
                try:
                    out[key] = z[key]
                except ValueError as e:
                    if "allow_pickle" not in str(e):
                        raise
                    raise DatasetError(f"{path}: {key!r} holds Python objects, not numbers "
                                       f"(an object array, which jgrind does not unpickle); "
                                       f"{hint}") from None
            return out
    except DatasetError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as e:
        raise DatasetError(f"cannot read {path}: the archive is truncated or damaged "
                           f"({type(e).__name__}: {e}); {hint}") from e


_NPY_MAGIC = b"\x93NUMPY"
# an .npz is a zip: it starts with a member's local header, or (no members) the end record
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def not_npz_problem(path: Path) -> str:
    """Why the file at `path` cannot be an ``.npz`` archive, judged from its first bytes, or
    "" if it starts like one. Without this, ``np.load`` returns a bare array for a ``.npy``
    file and blames "pickled data" (suggesting the unsafe ``allow_pickle``) for anything else."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
    except OSError as e:
        return f"cannot open it ({e.strerror or e})"
    if not head:
        return "the file is empty (0 bytes)"
    if head == _NPY_MAGIC:
        return ("it is a single .npy array, not an .npz archive of named arrays (numpy.savez "
                "writes those)")
    if head[:4] not in _ZIP_MAGICS:
        return ("it is not an .npz archive (numpy.savez writes a zip file, and this one does "
                "not start like one)")
    return ""


def npy_problem(path: Path, err: Exception) -> str:
    """Why ``np.load(path, allow_pickle=False)`` failed, in words. NumPy reads any file without
    the ``.npy`` header as a pickle, so its own message blames "pickled data" for a text file,
    an image or a truncated download."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(len(_NPY_MAGIC))
    except OSError as e:
        return f"cannot open it ({e.strerror or e})"
    if head != _NPY_MAGIC:
        return ("it is not a .npy file (it lacks the header np.save writes); save the array "
                "with numpy.save")
    if "allow_pickle" in str(err):
        return "it holds Python objects, not numbers (an object array); save a numeric array"
    return f"it is truncated or damaged ({type(err).__name__}: {err})"


def check_count(value, what: str, least: int) -> int:
    """`value` if it is a whole number of at least `least`, else `DatasetError` (an option
    typed as ``dataset_options=splits:0`` arrives here unchecked)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) \
            or value < least:
        raise DatasetError(f"{what}={value!r}: {what} must be a whole number of at least "
                           f"{least}")
    return int(value)
