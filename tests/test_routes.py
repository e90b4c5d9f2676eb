"""The store's routes: where each row of a partition's gathered input lives, worked out once
per table layout and partition (`jgrind.engine.routes`)."""

import jax
import numpy as np
import optax
import pytest

from jgrind import models
from jgrind.engine import OutOfCore
from jgrind.engine import routes as routes_module
from jgrind.engine.routes import DEVICE, SSD, Layout, make_route
from jgrind.plan.fates import H as HOST
from jgrind.plan import Fate

from helpers import community_graph


def test_a_route_groups_rows_by_tier_with_their_sources():
    # 4 blocks of 5 rows: block 0 host (slot 0), 1 SSD (file rows 0..4), 2 host (slot 5),
    # 3 SSD (file rows 5..9)
    layout = Layout(tier=np.array([HOST, SSD, HOST, SSD], np.int8), slot=np.array([0, 0, 5, 5]))
    owner = np.array([1, 1, 2, 3, 3], np.int32)   # block 0's halo, owner-major as partitions are
    row = np.array([0, 4, 2, 1, 3], np.int32)
    route = make_route(layout, 0, 5, owner, row)
    assert (route.own_code, route.own_start, route.own_rows) == (HOST, 0, 5)
    host, ssd = route.tier(HOST), route.tier(SSD)
    np.testing.assert_array_equal(host.dst, [7])           # input position 5 + halo index 2
    np.testing.assert_array_equal(host.src, [5 + 2])
    np.testing.assert_array_equal(ssd.dst, [5, 6, 8, 9])
    np.testing.assert_array_equal(ssd.src, [0, 4, 5 + 1, 5 + 3])  # file rows, ascending
    assert ssd.segments == ((0, 2, 1), (2, 4, 3))
    assert route.ssd_blocks == (1, 3) and route.tier(DEVICE) is None
    # with the own rows (scatter-adds): positions 0..4 first, in the host group
    both = make_route(layout, 0, 5, owner, row, with_own=True)
    np.testing.assert_array_equal(both.tier(HOST).dst, [0, 1, 2, 3, 4, 7])
    np.testing.assert_array_equal(both.tier(HOST).src, [0, 1, 2, 3, 4, 7])


def test_routes_are_made_once_per_layout_and_partition(tmp_path, monkeypatch):
    made = []
    real = routes_module.make_route

    def counting(*args, **kwargs):
        made.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(routes_module, "make_route", counting)
    g = community_graph(num_nodes=200, seed=3)
    model = models.gcn(g.num_features, 8, g.num_classes, num_layers=2, dropout=0.5)

    def mixed(info):  # blocks spread over host and SSD, so gathers need routes
        return Fate.SSD if info.partition % 2 else Fate.HOST

    params = model.init(jax.random.key(0))
    opt = optax.adam(1e-2)
    state = opt.init(params)
    with OutOfCore(g, model, opt, policy=mixed, num_parts=4, store=tmp_path) as ex:
        params, state, _ = ex.step(params, state, jax.random.key(0))
        first = len(made)
        assert first > 0
        params, state, _ = ex.step(params, state, jax.random.key(1))
        assert len(made) == first  # the second epoch reuses every route


def test_route_cache_reports_its_bytes():
    layout = Layout(tier=np.array([HOST, HOST], np.int8), slot=np.array([0, 3]))
    cache = routes_module.RouteCache()
    assert cache.nbytes == 0
    cache.get(layout, 0, 3, np.array([1, 1], np.int32), np.array([0, 2], np.int32))
    assert cache.nbytes == 2 * 2 * 4          # dst and src, int32, two halo rows


