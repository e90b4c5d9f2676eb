"""Page-locked staging buffers (`jgrind.hostio.transfers.PinnedStaging`): filled in place, sent to
the device from the buffer itself, and never refilled while a view or a transfer uses them."""

import numpy as np
import pytest

from jgrind.hostio import transfers

staging_or_skip = transfers.pinned_staging
if staging_or_skip() is None:  # every backend JAX ships for CPU has pinned_host memory
    pytest.skip("no pinned_host memory on this backend", allow_module_level=True)


def test_a_filled_buffer_arrives_on_the_device_unchanged():
    staging = transfers.pinned_staging()
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)
    host = staging.empty(rows.shape, np.float32)
    host[:] = rows
    on_device = staging.to_device(host)
    assert on_device is not None
    assert on_device.sharding.memory_kind == "device"
    np.testing.assert_array_equal(np.asarray(on_device), rows)
    del host
    refilled = staging.empty(rows.shape, np.float32)  # the same buffer, filled again
    assert staging.reused == 1
    refilled[:] = -1
    np.testing.assert_array_equal(np.asarray(on_device), rows)  # the device copy is its own


def test_a_buffer_with_a_live_view_is_not_handed_out_again():
    staging = transfers.pinned_staging(per_shape=2)
    first = staging.empty((5, 3), np.float32)
    first[:] = 1
    second = staging.empty((5, 3), np.float32)
    assert second.ctypes.data != first.ctypes.data
    assert staging.made == 2
    third = staging.empty((5, 3), np.float32)  # both held, and no room for a third
    assert staging.unpinned == 1
    assert staging.to_device(third) is None  # ordinary memory: the caller puts it
    np.testing.assert_array_equal(first, 1)
    view = first[1:]
    del first, third
    staging.empty((5, 3), np.float32)  # a slice still holds the first buffer
    assert staging.unpinned == 2 and staging.reused == 0
    del view
    staging.empty((5, 3), np.float32)
    assert staging.reused == 1


def test_only_whole_buffers_are_sent_from_pinned_memory():
    staging = transfers.pinned_staging()
    host = staging.empty((8, 2), np.float32)
    host[:] = 3
    assert staging.to_device(host[:4]) is None  # a part: not the buffer's shape
    assert staging.to_device(np.ones((8, 2), np.float32)) is None  # not a staging buffer
    assert staging.to_device(host.view(np.int32)) is None  # another dtype
    assert staging.to_device(host) is not None


def test_other_shapes_get_their_own_buffers():
    staging = transfers.pinned_staging(per_shape=1)
    a = staging.empty((4, 4), np.float32)
    b = staging.empty((2, 4), np.float32)
    a[:], b[:] = 1, 2
    np.testing.assert_array_equal(np.asarray(staging.to_device(a)), np.ones((4, 4)))
    np.testing.assert_array_equal(np.asarray(staging.to_device(b)), np.full((2, 4), 2))
    assert staging.made == 2 and staging.kept_bytes == 4 * (16 + 8)
