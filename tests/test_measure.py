"""Tests of jgrind.plan.measure: how a hardware profile is measured (the SSD figures with the
page cache out of the way, row rates on the store's own path, temporary files removed)."""

import dataclasses
import errno
import math
import os

import numpy as np
import pytest

from jgrind.plan import measure as measuring
from jgrind.plan.cost import SPAN_PIECE_BYTES
from jgrind.plan.profile import PROFILE_VERSION, ProfileError

RATES = ("matmul_flops", "spmm_rate", "step_latency", "sweep_step", "gather_bw", "scatter_add_bw",
         "copy_bw",
         "to_device_bw", "to_host_bw", "link_to_device_bw", "link_to_host_bw",
         "pageable_to_host_bw", "ssd_read_bw", "ssd_write_bw", "ssd_latency")


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One quick measurement shared by the tests (about half a second), and where it ran."""
    where = tmp_path_factory.mktemp("store")
    return measuring.measure(where, quick=True), where


def test_measure_gives_positive_figures_and_removes_its_files(measured):
    got, where = measured
    for name in RATES:
        value = getattr(got, name)
        assert math.isfinite(value) and value > 0, (name, value)
    assert 0 <= got.overlap <= 1
    assert len(got.fused_steps) == 2
    for nodes, edges, seconds in got.fused_steps:
        assert nodes > 0 and edges > nodes and math.isfinite(seconds) and seconds > 0
    assert got.device_free > 0 and got.host_free > 0 and got.ssd_free > 0
    assert got.version == PROFILE_VERSION and got.directory == str(where.resolve())
    # the sparse product at two input sizes, the cached one the smaller
    assert got.spmm_cached_rate > 0 and 0 < got.spmm_cached_bytes < got.spmm_bytes
    assert got.machine["cores"] == os.cpu_count() and got.machine["backend"]
    assert list(where.iterdir()) == []


def test_device_to_host_is_timed_on_the_engines_path(monkeypatch):
    """The profile's device -> host rate times the engine's own copy (`jgrind.hostio.transfers`):
    through ``pinned_host`` memory where the engine copies there, a view on the CPU backend."""
    from jgrind.hostio import transfers
    made = []
    plain = transfers.to_host

    def to_host(values, where):
        made.append(where)
        return plain(values, where)
    monkeypatch.setattr(transfers, "to_host", to_host)
    monkeypatch.setattr(transfers, "host_copies", transfers.pinned_host)  # as off the CPU
    sizes = dataclasses.replace(measuring._QUICK, repeats=1)
    measuring._transfer_bw(sizes)
    assert made and all(w is not None and w.memory_kind == "pinned_host" for w in made)
    to_device, to_host_rate, pageable = measuring.link_rates(1 << 20, repeats=1)
    assert min(to_device, to_host_rate, pageable) > 0


def test_measure_removes_its_file_when_a_measurement_fails(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(measuring, "_page_cache", broken)  # runs while its file exists
    with pytest.raises(RuntimeError, match="disk on fire"):
        measuring.measure(tmp_path, quick=True)
    assert list(tmp_path.iterdir()) == []


def test_measure_rejects_bad_directories(tmp_path):
    with pytest.raises(ProfileError, match="does not exist"):
        measuring.measure(tmp_path / "nope", quick=True)
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(ProfileError, match="not a directory"):
        measuring.measure(afile, quick=True)
    if os.geteuid() != 0:  # root may write anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ProfileError, match="not writable"):
            measuring.measure(locked, quick=True)


def test_ssd_reads_keep_the_page_cache_out_of_the_way(tmp_path, monkeypatch):
    """O_DIRECT where the filesystem takes it, else fadvise(DONTNEED) before every pass."""
    name = tmp_path / "data"
    name.write_bytes(os.urandom(1 << 20))
    advice = []
    real_fadvise, real_open = os.posix_fadvise, os.open
    monkeypatch.setattr(os, "posix_fadvise", lambda fd, o, n, a: (advice.append(a),
                                                                  real_fadvise(fd, o, n, a)))

    def no_direct(path, flags, *args):
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_direct)
    with measuring._UncachedReader(str(name), 1 << 18) as reader:
        assert not reader.direct
        assert reader.read(1 << 20) > 0 and advice == [os.POSIX_FADV_DONTNEED]
        reader.read(1 << 20)
        assert advice.count(os.POSIX_FADV_DONTNEED) == 2


def test_page_cache_rates_are_taken_as_the_ssd_tier_moves_data(tmp_path, monkeypatch):
    """Reads in MiB pieces through one reused buffer and writes over pages already written,
    so that neither rate folds in per-call costs (charged separately, per span) nor first
    page allocations (the engine rewrites its files): 64 KiB reads into fresh buffers and
    writes to a truncated file read as half the engine's rates."""
    name = tmp_path / "data"
    size = 4 * SPAN_PIECE_BYTES
    name.write_bytes(os.urandom(size))
    reads, writes, real_preadv, real_pwrite = [], [], os.preadv, os.pwrite

    def preadv(fd, buffers, offset):
        reads.append((id(buffers[0]), memoryview(buffers[0]).nbytes))
        return real_preadv(fd, buffers, offset)

    def pwrite(fd, data, offset):
        writes.append((offset, memoryview(data).nbytes, os.fstat(fd).st_size))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "pwrite", pwrite)
    sizes = dataclasses.replace(measuring._QUICK, ssd_bytes=size, repeats=2, random_reads=8)
    fd = os.open(name, os.O_RDWR)
    try:
        write_bw, read_bw, latency = measuring._page_cache(fd, str(name), sizes,
                                                          np.random.default_rng(0))
    finally:
        os.close(fd)
    assert write_bw > 0 and read_bw > 0 and latency > 0
    pieces = [r for r in reads if r[1] != measuring._PAGE]  # less the 4 KiB latency reads
    assert {n for _, n in pieces} == {SPAN_PIECE_BYTES}
    assert len({buffer for buffer, _ in pieces}) == 1
    assert writes and all(n == SPAN_PIECE_BYTES and offset + n <= file_size
                          for offset, n, file_size in writes)
    assert os.path.getsize(name) == size