def test_an_ssd_table_that_fits_the_host_cache_is_cached_whole(tmp_path):
    """Halo rows of an SSD table come from one cached copy of its whole file when the host
    cache can hold it: each block is read once, not once per partition that needs rows of it.
    A write to any block drops the copy, so later gathers see the new rows."""
    from jgrind.engine.store import WHOLE_FILE, Store
    sizes = np.array([3, 4, 5])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    full = np.random.default_rng(0).standard_normal((12, 2)).astype(np.float32)
    store = Store(sizes, tmp_path, host_cache_bytes=1 << 20, ssd_bytes_needed=full.nbytes)
    try:
        t = store.table("activation", 1, 2, [Fate.SSD] * 3)
        for b in range(3):
            t.write(b, full[starts[b]:starts[b] + sizes[b]])
        before = store.accounts.ssd_read

        def gather_0():  # partition 0: its own rows, then rows 1 of block 1 and 0, 4 of 2
            return t.gather(0, np.array([1, 2, 2], np.int32), np.array([1, 0, 4], np.int32), 8)

        got = gather_0()
        np.testing.assert_array_equal(got[:6], full[[0, 1, 2, 4, 7, 11]])
        np.testing.assert_array_equal(got[6:], 0)
        assert (t.key, WHOLE_FILE) in store.cache._entries
        assert store.accounts.ssd_read - before == full.nbytes      # every block once
        got = t.gather(1, np.array([0, 2], np.int32), np.array([2, 3], np.int32), 8)
        np.testing.assert_array_equal(got[:6], full[[3, 4, 5, 6, 2, 10]])
        assert store.accounts.ssd_read - before == full.nbytes      # nothing read again
        t.write(2, full[7:12] + 100)
        assert (t.key, WHOLE_FILE) not in store.cache._entries
        np.testing.assert_array_equal(gather_0()[3:6], [full[4], full[7] + 100, full[11] + 100])
    finally:
        store.close()


def test_an_ssd_file_too_big_for_the_host_cache_evicts_nothing(tmp_path):
    """When the whole file cannot be cached, a gather still caches the blocks it reads, and
    trying for the whole file evicts nothing: not other tables' entries, not the block the
    gather itself just cached."""
    from jgrind.engine.store import WHOLE_FILE, Store
    sizes = np.array([3, 4, 5])
    full = np.random.default_rng(0).standard_normal((12, 2)).astype(np.float32)  # 96 bytes
    store = Store(sizes, tmp_path, host_cache_bytes=90, ssd_bytes_needed=full.nbytes)
    try:
        t = store.table("activation", 1, 2, [Fate.SSD] * 3)
        for b, (start, n) in enumerate([(0, 3), (3, 4), (7, 5)]):
            t.write(b, full[start:start + n])
        store.cache.put(("another table", 0), np.zeros(2, np.float32))  # 8 bytes
        # partition 1: its own block (32 bytes), then rows 0 and 4 of block 2 (40 bytes)
        got = t.gather(1, np.array([2, 2], np.int32), np.array([0, 4], np.int32), 8)
        np.testing.assert_array_equal(got[:6], full[[3, 4, 5, 6, 7, 11]])
        entries = store.cache._entries
        assert (t.key, WHOLE_FILE) not in entries
        assert ("another table", 0) in entries and (t.key, 1) in entries and (t.key, 2) in entries
    finally:
        store.close()



def test_an_uncached_ssd_block_is_read_straight_into_the_step_input(tmp_path, monkeypatch):
    """With the host cache off, a block read from SSD (a node-wise layer's input, or a
    gather's own rows) lands in the padded step input in one pass, not in a fresh array that
    is then copied (nor copied onto itself). A block the cache keeps is still read on its own
    (the cache holds it)."""
    from jgrind.engine.store import Store, Table
    copies = []
    fill = Table._fill
    monkeypatch.setattr(Table, "_fill", staticmethod(
        lambda dst, src: copies.append(src is not dst) or fill(dst, src)))
    sizes = np.array([3, 4, 5])
    full = np.random.default_rng(0).standard_normal((12, 2)).astype(np.float32)
    for cache_bytes, in_place in ((0, True), (1 << 20, False)):
        store = Store(sizes, tmp_path, host_cache_bytes=cache_bytes,
                      ssd_bytes_needed=full.nbytes)
        try:
            t = store.table("activation", 1, 2, [Fate.SSD] * 3)
            for b, (start, n) in enumerate([(0, 3), (3, 4), (7, 5)]):
                t.write(b, full[start:start + n])
            targets = []
            read_block = t.ssd.read_block
            t.ssd.read_block = lambda i, out=None: targets.append(out) or read_block(i, out)
            got = t.read(1, 6)
            np.testing.assert_array_equal(got, np.concatenate([full[3:7], np.zeros((2, 2))]))
            gathered = t.gather(2, np.array([0], np.int32), np.array([1], np.int32), 8)
            np.testing.assert_array_equal(gathered[:6], full[[7, 8, 9, 10, 11, 1]])
            np.testing.assert_array_equal(gathered[6:], 0)
            if in_place:
                assert [np.shares_memory(o, a) for o, a in zip(targets, (got, gathered))] \
                    == [True, True]
                assert copies == [False, False]
            else:
                assert targets[:2] == [None, None]
                assert copies == [True, True]
            copies.clear()
        finally:
            store.close()

