"""Arrays inside ``.npz`` archives, read without holding the archive in memory.

``np.load`` reads an ``.npz`` member whole into memory and ignores ``mmap_mode``. For the
largest public graphs that is the obstacle: ogbn-papers100M's ``raw/data.npz`` holds 57 GB of
node features and 26 GB of edges (``np.savez_compressed``), and users of OGB's own loader
report it running out of memory with 256 GB (snap-stanford/ogb issues 46 and 404). Here a
member is

- memory-mapped where it lies when the archive stores it uncompressed (``np.savez``): no copy;
- otherwise decompressed a slice at a time (`read_flat`), into memory or into a ``.npy`` file
  that is then memory-mapped (`read_array` with ``out=``), so only one slice at a time is in the
  process's own memory.

Damage (a truncated download, a file that is not an archive, a member shorter than its
header says, a member holding Python objects) is a `DatasetError` naming the file. Compressed
members are checked against their CRC as they are read to the end; a stored member is mapped,
not read, so a flipped bit inside it is not detected (as with any memory-mapped file).
"""

from __future__ import annotations

import dataclasses
import math
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Iterator, Optional

import numpy as np
from tqdm import tqdm

from jgrind.datasets.errors import DatasetError, not_npz_problem, require_file

CHUNK_BYTES = 64 << 20  # a slice: large enough for zlib and NumPy to run at full speed
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")  # a zip entry's local header (APPNOTE 4.3.7)
_LOCAL_MAGIC = b"PK\x03\x04"
_ERRORS = (OSError, EOFError, ValueError, zipfile.BadZipFile, zlib.error, struct.error,
           NotImplementedError)  # (zipfile: a compression method it does not support)


@dataclasses.dataclass(frozen=True)
class Member:
    """One array of an ``.npz`` archive, described from its ``.npy`` header.

    Attributes:
      archive: the ``.npz`` file.
      key: the array's name (``"edge_index"``); ``entry`` is its file in the archive.
      shape, dtype, fortran_order: as ``np.load`` would return it.
      offset: where the array's bytes start in the archive file when it is stored
        uncompressed (then it can be memory-mapped), else None.
    """

    archive: Path
    key: str
    entry: str
    shape: tuple
    dtype: np.dtype
    fortran_order: bool
    offset: Optional[int]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def compressed(self) -> bool:
        return self.offset is None


def members(path, hint: str) -> dict[str, Member]:
    """Every array of the archive at ``path`` by name, reading headers only."""
    path = require_file(Path(path), "dataset file", hint)
    problem = not_npz_problem(path)
    if problem:
        raise DatasetError(f"cannot read {path}: {problem}; {hint}")
    found = {}
    try:
        with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    continue
                if info.flag_bits & 0x1:
                    raise DatasetError(f"{path}: {info.filename} is encrypted; {hint}")
                with archive.open(info) as fh:
                    shape, fortran, dtype = read_npy_header(fh)
                    header = fh.tell()
                if dtype.hasobject or dtype.itemsize == 0:
                    raise DatasetError(f"{path}: {info.filename} holds "
                                       + ("Python objects" if dtype.hasobject else
                                          f"empty {dtype} values") + f", not numbers; {hint}")
                offset = None
                if info.compress_type == zipfile.ZIP_STORED:
                    raw.seek(info.header_offset)
                    fields = _LOCAL_HEADER.unpack(raw.read(_LOCAL_HEADER.size))
                    if fields[0] != _LOCAL_MAGIC:
                        raise zipfile.BadZipFile(f"no local header for {info.filename}")
                    offset = (info.header_offset + _LOCAL_HEADER.size + fields[10] + fields[11]
                              + header)
                    if header + math.prod(shape) * dtype.itemsize > info.file_size:
                        raise EOFError(f"{info.filename} holds {info.file_size - header} bytes "
                                       f"of data, and its header promises {shape} {dtype}")
                key = info.filename[:-4]
                found[key] = Member(path, key, info.filename, shape, dtype, fortran, offset)
    except DatasetError:
        raise
    except _ERRORS as e:
        raise DatasetError(f"cannot read {path}: file is truncated, damaged or not an .npz "
                           f"archive ({type(e).__name__}: {e}); {hint}") from e
    return found


def require(found: dict[str, Member], keys, path, hint: str) -> None:
    """DatasetError listing what the archive has, unless it has every one of ``keys``."""
    missing = [k for k in keys if k not in found]
    if missing:
        raise DatasetError(f"{path} lacks the key(s) {', '.join(missing)} (it has "
                           f"{', '.join(sorted(found)) or 'none'}); {hint}")


def read_npy_header(fh):
    """``(shape, fortran_order, dtype)`` from the ``.npy`` header at ``fh``'s position, which
    it leaves at the array's first byte (format versions 1.0 and 2.0)."""
    version = np.lib.format.read_magic(fh)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(fh)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(fh)
    raise ValueError(f".npy format version {version[0]}.{version[1]} is not supported")


