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


def test_the_planner_benchmark_trains_auto_through_train(tmp_path, monkeypatch, capsys):
    """`tools/bench_planner.py accuracy` runs ``auto`` as `jgrind.train.train` runs it: long
    enough for the review and a new plan's timed epochs; its row is the last plan's."""
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).parents[1] / "tools"))
    import bench_planner
    from harness import Config
    graph, model, pg, w = equal_parts_workload(num_parts=4, num_layers=2)
    device = int(w.working_set() * 1.05)
    cfg = Config("tiny", 240, 6, 16, 32, 2, "gcn", device, 1 << 30, True, "test")
    plans = []
    run = bench_planner.train_auto(graph, model, cfg, fixed_profile(), str(tmp_path), 1, plans)
    assert not run["replanned"] and run["num_parts"] >= 2
    assert len(plans) == 2 and plans[0] is plans[1]  # kept: the first plan is the last
    assert len(run["times_first"]) == len(run["times"]) == 9  # 3 reviewed, 6 after, kept
    assert run["predicted"] == run["predicted_first"] > 0
    assert run["accounts"]["host"] == run["predicted_memory"]["host"]
    # every epoch held against the plan's own prediction keeps its sweeps, for the replay
    # (the epochs after the review are held against a re-priced one: not kept)
    assert 1 <= len(run["sweeps_first"]) <= len(run["times_first"])
    epoch = run["sweeps_first"][0]
    assert epoch["seconds"] in run["times_first"]
    labels = [row[0] for row in epoch["sweeps"]]
    assert labels[0] == "forward 0" and labels[-1] == "backward 0"
    assert {"compute", "reads", "writes", "machinery"} <= set(epoch["sweeps"][0][3]["predicted"])
    import replay_sweeps
    recorded = list(replay_sweeps._recorded({"auto": {"rounds": [run]}}))
    assert [r[0] for r in recorded] == ["auto 1 first plan"]
    assert recorded[0][2] == min(e["seconds"] for e in run["sweeps_first"])
    # the runs by turns: the plan's engine beside a fixed policy's, every one closed after
    import optax
    from jgrind.engine import OutOfCore
    from jgrind.plan import policies
    plan = plans[-1]
    made = []

    def engine(policy, prediction=None):
        made.append(OutOfCore(graph, model, optax.adam(1e-3), policy=policy,
                              partitioned=plan.partitioned, store=str(tmp_path),
                              device_budget=device, host_budget=1 << 30,
                              prediction=prediction))
        return made[-1]
    turns = bench_planner.compare(
        {"auto": lambda: engine(plan.policy(), plan.prediction),
         bench_planner.AGAIN: lambda: engine(plan.policy(), plan.prediction),
         "ssd_offload": lambda: engine(policies.ssd_offload(str(tmp_path)))},
        model, 2, "auto", ["ssd_offload"])
    assert turns["rounds"] == 2 and turns["auto"] == "auto"
    assert {n: len(t) for n, t in turns["times"].items()} == \
        {"auto": 2, bench_planner.AGAIN: 2, "ssd_offload": 2}
    # the control (the same plan twice) in the report's own column
    times = turns["times"]
    times["auto"], times[bench_planner.AGAIN] = [1.0, 2.0], [1.1, 2.2]
    bench_planner.report_turns([{"config": {"name": "c"}, "turns": turns}])
    assert capsys.readouterr().out.rstrip().endswith("| 1.10 |")
    assert all(ex.store.run_dir is None for ex in made) and not list(tmp_path.glob("jgrind-run-*"))


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


