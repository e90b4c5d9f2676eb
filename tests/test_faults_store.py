"""Faults of the SSD store's files during a run: rows changed on disk behind the run's back
(every row read back is checked against the checksum recorded when it was written, rows
written by gradient scatter-adds included) and failed reads and writes (EIO and the like),
which end in a `StoreError` naming the file and the operation, not an OSError traceback.

Each fault is tried on the native span loops (`jgrind/_kernels/spans.cc`) and on the Python
loops that replace them where the kernels do not build (forced here through
`SSDFile._native_spans`, or by hiding the kernels)."""

import errno
import os

import jax
import numpy as np
import optax
import pytest

from jgrind import _kernels, models
from jgrind.engine import StoreCorruptedError, StoreError, StoreIOError
from jgrind.engine.ssd import SSDFile
from jgrind.plan import policies
from jgrind.train import train

from helpers import community_graph, fails

WIDTH = 16
OFFSETS = np.array([0, 40, 100, 160])  # three blocks


@pytest.fixture(params=["native", "python", "no-kernels"])
def loops(request, monkeypatch):
    """Which span loops `SSDFile` runs: native, in Python (with the kernel's CRC32C), or in
    Python where no kernel built (row checksums by zlib)."""
    if request.param == "native":
        if not _kernels.available():
            pytest.skip(f"no native kernels: {_kernels.unavailable_reason()}")
    elif request.param == "python":
        monkeypatch.setattr(SSDFile, "_native_spans", lambda self, table: False)
    else:
        monkeypatch.setattr(_kernels, "library", lambda: None)
    return request.param


@pytest.fixture
def gradient_file(tmp_path):
    f = SSDFile(tmp_path / "gradient-1.bin", OFFSETS, WIDTH, b"run")
    yield f
    f.close()


