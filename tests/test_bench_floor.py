"""The floor `tools/bench_out_of_core.py` prints beside each out-of-core run: what its epoch
cannot go under on this machine (issue 39's targets are ratios to it)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "tools"))

import bench_out_of_core  # noqa: E402

GB = 1e9


def _run(to_device, to_host, file_read=0, file_written=0):
    return {"moved": [{"to_device": to_device, "to_host": to_host, "ssd_file_read": file_read,
                       "ssd_file_written": file_written}],
            "link": {"to_device": 40 * GB, "to_host": 20 * GB}}


def test_the_floor_is_the_slowest_of_compute_link_and_disk():
    ssd = {"read": 2 * GB, "write": 1 * GB}
    # the link: 8 GB over 40 GB/s and 4 GB back over 20 GB/s run at once
    got = bench_out_of_core.floor_terms(_run(8 * GB, 4 * GB), 0.05, ssd)
    assert got["to device"] == pytest.approx(0.2) and got["to host"] == pytest.approx(0.2)
    assert got["floor"] == pytest.approx(0.2)
    # compute bound
    assert bench_out_of_core.floor_terms(_run(8 * GB, 4 * GB), 0.5, ssd)["floor"] == 0.5
    # the disk: reads and writes share it
    disk = bench_out_of_core.floor_terms(_run(1 * GB, 1 * GB, 4 * GB, 2 * GB), 0.05, ssd)
    assert disk["SSD"] == pytest.approx(4.0) and disk["floor"] == pytest.approx(4.0)
    # no in-memory run: no compute term
    assert bench_out_of_core.floor_terms(_run(8 * GB, 0), None, ssd)["floor"] == \
        pytest.approx(0.2)
