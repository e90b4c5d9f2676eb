"""One tensor in the SSD tier: a file with a header, then rows in partition-major order.

Layout: a 4096-byte-aligned header (magic, format version, run id, rows, width, dtype, block
offsets), then ``rows x width`` values, so a partition's block is one contiguous range and reading
it is one sequential read. The data region is a plain C-order array: ``as_memmap()`` views it with
``np.memmap`` for inspection. A row that this epoch has not written yet reads as zeros through
the file's methods but may hold an earlier epoch's values on disk (`SSDFile.zero_lazily`).

I/O goes through ``pread`` / ``pwrite`` into NumPy buffers (``os.preadv`` / ``os.pwritev``, and
for row spans the native loops of ``jgrind/_kernels/spans.cc``) rather than through a mapping:
mapped pages count towards the process's resident memory, and the whole point of this tier is to
keep activations out of RAM.

Integrity: the file size and header are checked before every read (truncation, overwrites),
and the file keeps in memory one checksum per row (`jgrind.hostio.checksum.row_checksums`: CRC32C,
4 bytes a row). Every write records the checksums of the rows it changed (a whole block, or
the rows an addition added to or wrote back as zeros), and every read verifies the rows it
returns that hold this epoch's values, as does an addition for the rows it adds to. So a file
changed between a write and a read (activations between forward and backward, gradients
between their scatter-adds and their read) raises `StoreCorruptedError` instead of yielding
wrong gradients. A failed system call raises `StoreIOError`, a full disk `StoreFullError`.
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
from jgrind.hostio.checksum import row_checksums
from jgrind.plan.cost import COALESCE_BYTES, SPAN_PIECE_BYTES
from jgrind.hostio.rows import add_rows, take_rows

MAGIC = b"JGRINDST"
VERSION = 1
_ALIGN = 4096


SCRATCH_BYTES = SPAN_PIECE_BYTES  # span reads and read-add-writes go through pieces of at most this
# One scratch buffer per thread (the prefetcher reads while the writer scatter-adds), shared by
# all files and reused across calls: a fresh buffer per span would first-touch new pages, which
# costs more than the read itself when the page cache serves it.
_scratch = threading.local()


class StoreError(RuntimeError):
    """The store cannot be used: its directory (missing, read-only, too little free space), or
    its files' input and output (`StoreIOError`)."""


class StoreIOError(StoreError):
    """A read or write of a store file failed with an error of the disk or file system (EIO,
    ...) other than a full disk: the message names the file, the operation and the error."""


class StoreCorruptedError(RuntimeError):
    """An SSD store file changed behind jgrind's back (truncated, overwritten)."""


class StoreFullError(RuntimeError):
    """The store's disk ran out of space (or of the user's quota) during a run: the free space
    checked before the run was taken by something else since."""


_FULL = {errno.ENOSPC, errno.EDQUOT}


