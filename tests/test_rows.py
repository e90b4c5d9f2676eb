"""Tests of jgrind.hostio.rows: the host row gather and scatter-add the store uses."""

import numpy as np

from jgrind.hostio.rows import add_rows, take_rows


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


def _numpy_only(monkeypatch):
    """Run `jgrind.hostio.rows` on its NumPy fallback (as when the native kernels do not build)."""
    import jgrind.hostio.rows as rows
    monkeypatch.setattr(rows, "_kernels_lib", None)


def test_native_kernels_are_used_when_they_build():
    import jgrind.hostio.rows as rows
    from jgrind import _kernels
    if not _kernels.available():
        import pytest
        pytest.skip(f"native kernels unavailable: {_kernels.unavailable_reason()}")
    assert rows._native() is not None


def _scattered_case(width):
    rng = np.random.default_rng(width)
    table = rng.standard_normal((500, width)).astype(np.float32)
    idx = rng.choice(500, 120, replace=False)
    dst = rng.choice(200, 120, replace=False)
    values = rng.standard_normal((200, width)).astype(np.float32)
    return table, idx, dst, values


def test_take_rows_places_rows_at_scattered_positions(monkeypatch):
    for native in (True, False):
        if not native:
            _numpy_only(monkeypatch)
        for width in (1, 8, 37, 256):
            table, idx, dst, _ = _scattered_case(width)
            out = np.full((200, width), -1.0, np.float32)
            take_rows(table, idx, out=out, dst=dst)
            expected = np.full((200, width), -1.0, np.float32)
            expected[dst] = table[idx]
            np.testing.assert_array_equal(out, expected)   # untouched rows stay as they were


def test_add_rows_reads_values_at_given_positions(monkeypatch):
    for native in (True, False):
        if not native:
            _numpy_only(monkeypatch)
        for width in (1, 8, 37, 256):
            table, idx, src, values = _scattered_case(width)
            expected = table.copy()
            expected[idx] += values[src]
            add_rows(table, idx, values, src=src)
            np.testing.assert_array_equal(table, expected)


def test_out_of_range_rows_raise_instead_of_touching_memory(monkeypatch):
    import pytest
    for native in (True, False):
        if not native:
            _numpy_only(monkeypatch)
        table = np.zeros((10, 4), np.float32)
        out = np.zeros((3, 4), np.float32)
        with pytest.raises(IndexError, match="outside"):
            take_rows(table, np.array([1, 10, 2]), out=out)
        with pytest.raises(IndexError, match="outside"):
            take_rows(table, np.array([-1]))
        with pytest.raises(IndexError, match="outside"):
            take_rows(table, np.array([1, 2]), out=out, dst=np.array([0, 3]))
        with pytest.raises(IndexError, match="outside"):
            add_rows(table, np.array([3, 11]), np.ones((2, 4), np.float32))


def test_int32_and_int64_indices_move_the_same_rows():
    """The store keeps its routes as int32 (half the memory); the kernels take both."""
    table, idx, dst, values = _scattered_case(16)
    results = []
    for dtype in (np.int32, np.int64):
        out = np.zeros((200, 16), np.float32)
        take_rows(table, idx.astype(dtype), out=out, dst=dst.astype(dtype))
        added = table.copy()
        add_rows(added, idx.astype(dtype), values, src=dst.astype(dtype))
        results.append((out, added))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_array_equal(results[0][1], results[1][1])
    mixed = np.zeros((200, 16), np.float32)                 # one of each: int64 for both
    take_rows(table, idx.astype(np.int32), out=mixed, dst=dst.astype(np.int64))
    np.testing.assert_array_equal(mixed, results[0][0])


