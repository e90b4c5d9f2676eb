"""The plan's chart, partition by partition: the cost model's per-partition seconds and the
Gantt chart drawn from them (`jgrind.plan.cost.Prediction.schedule`,
`jgrind.plan.report.draw_schedule`)."""

import dataclasses

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from jgrind import models  # noqa: E402
from jgrind.partition import partition_graph  # noqa: E402
from jgrind.plan import cost  # noqa: E402
from jgrind.plan.cost import D, H, R, S, Assignment, Workload, predict  # noqa: E402
from jgrind.plan.planner import plan  # noqa: E402
from jgrind.plan.report import OUTLINED_PARTS, draw_schedule, plot_plan  # noqa: E402
from jgrind.plan.schedule import Schedule  # noqa: E402

from helpers import community_graph  # noqa: E402
from test_planner import fixed_profile  # noqa: E402

SIZES = (20, 40, 60, 120)  # rows owned by each partition: unequal on purpose


@pytest.fixture(scope="module")
def workload() -> Workload:
    """A 3-layer GCN (run as four layers: the narrowing top one split, its transform
    node-wise) on four partitions of unequal sizes."""
    graph = community_graph(num_nodes=sum(SIZES), num_features=16)
    model = models.gcn(graph.num_features, 32, graph.num_classes, num_layers=3)
    assignment = np.repeat(np.arange(len(SIZES)), SIZES)
    pg = partition_graph(model.normalize(graph), assignment, num_parts=len(SIZES))
    return Workload.build(pg, model)


def mixed(w: Workload) -> Assignment:
    """Blocks in every tier: H_2 partly recomputed, Z_0 kept, gradients split."""
    codes = lambda *c: np.array(c, np.int8)  # noqa: E731
    return Assignment(
        activations=(codes(D, H, S, S), codes(S, H, D, S), codes(R, H, R, S),
                     codes(H, S, D, H)),
        gradients=(codes(D, D, D, D), codes(S, H, S, D), codes(H, S, S, D),
                   codes(D, S, H, S)),
        aggregations={0: codes(S, D, H, S)})


@pytest.mark.parametrize("cache", [0, 1 << 30])
def test_parts_sum_to_the_sweep_totals(workload, cache):
    """Each sweep's per-partition compute, reads and writes sum to the totals the planner
    compares, and each partition's share is its own: bigger partitions cost more."""
    w = workload
    p = predict(w, mixed(w), fixed_profile(), cache_capacity=cache, num_params=1000)
    assert [s.label for s in p.sweeps] == [f"{k} {l}" for k, l in cost.schedule_of(
        w, mixed(w)).order()]
    for s in p.sweeps:
        for parts, total in ((s.part_compute, s.compute), (s.part_reads, s.reads),
                             (s.part_writes, s.writes)):
            assert parts.shape == (w.num_parts,)
            assert float(np.sum(parts)) == pytest.approx(total, rel=1e-12, abs=1e-18)
        # the compute of a step grows with the partition's rows (same tier for every block)
        by_partition = dict(zip(s.partitions, s.part_compute))
        compute = [by_partition[q] for q in range(w.num_parts)]
        assert compute == sorted(compute) and compute[0] < compute[-1]
    # not equal shares of the totals: the largest partition's step costs several times the
    # smallest's
    forward = p.sweeps[0]
    assert forward.part_compute.max() > 2 * forward.part_compute.min()


def test_parts_are_the_operations_prices(workload):
    """A forward sweep's per-partition seconds are the sum of its operations' (`gather_parts`,
    `write_parts`, `step_parts`), not the sweep's total spread out."""
    w, a, profile = workload, mixed(workload), fixed_profile()
    p = predict(w, a, profile)
    first = p.sweeps[0]  # forward 0: gather H_0, write H_1 and Z_0
    order = list(first.partitions)
    reads = cost.gather_parts(w, profile, 0, a.activations[0], order=order)
    writes = cost.write_parts(w, profile, 1, a.activations[1]) + \
        cost.write_parts(w, profile, 0, a.aggregations[0], w.aggregated[0])
    compute = cost.step_parts(w, profile, 0, "forward")
    np.testing.assert_allclose(first.part_reads, reads[order], rtol=1e-12)
    np.testing.assert_allclose(first.part_writes, writes[order], rtol=1e-12)
    np.testing.assert_allclose(first.part_compute, compute[order], rtol=1e-12)
    # and each operation's parts sum to its total
    g = a.gradients[1]
    assert cost.accumulate_parts(w, profile, 1, g).sum() == pytest.approx(
        cost.accumulate_seconds(w, profile, 1, g), rel=1e-12)
    assert cost.read_block_parts(w, profile, 1, g).sum() == pytest.approx(
        cost.read_block_seconds(w, profile, 1, g), rel=1e-12)


def test_whole_file_read_is_paid_by_the_first_reader(workload):
    """A layer's SSD file read whole into the host cache is paid once, by the first
    partition in the sweep's order that reads rows of it."""
    w, profile = workload, fixed_profile()
    codes = np.array([S, H, H, H], np.int8)
    holds = cost.CacheModel(capacity=1 << 30, holds_everything=True)
    total = cost.gather_seconds(w, profile, 1, codes, holds)
    without = cost.gather_seconds(w, profile, 1, codes, holds, reread=True)
    once = total - without  # the whole file's read and checks
    assert once > 0
    readers = (codes == S) | (w.halo @ (codes == S) > 0)
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        parts = cost.gather_parts(w, profile, 1, codes, holds, order=order)
        assert parts.sum() == pytest.approx(total, rel=1e-12)
        payer = next(q for q in order if readers[q])
        reread = cost.gather_parts(w, profile, 1, codes, holds, reread=True)
        extra = parts - reread
        assert extra[payer] == pytest.approx(once, rel=1e-9)
        assert np.allclose(np.delete(extra, payer), 0.0)


