"""Storage dtypes converted on the device (`jgrind.hostio.device_codecs`): the same bits as the
host codecs, the same epoch as converting on the host, the stored form counted as what crosses
between host and device; and the SSD tier's row spans coalesced at the stored width."""

import jax
import numpy as np
import optax
import pytest

from jgrind import generators, models
from jgrind.engine import OutOfCore
from jgrind.engine.store import Store
from jgrind.engine.tiers import coded
from jgrind.hostio import codecs, device_codecs
from jgrind.partition import contiguous
from jgrind.plan import Fate, policies
from jgrind.plan.cost import COALESCE_BYTES
from jgrind.plan.fates import ACTIVATION

LOSSY = [codecs.bfloat16(), codecs.float16(), codecs.int8(), codecs.int8(stochastic=True)]
# XLA's CPU backend flushes float32 subnormals (under 2**-126) to zero in arithmetic; NumPy
# keeps them. An int8 row whose largest magnitude is under 127 * 2**-126 has a subnormal scale
# (or subnormal values), so its device bits differ from the host's there: only those rows.
SUBNORMAL_SCALE = 127 * np.finfo(np.float32).tiny


def _block(width: int, rows: int = 64) -> np.ndarray:
    """Normal rows of many magnitudes, and the edge cases each codec handles: zeros of both
    signs, non-finite values, values under each format's smallest, float16's overflow,
    float32 subnormals."""
    rng = np.random.default_rng(width)
    x = (rng.standard_normal((rows, width)) * rng.uniform(1e-3, 100, (rows, 1))).astype(
        np.float32)
    x[1] = 0
    x[2, 0], x[3, 0], x[4, 0], x[5, 0] = np.inf, np.nan, -np.inf, -np.nan
    x[6, 0], x[7, 0], x[8, 0] = 70000, 65519, 65520       # float16's largest and beyond
    x[9, 0], x[10, 0], x[11, 0] = -1e-30, 1e-6, -3e-5     # under float16's (sub)normals
    x[12, 0] = -0.0
    x[13] = 1e-37 * rng.standard_normal(width)            # int8: 127 / largest overflows
    x[14, 0] = 1e-40                                      # float32 subnormals
    x[15] = 1e-42
    return x


@pytest.mark.parametrize("codec", LOSSY, ids=lambda c: c.name)
@pytest.mark.parametrize("width", [1, 3, 8, 37])
def test_the_device_codec_computes_the_host_codecs_bits(codec, width):
    x = _block(width)
    seed = (4, 1, 2, 7, 1)
    host = codec.encode(x, seed=seed).view(np.uint32)
    device = np.asarray(device_codecs.encode(codec, jax.device_put(x), seed))
    assert device.dtype == np.uint32 and device.shape == host.shape
    same = (host == device).all(axis=1)
    back_host = codec.decode(host.view(np.float32), np.empty_like(x))
    back_device = np.asarray(device_codecs.decode(codec, host, width))
    same_back = (back_host.view(np.uint32) == back_device.view(np.uint32)).all(axis=1)
    if isinstance(codec, codecs.Int8):
        largest = np.abs(x).max(axis=1)
        flushed = (largest > 0) & (largest < SUBNORMAL_SCALE)
        assert set(np.flatnonzero(flushed)) <= {13, 14, 15}
        same, same_back = same | flushed, same_back | flushed
    assert same.all(), f"rows {np.flatnonzero(~same)} differ"
    assert same_back.all(), f"decoded rows {np.flatnonzero(~same_back)} differ"


def test_stochastic_rounding_draws_the_same_numbers_in_any_chunking(monkeypatch):
    """The host codec converts a block in chunks of rows; the device in one piece; the hash
    of (seed, row, column) makes the numbers independent of that."""
    codec = codecs.int8(stochastic=True)
    x = _block(37, rows=300)[20:]
    whole = codec.encode(x, seed=(3,))
    monkeypatch.setattr(codecs, "CHUNK_BYTES", 4 * 37 * 7)  # 7 rows a chunk
    assert np.array_equal(codec.encode(x, seed=(3,)).view(np.uint32), whole.view(np.uint32))
    assert not np.array_equal(codec.encode(x, seed=(4,)).view(np.uint32),
                              whole.view(np.uint32))


# -- the store ---------------------------------------------------------------------------------
@pytest.mark.parametrize("codec", LOSSY, ids=lambda c: c.name)
def test_the_link_carries_the_stored_form(codec, tmp_path):
    """A step output written to a coded tier crosses to the host as its stored words, and a
    read or gather for a step is stored words sent and decoded on the device: the counters
    (and the buffers) hold the stored bytes."""
    rows, width, padded = np.array([6, 9]), 37, 16
    words = codec.words(width)
    rng = np.random.default_rng(0)
    values = [rng.standard_normal((padded, width)).astype(np.float32) for _ in rows]
    with Store(rows, tmp_path, host_cache_bytes=0, ssd_bytes_needed=1 << 16) as store:
        table = store.table(ACTIVATION, 1, width, [Fate.HOST, Fate.SSD], codec=codec)
        assert not table.stored_on_host(0) and not table.held_on_host(1)
        for b in range(2):
            table.write(b, jax.device_put(values[b]))
        assert store.accounts.to_host == 2 * padded * words * 4
        for b in range(2):
            read = table.read(b, padded)
            assert isinstance(read, coded.StoredRows) and read.host.nbytes == padded * words * 4
            expected = codec.decode(codec.encode(values[b][:rows[b]], seed=(0, 1, b, 1, 1)),
                                    np.empty((rows[b], width), np.float32))
            on_device = np.asarray(read.to_device())
            assert np.array_equal(on_device[:rows[b]], expected)
            assert not on_device[rows[b]:].any()
            assert np.array_equal(np.asarray(read), on_device)  # host reads decode alike
        gathered = table.gather(0, np.array([1, 1]), np.array([2, 5]), padded)
        assert isinstance(gathered, coded.StoredRows)
        assert gathered.host.shape == (padded, words)
        assert np.array_equal(np.asarray(gathered.to_device())[6:8],
                              np.asarray(table.read(1, padded).to_device())[[2, 5]])


