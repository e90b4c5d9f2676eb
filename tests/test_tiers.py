"""The store's tiers (`jgrind.engine.tiers`): a new tier is one class, plugged into a real
`Table` by the fate it serves, and an out-of-core epoch through it equals the in-memory one."""

import ast
import pathlib
import threading
import zlib

import jax
import numpy as np
import optax
import pytest

from jgrind import models
from jgrind.engine import OutOfCore, store as store_module, tiers
from jgrind.engine.routes import TierRows
from jgrind.engine.tiers import NOTHING_HELD, Shared, TierBlocks
from jgrind.plan import Fate, policies

from helpers import community_graph, reference
from test_engine import assert_same_gradients


class ZlibHostTier:
    """Host blocks kept zlib-compressed, one compressed string per block: lossless, so every
    number is the same as the host tier's. Charges the host account with the compressed bytes;
    an addition decompresses the blocks it touches, adds and compresses them again."""

    on_device = False
    made = []  # every tier made, for the tests to inspect

    def __init__(self, blocks: TierBlocks, shared: Shared):
        self.blocks, self._charge, self._count = blocks, shared.charge, shared.count
        self._lock = threading.Lock()
        self._packed = {}
        for b in blocks.blocks:
            self._pack(int(b), np.zeros((blocks.block_rows[b], blocks.width), np.float32))
        ZlibHostTier.made.append(self)

    def _pack(self, block: int, rows: np.ndarray) -> None:
        old = len(self._packed.get(block, b""))
        self._packed[block] = zlib.compress(np.ascontiguousarray(rows, np.float32).tobytes(), 1)
        self._charge(host=len(self._packed[block]) - old)

    def _unpack(self, block: int) -> np.ndarray:
        raw = bytearray(zlib.decompress(self._packed[block]))  # writable
        return np.frombuffer(raw, np.float32).reshape(-1, self.blocks.width)

    def write_block(self, block, values):
        with self._lock:
            self._pack(block, values)
        self._count(host_written=values.nbytes)

    def read_block(self, block, into=None):
        rows = self._unpack(block)
        self._count(host_read=rows.nbytes)
        if into is None:
            return rows
        into[...] = rows
        return into

    def take_rows(self, rows: TierRows, out):
        for a, b, owner in rows.segments:
            block = self._unpack(owner)
            out[rows.dst[a:b]] = block[rows.src[a:b] - self.blocks.start[owner]]
        self._count(host_read=rows.size * self.blocks.width * 4)

    def add_rows(self, rows: TierRows, values):
        with self._lock:
            for a, b, owner in rows.segments:
                block = self._unpack(owner)
                block[rows.src[a:b] - self.blocks.start[owner]] += values[rows.dst[a:b]]
                self._pack(owner, block)
        self._count(host_written=rows.size * self.blocks.width * 4)

    def hold(self, blocks):
        return NOTHING_HELD

    def free(self):
        self._charge(host=-sum(len(p) for p in self._packed.values()))
        self._packed = {}

    def close(self):
        pass


@pytest.fixture
def zlib_tiers():
    ZlibHostTier.made.clear()
    yield ZlibHostTier.made
    ZlibHostTier.made.clear()


def _put_together(got):
    return np.asarray(got.to_device() if isinstance(got, tiers.DeviceRows) else got)


