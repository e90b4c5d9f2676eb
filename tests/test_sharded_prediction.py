"""The predicted epoch of one model on several devices (`jgrind.plan.sharded`)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import community_graph
from jgrind import models
from jgrind.plan.cost import ITEMSIZE, in_memory_seconds, parameter_count
from jgrind.plan.exchange import epoch_exchange_bytes, exchange_plan
from jgrind.plan.sharded import (Link, calibrate, device_workloads, links_for,
                                 predict_sharded, scaled_profile)
from test_planner import fixed_profile


def _setup(num_devices, nodes=400, hidden=32):
    graph = community_graph(num_nodes=nodes, num_features=16)
    model = models.gcn(graph.num_features, hidden, graph.num_classes, num_layers=3)
    normalized = model.normalize(graph)
    device_of = np.arange(nodes) * num_devices // nodes  # contiguous blocks of nodes
    exchange = exchange_plan(normalized.indptr, normalized.indices, device_of, num_devices)
    return graph, model, normalized, exchange


def _gpu(profile):
    return dataclasses.replace(profile, machine={**profile.machine, "backend": "gpu"})


def test_one_device_is_the_in_memory_fast_path():
    graph, model, normalized, exchange = _setup(1)
    profile = fixed_profile()
    (w,) = device_workloads(exchange, normalized.indptr, model, graph.num_features)
    assert (w.num_nodes, w.num_edges) == (normalized.num_nodes, normalized.num_edges)
    p = predict_sharded(exchange, normalized.indptr, model, graph.num_features, profile,
                        links_for(profile)[0], parameter_count(model))
    assert p.exchange_seconds == 0 and p.allreduce_seconds == 0
    assert p.epoch_seconds == pytest.approx(in_memory_seconds(w, profile))


def test_exchange_is_the_collective_s_bytes_over_the_link():
    """Every device sends its K - 1 padded chunks: together what `epoch_exchange_bytes`
    counts; at the link's rate, or twice over the link through the host."""
    graph, model, normalized, exchange = _setup(4)
    moved, _ = epoch_exchange_bytes(exchange, model, graph.num_features)
    assert moved > 0
    profile = _gpu(fixed_profile())
    direct = Link("direct", 1e9)
    p = predict_sharded(exchange, normalized.indptr, model, graph.num_features, profile, direct,
                        parameter_count(model))
    assert p.exchange_bytes * 4 == pytest.approx(moved)
    assert p.exchange_seconds == pytest.approx(moved / 4 / 1e9)
    ring = 2 * 3 / 4 * parameter_count(model) * ITEMSIZE
    assert p.allreduce_seconds == pytest.approx(ring / 1e9)
    via_host = predict_sharded(exchange, normalized.indptr, model, graph.num_features, profile,
                               Link("host", 1e9, 1e9, through_host=True),
                               parameter_count(model))
    assert via_host.exchange_seconds == pytest.approx(2 * p.exchange_seconds)


def test_gpus_wait_for_the_slowest_and_cpu_devices_share_cores():
    graph, model, normalized, exchange = _setup(4)
    link = Link("direct", 1e12)
    args = (exchange, normalized.indptr, model, graph.num_features)
    cpu = predict_sharded(*args, fixed_profile(), link, parameter_count(model))
    gpu = predict_sharded(*args, _gpu(fixed_profile()), link, parameter_count(model))
    assert np.allclose(cpu.device_seconds, gpu.device_seconds)
    assert gpu.compute_seconds == pytest.approx(gpu.device_seconds.max())
    assert cpu.compute_seconds == pytest.approx(cpu.device_seconds.sum())
    # each device prices only its own rows and halo slots: less than the whole graph
    _, _, _, whole = _setup(1)
    one = predict_sharded(whole, normalized.indptr, model, graph.num_features,
                          _gpu(fixed_profile()), link, parameter_count(model))
    assert gpu.compute_seconds < one.compute_seconds
    assert {lk.through_host for lk in links_for(_gpu(fixed_profile()))} == {False, True}
    assert [lk.through_host for lk in links_for(fixed_profile())] == [False]


def test_calibrated_profile_prices_the_measured_epoch():
    graph, model, normalized, exchange = _setup(1)
    profile = fixed_profile()
    (w,) = device_workloads(exchange, normalized.indptr, model, graph.num_features)
    before = in_memory_seconds(w, profile)
    target = before / 50
    assert in_memory_seconds(w, calibrate(profile, w, target)) == pytest.approx(target,
                                                                                 rel=1e-6)
    faster = scaled_profile(profile, 2.0)
    assert faster.matmul_flops == 2 * profile.matmul_flops
    assert in_memory_seconds(w, faster) == pytest.approx(before / 2, rel=1e-6)
