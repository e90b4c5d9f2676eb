"""The store's host buffers are adopted by XLA's CPU client in place (`jgrind.buffers`)."""

import jax
import numpy as np
import pytest

from jgrind.buffers import ALIGNMENT, aligned_empty, aligned_zeros
from jgrind.engine.store import Store
from jgrind.plan import Fate


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
