"""Tests of jgrind.hostio.checksum: the SSD tier's block checksum (CRC32C by the CPU, else zlib)."""

import zlib

import numpy as np
import pytest

import jgrind.hostio.checksum as checksum_module
from jgrind.hostio.checksum import checksum, method


def _reference_crc32c(data: bytes) -> int:
    """CRC32C one bit at a time, straight from the polynomial (slow: small inputs only)."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def _native_or_skip():
    from jgrind import _kernels
    if not _kernels.available():
        pytest.skip(f"native kernels unavailable: {_kernels.unavailable_reason()}")
    if not _kernels.load().lib.jgrind_crc32c_hardware():
        pytest.skip("this CPU has no CRC32C instruction: the checksum is zlib's CRC-32")


def test_the_checksum_is_crc32c_by_the_cpu_where_it_can_be():
    _native_or_skip()
    assert method() == "CRC32C (CPU instruction)"
    assert checksum(np.frombuffer(b"123456789", np.uint8)) == 0xE3069283  # CRC32C check value


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 24575, 24576, 24577, 3 * 24576 + 1001, 100_003])
def test_crc32c_matches_the_polynomial_across_the_three_lane_blocks(size):
    # The kernel runs three CRC chains over adjacent 8 KiB lanes (24 KiB blocks) and combines
    # them algebraically; sizes below, at and across those blocks check the combination.
    _native_or_skip()
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    assert checksum(data) == _reference_crc32c(data.tobytes())


@pytest.mark.parametrize("rows, width", [(0, 4), (1, 3), (2, 8), (7, 2), (9, 31), (10, 32),
                                         (11, 257)])
def test_row_checksums_are_each_rows_crc32c(rows, width, monkeypatch):
    # Rows go three at a time: adjacent ones when short, else from three thirds; row counts
    # around multiples of three, and rows under, at and over 128 bytes and not whole words,
    # check the grouping and the tails. Without the kernels: zlib's CRC-32 of each row.
    from jgrind import _kernels
    data = np.random.default_rng(rows).standard_normal((rows, width)).astype(np.float32)
    if _kernels.available():
        expected = [_reference_crc32c(row.tobytes()) for row in data]
        assert checksum_module.row_checksums(data).tolist() == expected
    monkeypatch.setattr(_kernels, "library", lambda: None)
    assert checksum_module.row_checksums(data).tolist() == [zlib.crc32(row) for row in data]


def test_checksums_continue_like_zlib():
    data = np.random.default_rng(1).standard_normal((3000, 17)).astype(np.float32)
    whole = checksum(data)
    flat = data.reshape(-1).view(np.uint8)
    for cut in (0, 5, 24576, flat.size - 3):
        assert checksum(flat[cut:], checksum(flat[:cut])) == whole
    flipped = flat.copy()
    flipped[12345] ^= 0x10
    assert checksum(flipped) != whole


def test_without_the_kernels_the_checksum_is_zlibs(monkeypatch):
    from jgrind import _kernels

    def unavailable():
        raise RuntimeError("native kernels disabled by the test")
    monkeypatch.setattr(checksum_module, "_chosen", None)
    monkeypatch.setattr(_kernels, "load", unavailable)
    data = np.arange(5000, dtype=np.float32)
    assert method() == "CRC-32 (zlib)"
    assert checksum(data) == zlib.crc32(data)
    assert checksum(data[2500:], checksum(data[:2500])) == zlib.crc32(data)


def test_the_ssd_tier_records_and_verifies_this_checksum(tmp_path):
    from jgrind.engine.ssd import SSDFile, StoreCorruptedError
    block = np.random.default_rng(2).standard_normal((300, 64)).astype(np.float32)
    f = SSDFile(tmp_path / "h.bin", np.array([0, 300]), 64, b"run")
    try:
        f.write_block(0, block)
        assert all(f._row_crc[i] == checksum(block[i]) for i in (0, 150, 299))
        np.testing.assert_array_equal(f.read_block(0), block)
        with open(f.path, "r+b") as raw:  # one flipped bit in the middle of the data
            raw.seek(f.data_start + block.nbytes // 2)
            byte = raw.read(1)[0]
            raw.seek(-1, 1)
            raw.write(bytes([byte ^ 0x04]))
        with pytest.raises(StoreCorruptedError, match="checksum mismatch"):
            f.read_block(0)
    finally:
        f.close()