def test_cached_gathers_serve_the_owners_the_model_counts(tmp_path, monkeypatch):
    """A layer split over the device, host RAM and SSD, as the planner benchmark's
    `host-tight` plan splits ``H_0``, gathered through a host cache that holds a few of its SSD
    blocks: the halo owners the SSD tier serves from cached blocks, and those it looks up in
    vain (their rows read as spans), are the ones the cost model prices
    (`cost.halo_cache_reads`). (It priced none of them: on `host-tight`, 256 partitions, a
    gather sweep served ~17k owners one call each, and forward 0 ran 3.6x its prediction.)"""
    from helpers import community_graph
    from jgrind import models
    from jgrind.engine.tiers import cached_ssd
    from jgrind.partition import partition_graph
    from jgrind.plan.cost import Workload, halo_cache_reads, memory
    from jgrind.plan.fates import ACTIVATION, GRADIENT, S, Fate
    from jgrind.plan.planner import Planned
    from jgrind.plan.protocols import IOStrategy
    import numpy as np
    graph = community_graph(num_nodes=4800, num_features=64)
    model = models.gcn(graph.num_features, 64, graph.num_classes, num_layers=3)
    parts = 16
    pg = partition_graph(model.normalize(graph), np.arange(graph.num_nodes) % parts,
                         num_parts=parts)
    w = Workload.build(pg, model)
    tiers = (Fate.DEVICE, Fate.HOST, Fate.SSD)
    fates = {(ACTIVATION, l, p): tiers[p % 3] if l == 0 else Fate.HOST
             for l in range(w.num_layers) for p in range(parts)}
    fates.update({(GRADIENT, l, p): Fate.HOST for l in range(1, w.num_layers)
                  for p in range(parts)})
    a = Assignment.from_fates(fates, w.num_layers, parts)
    block = int(w.block_bytes(0).max())
    policy = Planned(assignment=tuple(sorted(fates.items())), directory=str(tmp_path),
                     io=IOStrategy(cache=True))
    ex = OutOfCore(graph, model, optax.adam(1e-2), policy=policy, partitioned=pg,
                   store=str(tmp_path), host_budget=memory(w, a).host + 3 * block)
    try:
        capacity = ex.store.cache.capacity
        in_ssd = a.activations[0] == S
        assert block <= capacity < int(w.block_bytes(0)[in_ssd].sum())  # a few blocks
        *_, taken, missed = halo_cache_reads(w, w.widths[0], in_ssd, w.widths[0] * 4,
                                             capacity)
        served = {"taken": 0, "owners": 0}
        take, serve = cached_ssd.take_rows, cached_ssd.SSDTier.take_rows

        def counted_take(*args, **kwargs):
            served["taken"] += 1
            return take(*args, **kwargs)

        def counted_serve(self, rows, out):
            served["owners"] += len(rows.segments)
            return serve(self, rows, out)
        monkeypatch.setattr(cached_ssd, "take_rows", counted_take)
        monkeypatch.setattr(cached_ssd.SSDTier, "take_rows", counted_serve)
        sweeps = ex.runner.sweeps
        forward, counts = sweeps.forward, {}

        def counted_forward(params, l, *args, **kwargs):
            before = dict(served)
            out = forward(params, l, *args, **kwargs)
            counts[l] = {k: served[k] - before[k] for k in served}
            return out
        sweeps.forward = counted_forward
        ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(0))
        assert counts[0]["taken"] == int(taken.sum()) > 0
        assert counts[0]["owners"] - counts[0]["taken"] == int(missed.sum()) > 0
        # and the model prices each: one second per owner served, nothing else
        priced = predict(w, a, _unit_profile(cached_take=1.0, cache_lookup=1e-6), capacity)
        reads = {s.label: s.reads for s in priced.sweeps}
        assert reads["forward 0"] == pytest.approx(taken.sum() + 1e-6 * missed.sum())
    finally:
        ex.close()


def test_the_host_cache_counts_its_pinned_bytes_as_they_change():
    """`HostCache.fits` answers from a running count of the pinned entries' bytes, kept
    through puts, evictions, pins, unpins, invalidations and dropped tables. (It summed the
    pinned entries on every call: a gather pins every block of its route and asks once per
    halo owner not cached, 21-33 us a call on `host-tight`'s 256 partitions under load, and
    ``ssd_offload`` on a quarter of the `ssd` configuration over 256 partitions took 30.6-34.8
    s of CPU an epoch with it against 18.6-25.3 s without, epochs alternated in one run.)"""
    import random

    import numpy as np

    from jgrind.engine.cache import HostCache
    rng = random.Random(0)
    cache, held = HostCache(10_000), []
    for step in range(5000):
        op, key = rng.random(), ("t", rng.randrange(20)) if rng.random() < 0.9 else \
            ("u", rng.randrange(5))
        if op < 0.3:
            cache.put(key, np.zeros(rng.randrange(1, 800), np.uint8))
        elif op < 0.45:
            keys = [("t", rng.randrange(20)) for _ in range(rng.randrange(1, 6))]
            cache.pin(keys)
            held.append(keys)
        elif op < 0.6 and held:
            cache.unpin(held.pop(rng.randrange(len(held))))
        elif op < 0.7:
            cache.invalidate(key)
        elif op < 0.72:
            cache.drop_table(key[0])
        elif op < 0.8:
            cache.make_room(rng.randrange(1, 3000))
        else:
            cache.get(key)
        pinned = sum(v.nbytes for k, v in cache._entries.items() if cache._pinned[k] > 0)
        assert cache._pinned_bytes == pinned, step
        assert cache.bytes == sum(v.nbytes for v in cache._entries.values()), step
        nbytes = rng.randrange(1, 5000)
        assert cache.fits(nbytes) == (pinned + nbytes <= cache.capacity), step
