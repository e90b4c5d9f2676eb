"""One tensor in the SSD tier: a file with a header, then rows in partition-major order.

Layout: a 4096-byte-aligned header (magic, format version, run id, rows, width, dtype, block
offsets), then ``rows x width`` values, so a partition's block is one contiguous range and reading
it is one sequential read. The data region is a plain C-order array: ``as_memmap()`` views it with
``np.memmap`` for inspection. A row that this epoch has not written yet reads as zeros through
the file's methods but may hold an earlier epoch's values on disk (`SSDFile.zero_lazily`).

I/O goes through ``pread`` / ``pwrite`` into NumPy buffers (``os.preadv`` / ``os.pwritev``, and
for row spans the native loops of ``jgrind/_kernels/spans.cc``) rather than through a mapping:
mapped pages count towards the process's resident memory, and the whole point of this tier is to
keep activations out of RAM. Integrity: the file size is checked before every read (truncation),
and every whole-block write records a checksum (`jgrind.checksum`: CRC32C) that whole-block
reads verify (corruption between the forward write and the backward read raises instead of
yielding wrong gradients).
"""

from __future__ import annotations

import errno
import os
import pathlib
import struct
import threading
from typing import Callable, Optional

import numpy as np

from jgrind import _kernels
from jgrind.checksum import checksum
from jgrind.plan.cost import COALESCE_BYTES, SPAN_PIECE_BYTES
from jgrind.rows import add_rows, take_rows

MAGIC = b"JGRINDST"
VERSION = 1
_ALIGN = 4096


SCRATCH_BYTES = SPAN_PIECE_BYTES  # span reads and read-add-writes go through pieces of at most this
# One scratch buffer per thread (the prefetcher reads while the writer scatter-adds), shared by
# all files and reused across calls: a fresh buffer per span would first-touch new pages, which
# costs more than the read itself when the page cache serves it.
_scratch = threading.local()


class StoreCorruptedError(RuntimeError):
    """An SSD store file changed behind jgrind's back (truncated, overwritten)."""


class StoreFullError(RuntimeError):
    """The store's disk ran out of space (or of the user's quota) during a run: the free space
    checked before the run was taken by something else since."""


_FULL = {errno.ENOSPC, errno.EDQUOT}


