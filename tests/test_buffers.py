"""The store's host buffers are adopted by XLA's CPU client in place, and recycled once
nothing holds them (`jgrind.hostio.buffers`)."""

import jax
import numpy as np
import optax
import pytest

from jgrind import models
from jgrind.hostio.buffers import ALIGNMENT, Recycler, aligned_empty, aligned_zeros
from jgrind.engine import OutOfCore
from jgrind.engine.store import Store
from jgrind.partition import contiguous
from jgrind.plan import Fate, policies

from helpers import csbm_graph, reference
from test_engine import assert_same_gradients


@pytest.mark.parametrize("shape", [(0, 4), (1, 3), (1000, 257), (5,)])
def test_aligned_buffers_have_the_shape_and_alignment(shape):
    for make in (aligned_empty, aligned_zeros):
        out = make(shape, np.float32)
        assert out.shape == shape and out.dtype == np.float32
        assert out.ctypes.data % ALIGNMENT == 0 or out.size == 0
        out[...] = 1.0  # writable
    assert not aligned_zeros((7, 9)).any()


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="in-place adoption is the CPU client's")
def test_xla_adopts_aligned_buffers_and_copies_others():
    """What the store relies on: an aligned buffer becomes a JAX array without a copy; NumPy's
    own allocation (16-byte aligned) is copied. If a JAX release changes this, the host tier
    gets slower, not wrong, and this test says why."""
    adopted = aligned_empty((1 << 12, 64))
    assert jax.device_put(adopted).unsafe_buffer_pointer() == adopted.ctypes.data
    plain = np.ones((1 << 12, 64 + 1), np.float32)[:, 1:]  # a misaligned view
    assert jax.device_put(plain).unsafe_buffer_pointer() != plain.ctypes.data


def test_host_gathers_and_reads_hand_over_aligned_buffers():
    store = Store(np.array([3, 4, 5]), None, host_cache_bytes=0)
    table = store.table("activation", 0, 6, [Fate.HOST] * 3)
    for block in range(3):
        table.write(block, np.full((8, 6), block, np.float32))
    got = table.gather(1, np.array([0, 2]), np.array([2, 4]), 16)
    assert got.ctypes.data % ALIGNMENT == 0
    np.testing.assert_array_equal(got[:6, 0], [1, 1, 1, 1, 0, 2])
    assert not got[6:].any()
    read = table.read(2, 8)
    assert read.ctypes.data % ALIGNMENT == 0 and read[:5].min() == 2 and not read[5:].any()
    store.close()


# -- Recycler: step inputs' buffers handed out again once nothing holds them -----------------
def test_a_dropped_buffer_serves_the_next_request_of_its_size_or_smaller():
    buffers = Recycler(1 << 20)
    first = buffers.empty((64, 32))
    address = first.ctypes.data
    first[...] = 7.0
    del first
    again = buffers.empty((64, 32))
    assert again.ctypes.data == address and again.ctypes.data % ALIGNMENT == 0
    assert again.shape == (64, 32) and again.dtype == np.float32
    del again
    smaller = buffers.empty((10, 32))  # a larger free block serves it
    assert smaller.ctypes.data == address
    assert (buffers.made, buffers.reused) == (1, 2)


def test_a_buffer_still_held_anywhere_is_not_handed_out_again():
    buffers = Recycler(1 << 24)
    held = buffers.empty((256, 64))
    view = held[3:5]  # a view keeps its block as well
    del held
    assert buffers.empty((256, 64)).ctypes.data != view.ctypes.data - 3 * 64 * 4
    del view
    adopted = buffers.empty((256, 64))
    adopted[...] = 1.0
    on_device = jax.device_put(adopted)  # XLA reads this memory in place on the CPU
    address = adopted.ctypes.data
    del adopted
    other = buffers.empty((256, 64))
    assert other.ctypes.data != address
    other[...] = 2.0
    assert float(on_device.sum()) == 256 * 64  # not overwritten
    # two blocks: the view's, reused once the view was dropped, and the one made beside it
    assert (buffers.made, buffers.reused) == (2, 2)


def test_nothing_is_kept_beyond_max_bytes():
    off = Recycler(0)
    for _ in range(3):
        off.empty((100, 10))
    assert (off.made, off.reused, off.kept_bytes) == (3, 0, 0)
    small = Recycler(3000)  # room for one block of 2 KB
    a = small.empty((500,))
    b = small.empty((500,))  # `a` is in use: made, and not kept (no room)
    assert small.kept_bytes <= 3000 and small.made == 2
    del a, b
    small.empty((600,))  # larger than the kept block: it is forgotten to make room
    assert small.kept_bytes == 600 * 4 + ALIGNMENT and small.reused == 0


def test_the_engine_reuses_step_input_buffers_and_stays_exact(tmp_path):
    graph = csbm_graph()
    model = models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5)
    params = model.init(jax.random.key(0))
    in_memory = reference(graph, model)
    for policy in (policies.host_offload(), policies.ssd_offload(tmp_path)):
        with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=6,
                       store=tmp_path, partitioner=contiguous) as ex:
            for epoch in range(2):
                key = jax.random.key(epoch)
                loss, grads = ex.loss_and_grad(params, key)
                ref_loss, ref_grads = in_memory.loss_and_grad(params, key)
                assert abs(float(loss) - float(ref_loss)) <= 1e-5 * abs(float(ref_loss))
                assert_same_gradients(grads, ref_grads)
            buffers = ex.store.buffers
            assert buffers.reused > buffers.made, (buffers.reused, buffers.made)


def test_input_buffers_are_kept_only_where_the_budget_holds_them():
    graph = csbm_graph()
    model = models.gcn(8, 16, graph.num_classes, num_layers=2)
    kwargs = dict(policy=policies.host_offload(), num_parts=4, partitioner=contiguous)
    with OutOfCore(graph, model, optax.sgd(0.1), **kwargs) as ex:
        kept = ex.store.buffers.max_bytes
        assert kept > 0  # no budget
        plan = ex.memory.device + ex.built.largest_output
    with OutOfCore(graph, model, optax.sgd(0.1), device_budget=plan, **kwargs) as ex:
        assert ex.store.buffers.max_bytes == 0
        ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(0))
        assert ex.store.buffers.reused == 0
    with OutOfCore(graph, model, optax.sgd(0.1), device_budget=plan + kept, **kwargs) as ex:
        assert ex.store.buffers.max_bytes == kept
