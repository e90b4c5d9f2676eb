"""The planner's misses of issue 42 at their cause: each test fails without its fix."""

import jax
import optax
import pytest

from jgrind.engine import OutOfCore
from jgrind.plan import policies
from jgrind.plan.cost import Assignment, predict
from test_planner import equal_parts_workload, fixed_profile


@pytest.mark.parametrize("num_layers", [3, 4])
def test_ssd_offloads_host_peak_is_the_predicted_one(tmp_path, num_layers):
    """``ssd_offload`` with a host cache that holds every SSD block: the store's host peak is
    the predicted one. (A gradient table kept on SSD for the next epoch kept its cached blocks
    too, so by the end of the backward pass the cache held every gradient layer: 0.76x the
    measured peak predicted on the benchmark's device-tight and wide configurations.)"""
    graph, model, pg, w = equal_parts_workload(num_parts=4, num_layers=num_layers)
    stored = sum(int(w.block_bytes(l).sum()) for l in range(w.num_layers))
    device, host = w.working_set() + stored, 8 * stored
    ex = OutOfCore(graph, model, optax.adam(1e-2), policy=policies.ssd_offload(str(tmp_path)),
                   partitioned=pg, store=str(tmp_path), device_budget=device, host_budget=host)
    try:
        a = Assignment.from_fates(ex.fates, w.num_layers, w.num_parts)
        m = predict(ex.workload, a, fixed_profile(), ex.store.cache.capacity).memory
        params = model.init(jax.random.key(0))
        for epoch in range(2):  # the second epoch reuses the kept gradient files
            ex.loss_and_grad(params, jax.random.key(epoch))
            acc = ex.store.accounts
            assert acc.peak_host == m.peak_host, epoch
            assert acc.peak_ssd == m.peak_ssd, epoch
            assert m.host_cache > 0 and m.peak_ssd > 0
    finally:
        ex.close()


def test_the_planner_benchmark_trains_auto_through_train(tmp_path, monkeypatch):
    """`tools/bench_planner.py accuracy` runs ``auto`` as `jgrind.train.train` runs it: long
    enough for the review and a new plan's timed epochs; its row is the last plan's."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1] / "tools"))
    import bench_planner
    from harness import Config
    graph, model, pg, w = equal_parts_workload(num_parts=4, num_layers=2)
    device = int(w.working_set() * 1.05)
    cfg = Config("tiny", 240, 6, 16, 32, 2, "gcn", device, 1 << 30, True, "test")
    run = bench_planner.train_auto(graph, model, cfg, fixed_profile(), str(tmp_path), 1)
    assert not run["replanned"] and run["num_parts"] >= 2
    assert len(run["times_first"]) == len(run["times"]) == 5  # 3 reviewed, 2 after, kept
    assert run["predicted"] == run["predicted_first"] > 0
    assert run["accounts"]["host"] == run["predicted_memory"]["host"]


def _unit_profile(**unit):
    """A profile under which a sweep's price is a count: every rate infinite and every
    per-call cost nothing, but for the figures in ``unit`` (1.0: one second per byte or per
    call)."""
    inf = 1e30
    figures = dict(matmul_flops=inf, spmm_rate=inf, contraction_bw=inf, step_latency=0.0,
                   sweep_step=0.0, gather_bw=inf, scatter_add_bw=inf, gather_row_seconds=0.0,
                   scatter_add_row_seconds=0.0, copy_bw=inf, to_device_bw=inf,
                   to_device_small_bw=inf, to_host_bw=inf, checksum_bw=inf, overlap=0.0,
                   io_parallel=0.0, ssd_latency=0.0, cached_latency=0.0,
                   read_call_overhead=0.0, update_call_overhead=0.0, ssd_read_bw=inf,
                   ssd_write_bw=inf, cached_read_bw=inf, cached_write_bw=inf, host_free=1 << 40)
    return fixed_profile(**{**figures, **unit})


def test_ssd_gathers_read_the_bytes_the_store_reads(tmp_path):
    """``ssd_offload`` with a host cache that holds a few blocks of a layer, not the layer:
    the SSD bytes the cost model prices each forward sweep's gather at are the bytes the
    store's files read. (Every halo owner's whole block was priced as loaded: the engine
    keeps the lowest owners' blocks cached from one partition to the next and reads the
    others' rows as spans. A quarter of the planner benchmark's `ssd` configuration was
    priced at 9.3 GB of reads an epoch against 4.1 GB read; `ssd_offload` there was
    over-predicted by a third.)"""
    from helpers import community_graph
    from jgrind import models
    # 300-row blocks of 256-wide rows: a halo's spans cover a part of its owner's block
    graph = community_graph(num_nodes=4800, num_features=256)
    model = models.gcn(graph.num_features, 256, graph.num_classes, num_layers=3)
    ex = OutOfCore(graph, model, optax.adam(1e-2), policy=policies.ssd_offload(str(tmp_path)),
                   num_parts=16, store=str(tmp_path), host_budget=4 * 300 * 256 * 4)
    try:
        w = ex.workload
        a = Assignment.from_fates(ex.fates, w.num_layers, w.num_parts)
        capacity = ex.store.cache.capacity
        assert 0 < capacity < int(w.block_bytes(1).sum())  # a few blocks, not a layer
        priced = predict(w, a, _unit_profile(ssd_read_bw=1.0, cached_read_bw=1.0), capacity)
        predicted = {s.label: s.reads for s in priced.sweeps}
        measured = {}
        sweeps = ex.runner.sweeps

        def counted(run):
            def sweep(params, l, *args, **kwargs):
                before = ex.store.accounts.ssd_file_read
                out = run(params, l, *args, **kwargs)
                measured[f"forward {l}"] = ex.store.accounts.ssd_file_read - before
                return out
            return sweep
        sweeps.forward = counted(sweeps.forward)
        params = model.init(jax.random.key(0))
        ex.loss_and_grad(params, jax.random.key(0))
        for label in ("forward 0", "forward 1"):
            assert measured[label] > 0
            # (the whole blocks of every halo owner: +57 % here)
            assert predicted[label] == pytest.approx(measured[label], rel=0.1), label
    finally:
        ex.close()
