"""Tests of jgrind.rows: the host row gather and scatter-add the store uses."""

import numpy as np

from jgrind.rows import add_rows, take_rows


def test_add_rows_equals_one_addition_per_row():
    rng = np.random.default_rng(0)
    table = rng.standard_normal((1000, 7)).astype(np.float32)
    idx = np.sort(rng.choice(1000, 300, replace=False))
    values = rng.standard_normal((300, 7)).astype(np.float32)
    expected = table.copy()
    np.add.at(expected, idx, values)
    add_rows(table, idx, values)
    np.testing.assert_array_equal(table, expected)  # bitwise: the same single float addition
    before = table.copy()
    add_rows(table, idx[:0], values[:0])            # nothing to add
    np.testing.assert_array_equal(table, before)


def test_take_rows_fills_the_given_buffer():
    table = np.arange(40, dtype=np.float32).reshape(10, 4)
    out = np.empty((3, 4), np.float32)
    got = take_rows(table, np.array([7, 2, 9]), out=out)
    assert got is out
    np.testing.assert_array_equal(out, table[[7, 2, 9]])