def read_flat(member: Member, start: int, count: int, *,
              chunk_bytes: Optional[int] = None) -> Iterator[np.ndarray]:
    """Elements ``[start, start + count)`` of the array in the order it is stored (C order, or
    Fortran order for a ``fortran_order`` array), as 1-d slices of at most ``chunk_bytes``.

    A stored member's slices are read-only views of a memory map. A compressed member is
    decompressed as it goes; reaching ``start`` decompresses (and drops) what lies before it.
    """
    if not 0 <= start <= start + count <= member.size:
        raise ValueError(f"elements [{start}, {start + count}) lie outside {member.key}'s "
                         f"{member.size}")
    step = max(1, (chunk_bytes or CHUNK_BYTES) // member.dtype.itemsize)
    try:
        if not member.compressed:
            if count == 0:
                return
            flat = np.memmap(member.archive, dtype=member.dtype, mode="r", offset=member.offset,
                             shape=(member.size,))
            for lo in range(start, start + count, step):
                yield flat[lo:min(lo + step, start + count)]
            return
        with zipfile.ZipFile(member.archive) as archive, archive.open(member.entry) as fh:
            read_npy_header(fh)
            _skip(fh, start * member.dtype.itemsize)
            for lo in range(start, start + count, step):
                n = min(step, start + count - lo)
                buf = np.empty(n, member.dtype)
                got = fh.readinto(memoryview(buf).cast("B"))
                if got != buf.nbytes:
                    raise EOFError(f"{member.entry} ends after {lo + got // buf.itemsize} of "
                                   f"its {member.size} elements")
                yield buf
    except _ERRORS as e:
        raise DatasetError(f"cannot read {member.key} from {member.archive}: the archive is "
                           f"truncated or damaged ({type(e).__name__}: {e})") from e


def _skip(fh, nbytes: int, piece: int = 1 << 20) -> None:
    """Decompress and drop ``nbytes``, a bounded piece at a time (`ZipExtFile.seek` reads up to
    16 MiB at once)."""
    buf = memoryview(bytearray(min(piece, nbytes)))
    while nbytes:
        got = fh.readinto(buf[:min(len(buf), nbytes)])
        if not got:
            raise EOFError("the member ends before the elements asked for")
        nbytes -= got


def mappable(member: Member, dtype=None) -> bool:
    """Whether `read_array` returns ``member`` as a map of the archive, with no copy: stored
    uncompressed, in C order, in ``dtype`` (default: any)."""
    return (not member.compressed and not member.fortran_order
            and (dtype is None or np.dtype(dtype) == member.dtype))


def read_array(member: Member, *, dtype=None, out: Optional[np.ndarray] = None,
               chunk_bytes: Optional[int] = None, progress: Optional[str] = None) -> np.ndarray:
    """The whole array in C order, as ``dtype`` (default: its own).

    A `mappable` member asked for without ``out`` comes back as a read-only memory map of
    the archive: nothing is read until it is used. Otherwise it is read slice by slice into
    ``out`` (a C-contiguous array of its shape, e.g. a ``.npy`` file opened with
    ``np.lib.format.open_memmap``) or into a new array, converting each slice. A 2-d array
    stored in Fortran order arrives column by column. ``progress`` names a progress bar
    (shown on a terminal only) for a slow read.
    """
    dtype = member.dtype if dtype is None else np.dtype(dtype)
    if out is None and mappable(member, dtype):
        return np.memmap(member.archive, dtype=member.dtype, mode="r", offset=member.offset,
                         shape=member.shape)
    if out is None:
        out = np.empty(member.shape, dtype)
    if tuple(out.shape) != tuple(member.shape) or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous array of {member.key}'s shape "
                         f"{member.shape}, got {out.shape}")
    if member.fortran_order and len(member.shape) > 2:
        raise ValueError(f"{member.key} is a {len(member.shape)}-d array in Fortran order; "
                         "only 1-d and 2-d ones are read")
    rows = member.shape[0] if member.shape else 1
    flat = out.reshape(-1)
    at = 0
    with tqdm(total=member.nbytes, desc=progress, unit="B", unit_scale=True, leave=False,
              disable=None if progress else True) as bar:
        for piece in read_flat(member, 0, member.size, chunk_bytes=chunk_bytes):
            if member.fortran_order and len(member.shape) == 2:
                # storage order is column by column: element k is out[k % rows, k // rows]
                done = 0
                while done < piece.size:
                    col, row = divmod(at + done, rows)
                    take = min(rows - row, piece.size - done)
                    out[row:row + take, col] = piece[done:done + take]
                    done += take
            else:
                flat[at:at + piece.size] = piece
            at += piece.size
            bar.update(piece.nbytes)
    return out


def edge_chunks(member: Member, *, chunk_edges: int = 1 << 22):
    """A function returning a fresh iterator of ``(src, dst)`` slices of an edge list stored
    as ``[2, E]`` (PyG's and OGB's ``edge_index``) or ``[E, 2]``, in edge order; ValueError for
    another shape. For a compressed ``[2, E]`` array the sources and destinations are read by
    two decompressors side by side (the second starts by skipping the first's half)."""
    shape = tuple(member.shape)
    if len(shape) != 2 or 2 not in shape:
        raise ValueError(f"{member.key} has shape {shape}, expected [2, E] or [E, 2]")
    rows_first = shape[0] == 2  # [2, 2] is read as PyG's [2, E]
    num_edges = shape[1] if rows_first else shape[0]
    # whether all sources are stored before all destinations (else they alternate)
    planes = rows_first != member.fortran_order
    chunk_bytes = chunk_edges * member.dtype.itemsize

    def chunks():
        if planes:
            yield from zip(read_flat(member, 0, num_edges, chunk_bytes=chunk_bytes),
                           read_flat(member, num_edges, num_edges, chunk_bytes=chunk_bytes))
            return
        for pairs in read_flat(member, 0, 2 * num_edges, chunk_bytes=2 * chunk_bytes):
            pairs = pairs.reshape(-1, 2)
            yield pairs[:, 0], pairs[:, 1]
    chunks.num_edges = num_edges
    return chunks