def _values(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


def _flip_bit(f: SSDFile, row: int, column: int = 3, bit: int = 0) -> None:
    """Flip one bit of ``f[row, column]`` on disk (the lowest: a change of one ulp)."""
    offset = f.data_start + row * f.row_bytes + column * 4
    with open(f.path, "r+b") as raw:
        raw.seek(offset)
        byte = raw.read(1)[0]
        raw.seek(offset)
        raw.write(bytes([byte ^ (1 << bit)]))


ADDED = np.array([3, 5, 6, 41, 42, 90, 130])  # spans with gaps, across blocks


def test_rows_written_by_additions_are_checked_when_the_block_is_read(loops, gradient_file):
    f = gradient_file
    f.add_rows(ADDED, _values(ADDED.size, 1))
    f.add_rows(ADDED, _values(ADDED.size, 2))
    expected = f.read_block(1).copy()
    _flip_bit(f, 42)
    with pytest.raises(StoreCorruptedError, match=r"row 42 \(block 1\) of store file .*"
                                                  r"gradient-1.bin.*checksum mismatch"):
        f.read_block(1)
    _flip_bit(f, 42)  # back as it was: no false alarm after the check
    np.testing.assert_array_equal(f.read_block(1), expected)


def test_rows_an_addition_adds_to_are_checked_first(loops, gradient_file):
    """A damaged row must not be added to and written back with a fresh checksum."""
    f = gradient_file
    f.add_rows(ADDED, _values(ADDED.size, 1))
    _flip_bit(f, 5, bit=2)
    with pytest.raises(StoreCorruptedError, match="row 5 .*checksum mismatch"):
        f.add_rows(ADDED, _values(ADDED.size, 3))


def test_a_damaged_row_between_added_ones_keeps_its_old_checksum(loops, gradient_file):
    """Row 4, between added rows 3 and 5, goes back to the file as it was read: damaged, it
    stays damaged against its old checksum (not a new one of the damaged bytes), and the read
    that uses it finds out."""
    f = gradient_file
    f.add_rows(ADDED, _values(ADDED.size, 1))
    _flip_bit(f, 4, bit=2)
    f.add_rows(np.array([3, 5]), _values(2, 3))
    with pytest.raises(StoreCorruptedError, match="row 4 .*checksum mismatch"):
        f.read_block(0)


def test_halo_rows_read_by_spans_are_checked(loops, gradient_file):
    f = gradient_file
    f.write_block(0, _values(40, 4))
    f.add_rows(ADDED[ADDED >= 40], _values(4, 5))
    wanted = np.array([2, 3, 41, 90])
    _flip_bit(f, 90, column=WIDTH - 1, bit=7)
    for per_row in (False, True):
        with pytest.raises(StoreCorruptedError, match="row 90 .*checksum mismatch"):
            f.read_rows(wanted, per_row=per_row)
        out = np.zeros((10, WIDTH), np.float32)
        with pytest.raises(StoreCorruptedError, match="row 90 "):
            f.read_rows(wanted, per_row=per_row, out=out, dst=np.array([9, 0, 4, 7]))


def test_rows_from_before_the_file_was_zeroed_are_not_checked(loops, gradient_file):
    """Rows that do not hold this epoch's values read as zeros: damage to them is harmless,
    and rows written since are checked again."""
    f = gradient_file
    f.add_rows(ADDED, _values(ADDED.size, 1))
    f.zero_lazily()
    f.add_rows(np.array([41]), _values(1, 6))
    _flip_bit(f, 42)  # an old epoch's row, in a span written back as zeros
    _flip_bit(f, 90)  # an old epoch's row, not written this epoch
    block = f.read_block(1)
    np.testing.assert_array_equal(block[2:], 0)
    assert not f.read_rows(np.array([41, 90]))[1].any()
    _flip_bit(f, 41)
    with pytest.raises(StoreCorruptedError, match="row 41 "):
        f.read_block(1)


def test_checked_rows_hold_what_was_added(loops, gradient_file):
    """No false alarms: random additions over two epochs of a kept file, whole-block writes
    between them, read back in every way, equal a NumPy table."""
    f, rng = gradient_file, np.random.default_rng(7)
    for epoch in range(2):
        table = np.zeros((OFFSETS[-1], WIDTH), np.float32)
        if epoch:
            f.zero_lazily()
        table[100:160] = block = _values(60, 8 + epoch)
        f.write_block(2, block)
        for step in range(6):
            rows = np.unique(rng.choice(OFFSETS[-1], 25))
            src = rng.permutation(40)[:rows.size]
            values = _values(40, 20 + step)
            f.add_rows(rows, values, src=src)
            table[rows] += values[src]
        for b in range(3):
            np.testing.assert_array_equal(f.read_block(b), table[OFFSETS[b]:OFFSETS[b + 1]])
        every = np.arange(OFFSETS[-1])
        np.testing.assert_array_equal(f.read_rows(every[::3]), table[::3])
        np.testing.assert_array_equal(f.read_rows(every[1::7], per_row=True), table[1::7])


# -- a damaged gradient file during training ----------------------------------------------------
def _damage_the_second_gradient_addition(monkeypatch, damaged):
    """Make `SSDFile.add_rows` flip one bit of a row it just added, once, on its second call
    for a gradient file: mid-epoch, between the scatter-adds and the read."""
    real, calls = SSDFile.add_rows, []

    def add_then_damage(self, rows, values, src=None):
        read = real(self, rows, values, src)
        if self.path.name.startswith("gradient"):
            calls.append(self.path.name)
            if len(calls) == 2:
                _flip_bit(self, int(rows[rows.size // 2]), column=0, bit=1)
                damaged.append(self.path.name)
        return read

    monkeypatch.setattr(SSDFile, "add_rows", add_then_damage)


def test_training_stops_at_a_damaged_gradient_file(loops, tmp_path, monkeypatch):
    graph = community_graph(num_nodes=300)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    damaged = []
    _damage_the_second_gradient_addition(monkeypatch, damaged)
    with pytest.raises(StoreCorruptedError, match="gradient-.*checksum mismatch"):
        train(jax.random.key(0), graph, model, optax.adam(0.01), epochs=3, progress=False,
              policy=policies.ssd_offload(tmp_path), num_parts=3, host_budget=0)
    assert damaged
    assert list(tmp_path.iterdir()) == []


SMALL = ["--dataset", "csbm", "--set", "num_nodes=300", "--epochs", "2", "--no-progress"]


def test_the_command_line_stops_at_a_damaged_gradient_file(tmp_path, capsys, monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    damaged = []
    _damage_the_second_gradient_addition(monkeypatch, damaged)
    fails(capsys, ["train", *SMALL, "--policy", "ssd", "--store", str(store), "--parts", "3",
                   "--out", str(tmp_path / "run")], "checksum mismatch", "gradient-")
    assert damaged
    assert list(store.iterdir()) == []


# -- failed reads and writes ---------------------------------------------------------------------
def _failing_on(f: SSDFile, real, code=errno.EIO):
    """``real`` (an ``os`` call on a descriptor), failing with ``code`` on ``f``'s."""
    def call(fd, *args, **kwargs):
        if fd == f.fd:
            raise OSError(code, os.strerror(code))
        return real(fd, *args, **kwargs)
    return call


@pytest.mark.parametrize("call, doing", [("preadv", "reading"), ("pwritev", "writing"),
                                         ("fstat", "checking the size of")])
def test_a_failed_system_call_names_the_file_and_the_operation(gradient_file, monkeypatch,
                                                               call, doing):
    f = gradient_file
    f.write_block(0, _values(40))
    f.add_rows(ADDED, _values(ADDED.size))
    monkeypatch.setattr(SSDFile, "_native_spans", lambda self, table: False)
    monkeypatch.setattr(os, call, _failing_on(f, getattr(os, call)))
    moves = {"preadv": [lambda: f.read_block(0), lambda: f.read_rows(ADDED)],
             "pwritev": [lambda: f.write_block(0, _values(40))],
             "fstat": [lambda: f.read_block(0), lambda: f.read_rows(ADDED)]}[call]
    for move in [*moves, lambda: f.add_rows(ADDED, _values(ADDED.size))]:
        with pytest.raises(StoreIOError) as caught:
            move()
        message = str(caught.value)
        assert isinstance(caught.value, StoreError)
        for needle in (f"while {doing} store file {f.path}", "Input/output error (EIO)",
                       "check the disk"):
            assert needle in message, (needle, message)


def test_a_failed_read_or_write_in_the_native_span_loops_names_the_file(gradient_file):
    """The native loops return -errno; a descriptor opened for the other direction makes the
    kernel's own pread / pwrite fail (EBADF)."""
    if not _kernels.available():
        pytest.skip(f"no native kernels: {_kernels.unavailable_reason()}")
    f, fd = gradient_file, gradient_file.fd
    f.add_rows(ADDED, _values(ADDED.size))
    for flags, move in [(os.O_WRONLY, lambda: f.read_rows(ADDED)),
                        (os.O_RDONLY, lambda: f.add_rows(ADDED, _values(ADDED.size)))]:
        f.fd = os.open(f.path, flags)
        try:
            with pytest.raises(StoreIOError, match=f"(EBADF).*moving rows of store file "
                                                   f"{f.path}: .*check the disk"):
                move()
        finally:
            os.close(f.fd)
            f.fd = fd


def test_the_command_line_reports_a_failed_store_read_in_one_line(tmp_path, capsys,
                                                                  monkeypatch):
    store = tmp_path / "store"
    store.mkdir()
    real = os.preadv

    def eio_in_the_store(fd, buffers, offset):
        if str(store) in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", eio_in_the_store)
    fails(capsys, ["train", *SMALL, "--policy", "ssd", "--store", str(store), "--parts", "2",
                   "--out", str(tmp_path / "run")],
          "Input/output error (EIO) while reading store file", str(store), "check the disk")
    assert list(store.iterdir()) == []