def test_float32_tables_are_untouched(tmp_path):
    """float32 keeps the path from before storage dtypes: the host copy of the output is
    stored as it is, reads are float32 NumPy rows, and the tiers count no transfer."""
    rows, width = np.array([6, 9]), 5
    values = np.random.default_rng(0).standard_normal((16, width)).astype(np.float32)
    with Store(rows, tmp_path, host_cache_bytes=0, ssd_bytes_needed=1 << 16) as store:
        table = store.table(ACTIVATION, 1, width, [Fate.HOST, Fate.SSD])
        assert table.stored_on_host(0) and table.held_on_host(1)
        for b in range(2):
            table.write(b, values)
        read = table.read(1, 16)
        assert type(read) is np.ndarray and np.array_equal(read[:9], values[:9])
        assert store.accounts.to_host == 0 and store.accounts.to_device == 0


def _epoch(graph, model, tmp_path, codec):
    """Loss, parameter gradients and accounts of one `loss_and_grad`: activations on SSD,
    gradients in host RAM, both in ``codec``."""
    policy = policies.with_storage(policies.ssd_offload(tmp_path, gradients=Fate.HOST),
                                   activations=codec, gradients=codec)
    params = model.init(jax.random.key(0))
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=4, store=tmp_path,
                   partitioner=contiguous, max_shapes=1) as ex:
        loss, grads = ex.loss_and_grad(params, jax.random.key(1))
        accounts = ex.store.accounts
    return float(loss), [np.asarray(g) for g in jax.tree.leaves(grads)], accounts


@pytest.mark.parametrize("codec", LOSSY, ids=lambda c: c.name)
def test_an_epoch_converting_on_the_device_equals_converting_on_the_host(codec, tmp_path,
                                                                         monkeypatch):
    graph = generators.csbm(num_nodes=600, num_features=16, avg_degree=8, seed=3)
    model = models.sage(16, 16, 4, num_layers=3)
    on_device = _epoch(graph, model, tmp_path, codec)
    monkeypatch.setattr(coded._Coded, "converts_on_device", False)
    on_host = _epoch(graph, model, tmp_path, codec)
    assert on_device[0] == on_host[0]
    for a, b in zip(on_device[1], on_host[1]):
        assert np.array_equal(a, b)
    device_acc, host_acc = on_device[2], on_host[2]
    # the tiers' own bytes are the stored form either way; the link's are smaller
    for field in ("host_read", "host_written", "ssd_read", "ssd_written"):
        assert getattr(device_acc, field) == getattr(host_acc, field)
    assert device_acc.to_device < host_acc.to_device
    assert device_acc.to_host < host_acc.to_host


# -- the SSD tier's row spans ------------------------------------------------------------------
@pytest.mark.parametrize("codec", [codecs.bfloat16(), codecs.int8()], ids=lambda c: c.name)
def test_ssd_row_spans_coalesce_at_the_stored_width(codec, tmp_path):
    """Halo rows a little more than float32's gap apart (`COALESCE_BYTES` of float32 rows)
    but within the stored rows' gap are one read of one span, not a read per row."""
    width = 256
    stored_gap = COALESCE_BYTES // (4 * codec.words(width))
    float32_gap = COALESCE_BYTES // (4 * width)
    step = float32_gap + 2  # rows this far apart: one span at the stored width, not at float32's
    assert step <= stored_gap + 1
    halo = np.arange(0, 20 * step, step)
    rows = np.array([8, int(halo[-1]) + 1])
    with Store(rows, tmp_path, host_cache_bytes=0, ssd_bytes_needed=1 << 24) as store:
        table = store.table(ACTIVATION, 1, width, [Fate.HOST, Fate.SSD], codec=codec)
        rng = np.random.default_rng(1)
        for b, r in enumerate(rows):
            table.write(b, rng.standard_normal((r, width)).astype(np.float32))
        before = store.accounts.ssd_read_ops, store.accounts.ssd_file_read
        table.gather(0, np.ones(halo.size, np.int64), halo, 8 + halo.size)
        ops = store.accounts.ssd_read_ops - before[0]
        nbytes = store.accounts.ssd_file_read - before[1]
    assert ops == 1
    assert nbytes == (int(halo[-1]) + 1) * codec.words(width) * 4