def test_the_host_cache_makes_room_before_an_entry_is_built():
    """`HostCache.make_room` evicts least-recently-used unpinned entries before a whole-file
    entry's buffer is filled, so the cache and that buffer stay within the capacity; pinned
    entries stay, and it says when they leave too little room."""
    from jgrind.engine.cache import HostCache
    cache = HostCache(100)
    for name in "abc":
        cache.put(name, np.zeros(6, np.float32))                   # 24 bytes each: 72 held
    cache.get("a")                                                   # b is now the oldest
    cache.pin(["c"])
    assert cache.make_room(40)
    assert cache.bytes + 40 <= 100 and cache.get("b") is None and cache.get("a") is not None
    assert not cache.make_room(80)                                   # c is pinned: 24 + 80
    assert cache.get("c") is not None and cache.get("a") is None     # a went trying


def _put_together(gathered):
    """`DeviceRows.to_device`, the positions it must set made NaN first in the host buffer:
    a reused allocation may hold the right rows already."""
    positions = gathered.rows[gathered.rows < gathered.host.shape[0]]
    gathered.host[positions] = np.nan
    return gathered.to_device()


@pytest.mark.parametrize("keep_device_rows", [False, True], ids=["copied", "kept"])
def test_gathers_and_scatter_adds_across_every_tier(keep_device_rows, tmp_path):
    """A partition's rows spread over the device, host RAM and SSD: the gather gives the same
    rows whether the device's are copied into the host buffer or left on the device
    (`DeviceRows`, put together there), and a scatter-add adds each row once, the device's
    taken from the step output where it is."""
    from jgrind.engine.store import DeviceRows, Store
    sizes = np.array([3, 4, 5, 2])
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    full = np.random.default_rng(0).standard_normal((14, 3)).astype(np.float32)
    fates = [Fate.DEVICE, Fate.HOST, Fate.SSD, Fate.DEVICE]
    store = Store(sizes, tmp_path, host_cache_bytes=0, ssd_bytes_needed=full.nbytes)
    try:
        t = store.table("activation", 1, 3, fates)
        for b in range(4):
            t.write(b, full[starts[b]:starts[b] + sizes[b]])
        # partition 1 (on the host): row 2 of block 0, rows 4 and 1 of block 2, 1 and 0 of 3
        owner, row = np.array([0, 2, 2, 3, 3], np.int32), np.array([2, 4, 1, 1, 0], np.int32)
        got = t.gather(1, owner, row, 16, keep_device_rows=keep_device_rows)
        assert isinstance(got, DeviceRows) == keep_device_rows
        got = np.asarray(_put_together(got) if keep_device_rows else got)
        np.testing.assert_array_equal(got[:9], full[[3, 4, 5, 6, 2, 11, 8, 13, 12]])
        np.testing.assert_array_equal(got[9:], 0)
        # partition 3 (on the device) reads host and SSD rows too: its own rows stay there
        got = t.gather(3, np.array([1, 2], np.int32), np.array([0, 3], np.int32), 8,
                       keep_device_rows=keep_device_rows)
        got = np.asarray(_put_together(got) if keep_device_rows else got)
        np.testing.assert_array_equal(got[:4], full[[12, 13, 3, 10]])

        g = store.table("gradient", 1, 3, fates)
        for b in range(4):
            g.write(b, np.zeros((sizes[b], 3), np.float32))
        grad = jax.numpy.asarray(np.arange(16 * 3, dtype=np.float32).reshape(16, 3))
        g.accumulate(1, owner, row, grad, keep_device_rows=keep_device_rows)
        expected = np.zeros_like(full)
        np.add.at(expected, [3, 4, 5, 6, 2, 11, 8, 13, 12], np.asarray(grad)[:9])
        back = np.concatenate([np.asarray(g.read(b, sizes[b])) for b in range(4)])
        np.testing.assert_array_equal(back, expected)
    finally:
        store.close()
