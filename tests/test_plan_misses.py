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