def _io_error(code: int, path: pathlib.Path, doing: str) -> Exception:
    """The exception for a failed system call on a store file: `StoreFullError` for a full
    disk, with what to do, else the OSError itself."""
    if code in _FULL:
        return StoreFullError(f"the disk of the store ({path.parent.parent}) is full "
                              f"({os.strerror(code)}) while {doing} {path.name}: something else "
                              "took the space checked before the run; free space on it, raise "
                              "the host budget, or choose another disk (--store)")
    return OSError(code, f"{os.strerror(code)} while {doing} store file {path}", str(path))


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class SSDFile:
    """A ``[rows, width]`` float32 tensor on disk whose block ``b`` is rows
    ``offsets[b]:offsets[b+1]``."""

    def __init__(self, path: pathlib.Path, offsets: np.ndarray, width: int, run_id: bytes,
                 dtype=np.float32, on_io: Optional[Callable[..., None]] = None):
        self.path = pathlib.Path(path)
        self.offsets = np.asarray(offsets, np.int64)
        self.rows = int(self.offsets[-1])
        self.width = int(width)
        self.dtype = np.dtype(dtype)
        self.row_bytes = self.width * self.dtype.itemsize
        head = struct.pack("<8sI16sqqq", MAGIC, VERSION, run_id[:16].ljust(16, b"\0"),
                           self.rows, self.width, self.offsets.size) + self.offsets.tobytes()
        self.data_start = _align(len(head))
        self.size = self.data_start + self.rows * self.row_bytes
        self._crc: dict[int, Optional[int]] = {}
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.pwrite(fd, head, 0)
            os.ftruncate(fd, self.size)  # sparse: no disk blocks until written
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        self.fd = fd
        self.bytes_read = 0
        self.bytes_written = 0
        # called as on_io(ssd_read_ops=calls, ssd_file_read=bytes) and on_io(ssd_write_ops=...,
        # ssd_file_written=...): the calls made and the bytes they passed, gap rows included
        self.on_io = on_io
        # The blocks that still hold old values (or a new file's holes), and per row whether it
        # holds its current value (a row that does not reads as zeros): see `zero_lazily`.
        self._stale: set[int] = set()
        self._current: Optional[np.ndarray] = None
        self.zero_lazily()  # a new file's rows are zeros too: its first additions read nothing

    # -- reuse --------------------------------------------------------------------------------
    def zero_lazily(self) -> None:
        """Make every row read as zeros again without writing anything now.

        A file kept from one epoch to the next is rewritten in pages the page cache already
        holds; a new file's pages are allocated (and zeroed by the kernel) again. A new file
        starts in this state too. Which rows hold current values is kept per row: a whole-block
        write makes a block current, an addition makes current every row of the spans it
        rewrites (rows between the added ones are written back as zeros), and reads show a row
        that is not current as zeros. So no zeros are written on their own, and an addition
        whose span holds no current row adds into zeros without reading the disk."""
        self._stale = set(range(self.offsets.size - 1))
        if self._current is None:
            self._current = np.zeros(self.rows, bool)
        else:
            self._current.fill(False)
        self._crc.clear()

    def _settle(self, blocks) -> None:
        """Forget the staleness of those ``blocks`` whose every row is now current."""
        for b in blocks:
            b = int(b)
            if b in self._stale and self._current[self.offsets[b]:self.offsets[b + 1]].all():
                self._stale.discard(b)

    def _zero_old(self, out: np.ndarray, rows: np.ndarray,
                  dst: Optional[np.ndarray] = None) -> None:
        """Zero the rows of ``out`` (``out[i]``, or ``out[dst[i]]``) read from ``rows`` that do
        not hold current values (the disk has an earlier epoch's there, or a new file's hole)."""
        if self._stale and rows.size:
            old = ~self._current[rows]
            if old.any():
                out[np.flatnonzero(old) if dst is None else dst[old]] = 0

    # -- integrity ----------------------------------------------------------------------------
    def _check_size(self) -> None:
        actual = os.fstat(self.fd).st_size
        if actual != self.size:
            raise StoreCorruptedError(
                f"store file {self.path} is {actual} bytes, expected {self.size}: it was "
                "truncated or overwritten during the epoch; keep the store directory private "
                "to this run and check the disk")

    def _check_header(self) -> None:
        magic = os.pread(self.fd, 8, 0)
        if magic != MAGIC:
            raise StoreCorruptedError(f"store file {self.path} lost its header (found "
                                      f"{magic!r}): it was overwritten during the epoch")

    # -- whole blocks -------------------------------------------------------------------------
    def write_block(self, b: int, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, self.dtype)
        start, stop = self.offsets[b], self.offsets[b + 1]
        if values.shape != (stop - start, self.width):
            raise ValueError(f"block {b} of {self.path.name} has shape "
                             f"{(stop - start, self.width)}, got {values.shape}")
        self._pwrite(values, self.data_start + start * self.row_bytes)
        if b in self._stale:
            self._current[start:stop] = True
            self._stale.discard(b)
        self._crc[b] = checksum(values)

    def read_block(self, b: int, out: Optional[np.ndarray] = None) -> np.ndarray:
        start, stop = self.offsets[b], self.offsets[b + 1]
        out = np.empty((stop - start, self.width), self.dtype) if out is None else out
        self._check_size()
        self._check_header()
        if b in self._stale:
            current = self._current[start:stop]
            if not current.any():  # nothing written since `zero_lazily`
                out[...] = 0
                return out
            self._pread(out, self.data_start + start * self.row_bytes)
            out[~current] = 0
            return out
        self._pread(out, self.data_start + start * self.row_bytes)
        expected = self._crc.get(b)
        if expected is not None and checksum(out) != expected:
            raise StoreCorruptedError(
                f"block {b} of store file {self.path} does not match what was written "
                "(checksum mismatch): the file was modified during the epoch or the disk "
                "returned bad data")
        return out

    # -- rows (halo reads, gradient accumulation) ---------------------------------------------
    def read_rows(self, rows: np.ndarray, per_row: bool = False,
                  out: Optional[np.ndarray] = None,
                  dst: Optional[np.ndarray] = None) -> np.ndarray:
        """Rows ``rows`` (ascending) as ``[len(rows), width]``, or into ``out[dst]`` when
        given: one read per span of rows whose gaps are under `COALESCE_BYTES` (a read call
        costs about as much as that many bytes), or one read per row with ``per_row`` (the
        naive scheme)."""
        if out is None:
            out, dst = np.empty((rows.size, self.width), self.dtype), None
        self._check_size()
        if per_row:
            for lo, hi, i in _singles(rows):
                d = i if dst is None else int(dst[i])
                self._pread(out[d:d + 1], self.data_start + lo * self.row_bytes)
            self._zero_old(out, rows, dst)
            return out
        scratch = self._span_buffer(max(1, SCRATCH_BYTES // self.row_bytes))
        if self._native_spans(out):
            stats = self._spans_native("read", rows, out, dst, scratch)
            if self.on_io is not None and stats[0]:
                self.on_io(ssd_read_ops=int(stats[0]), ssd_file_read=int(stats[3]))
            self._zero_old(out, rows, dst)
            return out
        self._check_rows(rows)
        # The loop below runs once per span (hundreds of thousands per sweep), so it keeps its
        # per-iteration work small: one scratch buffer for the call, the counters added once.
        start, row_bytes, calls, nbytes = self.data_start, self.row_bytes, 0, 0
        for lo, hi, first, last in _spans(rows, self._gap_rows()):
            if dst is None and hi - lo == last - first:
                # a run of consecutive rows: read straight into out
                self._pread(out[first:last], start + lo * row_bytes, count=False)
                calls, nbytes = calls + 1, nbytes + (hi - lo) * row_bytes
                continue
            for c_lo, c_hi, i, j in self._pieces(rows, lo, hi, first, last):
                buf = scratch[: c_hi - c_lo]
                self._pread(buf, start + c_lo * row_bytes, count=False)
                if dst is None:
                    take_rows(buf, rows[i:j] - c_lo, out=out[i:j])
                else:
                    take_rows(buf, rows[i:j] - c_lo, out=out, dst=dst[i:j])
                calls, nbytes = calls + 1, nbytes + buf.nbytes
        if self.on_io is not None and calls:
            self.on_io(ssd_read_ops=calls, ssd_file_read=nbytes)
        self._zero_old(out, rows, dst)
        return out

    def _pieces(self, rows: np.ndarray, lo: int, hi: int, first: int, last: int):
        """The span ``[lo, hi)`` (holding ``rows[first:last]``) in pieces of at most
        `SCRATCH_BYTES`: ``(piece_lo, piece_hi, i, j)`` with ``rows[i:j]`` inside the piece."""
        step = max(1, SCRATCH_BYTES // self.row_bytes)
        if hi - lo <= step:
            return [(lo, hi, first, last)]
        cuts = np.arange(lo, hi, step)
        bounds = np.searchsorted(rows[first:last], np.append(cuts[1:], hi)) + first
        starts = np.concatenate([[first], bounds[:-1]])
        return [(int(c), int(min(c + step, hi)), int(i), int(j))
                for c, i, j in zip(cuts, starts, bounds) if j > i]

    def _span_buffer(self, rows: int) -> np.ndarray:
        """``[rows, width]`` scratch rows owned by the calling thread, valid until its next
        call (rows <= `SCRATCH_BYTES` worth, see `_pieces`)."""
        nbytes = rows * self.row_bytes
        raw = getattr(_scratch, "raw", None)
        if raw is None or raw.size < nbytes:
            raw = _scratch.raw = np.empty(max(nbytes, SCRATCH_BYTES), np.uint8)
        return raw[:nbytes].view(self.dtype).reshape(rows, self.width)

    def add_rows(self, rows: np.ndarray, values: np.ndarray,
                 src: Optional[np.ndarray] = None) -> int:
        """``file[rows] += values`` (or ``values[src]``; rows ascending, unique): read, add,
        write per span (as `read_rows`). Returns how many of ``rows`` were read from disk: a
        span with no current row (`zero_lazily`) is added into zeros instead. Blocks touched
        this way lose their checksum (it would need the whole block)."""
        self._check_size()
        scratch = self._span_buffer(max(1, SCRATCH_BYTES // self.row_bytes))
        start, row_bytes, reads, writes, read_rows = self.data_start, self.row_bytes, 0, 0, 0
        read_bytes = written_bytes = 0
        current = self._current if self._stale else None
        if self._native_spans(values):
            stats = self._spans_native("add", rows, values, src, scratch, current)
            reads, writes, read_rows = int(stats[0]), int(stats[1]), int(stats[2])
            read_bytes, written_bytes = int(stats[3]), int(stats[4])
            spans = ()
        else:
            self._check_rows(rows)
            spans = _spans(rows, self._gap_rows())
        for lo, hi, first, last in spans:
            for c_lo, c_hi, i, j in self._pieces(rows, lo, hi, first, last):
                buf = scratch[: c_hi - c_lo]
                offset = start + c_lo * row_bytes
                here = None if current is None else current[c_lo:c_hi]
                if here is None or here.all():
                    self._pread(buf, offset, count=False)
                    reads, read_rows = reads + 1, read_rows + j - i
                    read_bytes += buf.nbytes
                elif here.any():  # some rows current, the others an old epoch's
                    self._pread(buf, offset, count=False)
                    buf[~here] = 0
                    reads, read_rows = reads + 1, read_rows + j - i
                    read_bytes += buf.nbytes
                else:
                    buf[...] = 0
                add_rows(buf, rows[i:j] - c_lo, values if src is not None else values[i:j],
                         src=None if src is None else src[i:j])
                self._pwrite(buf, offset, count=False)
                writes, written_bytes = writes + 1, written_bytes + buf.nbytes
                if here is not None:
                    here[...] = True  # the whole piece went back: its gaps as zeros
        if self.on_io is not None and writes:
            self.on_io(ssd_read_ops=reads, ssd_write_ops=writes, ssd_file_read=read_bytes,
                       ssd_file_written=written_bytes)
        blocks = np.unique(np.searchsorted(self.offsets, rows, side="right") - 1)
        for b in blocks:
            self._crc[int(b)] = None
        if current is not None:
            self._settle(blocks)
        return read_rows

    def _check_rows(self, rows: np.ndarray) -> None:
        """The Python span loops' check of what the native ones check row by row."""
        if rows.size and (rows[0] < 0 or rows[-1] >= self.rows or np.any(np.diff(rows) < 0)):
            raise IndexError(f"rows of {self.path.name}: not ascending or outside "
                             f"[0, {self.rows})")

    # -- native span loops --------------------------------------------------------------------
    def _native_spans(self, table: np.ndarray) -> bool:
        """Whether the span loops can run natively (`jgrind/_kernels/spans.cc`) on ``table``
        (the output of a read, the values of an addition)."""
        return (self.dtype == np.float32 and table.dtype == np.float32 and table.ndim == 2
                and table.shape[1] == self.width and table.flags.c_contiguous
                and _kernels.library() is not None)

    def _spans_native(self, kind: str, rows: np.ndarray, table: np.ndarray,
                      index: Optional[np.ndarray], scratch: np.ndarray,
                      current: Optional[np.ndarray] = None) -> np.ndarray:
        """Run the native ``kind`` ("read" or "add") span loop; its counters
        ``[read calls, write calls, rows read, bytes read, bytes written]``."""
        rows = np.ascontiguousarray(rows, np.int64)
        index = None if index is None else np.ascontiguousarray(index, np.int64)
        stats = np.zeros(5, np.int64)
        args = [self.fd, self.data_start, self.rows, self.width, rows.ctypes.data, rows.size,
                self._gap_rows(), table.ctypes.data, table.shape[0],
                None if index is None else index.ctypes.data, scratch.ctypes.data,
                scratch.shape[0]]
        lib = _kernels.library()
        if kind == "read":
            rc = lib.jgrind_read_spans_f32(*args, stats.ctypes.data)
        else:
            rc = lib.jgrind_add_spans_f32(
                *args, None if current is None else current.ctypes.data, stats.ctypes.data)
        self.bytes_read += int(stats[3])
        self.bytes_written += int(stats[4])
        if rc == 3:
            raise StoreCorruptedError(f"store file {self.path} ended inside a row span: it was "
                                      "truncated")
        if rc < 0:
            raise _io_error(-rc, self.path, "moving rows of")
        if rc == 1:
            raise IndexError(f"rows of {self.path.name}: not ascending or outside "
                             f"[0, {self.rows})")
        if rc == 2:
            raise IndexError(f"rows of {self.path.name}: an index into the "
                             f"{'output' if kind == 'read' else 'values'} is out of range")
        return stats

    # -- raw I/O ------------------------------------------------------------------------------
    def _pread(self, out: np.ndarray, offset: int, count: bool = True) -> None:
        """Fill ``out`` (C-contiguous) from ``offset``. ``count=False``: the caller reports the
        call to ``on_io`` itself (span loops add their calls up once)."""
        nbytes = out.nbytes
        done = os.preadv(self.fd, [out], offset)
        if done < nbytes:  # short read (a signal, or the file ended): finish or fail
            view = memoryview(out).cast("B")
            while done < nbytes:
                n = os.preadv(self.fd, [view[done:]], offset + done)
                if n == 0:
                    raise StoreCorruptedError(f"store file {self.path} ended early at byte "
                                              f"{offset + done}: it was truncated")
                done += n
        self.bytes_read += nbytes
        if count and self.on_io is not None:
            self.on_io(ssd_read_ops=1, ssd_file_read=nbytes)

    def _pwrite(self, values: np.ndarray, offset: int, count: bool = True) -> None:
        values = np.ascontiguousarray(values)
        nbytes = values.nbytes
        try:
            done = os.pwritev(self.fd, [values], offset)
            if done < nbytes:
                view = memoryview(values).cast("B")
                while done < nbytes:
                    done += os.pwritev(self.fd, [view[done:]], offset + done)
        except OSError as err:
            raise _io_error(err.errno, self.path, "writing") from None
        self.bytes_written += nbytes
        if count and self.on_io is not None:
            self.on_io(ssd_write_ops=1, ssd_file_written=nbytes)

    def as_memmap(self) -> np.memmap:
        return np.memmap(self.path, self.dtype, "r", self.data_start, (self.rows, self.width))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


    def _gap_rows(self) -> int:
        return COALESCE_BYTES // self.row_bytes


def _spans(rows: np.ndarray, gap_rows: int):
    """``(first_row, last_row + 1, start, end)`` for each span of ``rows[start:end]`` in which
    consecutive rows are at most ``gap_rows`` rows apart (0: runs of consecutive rows)."""
    if rows.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) > gap_rows + 1) + 1
    starts = np.concatenate([[0], breaks])
    ends = np.concatenate([breaks, [rows.size]])
    return [(int(rows[s]), int(rows[e - 1]) + 1, int(s), int(e)) for s, e in zip(starts, ends)]


def _singles(rows: np.ndarray):
    """``(row, row + 1, index into rows)`` for every row on its own."""
    return [(int(r), int(r) + 1, i) for i, r in enumerate(rows)]