def _io_error(code: Optional[int], path: pathlib.Path, doing: str) -> Exception:
    """The exception for a failed system call on a store file, saying what to do:
    `StoreFullError` for a full disk, else `StoreIOError`."""
    if code in _FULL:
        return StoreFullError(f"the disk of the store ({path.parent.parent}) is full "
                              f"({os.strerror(code)}) while {doing} {path.name}: something else "
                              "took the space checked before the run; free space on it, raise "
                              "the host budget, or choose another disk (--store)")
    name = errno.errorcode.get(code, "") if code is not None else ""
    what = f"{os.strerror(code)} ({name})" if name else "an I/O error"
    return StoreIOError(f"{what} while {doing} store file {path}: the disk or its file system "
                        "failed; check the disk (e.g. dmesg) or choose another one (--store). "
                        "The run's store files are removed")


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
        # the checksum of every row that holds this epoch's value (`row_checksums`); the others'
        # are meaningless (`zero_lazily`)
        self._row_crc = np.zeros(self.rows, np.uint32)
        self._zeros_crc = row_checksums(np.zeros((1, self.width), self.dtype))[0]
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.pwrite(fd, head, 0)
            os.ftruncate(fd, self.size)  # sparse: no disk blocks until written
        except BaseException as err:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            if isinstance(err, OSError):
                raise _io_error(err.errno, self.path, "creating") from None
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
        try:
            actual = os.fstat(self.fd).st_size
        except OSError as err:
            raise _io_error(err.errno, self.path, "checking the size of") from None
        if actual != self.size:
            raise StoreCorruptedError(
                f"store file {self.path} is {actual} bytes, expected {self.size}: it was "
                "truncated or overwritten during the epoch; keep the store directory private "
                "to this run and check the disk")

    def _check_header(self) -> None:
        try:
            magic = os.pread(self.fd, 8, 0)
        except OSError as err:
            raise _io_error(err.errno, self.path, "reading the header of") from None
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
        self._row_crc[start:stop] = row_checksums(values)

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
            self._verify(out, np.arange(start, stop), current)
            out[~current] = 0
            return out
        self._pread(out, self.data_start + start * self.row_bytes)
        self._verify(out, np.arange(start, stop))
        return out

    def _verify(self, data: np.ndarray, rows: np.ndarray,
                current: Optional[np.ndarray] = None) -> None:
        """Check ``data[i]``, read from file row ``rows[i]``, against that row's checksum,
        where ``current[i]`` (default: every row)."""
        bad = row_checksums(data) != self._row_crc[rows]
        if current is not None:
            bad &= current
        if bad.any():
            raise self._mismatch(int(rows[np.argmax(bad)]))

    def _mismatch(self, row: int) -> StoreCorruptedError:
        block = int(np.searchsorted(self.offsets, row, side="right") - 1)
        return StoreCorruptedError(
            f"row {row} (block {block}) of store file {self.path} does not match what was "
            "written (checksum mismatch): the file was modified during the epoch or the disk "
            "returned bad data; keep the store directory private to this run and check the "
            "disk")

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
            self._verify_rows(out, rows, dst)
            self._zero_old(out, rows, dst)
            return out
        scratch = self._span_buffer(max(1, SCRATCH_BYTES // self.row_bytes))
        if self._native_spans(out):
            stats = self._spans_native("read", rows, out, dst, scratch,
                                       self._current if self._stale else None)
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
        self._verify_rows(out, rows, dst)
        self._zero_old(out, rows, dst)
        return out

    def _verify_rows(self, out: np.ndarray, rows: np.ndarray,
                     dst: Optional[np.ndarray]) -> None:
        """`_verify` for the Python read loops: ``out[i]`` (or ``out[dst[i]]``) holds file row
        ``rows[i]``; rows not current are not checked (they read as zeros)."""
        data = out[:rows.size] if dst is None else out[dst]
        self._verify(data, rows, self._current[rows] if self._stale else None)

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
                 src: Optional[np.ndarray] = None,
                 combine: Optional[Callable[[np.ndarray, np.ndarray, int, int], None]] = None
                 ) -> int:
        """``file[rows] += values`` (or ``values[src]``; rows ascending, unique): read, add,
        write per span (as `read_rows`). Returns how many of ``rows`` were read from disk: a
        span with no current row (`zero_lazily`) is added into zeros instead. The current rows
        added to are verified first, and get the checksums of their new values (rows between
        them go back as read, or as zeros, see `jgrind/_kernels/spans.cc`).

        ``combine(piece, at, i, j)``, when given, updates the rows ``piece[at]`` (file rows
        ``rows[i:j]``, as read) in place instead of the addition: rows kept in a storage dtype
        (`jgrind.engine.tiers.coded`) are decoded, added to and encoded again there."""
        self._check_size()
        scratch = self._span_buffer(max(1, SCRATCH_BYTES // self.row_bytes))
        start, row_bytes, reads, writes, read_rows = self.data_start, self.row_bytes, 0, 0, 0
        read_bytes = written_bytes = 0
        current = self._current if self._stale else None
        if combine is None and self._native_spans(values):
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
                added = rows[i:j] - c_lo
                if here is None or here.all():
                    self._pread(buf, offset, count=False)
                    self._verify(buf[added], rows[i:j])
                    reads, read_rows = reads + 1, read_rows + j - i
                    read_bytes += buf.nbytes
                elif here.any():  # some rows current, the others an old epoch's
                    self._pread(buf, offset, count=False)
                    self._verify(buf[added], rows[i:j], here[added])
                    buf[~here] = 0
                    reads, read_rows = reads + 1, read_rows + j - i
                    read_bytes += buf.nbytes
                else:
                    buf[...] = 0
                if combine is not None:
                    combine(buf, added, i, j)
                else:
                    add_rows(buf, added, values if src is not None else values[i:j],
                             src=None if src is None else src[i:j])
                self._pwrite(buf, offset, count=False)
                if here is not None:  # (a current gap row went back as read: its checksum holds)
                    self._row_crc[c_lo:c_hi][~here] = self._zeros_crc
                self._row_crc[rows[i:j]] = row_checksums(buf[added])
                writes, written_bytes = writes + 1, written_bytes + buf.nbytes
                if here is not None:
                    here[...] = True  # the whole piece went back: its gaps as zeros
        if self.on_io is not None and writes:
            self.on_io(ssd_read_ops=reads, ssd_write_ops=writes, ssd_file_read=read_bytes,
                       ssd_file_written=written_bytes)
        if current is not None:
            self._settle(np.unique(np.searchsorted(self.offsets, rows, side="right") - 1))
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
        ``[read calls, write calls, rows read, bytes read, bytes written, bad row]``. Both
        verify the current rows they read against the rows' checksums, and an addition records
        the checksums of the rows it writes back."""
        rows = np.ascontiguousarray(rows, np.int64)
        index = None if index is None else np.ascontiguousarray(index, np.int64)
        stats = np.zeros(6, np.int64)
        args = [self.fd, self.data_start, self.rows, self.width, rows.ctypes.data, rows.size,
                self._gap_rows(), table.ctypes.data, table.shape[0],
                None if index is None else index.ctypes.data, scratch.ctypes.data,
                scratch.shape[0]]
        lib = _kernels.library()
        fn = lib.jgrind_read_spans_f32 if kind == "read" else lib.jgrind_add_spans_f32
        rc = fn(*args, None if current is None else current.ctypes.data,
                self._row_crc.ctypes.data, stats.ctypes.data)
        self.bytes_read += int(stats[3])
        self.bytes_written += int(stats[4])
        if rc == 3:
            raise StoreCorruptedError(f"store file {self.path} ended inside a row span: it was "
                                      "truncated")
        if rc == 4:
            raise self._mismatch(int(stats[5]))
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
        try:
            done = os.preadv(self.fd, [out], offset)
            if done < nbytes:  # short read (a signal, or the file ended): finish or fail
                view = memoryview(out).cast("B")
                while done < nbytes:
                    n = os.preadv(self.fd, [view[done:]], offset + done)
                    if n == 0:
                        raise StoreCorruptedError(f"store file {self.path} ended early at byte "
                                                  f"{offset + done}: it was truncated")
                    done += n
        except OSError as err:
            raise _io_error(err.errno, self.path, "reading") from None
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
