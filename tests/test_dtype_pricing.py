"""The cost model against the store for storage dtypes converted on the device (issue 41): the
bytes that cross between host and device, where the conversions run, the SSD tier's row spans
at the stored width; and R-GCN's recompute price in the inventory (issue 40). Byte and call
counts, not timings."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from jgrind import generators, models
from jgrind.datasets import load
from jgrind.engine import OutOfCore
from jgrind.engine.store import Store
from jgrind.hostio import codecs
from jgrind.partition import contiguous, partition_graph
from jgrind.plan import Fate, policies
from jgrind.plan import cost
from jgrind.plan.check import engine_prediction
from jgrind.plan.cost import D, H, S, Workload
from jgrind.plan.fates import ACTIVATION, Storage
from jgrind.plan.inventory import build_inventory
from test_planner import equal_parts_workload, fixed_profile

FREE = 1e30  # a rate that makes its term vanish


def _only(**figures):
    """A profile in which only ``figures`` cost anything: every other rate infinite, every
    latency and per-call or per-row cost 0. Its seconds are then counts (bytes, calls)."""
    rates = dict(matmul_flops=FREE, spmm_rate=FREE, gather_bw=FREE, scatter_add_bw=FREE,
                 copy_bw=FREE, to_device_bw=FREE, to_device_small_bw=FREE, to_host_bw=FREE,
                 ssd_read_bw=FREE, ssd_write_bw=FREE, cached_read_bw=FREE,
                 cached_write_bw=FREE, checksum_bw=FREE, contraction_bw=FREE,
                 step_latency=0.0, sweep_step=0.0, gather_row_seconds=0.0,
                 scatter_add_row_seconds=0.0, ssd_latency=0.0, cached_latency=0.0,
                 read_call_overhead=0.0, update_call_overhead=0.0, device_call=0.0)
    return fixed_profile(**{**rates, **figures})


# -- 1. link bytes by stored form -------------------------------------------------------------
def _mixed(info):
    """Every tier in every layer (device, host and SSD blocks side by side, so some gathers
    mix coded rows with device ones), ``H_2`` recomputed, ``Z_1`` kept in host RAM."""
    if info.name == "aggregation":
        return Fate.HOST if info.layer == 1 else Fate.RECOMPUTE
    if info.name == "activation" and info.layer == 2:
        return Fate.RECOMPUTE
    return [Fate.DEVICE, Fate.HOST, Fate.SSD, Fate.HOST][(info.partition + info.layer) % 4]


@pytest.mark.parametrize("codec", [codecs.float32(), codecs.bfloat16(), codecs.int8()],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("placement", ["ssd", "mixed"])
def test_link_bytes_are_the_stores_counts(codec, placement, tmp_path):
    """An epoch's predicted ``to_device`` and ``to_host`` bytes equal the pipeline's counters:
    lossy host and SSD blocks cross as stored words when written from a step's output and
    when read or gathered for a step (all rows from coded blocks), as float32 in gathers
    that mix them with device or recomputed rows and in scatter-adds. Without device blocks
    the I/O seconds are those bytes at the link's rates (a profile where only the link costs
    anything); with them, a device block's rows moved to and from the host buffers of a
    mixed gather or scatter-add are priced as well, and the store does not count them."""
    graph = generators.csbm(num_nodes=600, num_features=16, avg_degree=8, seed=3)
    model = models.sage(16, 16, 4, num_layers=4)
    base = policies.ssd_offload(str(tmp_path), gradients=Fate.HOST) \
        if placement == "ssd" else _mixed
    policy = policies.with_storage(base, codec, codec, codec)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=4,
                   store=str(tmp_path), partitioner=contiguous, max_shapes=2) as ex:
        params = model.init(jax.random.key(0))
        ex.loss_and_grad(params, jax.random.key(1))  # compiles; puts the block structures
        acc = ex.store.accounts
        before = acc.to_device, acc.to_host
        ex.loss_and_grad(params, jax.random.key(2))
        measured = acc.to_device - before[0], acc.to_host - before[1]
        link = _only(to_device_bw=1.0, to_device_small_bw=1.0, to_host_bw=1.0)
        predicted = engine_prediction(ex, 0, link)
        w, fates = ex.workload, set(ex.fates.values())
    assert (predicted.to_device, predicted.to_host) == measured
    if placement == "mixed":
        assert fates == {Fate.DEVICE, Fate.HOST, Fate.SSD, Fate.RECOMPUTE}
        return
    labels = int(np.sum(np.where(w.owned > 0, w.pad_out, 0))) * w.label_row_bytes
    assert sum(s.reads for s in predicted.sweeps) == pytest.approx(measured[0] - labels)
    assert sum(s.writes for s in predicted.sweeps) == pytest.approx(measured[1])


# -- 2. where the conversions run --------------------------------------------------------------
def test_the_host_converts_only_scatter_adds_and_mixed_gathers():
    """The measured host conversion rates (`codec_bw`) price a scatter-add's decode and
    encode and the coded rows of a gather that mixes them with device rows; a write, a block
    read and an all-coded gather convert on the device, at its elementwise rate."""
    _, _, _, w = equal_parts_workload(num_parts=4, num_layers=3)
    int8 = codecs.int8()
    coded = dataclasses.replace(w, storage=Storage(int8, int8, int8))
    free = fixed_profile(codec_bw={"int8": (FREE, FREE)})
    slow = fixed_profile(codec_bw={"int8": (1e6, 2e6)})  # bytes/s: encode, decode
    for tier in (H, S):
        codes = np.full(w.num_parts, tier, np.int8)
        for op in (cost.write_seconds, cost.read_block_seconds, cost.gather_seconds):
            assert op(coded, slow, 1, codes) == op(coded, free, 1, codes), (op, tier)
        # every row added to: decoded, added and encoded again on the host
        added = float(np.sum(w.inputs) * w.widths[1] * cost.ITEMSIZE)
        assert cost.accumulate_seconds(coded, slow, 1, codes) \
            - cost.accumulate_seconds(coded, free, 1, codes) \
            == pytest.approx(added / 1e6 + added / 2e6)
    mixed = np.array([D, H, H, H], np.int8)  # partition 0's block on the device
    assert cost.gather_seconds(coded, slow, 1, mixed) > cost.gather_seconds(coded, free, 1,
                                                                            mixed)
    # the device's conversion: one pass over the float32 rows and their stored words
    row, srow = w.widths[1] * cost.ITEMSIZE, 4 * int8.words(w.widths[1])
    memory = _only(copy_bw=1.0)
    host = np.full(w.num_parts, H, np.int8)
    assert cost.write_seconds(coded, memory, 1, host) == pytest.approx(
        np.sum(w.owned) * srow + np.sum(w.pad_out) * (row + srow))  # + the host copy
    assert cost.write_seconds(w, memory, 1, host) == pytest.approx(np.sum(w.owned) * row)


# -- 3. SSD row spans at the stored width ------------------------------------------------------
@pytest.mark.parametrize("codec", [codecs.bfloat16(), codecs.int8()], ids=lambda c: c.name)
def test_predicted_ssd_span_reads_are_the_stores(codec, tmp_path):
    """A gather's halo rows in SSD blocks kept in a lossy dtype are read in spans coalesced
    at the stored width (`COALESCE_BYTES` of stored rows): the calls and bytes the workload
    predicts for every partition are the ones the store makes. (Keyed by the float32 width,
    they were not: sparse halos of a 1024-wide layer take several times the calls.)"""
    width = 1024
    graph = generators.csbm(num_nodes=2000, num_features=8, avg_degree=1, seed=0)
    model = models.sage(8, width, graph.num_classes, num_layers=2)  # layer 1 gathers
    normalized = model.normalize(graph)
    pg = partition_graph(normalized, contiguous(normalized, 4), num_parts=4)
    w = dataclasses.replace(Workload.build(pg, model), storage=Storage(activations=codec))
    words, P = codec.words(width), w.num_parts
    spans = _only(ssd_latency=1.0)  # a second per SSD read call
    rng = np.random.default_rng(0)
    differ = 0
    # one owner's block on SSD at a time, every other in host RAM: the store's SSD file then
    # holds that block alone (a file of several blocks also merges spans across a boundary
    # between two owners' rows, which the workload counts apart unless the file holds every
    # block: `test_spans_over_a_file_of_every_block_are_the_stores`)
    for q in range(P):
        in_ssd = np.arange(P) == q
        with Store(w.owned, tmp_path, host_cache_bytes=0, ssd_bytes_needed=1 << 26) as store:
            table = store.table(ACTIVATION, 1, width,
                                [Fate.SSD if s else Fate.HOST for s in in_ssd], codec=codec)
            for b in range(P):
                table.write(b, rng.standard_normal((int(w.owned[b]), width)).astype(
                    np.float32))
            for part in pg.partitions:
                p = part.index
                if p == q:
                    continue
                before = store.accounts.ssd_read_ops, store.accounts.ssd_file_read
                table.gather(p, part.halo_owner, part.halo_row, int(w.pad_in[p]))
                calls = store.accounts.ssd_read_ops - before[0]
                nbytes = store.accounts.ssd_file_read - before[1]
                # the owner's table (the price scales it by what a file of every block
                # makes: `test_spans_over_a_file_of_every_block_are_the_stores`)
                predicted_calls, predicted_rows = w._pair_spans_in(words, in_ssd)
                assert (predicted_calls[p], predicted_rows[p] * 4 * words) == (calls, nbytes)
                codes = np.where(in_ssd, S, H).astype(np.int8)
                assert cost.gather_parts(w, spans, 1, codes)[p] == pytest.approx(
                    calls * w._file_scales(words, False)[0])
                differ += w._pair_spans_in(width, in_ssd)[0][p] != calls
    assert differ  # at float32's gap the calls are others


@pytest.mark.parametrize("width,piece,gap", [(8, 1 << 20, None), (8, 1 << 10, None),
                                             (8, 1 << 10, 1 << 8), (64, 1 << 20, None)],
                         ids=["8-wide", "8-wide-small-pieces", "several-long-spans", "64-wide"])
def test_spans_over_a_file_of_every_block_are_the_stores(width, piece, gap, tmp_path,
                                                        monkeypatch):
    """With every block of a table on SSD (its file holds them all, in block order), a
    gather's halo rows and a scatter-add's own and halo rows are read in spans that run on
    across adjacent blocks where their rows are closer than the gap, and long spans in
    pieces: the calls and bytes the workload predicts for a sweep are the ones the store
    makes (spread over partitions as the owners' tables spread them), a scatter-add's unless
    a piece cuts a span its own block joins. (Counted per owner block, 8-wide rows of 16
    blocks narrower than the gap took several times the calls; the top layer's classes on the
    planner benchmark's host-tight configuration: 65,541 priced, 1,309 made.)"""
    from jgrind.engine import ssd
    monkeypatch.setattr(ssd, "SCRATCH_BYTES", piece)
    monkeypatch.setattr(cost, "SPAN_PIECE_BYTES", piece)
    if gap:  # narrow gaps: several spans a partition, some longer than a piece
        monkeypatch.setattr(ssd, "COALESCE_BYTES", gap)
        monkeypatch.setattr(cost, "COALESCE_BYTES", gap)
    graph = generators.csbm(num_nodes=3000, num_features=8, avg_degree=4, seed=0)
    model = models.gcn(8, width, graph.num_classes, num_layers=2)  # layer 1 gathers
    normalized = model.normalize(graph)
    pg = partition_graph(normalized, contiguous(normalized, 16), num_parts=16)
    w, P, row = Workload.build(pg, model), 16, width * 4
    every = np.ones(P, bool)
    exact = {own: w.spans.file_spans(cost.COALESCE_BYTES // row, piece // row, own)
             for own in (False, True)}
    made = {False: np.zeros((P, 2), np.int64), True: np.zeros((P, 3), np.int64)}
    rng = np.random.default_rng(0)
    with Store(w.owned, tmp_path, host_cache_bytes=0, ssd_bytes_needed=1 << 26) as store:
        table = store.table(ACTIVATION, 1, width, [Fate.SSD] * P)
        for b in range(P):
            table.write(b, rng.standard_normal((int(w.owned[b]), width)).astype(np.float32))
        acc = store.accounts
        for part in pg.partitions:
            p = part.index
            before = acc.ssd_read_ops, acc.ssd_file_read
            table.gather(p, part.halo_owner, part.halo_row, int(w.pad_in[p]))
            # less the own block, read whole in one call
            made[False][p] = (acc.ssd_read_ops - before[0] - 1,
                              (acc.ssd_file_read - before[1]) // row - w.owned[p])
            before = acc.ssd_read_ops, acc.ssd_write_ops, acc.ssd_file_read, acc.ssd_file_written
            table.accumulate(p, part.halo_owner, part.halo_row,
                             np.ones((int(w.pad_in[p]), width), np.float32))
            made[True][p] = (acc.ssd_read_ops - before[0], acc.ssd_write_ops - before[1],
                             (acc.ssd_file_read - before[2]) // row)
            assert acc.ssd_file_written - before[3] == made[True][p][2] * row
    for own in (False, True):
        calls, rows = exact[own]  # the file's spans, partition by partition, are the store's
        assert np.array_equal(made[own][:, 0], calls) and np.array_equal(made[own][:, -1], rows)
        if own:
            assert np.array_equal(made[own][:, 1], calls)  # a write per span read
        priced = cost.ssd_span_reads(w, width, every, with_own=own)
        # (a scatter-add's own block joins its neighbours' spans as if no piece cut them)
        assert [float(np.sum(t)) for t in priced] == pytest.approx(
            [calls.sum(), rows.sum()], rel=0.1 if own and piece < 1 << 20 else 1e-9)
        apart = w._pair_spans_in(width, every)[0] + (every if own else 0)
        assert np.sum(apart) != np.sum(calls)  # counted per owner block, the calls are others


# -- 4. R-GCN's recompute price ----------------------------------------------------------------
def test_rgcn_recompute_flops_are_what_the_cost_model_prices():
    """R-GCN aggregates first (one sparse product over the relation rows at the input width)
    and multiplies the relation weights on the output rows: the inventory's recompute price
    of a block is the forward the cost model prices (`layer_products`, at one flop per
    second), per output row, not per input row times the relations."""
    g = load("mag-like:0.002")
    w_in, hidden = g.num_features, 16
    model = models.rgcn(w_in, hidden, g.num_classes, g.num_relations, num_layers=2)
    normalized = model.normalize(g)
    pg = partition_graph(normalized, contiguous(normalized, 4), num_parts=4)
    counts = _only(matmul_flops=1.0, spmm_rate=0.5)  # a sparse nonzero-width: 2 flops
    layer, relations = model.layers[0], g.num_relations
    recomputed = {i.partition: i.recompute_flops for i in build_inventory(model, pg)
                  if i.name == ACTIVATION and i.layer == 1}
    for part in pg.partitions:
        priced = cost.layer_products(layer, w_in, hidden, part.num_owned, part.num_inputs,
                                     part.num_edges, counts).forward
        assert recomputed[part.index] == pytest.approx(float(priced))
        assert recomputed[part.index] == pytest.approx(
            2.0 * part.num_edges * w_in + 2.0 * part.num_owned * w_in * hidden * (relations + 1))
        # the price the inventory had: every input row (halo included) times R + 1 products
        assert recomputed[part.index] < 2.0 * part.num_edges * w_in \
            + 2.0 * part.num_inputs * w_in * hidden * (relations + 1)