def test_row_rates_are_timed_on_the_store_path_at_two_widths(monkeypatch):
    """Gathers go through `jgrind.hostio.rows.take_rows` into scattered output rows and scatter-adds
    through `add_rows`, as the store moves halo rows, at two widths: narrow rows pay a per-row
    cost that a rate per byte alone misses."""
    calls = []
    real_take, real_add = measuring.take_rows, measuring.add_rows

    def take(table, idx, out=None, dst=None):
        calls.append(("take", table.shape[1], dst is not None))
        return real_take(table, idx, out=out, dst=dst)

    def add(table, idx, values, src=None):
        calls.append(("add", table.shape[1], src is not None))
        return real_add(table, idx, values, src=src)

    monkeypatch.setattr(measuring, "take_rows", take)
    monkeypatch.setattr(measuring, "add_rows", add)
    (gather_bw, gather_row), (add_bw, add_row) = measuring._row_rates(
        measuring._QUICK, np.random.default_rng(0))
    rows, width, _ = measuring._QUICK.gather
    assert {c for c in calls} == {("take", width // 8, True), ("take", width, True),
                                  ("add", width // 8, True), ("add", width, True)}
    assert gather_bw > 0 and add_bw > 0 and gather_row >= 0 and add_row >= 0


def test_measured_profile_has_per_row_costs(measured):
    got, _ = measured
    # (a quick measurement is too small to promise a positive per-row cost on a busy machine)
    assert got.gather_row_seconds >= 0 and got.scatter_add_row_seconds >= 0
    assert got.step_latency > 0


def test_device_calls_are_timed_as_the_engine_compiles_them():
    """The profile's device-tier calls (`measure._device_call`) are the device tier's own
    programs on a table of a layer's width (`DEVICE_CALL_ROWS`): compiled, each is split
    across XLA's CPU threads exactly as the engine's take, set and add on a 150k x 128 table
    are. (They were timed on an 8-wide table, whose calls XLA runs on one thread; the
    engine's, split and waiting for a thread pool its steps keep busy, took ten times the
    price.)"""
    import re

    import jax
    import jax.numpy as jnp
    from jgrind.engine.tiers import device

    def split(fn, table_shape, rows):
        shapes = (jax.ShapeDtypeStruct(table_shape, jnp.float32),
                  jax.ShapeDtypeStruct((rows,), jnp.int32),
                  jax.ShapeDtypeStruct((rows, table_shape[1]), jnp.float32))
        args = shapes[:2] if fn in (device.table_take, measuring._device_take) else shapes
        text = fn.lower(*args).compile().as_text()
        return re.findall(r'outer_dimension_partitions":\[([^\]]*)\]', text)

    table_rows, width, rows = measuring.DEVICE_CALL_ROWS
    engine_table = (150_000, 128)
    for measured_fn, engine_fn in ((measuring._device_take, device.table_take),
                                   (measuring._device_set, device.table_set),
                                   (measuring._device_add, device.table_add)):
        assert split(measured_fn, (table_rows, width), rows) == split(engine_fn, engine_table,
                                                                      rows)


def test_work_on_a_thread_is_timed_from_before_the_thread_starts(monkeypatch):
    """A thread may finish its calls before its starter gets the join back (a loaded machine
    deschedules the starter): the time still counts them, so the reads-beside-writes
    measurement sizes its call counts by real call times, not by a join that waited for
    nothing (which made its counts run into the thousands and one quick profile take 30 s)."""
    import time

    real = measuring._on_thread

    def finished_before_the_join(work, n):
        real(work, n)()  # the thread's calls are all done when the starter resumes
        return lambda: None

    monkeypatch.setattr(measuring, "_on_thread", finished_before_the_join)
    assert measuring._timed_on_thread(lambda: time.sleep(0.01), 3) >= 0.03
