"""`jgrind.engine.host_arrays.HostArrays`: freed host tables' arrays handed to the next table,
within a byte limit that counts every array held."""

import numpy as np

from jgrind.engine.host_arrays import HostArrays


def test_a_freed_array_serves_the_next_table_zeroed():
    charged = []
    pool = HostArrays(limit=10_000, on_change=charged.append)
    a = pool.take(10, 8)
    assert a.shape == (10, 8) and a.dtype == np.float32 and not a.any()
    a += 7.0
    pool.give(a)
    b = pool.take(10, 8)
    assert b.base is a.base          # the same memory, not a new allocation
    assert not b.any()               # zeroed for its new table
    assert (pool.made, pool.reused) == (1, 1)
    assert charged == [320] and pool.resident == 320  # charged once, while held


def test_only_an_array_of_the_same_size_is_handed_on():
    """A larger array's unused tail would stay held while the narrower table lives, past what
    the plan counts; so a narrower table gets its own."""
    pool = HostArrays(limit=10_000)
    wide = pool.take(10, 8)
    pool.give(wide)
    narrow = pool.take(10, 3)
    assert narrow.shape == (10, 3) and narrow.base is not wide.base
    assert pool.resident == 320 + 120 and pool.kept_bytes == 320
    same = pool.take(8, 10)          # another shape of the same size
    assert same.base is wide.base and pool.reused == 1


def test_kept_arrays_are_given_back_before_the_limit_is_passed():
    charged = []
    pool = HostArrays(limit=640, on_change=charged.append)
    a, b = pool.take(10, 8), pool.take(10, 8)   # 640 bytes: the limit
    pool.give(a)
    pool.give(b)
    assert pool.kept_bytes == 640
    c = pool.take(20, 8)             # 640 bytes: nothing kept holds it; both kept ones go
    assert c.shape == (20, 8) and pool.kept_bytes == 0 and pool.resident == 640
    assert charged == [320, 320]     # freed and allocated in one step: no overshoot charged
    pool.give(c)
    d = pool.take(10, 16)
    assert d.base is c.base and pool.made == 3


def test_over_the_limit_nothing_is_kept():
    charged = []
    pool = HostArrays(limit=0, on_change=charged.append)
    a = pool.take(4, 4)
    pool.give(a)
    assert pool.kept_bytes == 0 and pool.resident == 0 and charged == [64, -64]
    pool.take(4, 4)
    assert pool.made == 2 and pool.reused == 0


def test_clear_gives_back_every_kept_array():
    pool = HostArrays(limit=1000)
    a, b = pool.take(4, 4), pool.take(4, 4)
    pool.give(a)
    pool.give(b)
    held = pool.take(4, 4)
    pool.clear()
    assert pool.kept_bytes == 0 and pool.resident == held.nbytes == 64