def test_large_moves_split_across_threads_move_the_same_rows(monkeypatch):
    import threading

    import pytest

    import jgrind.hostio.rows as rows
    from jgrind import _kernels
    if not _kernels.available():
        pytest.skip("the native kernels did not build here")
    rng = np.random.default_rng(1)
    table = rng.standard_normal((5000, 16)).astype(np.float32)
    idx = rng.permutation(5000)[:3001]
    dst = rng.permutation(4000)[:3001]
    values = rng.standard_normal((4000, 16)).astype(np.float32)
    single = (take_rows(table, idx), take_rows(table, idx, out=np.zeros((4000, 16), np.float32),
                                              dst=dst))
    added = [table.copy(), table.copy()]
    add_rows(added[0], idx, values)
    add_rows(added[1], idx, values, src=dst)

    seen = []  # the threads the native kernels run on
    lib = rows._native()

    class Spy:
        def __getattr__(self, name):
            fn = getattr(lib, name)
            return lambda *a: seen.append(threading.get_ident()) or fn(*a)
    monkeypatch.setattr(rows, "_kernels_lib", Spy())
    monkeypatch.setattr(rows, "MIN_BYTES_PER_THREAD", 1000 * 16 * 4)  # parts of >= 1000 rows
    previous = rows.set_threads(4)
    try:
        assert rows.threads() == 4
        np.testing.assert_array_equal(take_rows(table, idx), single[0])
        assert len(seen) == 3 and len(set(seen)) > 1  # 3001 rows: 3 parts, not 4
        seen.clear()
        out = take_rows(table, idx, out=np.zeros((4000, 16), np.float32), dst=dst)
        np.testing.assert_array_equal(out, single[1])
        mine = [table.copy(), table.copy()]
        add_rows(mine[0], idx, values)
        add_rows(mine[1], idx, values, src=dst)
        for got, want in zip(mine, added):
            np.testing.assert_array_equal(got, want)  # bitwise: one addition per row
        assert len(seen) == 9
        seen.clear()
        take_rows(table, idx[:999])  # under one part's worth: on this thread, whole
        assert seen == [threading.get_ident()]
        bad = idx.copy()
        bad[2500] = 5000  # in the last part
        with pytest.raises(IndexError, match="outside"):
            take_rows(table, bad)
        with pytest.raises(IndexError, match="outside"):
            add_rows(table.copy(), bad, values)
        with pytest.raises(ValueError, match="at least 1"):
            rows.set_threads(0)
    finally:
        rows.set_threads(previous)
    assert rows._threads == previous


def test_row_threads_follow_the_backend_unless_set(monkeypatch):
    """Unset, a row move uses one thread on the CPU backend (its steps use the cores) and
    several where the compute runs on an accelerator (the host's cores are idle)."""
    import jax

    import jgrind.hostio.rows as rows
    previous = rows.set_threads(None)
    try:
        assert rows.threads() == 1  # this suite runs on the CPU backend
        rows.set_threads(None)
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        monkeypatch.setenv("JGRIND_NUM_THREADS", "16")
        assert rows.threads() == rows.ACCELERATOR_THREADS
        rows.set_threads(None)
        monkeypatch.setenv("JGRIND_NUM_THREADS", "3")
        assert rows.threads() == 3
        rows.set_threads(2)
        assert rows.threads() == 2  # a setting wins over the backend
    finally:
        rows.set_threads(previous)


def test_row_threads_from_the_environment(monkeypatch):
    import pytest

    import jgrind.hostio.rows as rows
    for text, want in (("", None), ("3", 3), (" 2 ", 2)):
        monkeypatch.setenv("JGRIND_ROW_THREADS", text)
        assert rows._threads_from_environment() == want
    for text in ("0", "two", "-1", "1.5"):
        monkeypatch.setenv("JGRIND_ROW_THREADS", text)
        with pytest.raises(ValueError, match="JGRIND_ROW_THREADS=.*whole number"):
            rows._threads_from_environment()


def test_copy_rows_splits_large_copies_across_the_row_threads(monkeypatch):
    """`copy_rows` copies whole blocks (a step output into its host table, a table's rows
    into a step input) on the row threads, in row ranges; every byte arrives."""
    import threading

    import pytest

    import jgrind.hostio.rows as rows
    src = np.random.default_rng(0).standard_normal((3001, 16)).astype(np.float32)
    seen, plain = [], np.copyto

    def copyto(dst, s):
        seen.append(threading.get_ident())
        return plain(dst, s)
    monkeypatch.setattr(rows, "MIN_BYTES_PER_THREAD", 1000 * 16 * 4)
    monkeypatch.setattr(rows.np, "copyto", copyto)
    previous = rows.set_threads(4)
    try:
        dst = np.zeros_like(src)
        rows.copy_rows(dst, src)
        np.testing.assert_array_equal(dst, src)
        assert len(seen) == 3 and len(set(seen)) > 1  # 3 ranges of >= 1000 rows, not 4
        seen.clear()
        small = np.zeros((10, 16), np.float32)
        rows.copy_rows(small, src[:10])
        assert seen == [threading.get_ident()]  # under a range's worth: one copy, here
        with pytest.raises(ValueError, match="into"):
            rows.copy_rows(np.zeros((5, 16), np.float32), src)
    finally:
        rows.set_threads(previous)