class _Reversed(Schedule):
    """A schedule whose steps visit the partitions last to first."""

    def steps(self, partitions, tiers=None, halo_sources=None):
        return super().steps(list(partitions)[::-1], tiers, halo_sources)


def test_partition_order_comes_from_the_schedule(workload, monkeypatch):
    """The cost model lists each sweep's partitions in the order `Schedule.steps` runs them,
    and its per-partition seconds follow that order."""
    w, a, profile = workload, mixed(workload), fixed_profile()
    plain = predict(w, a, profile)
    schedule = cost.schedule_of(w, a)
    steps = schedule.steps(range(w.num_parts))
    for i, s in enumerate(plain.sweeps):
        assert list(s.partitions) == [st.partition for st in steps if st.sweep == i]

    reversed_schedule = _Reversed(**{f.name: getattr(schedule, f.name)
                                     for f in dataclasses.fields(schedule)})
    monkeypatch.setattr(cost, "schedule_of", lambda w, a: reversed_schedule)
    turned = predict(w, a, profile)
    for s, t in zip(plain.sweeps, turned.sweeps):
        assert list(t.partitions) == list(s.partitions)[::-1]
        assert (t.compute, t.reads, t.writes) == (s.compute, s.reads, s.writes)
        np.testing.assert_allclose(t.part_compute, s.part_compute[::-1])
        np.testing.assert_allclose(t.part_writes, s.part_writes[::-1])


def test_schedule_rows_fill_each_sweep(workload):
    """`Prediction.schedule`: one row per (sweep, partition) in each lane the sweep uses, as
    long as the partition's priced seconds, within the sweep's predicted span."""
    w = workload
    p = predict(w, mixed(w), fixed_profile(), num_params=1000)
    rows = p.schedule()
    t = 0.0
    for i, s in enumerate(p.sweeps):
        span = p.sweep_seconds(s)
        epoch, = [r for r in rows if r["sweep"] == i and r["lane"] == "epoch"]
        assert (epoch["start"], epoch["end"]) == pytest.approx((t, t + span))
        for lane, parts in (("compute", s.part_compute), ("reads", s.part_reads),
                            ("writes", s.part_writes)):
            mine = [r for r in rows if r["sweep"] == i and r["lane"] == lane]
            if lane == "writes" and s.writes == 0:
                assert not mine
                continue
            assert [r["partition"] for r in mine] == list(s.partitions)
            np.testing.assert_allclose([r["end"] - r["start"] for r in mine], parts,
                                       rtol=1e-9, atol=1e-15)
            assert all(b["start"] == a["end"] for a, b in zip(mine, mine[1:]))
            assert mine[0]["start"] >= t - 1e-15 and mine[-1]["end"] <= t + span + 1e-15
        t += span
    assert t == pytest.approx(p.epoch_seconds - p.update_seconds)


@pytest.mark.parametrize("num_parts", [4, 2 * OUTLINED_PARTS + 1])
def test_chart_draws_a_segment_per_sweep_and_partition(tmp_path, num_parts):
    graph = community_graph(num_nodes=40 * num_parts, num_features=16)
    model = models.gcn(graph.num_features, 32, graph.num_classes, num_layers=3)
    sizes = np.arange(1, num_parts + 1) * 20 * num_parts // np.arange(1, num_parts + 1).sum()
    sizes[-1] += 40 * num_parts - sizes.sum()
    assignment = np.repeat(np.arange(num_parts), sizes)
    pg = partition_graph(model.normalize(graph), assignment, num_parts=num_parts)
    w = Workload.build(pg, model)
    stored = sum(int(w.block_bytes(l).sum()) for l in range(w.num_layers))
    the_plan = plan(w, fixed_profile(), device_budget=w.working_set() + stored // 4,
                    host_budget=stored // 4, directory=str(tmp_path))
    assert not the_plan.in_memory
    schedule, memory = plot_plan(the_plan, tmp_path / "charts")
    assert schedule.stat().st_size > 1000 and memory.stat().st_size > 1000

    p = the_plan.prediction
    fig, ax = plt.subplots()
    try:
        drawn = draw_schedule(p, ax)
        labels = {text.get_text() for text in ax.texts}
    finally:
        plt.close(fig)
    assert labels == {s.label for s in p.sweeps}
    for i, s in enumerate(p.sweeps):
        lanes = ("compute", "reads") + (("writes",) if s.writes else ())
        assert {lane for (j, lane) in drawn if j == i} == set(lanes)
        for lane in lanes:
            paths = drawn[(i, lane)].get_paths()
            assert len(paths) == num_parts
            widths = [path.get_extents().width for path in paths]
            np.testing.assert_allclose(widths, getattr(s, f"part_{lane}"), rtol=1e-6,
                                       atol=1e-12)
    assert sum(len(c.get_paths()) for (_, lane), c in drawn.items() if lane == "compute") \
        == len(p.sweeps) * num_parts
    outlined = [len(c.get_edgecolor()) > 0 for c in drawn.values()]
    assert all(outlined) if num_parts <= OUTLINED_PARTS else not any(outlined)