@pytest.mark.parametrize("keep_device_rows", [False, True], ids=["copied", "kept"])
def test_a_new_tier_serves_a_fate_in_a_real_table(zlib_tiers, keep_device_rows, tmp_path):
    """Blocks spread over the device, the compressed host tier and SSD: whole blocks, gathers
    and scatter-adds give the rows the host tier would, and the accounts hold the compressed
    bytes."""
    sizes = np.array([3, 4, 5, 2])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    full = np.random.default_rng(0).standard_normal((14, 3)).astype(np.float32)
    fates = [Fate.DEVICE, Fate.HOST, Fate.SSD, Fate.HOST]
    with store_module.Store(sizes, tmp_path, host_cache_bytes=0, ssd_bytes_needed=full.nbytes,
                            tiers={Fate.HOST: ZlibHostTier}) as store:
        t = store.table("activation", 1, 3, fates)
        assert len(zlib_tiers) == 1 and t.host is None  # not the host tier's array
        for b in range(4):
            t.write(b, full[starts[b]:starts[b] + sizes[b]])
        for b in range(4):
            np.testing.assert_array_equal(np.asarray(t.read(b, 6))[:sizes[b]],
                                          full[starts[b]:starts[b] + sizes[b]])
        # partition 1 (compressed): row 2 of block 0, rows 4 and 1 of block 2, 1 and 0 of 3
        owner, row = np.array([0, 2, 2, 3, 3], np.int32), np.array([2, 4, 1, 1, 0], np.int32)
        got = _put_together(t.gather(1, owner, row, 16, keep_device_rows=keep_device_rows))
        np.testing.assert_array_equal(got[:9], full[[3, 4, 5, 6, 2, 11, 8, 13, 12]])
        np.testing.assert_array_equal(got[9:], 0)
        assert 0 < store.accounts.host

        g = store.table("gradient", 1, 3, fates)
        grad = jax.numpy.asarray(np.arange(16 * 3, dtype=np.float32).reshape(16, 3))
        g.accumulate(1, owner, row, grad, keep_device_rows=keep_device_rows)
        g.accumulate(3, np.array([1], np.int32), np.array([2], np.int32), grad[:8],
                     keep_device_rows=keep_device_rows)
        expected = np.zeros_like(full)
        np.add.at(expected, [3, 4, 5, 6, 2, 11, 8, 13, 12], np.asarray(grad)[:9])
        np.add.at(expected, [12, 13, 5], np.asarray(grad)[:3])
        back = np.concatenate([np.asarray(g.read(b, sizes[b])) for b in range(4)])
        np.testing.assert_array_equal(back, expected)
        held = store.accounts.host
        store.drop(g)
        assert store.accounts.host < held


def test_an_epoch_through_a_new_tier_equals_the_in_memory_one(zlib_tiers, monkeypatch,
                                                                tmp_path):
    """The same loss and gradients as in memory when every host block of the run is kept
    compressed: the engine's tables, made by the store, take the tier from `TIERS`."""
    monkeypatch.setitem(store_module.TIERS, Fate.HOST, ZlibHostTier)
    graph = community_graph(num_nodes=300)
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=3, dropout=0.5)
    params, key = model.init(jax.random.key(0)), jax.random.key(42)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)

    def mixed(info):  # odd partitions on SSD, the rest in (compressed) host RAM
        return Fate.SSD if info.partition % 2 else Fate.HOST

    for policy in (policies.host_offload(), mixed):
        zlib_tiers.clear()
        with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=4,
                       store=tmp_path) as ex:
            loss, grads = ex.loss_and_grad(params, key)
            assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
            assert_same_gradients(grads, ref_grads)
            assert all(t.host is None for t in ex.activations)
        # every activation layer and every gradient table held compressed blocks
        assert {t.blocks.key for t in zlib_tiers} >= {
            ("activation", l) for l in range(ex.num_layers)} | {
            ("gradient", l) for l in range(1, ex.num_layers)}


def test_the_naive_scheme_runs_on_its_own_tiers(tmp_path):
    """`row_reads` serves the SSD fate by the naive scheme's tier, outside the production
    SSD tier; the host cache is off."""
    sizes = np.array([3, 4])
    full = np.arange(7 * 2, dtype=np.float32).reshape(7, 2)
    with store_module.Store(sizes, tmp_path, host_cache_bytes=1 << 20,
                            ssd_bytes_needed=full.nbytes, row_reads=True) as store:
        t = store.table("activation", 1, 2, [Fate.SSD, Fate.SSD])
        t.write(0, full[:3])
        t.write(1, full[3:])
        before = store.accounts.ssd_read_ops
        got = t.gather(0, np.array([1, 1], np.int32), np.array([3, 0], np.int32), 8)
        np.testing.assert_array_equal(got[:5], full[[0, 1, 2, 6, 3]])
        assert store.accounts.ssd_read_ops - before == 5  # one call per row
        assert store.cache.capacity == 0
        assert store.tiers[Fate.SSD] is tiers.RowReadsSSDTier
        snap = store.snapshot(0, 2, np.array([4, 5]))
        snap.write(1, full[:5])
        np.testing.assert_array_equal(snap.read(1, 6)[:5], full[:5])


def test_tiers_reach_nothing_of_the_store():
    """Tiers get the run's shared resources when they are made (`Shared`): no tier module
    imports the store."""
    folder = pathlib.Path(tiers.__file__).parent
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module != "jgrind.engine.store", path.name
