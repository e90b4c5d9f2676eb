"""The sparse product priced by the size of its input (`jgrind.plan.cost.spmm_rate_at`): the
profile's cached rate for an input the caches hold, its out-of-cache rate for a large one,
geometric in the bytes between them; each product of a step priced at its own input's size."""

import json

import numpy as np
import pytest

from jgrind import models
from jgrind.plan.cost import ITEMSIZE, backward_seconds, kept_seconds, layer_seconds, \
    spmm_rate_at
from jgrind.plan.hardware import Profile
from jgrind.plan.replan import Calibration
from test_planner import fixed_profile

MB = 1e6
SLOW, FAST = 2e9, 8e9


def two_sizes(**overrides) -> Profile:
    """A profile whose sparse product runs at 8 G/s on 5 MB of input and 2 G/s on 50 MB."""
    figures = dict(spmm_rate=SLOW, spmm_cached_rate=FAST, spmm_bytes=int(50 * MB),
                   spmm_cached_bytes=int(5 * MB))
    return fixed_profile(**{**figures, **overrides})


def test_rate_follows_the_input_size_between_the_two_probes():
    prof = two_sizes()
    got = spmm_rate_at(prof, np.array([1 * MB, 5 * MB, np.sqrt(5 * 50) * MB, 50 * MB, 400 * MB]))
    assert got == pytest.approx([FAST, FAST, np.sqrt(FAST * SLOW), SLOW, SLOW])
    assert np.all(np.diff(spmm_rate_at(prof, np.geomspace(1 * MB, 100 * MB, 20))) <= 0)


def test_without_the_cached_figure_every_size_is_priced_at_the_one_rate():
    for prof in (fixed_profile(spmm_rate=SLOW),
                 two_sizes(spmm_cached_bytes=0),        # sizes not recorded
                 two_sizes(spmm_cached_rate=0.0)):
        assert spmm_rate_at(prof, np.array([1e3, 1e9])) == pytest.approx([SLOW, SLOW])


def test_a_cached_figure_below_the_large_one_is_noise_not_a_slower_cache():
    prof = two_sizes(spmm_cached_rate=SLOW / 2)
    assert spmm_rate_at(prof, np.array([1 * MB, 20 * MB])) == pytest.approx([SLOW, SLOW])


@pytest.mark.parametrize("w_in,w_out", [(16, 64), (64, 16)])
def test_each_product_is_priced_at_its_own_input(w_in, w_out):
    """A partition step's forward product reads its gathered rows and halo (``n_in``), the
    transposed one the output rows' cotangent (``n_out``): with many halo rows the first is
    out of the caches and the second in them. Priced with free dense work and copies."""
    prof = two_sizes(matmul_flops=1e30, contraction_bw=1e30, copy_bw=1e30)
    width = min(w_in, w_out)
    n_out = np.array([2_000.0])                          # 2,000 x 16 x 4 bytes: cached
    n_in = np.array([100 * MB / (width * ITEMSIZE)])     # 100 MB: out of the caches
    nnz = np.array([1e6])
    layer = models.GCNConv(w_in, w_out)
    forward = float(layer_seconds(layer, w_in, w_out, n_out, n_in, nnz, prof)[0])
    assert forward == pytest.approx(nnz[0] * width / SLOW)
    # with the input gradient and no mask: the forward again, and one transposed product
    # (dW of A (X W) needs A^T g too, without the input gradient)
    both = float(backward_seconds(layer, w_in, w_out, n_out, n_in, nnz, prof,
                                  input_grad=w_in <= w_out, masked=False)[0])
    assert both - forward == pytest.approx(nnz[0] * width / FAST)
    kept = float(kept_seconds(layer, w_in, w_out, n_out, n_in, nnz, prof, input_grad=True,
                              masked=True)[0])
    assert kept == pytest.approx(nnz[0] * w_in / FAST)


def test_the_figures_round_trip_and_an_older_profile_reads_without_them():
    prof = two_sizes()
    again = Profile.from_json(json.loads(json.dumps(prof.to_json())))
    assert (again.spmm_cached_rate, again.spmm_bytes, again.spmm_cached_bytes) == \
        (FAST, int(50 * MB), int(5 * MB))
    older = {k: v for k, v in prof.to_json().items()
             if k not in ("spmm_cached_rate", "spmm_bytes", "spmm_cached_bytes")}
    read = Profile.from_json(older)
    assert spmm_rate_at(read, 1 * MB) == pytest.approx(SLOW)
    assert "at 50.0 MB of input, 8.00 at 5.0 MB" in prof.format()


def test_calibrating_compute_scales_both_rates():
    scaled = Calibration(compute=2.0).profile(two_sizes())
    assert (scaled.spmm_rate, scaled.spmm_cached_rate) == (SLOW / 2, FAST / 2)
    # the sizes they were measured at stay
    assert (scaled.spmm_bytes, scaled.spmm_cached_bytes) == (int(50 * MB), int(5 * MB))


def test_a_profile_scaled_to_another_machine_scales_both_rates():
    """`jgrind.plan.sharded.scaled_profile` (a measured epoch of a machine whose profile was
    not saved) speeds up the cached rate with the rest."""
    from jgrind.plan.sharded import scaled_profile
    faster = scaled_profile(two_sizes(), 3.0)
    assert (faster.spmm_rate, faster.spmm_cached_rate) == (3 * SLOW, 3 * FAST)
