"""The out-of-core engine against the in-memory full-graph computation.

Tolerance: float32 with the partition-wise sums taken in a different order than the in-memory
ones. Each gradient entry is a sum over up to a few thousand products, so reordering moves it by
a few ulps of the largest partial sum; we allow ``1e-4 * max|g| + 1e-7`` per tensor. Every real
bug we have made while building the engine (a dropped halo gradient, a wrong loss scale,
per-partition dropout masks, normalisation recomputed per partition) moves gradients by 1e-2
relative or more, so this bound separates the two by orders of magnitude.
"""

import collections
import dataclasses
import functools
import os
import pathlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jgrind import datasets, generators, models
from jgrind.engine import BudgetError, OutOfCore, StoreCorruptedError, StoreError
from jgrind.models.conv import derivative_from_output
from jgrind.partition import contiguous, random as random_partition
from jgrind.plan import Fate, policies
from jgrind.plan.fates import AGGREGATION
from jgrind.train import InMemory, make_executor, train

from helpers import community_graph, csbm_graph, reference

RTOL = 1e-4


def assert_same_gradients(grads, reference):
    for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads),
                            jax.tree.leaves(reference)):
        g, r = np.asarray(g), np.asarray(r)
        bound = RTOL * np.abs(r).max() + 1e-7
        err = np.abs(g - r).max()
        assert err <= bound, f"{jax.tree_util.keystr(path)}: max error {err:.3g} > {bound:.3g}"


def _models(f, c):
    return {
        "gcn": models.gcn(f, 16, c, num_layers=3, dropout=0.5),
        "sage-res-ln": models.sage(f, 16, c, num_layers=2, dropout=0.5, residual=True,
                                   layer_norm=True),
        "gat": models.gat(f, 4, c, heads=2, num_layers=2, dropout=0.5),
        "gcn-res-ln": models.gcn(f, 16, c, num_layers=2, dropout=0.3, residual=True,
                                 layer_norm=True),
    }


def _policies(tmp_path):
    return {"in_memory": policies.in_memory(), "host": policies.host_offload(),
            "ssd": policies.ssd_offload(tmp_path),
            "recompute": policies.recompute_activations(),
            "grinnder": policies.grinnder(2**20, 2**20, tmp_path)}


def _check(graph, model, policy, parts, tmp_path, partitioner=contiguous, max_shapes=3,
           built=lambda ex: None):
    """The engine's loss and gradients are the in-memory ones; ``built`` is handed the engine
    before its step (checks of what it was built with). Returns the store's accounts."""
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)  # dropout on: masks must not depend on the partitioning
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=parts,
                   store=tmp_path, partitioner=partitioner, max_shapes=max_shapes) as ex:
        built(ex)
        loss, grads = ex.loss_and_grad(params, key)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
        assert_same_gradients(grads, ref_grads)
        return ex.store.accounts


MODELS = ["gcn", "sage-res-ln", "gat", "gcn-res-ln"]
POLICIES = ["in_memory", "host", "ssd", "recompute", "grinnder"]
PARTS = [1, 2, 7, 16]


def _rotated_parts(model, policy):
    return PARTS[(MODELS.index(model) + POLICIES.index(policy)) % len(PARTS)]


# The generated-graph cases pad their partitions to one shape (a third of the compilations
# of the default three), but under `in_memory`. Partitions of several padded shapes, whose
# steps run grouped by shape and hand their outputs on (`Spares`), stay checked under
# `in_memory` here, under `host` and `ssd` by test_cora and
# test_row_moves_split_across_threads_are_exact, under `recompute` by test_tolokers.
def _max_shapes(policy):
    return 3 if policy == "in_memory" else 1


# Every model under every policy (partition counts rotate), and every model at every partition
# count (under the SSD policy, the one with the most moving parts): all pairs, not the product.
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("model", MODELS)
def test_generated_graph_every_policy(model, policy, tmp_path):
    graph = csbm_graph()
    parts = _rotated_parts(model, policy)
    _check(graph, _models(8, graph.num_classes)[model], _policies(tmp_path)[policy], parts,
           tmp_path, partitioner=random_partition, max_shapes=_max_shapes(policy))


@pytest.mark.parametrize("policy", ["host", "ssd"])
def test_row_moves_split_across_threads_are_exact(policy, tmp_path, monkeypatch):
    # every gather and scatter-add of the store in parts of a few rows, on 3 threads
    import jgrind.hostio.rows as rows
    graph = csbm_graph()
    monkeypatch.setattr(rows, "MIN_BYTES_PER_THREAD", 256)
    calls = []
    real_run_parts = rows._run_parts
    monkeypatch.setattr(rows, "_run_parts", lambda parts, call: calls.append(len(parts))
                        or real_run_parts(parts, call))
    previous = rows.set_threads(3)
    try:
        _check(graph, _models(8, graph.num_classes)["gcn-res-ln"], _policies(tmp_path)[policy],
               7, tmp_path, partitioner=random_partition)
    finally:
        rows.set_threads(previous)
    assert calls and max(calls) == 3  # the store's moves were really split


# (the pair the rotation above already runs under the SSD policy is left out here)
@pytest.mark.parametrize("model, parts", [(m, p) for m in MODELS for p in PARTS
                                          if p != _rotated_parts(m, "ssd")])
def test_generated_graph_every_partition_count(model, parts, tmp_path):
    graph = csbm_graph()
    _check(graph, _models(8, graph.num_classes)[model], _policies(tmp_path)["ssd"], parts,
           tmp_path, partitioner=random_partition, max_shapes=_max_shapes("ssd"))


_dataset = functools.cache(datasets.load)  # the real graphs, loaded once


# The real graphs: each model once, at one partition count each (every model meets every
# count and every policy on the generated graph above; a real graph compiles its own steps
# for each count, 5-15 s apiece).
@pytest.mark.parametrize("model, parts, policy", [("gcn", 16, "host"), ("sage-res-ln", 7, "ssd"),
                                                  ("gat", 2, "ssd")])
def test_cora(model, parts, policy, tmp_path, data_file):
    data_file("planetoid/ind.cora.graph")
    graph = _dataset("cora")
    _check(graph, _models(graph.num_features, 7)[model], _policies(tmp_path)[policy], parts,
           tmp_path)


def test_tolokers(tmp_path, data_file):
    data_file("heterophilous/tolokers.npz")
    graph = _dataset("tolokers")
    model = models.gcn(graph.num_features, 16, 2, num_layers=2, dropout=0.2, residual=True,
                       layer_norm=True)
    _check(graph, model, _policies(tmp_path)["recompute"], 16, tmp_path)


def test_parameters_agree_after_20_epochs(tmp_path):
    graph = community_graph(num_nodes=300, num_features=8)
    model = models.gcn(8, 16, graph.num_classes, num_layers=2, dropout=0.5, residual=True,
                       layer_norm=True)
    opt = optax.adam(0.01)
    ref = train(jax.random.key(3), graph, model, opt, epochs=20, progress=False)
    ooc = train(jax.random.key(3), graph, model, opt, epochs=20, progress=False,
                policy=policies.ssd_offload(tmp_path), num_parts=5)
    for a, b in zip(jax.tree.leaves(ooc.params), jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
    assert ooc.best_epoch == ref.best_epoch and ooc.test == pytest.approx(ref.test)
    assert list(tmp_path.iterdir()) == []  # the run's directory is gone


def test_small_budgets_really_use_the_ssd_tier(tmp_path):
    graph = generators.csbm(num_nodes=3000, num_features=16, avg_degree=8, seed=0)
    model = models.gcn(16, 32, graph.num_classes, num_layers=3, dropout=0.5)
    probe = OutOfCore(graph, model, optax.sgd(0.1), num_parts=8, store=tmp_path)
    working_set = probe.memory.device_working_set
    total = sum(info.nbytes for info in probe.inventory if info.name != "aggregation")
    probe.close()
    device_budget = working_set + 20_000        # room for a block or two at most
    host_budget = total // 4                    # a quarter of the stored tensors
    params = model.init(jax.random.key(0))
    key = jax.random.key(1)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with OutOfCore(graph, model, optax.sgd(0.1), num_parts=8, store=tmp_path,
                   device_budget=device_budget, host_budget=host_budget) as ex:
        fates = set(ex.fates.values())
        assert Fate.SSD in fates and Fate.HOST in fates
        loss, grads = ex.loss_and_grad(params, key)
        acc = ex.store.accounts
        assert acc.peak_ssd > 0 and acc.ssd_written > 0 and acc.ssd_read > 0
        assert acc.peak_host <= host_budget
        assert acc.peak_device <= device_budget - working_set
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)


def test_budget_too_small_fails_before_work_with_minimum(tmp_path):
    graph = community_graph(num_nodes=300)
    model = models.gcn(graph.num_features, 16, graph.num_classes)
    with pytest.raises(BudgetError, match=r"working set .* at least"):
        OutOfCore(graph, model, optax.sgd(0.1), num_parts=2, device_budget=1000,
                  store=tmp_path)
    with pytest.raises(BudgetError, match="host budget"):
        OutOfCore(graph, model, optax.sgd(0.1), num_parts=2, policy=policies.host_offload(),
                  host_budget=1000)
    assert list(tmp_path.iterdir()) == []


def test_store_directory_problems(tmp_path):
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    build = lambda d: OutOfCore(graph, model, optax.sgd(0.1),  # noqa: E731
                                policy=policies.ssd_offload(d), num_parts=2)
    with pytest.raises(StoreError, match="does not exist"):
        build(tmp_path / "missing")
    with pytest.raises(StoreError, match="no store directory"):
        OutOfCore(graph, model, optax.sgd(0.1), policy=lambda info: Fate.SSD, num_parts=2)
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        if os.access(read_only, os.W_OK):
            pytest.skip("running as a user that can write anywhere (root)")
        with pytest.raises(StoreError, match="not writable"):
            build(read_only)
    finally:
        read_only.chmod(0o700)


def test_store_full_disk_is_refused_before_writing(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 100, 100))
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    with pytest.raises(StoreError, match="GiB free"):
        OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                  num_parts=2)
    assert list(tmp_path.iterdir()) == []


def test_read_only_directory_message_without_root(tmp_path, monkeypatch):
    """Root can write anywhere, so also check the message path with os.access faked."""
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if pathlib.Path(p) == tmp_path
                        else real_access(p, mode))
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    with pytest.raises(StoreError, match="not writable"):
        OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                  num_parts=2)


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "header"])
def test_store_damaged_between_forward_and_backward(damage, tmp_path):
    graph = community_graph(num_nodes=300)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=2)
    ex = OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                   num_parts=3, host_budget=0, prefetch=False)
    forward = ex.runner.sweeps.forward

    def forward_then_damage(params, layer, key, *variant):
        forward(params, layer, key, *variant)
        path = ex.store.tables[("activation", layer + 1)].ssd.path
        size = path.stat().st_size
        with open(path, "r+b") as f:
            if damage == "truncate":
                f.truncate(size - 64)
            elif damage == "corrupt":
                f.seek(size - 16)
                f.write(b"\x7f" * 16)
            else:
                f.write(b"XXXXXXXX")
    ex.runner.sweeps.forward = forward_then_damage
    with pytest.raises(StoreCorruptedError, match="store file"):
        ex.loss_and_grad(model.init(jax.random.key(0)), None)
    ex.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("prefetch", [True, False], ids=["prefetch", "serial"])
def test_a_step_finishes_before_the_load_two_partitions_on_starts(prefetch, monkeypatch):
    """A sweep's pipeline (`jgrind.engine.pipeline.SweepIO`) bounds the inputs alive to two
    partitions' (the working-set model):
    partition i's load starts only once the step of partition i-2 has finished. Steps are
    dispatched asynchronously, so without this wait a fast loader lets them queue up. With a
    loader thread the wait is the loader's, and load i is queued before step i-1 is
    dispatched: the main thread, which dispatches, never waits on a step there."""
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    events = []
    plain_wait = jax.block_until_ready

    def waiting(x):
        if isinstance(x, jax.Array) and x.ndim == 1:  # a step's marker, not a load
            events.append(("finished", int(np.asarray(x)[0]),
                           threading.current_thread() is threading.main_thread()))
        return plain_wait(x)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(), num_parts=5,
                   prefetch=prefetch) as ex:
        def load(part):
            events.append(("load", part.index))
            return part.index
        monkeypatch.setattr(jax, "block_until_ready", waiting)
        with ex.built.pipeline.sweep(ex.parts, load) as io:
            for part, got in io:
                assert got == part.index
                events.append(("dispatch", part.index))
                io.dispatched(jnp.full(3, float(part.index)))
        monkeypatch.undo()
        order = [part.index for part in ex.parts]  # the partitions run grouped by shape
    assert sorted(order) == list(range(5))
    finished = {e[1]: i for i, e in enumerate(events) if e[0] == "finished"}
    for k in range(2, len(order)):
        assert finished[order[k - 2]] < events.index(("load", order[k]))
    on_main = [e for e in events if e[0] == "finished" and e[2]]
    assert (not on_main) if prefetch else len(on_main) == len(order) - 1


@pytest.mark.parametrize("aggregations", [Fate.RECOMPUTE, Fate.HOST],
                         ids=["regathered", "kept-aggregation"])
def test_backward_reads_output_gradients_on_the_loader_thread(aggregations, monkeypatch):
    """A backward step's output gradient is loaded with its input, on the loader thread, and
    handed over as a device array: on a GPU its read and host-to-device copy then overlap the
    running step instead of holding up the main thread, which dispatches the steps."""
    from jgrind.engine.store import Table
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    threads, plain_read = [], Table.read

    def read(table, block, padded_rows):
        if table.name == "gradient":
            threads.append(threading.current_thread().name)
        return plain_read(table, block, padded_rows)
    monkeypatch.setattr(Table, "read", read)
    with OutOfCore(graph, model, optax.sgd(0.1), num_parts=4,
                   policy=policies.host_offload(aggregations=aggregations)) as ex:
        ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(1))
        staged = []
        with ex.built.pipeline.sweep(ex.parts, lambda part: (np.zeros(3, np.float32),
                                                             part.index)) as io:
            for part, loaded in io:
                staged.append((part, loaded))
                io.dispatched(loaded[0])
    # every executed layer but the top reads the gradient of its output, once per partition
    assert len(threads) == (ex.num_layers - 1) * len(ex.parts)
    assert all(name.startswith("jgrind-loader") for name in threads), threads
    for part, (array, index) in staged:
        assert isinstance(array, jax.Array) and index == part.index


def _device_first_partition(keep_aggregations: bool):
    """Partition 0's blocks on the device, the others' in host RAM; aggregations kept so, or
    recomputed."""
    def policy(info):
        if info.name == AGGREGATION and not keep_aggregations:
            return Fate.RECOMPUTE
        return Fate.DEVICE if info.partition == 0 else Fate.HOST
    return policy


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "all-device"])
@pytest.mark.parametrize("aggregations", [False, True], ids=["regathered", "kept-aggregation"])
def test_host_copies_start_at_dispatch_for_outputs_stored_off_the_device(mixed, aggregations,
                                                                          monkeypatch):
    """A step output that the store will read in host memory (a block written to host RAM or
    SSD, or a gradient scatter-added into any block off the device) has its device-to-host
    copy started when the step is dispatched (on a GPU it then overlaps the next step); one
    that lands on the device only is not copied at all."""
    from jax._src.array import ArrayImpl
    from jgrind.engine.store import Table
    policy = _device_first_partition(aggregations) if mixed else \
        policies.in_memory(aggregations=Fate.DEVICE if aggregations else Fate.RECOMPUTE)
    graph = community_graph(num_nodes=240)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    copied, stored = [], []  # arrays whose host copy was started; (array, read on host)
    plain_copy = ArrayImpl.copy_to_host_async
    monkeypatch.setattr(ArrayImpl, "copy_to_host_async",
                        lambda self: (copied.append(self), plain_copy(self))[-1])
    plain_write, plain_accumulate = Table.write, Table.accumulate

    def off_device(table, blocks):
        return any(table.fate(int(b)) is not Fate.DEVICE for b in blocks)

    def write(table, block, values):
        stored.append((values, off_device(table, [block])))
        return plain_write(table, block, values)

    def accumulate(table, block, halo_owner, halo_row, values, **kw):
        stored.append((values, off_device(table, [block, *halo_owner])))
        return plain_accumulate(table, block, halo_owner, halo_row, values, **kw)
    monkeypatch.setattr(Table, "write", write)
    monkeypatch.setattr(Table, "accumulate", accumulate)
    with OutOfCore(graph, model, optax.sgd(0.1), num_parts=4, policy=policy) as ex:
        ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(1))
    outputs = [(v, host) for v, host in stored if isinstance(v, jax.Array)]
    assert outputs
    for values, on_host in outputs:
        assert any(c is values for c in copied) == on_host
    if mixed:
        assert any(on_host for _, on_host in outputs) and not all(h for _, h in outputs)
    else:
        assert not copied


def _exact_with_blocks_on_every_tier(model: str, tmp_path, setup) -> None:
    """An engine whose blocks are spread over the device, host RAM and SSD, given to
    ``setup`` before its step, gives the in-memory loss and gradients."""
    graph = csbm_graph()
    net = _models(8, graph.num_classes)[model]

    def spread(info):
        return (Fate.DEVICE, Fate.HOST, Fate.SSD)[info.partition % 3]
    params = net.init(jax.random.key(0))
    key = jax.random.key(42)
    ref_loss, ref_grads = reference(graph, net).loss_and_grad(params, key)
    with OutOfCore(graph, net, optax.sgd(0.1), policy=spread, num_parts=5, store=tmp_path,
                   partitioner=random_partition) as ex:
        setup(ex)
        loss, grads = ex.loss_and_grad(params, key)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)


@pytest.mark.parametrize("model", ["gcn", "sage-res-ln", "gat"])
def test_inputs_put_together_on_the_device_are_exact(model, tmp_path, monkeypatch):
    """Where the device is not host RAM (a GPU), a gather leaves the rows held on the device
    there and sets them into the input sent from the host (`DeviceRows`), and a scatter-add
    takes the rows bound for device blocks from the step output; forced here on the CPU, with
    blocks spread over the device, host RAM and SSD, the loss and gradients are the in-memory
    ones."""
    from jgrind.engine.store import DeviceRows
    merged, plain_to_device = [], DeviceRows.to_device
    monkeypatch.setattr(DeviceRows, "to_device",
                        lambda rows: (merged.append(1), plain_to_device(rows))[-1])

    def setup(ex):
        ex.keep_device_rows = True
    _exact_with_blocks_on_every_tier(model, tmp_path, setup)
    assert merged  # inputs were put together on the device


@pytest.mark.parametrize("model", ["gcn", "sage-res-ln", "gat"])
def test_outputs_stored_through_pinned_host_memory_are_exact(model, tmp_path, monkeypatch):
    """Where the device is not host RAM (a GPU), a step output the store reads on the host
    only is copied to the device's page-locked host memory (``pinned_host``) and stored from
    there; forced here on the CPU, with blocks spread over the device, host RAM and SSD (so
    some scatter-adds touch device blocks and keep the device output), the loss and gradients
    are the in-memory ones."""
    from jgrind.hostio import transfers
    pinned, plain_put = [], jax.device_put

    def put(x, *args, **kwargs):
        if args and getattr(args[0], "memory_kind", None) == "pinned_host":
            pinned.append(x.shape)
        return plain_put(x, *args, **kwargs)

    def setup(ex):
        assert ex.pinned_host is None  # the CPU backend: the output's buffer is its host view
        ex.pinned_host = transfers.pinned_host()
        monkeypatch.setattr(jax, "device_put", put)
    _exact_with_blocks_on_every_tier(model, tmp_path, setup)
    assert pinned  # outputs went through pinned host memory


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_inputs_sent_in_row_ranges_are_exact(model, tmp_path, monkeypatch):
    """A step input sent to the device in several row ranges at once, joined there
    (`OutOfCore.staging_pieces`, for a GPU's host-side staging), gives the in-memory loss
    and gradients."""
    from jgrind.engine import pipeline
    joined, plain_join = [], pipeline._join_rows
    monkeypatch.setattr(pipeline, "MIN_PIECE_BYTES", 256)
    monkeypatch.setattr(pipeline, "_join_rows",
                        lambda *parts: (joined.append(len(parts)), plain_join(*parts))[-1])

    def setup(ex):
        ex.staging_pieces = 3
    _exact_with_blocks_on_every_tier(model, tmp_path, setup)
    assert joined and max(joined) == 3


@pytest.mark.parametrize("model", ["gcn", "gat"])
def test_inputs_filled_into_pinned_buffers_are_exact(model, tmp_path, monkeypatch):
    """Off the CPU backend the store can fill step inputs into page-locked buffers that are
    put on the device from there (`OutOfCore.pinned_inputs`, `jgrind.hostio.transfers.PinnedStaging`);
    forced here on the CPU, with blocks spread over the device, host RAM and SSD, and the
    buffers refilled over the sweeps, the loss and gradients are the in-memory ones."""
    from jgrind.hostio import transfers
    from jgrind.engine import build
    made, sent, plain_to_device = [], [], transfers.PinnedStaging.to_device
    monkeypatch.setattr(transfers.PinnedStaging, "to_device", lambda self, values: (
        lambda out: (sent.append(out is not None), out)[-1])(plain_to_device(self, values)))

    def staging():
        made.append(transfers.pinned_staging(per_shape=3, enabled=False))
        return made[-1]
    monkeypatch.setattr(build, "_input_staging", staging)

    def setup(ex):
        assert not ex.pinned_inputs  # built switched off
        ex.pinned_inputs = True
    _exact_with_blocks_on_every_tier(model, tmp_path, setup)
    assert made[0].made and made[0].reused  # inputs went through refilled pinned buffers
    assert any(sent)  # and were put on the device from them


def test_pinned_inputs_need_pinned_buffers(tmp_path):
    graph = csbm_graph()
    with OutOfCore(graph, _models(8, graph.num_classes)["gcn"], optax.sgd(0.1),
                   policy=policies.host_offload(), num_parts=2) as ex:
        assert ex.pinned_inputs is False  # the CPU backend: the store has none
        with pytest.raises(ValueError, match="no page-locked input buffers"):
            ex.pinned_inputs = True


GUARDED = ["in_memory", "host", "ssd", "recompute", "grinnder", "spread", "spread-gpu-paths"]


@pytest.mark.parametrize("policy", GUARDED)
def test_no_implicit_transfers_in_an_out_of_core_epoch(policy, tmp_path):
    """An out-of-core epoch and a prediction run with JAX's transfer guard set to refuse every
    implicit host-device transfer, on every thread: what crosses does so by `jax.device_put`
    or `jax.device_get`. On a GPU an implicit transfer is a synchronous copy that no profile
    names (the big_vision trainer runs under the same guard). "spread" puts blocks on the
    device, in host RAM and on SSD; "spread-gpu-paths" also forces the paths the engine takes
    off the CPU backend (device rows kept there, outputs through ``pinned_host`` memory)."""
    from jgrind.hostio import transfers
    graph = csbm_graph()
    names = list(_models(8, graph.num_classes))
    net = _models(8, graph.num_classes)[names[GUARDED.index(policy) % len(names)]]

    def spread(info):
        return (Fate.DEVICE, Fate.HOST, Fate.SSD)[info.partition % 3]
    chosen = spread if policy.startswith("spread") else _policies(tmp_path)[policy]
    with OutOfCore(graph, net, optax.adam(0.01), policy=chosen, num_parts=3, store=tmp_path,
                   partitioner=random_partition) as ex:
        if policy == "spread-gpu-paths":
            ex.keep_device_rows = True
            ex.pinned_host = transfers.pinned_host()
        params = net.init(jax.random.key(0))
        opt_state = optax.adam(0.01).init(params)
        params, opt_state, _ = ex.step(params, opt_state, jax.random.key(1))  # compiles
        key = jax.random.key(2)
        previous = jax.config.jax_transfer_guard
        jax.config.update("jax_transfer_guard", "disallow")  # every thread, not just this one
        try:
            params, opt_state, loss = ex.step(params, opt_state, key)
            logits = ex.predict(params)
        finally:
            jax.config.update("jax_transfer_guard", previous)
    assert np.isfinite(float(loss)) and np.isfinite(logits).all()


def test_bytes_across_the_link_are_counted(tmp_path):
    """The store counts what the engine hands to the device and reads back on the host (what
    crosses PCIe on a GPU): nothing comes back when every block is kept on the device, and
    through host RAM every stored output comes back and every input goes over, at least the
    rows the store read for them."""
    graph = community_graph(num_nodes=300)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    moved = {}
    for name, policy in (("device", policies.in_memory()), ("host", policies.host_offload())):
        with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=3,
                       store=tmp_path) as ex:
            ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(1))
            moved[name] = ex.store.accounts
            outputs = sum(4 * p.num_out * ex.widths[l + 1] for p in ex.parts
                          for l in range(ex.num_layers - 1))  # the forward's stored outputs
    assert moved["device"].to_host == 0
    host = moved["host"]
    assert host.to_host >= outputs  # and the backward's input gradients
    assert host.to_device >= host.host_read > 0


def test_naive_snapshots_are_written_from_the_host_rows(tmp_path, monkeypatch):
    """The naive scheme writes each forward step input to its snapshot as the NumPy rows that
    were loaded, not as a device array (on a GPU a copy there and back)."""
    from jgrind.engine.store import Snapshot
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    kinds, plain_write = [], Snapshot.write

    def write(snapshot, block, values):
        kinds.append(type(values))
        return plain_write(snapshot, block, values)
    monkeypatch.setattr(Snapshot, "write", write)
    with OutOfCore(graph, model, optax.sgd(0.1), num_parts=3,
                   policy=policies.naive(tmp_path)) as ex:
        ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(1))
    assert kinds and all(k is np.ndarray for k in kinds), kinds


@pytest.mark.parametrize("stop", [KeyboardInterrupt, RuntimeError])
def test_an_engine_stopped_while_it_is_built_leaves_no_files(tmp_path, monkeypatch, stop):
    """Ctrl-C or SIGTERM (the CLI raises them in the main thread) can land after the engine
    has written the features to its store but before it is returned to a ``with``, which
    would close it: the constructor removes the run's folder itself (seen in the full suite:
    the SIGINT test's run folder left behind)."""
    from jgrind.engine import build
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)

    def interrupted(*args, **kwargs):
        raise stop()
    monkeypatch.setattr(build, "Spares", interrupted)  # made after the threads
    with pytest.raises(stop):
        OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                  num_parts=2)
    assert list(tmp_path.iterdir()) == []
    alive = [t.name for t in threading.enumerate() if t.name.startswith("jgrind-")]
    assert not alive, alive


def test_two_runs_share_a_directory_without_colliding(tmp_path):
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    a = OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                  num_parts=2)
    b = OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                  num_parts=2)
    assert a.store.run_dir != b.store.run_dir and len(list(tmp_path.iterdir())) == 2
    params = model.init(jax.random.key(0))
    _, ga = a.loss_and_grad(params, None)
    _, gb = b.loss_and_grad(params, None)
    assert_same_gradients(ga, gb)
    a.close()
    b.close()
    assert list(tmp_path.iterdir()) == []


def test_files_removed_when_training_fails(tmp_path):
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    bad_lr = optax.sgd(jnp.inf)
    with pytest.raises(FloatingPointError):
        train(jax.random.key(0), graph, model, bad_lr, epochs=3, progress=False,
              policy=policies.ssd_offload(tmp_path), num_parts=2)
    assert list(tmp_path.iterdir()) == []


def test_fast_path_when_everything_fits(tmp_path):
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    opt = optax.sgd(0.1)
    assert isinstance(make_executor(graph, model, opt, device_budget=2**30), InMemory)
    assert isinstance(make_executor(graph, model, opt, policy=policies.in_memory()), InMemory)
    from jgrind.train import in_memory_bytes
    ex = make_executor(graph, model, opt, device_budget=in_memory_bytes(graph, model) - 1,
                       store=tmp_path, num_parts=2)
    assert isinstance(ex, OutOfCore)
    ex.close()
    ex = make_executor(graph, model, opt, policy=policies.host_offload(), num_parts=3)
    assert isinstance(ex, OutOfCore)
    ex.close()


def test_user_policy_in_a_few_lines(tmp_path):
    def odd_partitions_on_ssd(info):
        return Fate.SSD if info.partition % 2 else Fate.HOST
    graph = community_graph(num_nodes=300)
    model = models.sage(graph.num_features, 8, graph.num_classes, num_layers=3)
    acc = _check(graph, model, odd_partitions_on_ssd, 4, tmp_path)
    assert acc.peak_ssd > 0 and acc.peak_host > 0


def test_recompute_of_features_is_refused():
    graph = community_graph(num_nodes=100)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    from jgrind.plan import PolicyError
    with pytest.raises(PolicyError, match="cannot be recomputed"):
        OutOfCore(graph, model, optax.sgd(0.1), policy=lambda info: Fate.RECOMPUTE,
                  num_parts=2)



@pytest.mark.parametrize("model", ["gcn", "sage-res-ln"])
def test_naive_scheme_is_exact_and_moves_more_bytes(model, tmp_path):
    """`naive` (snapshots of the gathered inputs, row-by-row SSD reads) is a comparison
    baseline: the same loss and gradients, and strictly more SSD traffic than regathering."""
    graph = csbm_graph()
    net = _models(8, graph.num_classes)[model]
    ssd = _check(graph, net, policies.ssd_offload(tmp_path), 3, tmp_path)
    naive = _check(graph, net, policies.naive(tmp_path), 3, tmp_path)
    assert naive.ssd_read + naive.ssd_written > ssd.ssd_read + ssd.ssd_written
    assert naive.ssd_read_ops > 10 * ssd.ssd_read_ops  # one read call per row
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("layer_norm", [True, False], ids=["all-gather", "node-wise"])
def test_naive_snapshots_cost_exactly_the_step_inputs(layer_norm, tmp_path):
    """With the host cache off, snapshots add exactly one write of every partition's step
    input of layers 0..L-2 per epoch; reading them back replaces the regather byte for byte.
    They are freed by the end of the epoch. Without LayerNorm the narrowing last layer runs as
    a node-wise transform (`jgrind.executed.split`), whose input both schemes read, and the
    naive one snapshots, as own rows only: the same reads, not a halo's more."""
    graph = csbm_graph()
    model = models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5,
                       layer_norm=layer_norm)
    params = model.init(jax.random.key(0))
    moved = {}
    for name, policy in {"ssd": policies.ssd_offload(tmp_path),
                         "naive": policies.naive(tmp_path)}.items():
        with OutOfCore(graph, model, optax.sgd(0.1), policy=policy, num_parts=3,
                       store=tmp_path, host_budget=0, partitioner=contiguous) as ex:
            ex.loss_and_grad(params, None)
            before = dataclasses.replace(ex.store.accounts)
            ex.loss_and_grad(params, None)
            after = ex.store.accounts
            moved[name] = (after.ssd_read - before.ssd_read,
                           after.ssd_written - before.ssd_written)
            assert any(ex.local) is not layer_norm
            owned = sum(p.num_owned for p in ex.pg.partitions)
            inputs = sum(p.num_inputs for p in ex.pg.partitions)
            assert inputs > owned
            snapshots = 4 * sum((owned if ex.local[l] else inputs) * ex.widths[l]
                                for l in range(ex.num_layers - 1))
            activations = sum(i.nbytes for i in ex.inventory if i.name == "activation")
            gradients = sum(i.nbytes for i in ex.inventory if i.name == "gradient")
            # what is left after the epoch: the activations and the gradient files, kept for
            # the next epoch (`Store.drop`); the snapshots are gone
            assert after.ssd == activations + gradients
            assert after.ssd == ex.memory.ssd
            if name == "naive":
                assert after.peak_ssd >= activations + snapshots
    assert moved["naive"][0] == moved["ssd"][0]
    assert moved["naive"][1] == moved["ssd"][1] + snapshots


@pytest.mark.parametrize("policy", ["ssd", "naive"])
def test_epoch_after_a_failed_epoch(policy, tmp_path):
    """An epoch that raises mid-backward leaves gradient tables (and snapshots) behind; the
    next epoch replaces them instead of failing on the existing files."""
    graph = community_graph(num_nodes=300)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    params = model.init(jax.random.key(0))
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, None)
    chosen = {"ssd": policies.ssd_offload, "naive": policies.naive}[policy](tmp_path)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=chosen, num_parts=3,
                   partitioner=contiguous) as ex:
        sweeps = ex.runner.sweeps
        backward = sweeps.backward

        def fail_at_layer_1(params, l, *args):
            if l == 1:
                raise RuntimeError("injected")
            return backward(params, l, *args)
        sweeps.backward = fail_at_layer_1
        with pytest.raises(RuntimeError, match="injected"):
            ex.loss_and_grad(params, None)
        sweeps.backward = backward
        loss, grads = ex.loss_and_grad(params, None)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)
    assert list(tmp_path.iterdir()) == []


def test_policy_combinators_route_by_kind_and_layer(tmp_path):
    from jgrind.plan.fates import TensorInfo
    info = lambda name, layer: TensorInfo(name, layer, 0, (1, 1), "float32", 4)  # noqa: E731
    by_kind = policies.ByKind(activations=policies.host_offload(),
                              gradients=policies.ssd_offload(tmp_path))
    assert by_kind(info("activation", 1)) is Fate.HOST
    assert by_kind(info("gradient", 1)) is Fate.SSD
    layered = policies.by_layer(policies.in_memory(), policies.host_offload())
    assert layered(info("activation", 0)) is Fate.DEVICE
    assert layered(info("activation", 5)) is Fate.HOST  # past the end: the last policy
    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=3)
    acc = _check(graph, model, policies.ByKind(layered, policies.ssd_offload(tmp_path)), 3,
                 tmp_path)
    assert acc.peak_ssd > 0 and acc.peak_device > 0


def _count_calls(ex):
    """Count the engine's backward steps by kind (wraps the jitted functions it holds)."""
    calls = {"recompute": 0, "masked": 0}
    for l, steps in enumerate(ex.steps):
        wrapped = {}
        for name, kind in (("backward", "recompute"), ("backward_params", "recompute"),
                           ("masked_backward", "masked"), ("masked_backward_params", "masked")):
            fn = getattr(steps, name)
            if fn is None:
                continue

            def counted(*a, _fn=fn, _kind=kind):
                calls[_kind] += 1
                return _fn(*a)
            wrapped[name] = counted
        ex.steps[l] = dataclasses.replace(steps, **wrapped)
    return calls


def test_relu_layers_backward_from_output_masks_without_recompute(tmp_path):
    """A ReLU GCN's backward reads each layer's output mask (made by the layer above) instead
    of recomputing the output, and the gradients stay exact; a residual model cannot (its
    output hides act(z)) and recomputes."""
    graph = csbm_graph()
    params_key, key = jax.random.key(0), jax.random.key(42)
    for name, expect_masked in (("gcn", True), ("gcn-res-ln", False)):
        model = _models(graph.num_features, graph.num_classes)[name]
        params = model.init(params_key)
        ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
        with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(),
                       num_parts=3, partitioner=contiguous) as ex:
            calls = _count_calls(ex)
            loss, grads = ex.loss_and_grad(params, key)
            assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
            assert_same_gradients(grads, ref_grads)
        # the executed layers (the GCN's narrowing top layer runs as a transform, which has
        # no activation, and a propagation); the top one is fused with the loss: never masked
        below_top = ex.model.layers[:-1]
        relu = [derivative_from_output(layer) is not None for layer in below_top]
        # (a residual model's input projection is plain ReLU)
        assert any(relu[1:]) == expect_masked
        assert calls == {"recompute": 3 * relu.count(False), "masked": 3 * relu.count(True)}


def test_masks_give_way_when_the_device_budget_is_tight(tmp_path):
    """Masks count towards the device working set; with a budget that holds the working set
    only without them, the engine recomputes instead and is still exact."""
    from jgrind.plan.cost import Workload
    from jgrind.partition import partition_graph

    graph = csbm_graph()
    model = _models(graph.num_features, graph.num_classes)["gcn"]
    pg = partition_graph(model.normalize(graph), contiguous(model.normalize(graph), 4),
                         num_parts=4)
    w = Workload.build(pg, model)
    assert w.mask_bytes() > 0
    budget = w.without_masks().working_set() + w.mask_bytes() // 2
    assert w.working_set() > budget
    params, key = model.init(jax.random.key(0)), jax.random.key(42)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(),
                   partitioned=pg, device_budget=budget) as ex:
        assert not ex.workload.masks
        assert not any(s.emits_mask for s in ex.steps)
        loss, grads = ex.loss_and_grad(params, key)
        assert_same_gradients(grads, ref_grads)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(),
                   partitioned=pg, device_budget=w.working_set()) as ex:
        assert ex.workload.masks and ex.steps[1].emits_mask


def _span_loops(native: bool, monkeypatch) -> None:
    """Run the SSD tier's span loops natively (`spans.cc`) or in Python (no kernels)."""
    from jgrind import _kernels
    if native and _kernels.library() is None:
        pytest.skip(f"native kernels unavailable: {_kernels.unavailable_reason()}")
    if not native:
        monkeypatch.setattr(_kernels, "library", lambda: None)


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
@pytest.mark.parametrize("scratch_rows", [1, 3, 1000])
def test_ssd_row_spans_through_a_small_scratch_buffer(scratch_rows, native, tmp_path,
                                                      monkeypatch):
    """Row reads and scatter-adds of the SSD tier go through a reused scratch buffer in pieces;
    whatever the piece size, they equal the same operations on an in-memory array."""
    from jgrind.engine import ssd

    import threading

    _span_loops(native, monkeypatch)
    width = 5
    monkeypatch.setattr(ssd, "SCRATCH_BYTES", scratch_rows * width * 4)
    monkeypatch.setattr(ssd, "_scratch", threading.local())
    offsets = np.array([0, 40, 90, 130])
    f = ssd.SSDFile(tmp_path / "t.bin", offsets, width, b"r" * 16)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((130, width)).astype(np.float32)
    for b in range(3):
        f.write_block(b, data[offsets[b]:offsets[b + 1]])
    rows = np.sort(rng.choice(130, 57, replace=False))
    np.testing.assert_array_equal(f.read_rows(rows), data[rows])
    np.testing.assert_array_equal(f.read_rows(rows, per_row=True), data[rows])
    dst = rng.permutation(80)[:rows.size]  # into scattered rows of a larger output
    placed = np.full((80, width), 7.0, np.float32)
    f.read_rows(rows, out=placed, dst=dst)
    expected = np.full((80, width), 7.0, np.float32)
    expected[dst] = data[rows]
    np.testing.assert_array_equal(placed, expected)
    add = rng.standard_normal((rows.size, width)).astype(np.float32)
    f.add_rows(rows, add)
    data[rows] += add
    np.testing.assert_array_equal(f.read_rows(np.arange(130)), data)
    src = rng.permutation(rows.size)  # values taken from scattered rows
    f.add_rows(rows, add, src=src)
    data[rows] += add[src]
    np.testing.assert_array_equal(f.read_rows(np.arange(130)), data)
    with pytest.raises(IndexError):
        f.read_rows(np.array([3, 130]))
    with pytest.raises(IndexError):
        f.add_rows(np.array([5, 2]), add[:2])
    # the reads went through this thread's one scratch buffer, bounded by SCRATCH_BYTES
    assert ssd._scratch.raw.size == ssd.SCRATCH_BYTES
    f.close()


# -- kept aggregations (jgrind.plan.fates.AGGREGATION) ------------------------------------------
def _aggregating_models(f, c):
    """Models whose layers below the top aggregate before their matmul (hidden >= features)."""
    return {"gcn": models.gcn(f, 16, c, num_layers=3, dropout=0.5),
            "sage": models.sage(f, 16, c, num_layers=3, dropout=0.5)}


def _keep_in(tier, tmp_path):
    return {"device": policies.in_memory(aggregations=Fate.DEVICE),
            "host": policies.host_offload(aggregations=Fate.HOST),
            "ssd": policies.ssd_offload(tmp_path, aggregations=Fate.SSD),
            # hidden activations recomputed, aggregations kept: nothing of H_1 is needed again
            "host-recompute": lambda info: (Fate.HOST if info.name == "aggregation" else
                                            Fate.RECOMPUTE if info.recomputable else Fate.HOST),
            }[tier]


@pytest.mark.parametrize("tier", ["device", "host", "ssd", "host-recompute"])
@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_kept_aggregations_are_exact_on_every_tier(model, tier, tmp_path):
    graph = csbm_graph()
    parts = 7 if tier in ("ssd", "host-recompute") else 2
    net = _aggregating_models(graph.num_features, graph.num_classes)[model]

    def keeps_both(ex):
        assert sorted(ex.aggregations) == [0, 1]
    acc = _check(graph, net, _keep_in(tier, tmp_path), parts, tmp_path,
                 partitioner=random_partition, built=keeps_both)
    if tier == "ssd":
        assert acc.peak_ssd > 0


def _count_gathers(ex):
    """Count `Table.gather` calls per (name, layer) and the steps run from kept aggregations."""
    calls = collections.Counter()
    for table in ex.activations:
        def gather(*a, _fn=table.gather, _key=table.key, **kw):
            calls[_key] += 1
            return _fn(*a, **kw)
        table.gather = gather
    for l, steps in enumerate(ex.steps):
        if steps.saved_backward is None:
            continue
        wrapped = {}
        for name in ("saved_backward", "saved_backward_params"):
            def counted(*a, _fn=getattr(steps, name)):
                calls["from kept"] += 1
                return _fn(*a)
            wrapped[name] = counted
        ex.steps[l] = dataclasses.replace(steps, **wrapped)
    return calls


def test_kept_aggregations_replace_the_regather(tmp_path):
    """With the aggregations kept, the backward of layers 0 and 1 reads them instead of
    regathering H_0 and H_1 (each is gathered once per epoch, by its forward); the store
    accounts hold exactly their bytes in the tier the policy names."""
    graph = csbm_graph()
    net = _aggregating_models(graph.num_features, graph.num_classes)["gcn"]
    params, key = net.init(jax.random.key(0)), jax.random.key(42)
    parts = 4
    peaks = {}
    for keep in (Fate.RECOMPUTE, Fate.HOST):
        with OutOfCore(graph, net, optax.sgd(0.1), num_parts=parts, partitioner=contiguous,
                       policy=policies.host_offload(aggregations=keep)) as ex:
            calls = _count_gathers(ex)
            ex.loss_and_grad(params, key)
            peaks[keep] = ex.store.accounts.peak_host
        regathers = 2 if keep is Fate.RECOMPUTE else 1
        assert calls[("activation", 0)] == regathers * parts
        assert calls[("activation", 1)] == regathers * parts
        # the top layer runs as a node-wise transform, which reads own rows (no gather), and
        # a propagation, run once, in backward
        assert calls[("activation", 2)] == 0
        assert calls[("activation", 3)] == parts
        assert calls["from kept"] == (0 if keep is Fate.RECOMPUTE else 2 * parts)
    # Z_0 (8 wide) and Z_1 (16 wide) for every node, in host RAM for the whole epoch
    widths = 8 + 16
    assert peaks[Fate.HOST] - peaks[Fate.RECOMPUTE] == 4 * graph.num_nodes * widths


def test_kept_aggregations_are_counted_against_the_budgets(tmp_path):
    graph = csbm_graph()
    net = _aggregating_models(graph.num_features, graph.num_classes)["gcn"]
    with OutOfCore(graph, net, optax.sgd(0.1), num_parts=3,
                   policy=policies.host_offload()) as ex:
        without = ex.memory.host
    kept = 4 * graph.num_nodes * (8 + 16)
    with OutOfCore(graph, net, optax.sgd(0.1), num_parts=3, host_budget=without + kept,
                   policy=policies.host_offload(aggregations=Fate.HOST)) as ex:
        assert ex.memory.host == without + kept
    with pytest.raises(BudgetError, match="host budget"):
        OutOfCore(graph, net, optax.sgd(0.1), num_parts=3, host_budget=without + kept - 1,
                  policy=policies.host_offload(aggregations=Fate.HOST))


def test_aggregations_kept_for_some_partitions_only_are_refused():
    graph = csbm_graph()
    net = _aggregating_models(graph.num_features, graph.num_classes)["gcn"]

    def half(info):
        if info.name == "aggregation":
            return Fate.HOST if info.partition % 2 else Fate.RECOMPUTE
        return Fate.HOST
    with pytest.raises(ValueError, match="aggregation of layer 0: RECOMPUTE must be chosen"):
        OutOfCore(graph, net, optax.sgd(0.1), num_parts=4, policy=half)


def test_only_layers_that_aggregate_first_have_an_aggregation(tmp_path):
    """No aggregation for the top layer (fused with the loss), for a layer that multiplies
    before aggregating (in > out), for LayerNorm or residual layers, nor for GAT."""
    from jgrind.plan.inventory import aggregation_widths
    assert aggregation_widths(models.gcn(8, 16, 3, num_layers=3)) == {0: 8, 1: 16}
    assert aggregation_widths(models.sage(8, 16, 3, num_layers=3)) == {0: 16, 1: 32}
    assert aggregation_widths(models.gcn(32, 16, 3, num_layers=3)) == {1: 16}
    # LayerNorm normalises the input of every layer but the first
    assert aggregation_widths(models.gcn(8, 16, 3, num_layers=3, layer_norm=True)) == {0: 8}
    for net in (models.gcn(8, 16, 3, num_layers=3, residual=True),
                models.gat(8, 4, 3, heads=2, num_layers=3)):
        assert aggregation_widths(net) == {}


def test_training_with_kept_aggregations_matches_in_memory(tmp_path):
    graph = csbm_graph()
    net = _aggregating_models(graph.num_features, graph.num_classes)["sage"]
    opt = optax.adam(0.01)
    ref = train(jax.random.key(3), graph, net, opt, epochs=8, progress=False)
    ooc = train(jax.random.key(3), graph, net, opt, epochs=8, progress=False, num_parts=3,
                policy=policies.ssd_offload(tmp_path, aggregations=Fate.SSD))
    for a, b in zip(jax.tree.leaves(ooc.params), jax.tree.leaves(ref.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("host_budget", [0, None])
def test_gradient_files_are_kept_and_zeroed_between_epochs(host_budget, tmp_path):
    """All-SSD gradient tables keep their files from one epoch to the next (a new file's pages
    cost as much as fresh memory) and read as zeros again: the second epoch's gradients equal
    the in-memory ones, with the host cache in front of the SSD tier off and on."""
    graph = csbm_graph()
    model = _models(graph.num_features, graph.num_classes)["gcn"]
    params = model.init(jax.random.key(0))
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                   num_parts=3, store=tmp_path, host_budget=host_budget,
                   partitioner=contiguous) as ex:
        ex.loss_and_grad(params, jax.random.key(1))
        files = {key: table.ssd for key, table in ex.store.kept.items()}
        assert sorted(layer for _, layer in files) == list(range(1, ex.num_layers))
        loss, grads = ex.loss_and_grad(params, jax.random.key(2))
        assert {key: table.ssd for key, table in ex.store.kept.items()} == files
        assert all(ex.store.kept[key].ssd is f for key, f in files.items())
        assert ex.store.accounts.peak_ssd == ex.memory.ssd
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, jax.random.key(2))
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("policy", ["host", "recompute"])
def test_host_tables_arrays_are_handed_on_between_epochs(policy, tmp_path):
    """Gradient tables (and recomputed layers' transients) in host RAM take the arrays freed by
    the epoch before (`HostArrays`), zeroed: with host offload the second epoch allocates no
    host array at all (the narrow top gradient takes a wider one); the gradients equal the
    in-memory ones, and the host account, kept arrays included, never passes the plan's
    peak."""
    graph = csbm_graph()
    model = _models(graph.num_features, graph.num_classes)["gcn"]
    params = model.init(jax.random.key(0))
    chosen = _policies(tmp_path)[policy]
    with OutOfCore(graph, model, optax.sgd(0.1), policy=chosen, num_parts=3,
                   partitioner=contiguous) as ex:
        arrays = ex.store.host_arrays
        ex.loss_and_grad(params, jax.random.key(1))
        made, reused = arrays.made, arrays.reused
        loss, grads = ex.loss_and_grad(params, jax.random.key(2))
        assert arrays.reused - reused >= ex.num_layers - 1  # every gradient table
        if policy == "host":
            assert arrays.made == made
        else:  # transients take only an array of their own size: some are made again
            assert arrays.made - made < made
        assert ex.store.accounts.peak_host == ex.memory.stored_peaks[1]
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(
        params, jax.random.key(2))
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)


def test_ssd_epochs_write_no_zeros_and_move_the_same_bytes(tmp_path):
    """Gradient files are new in the first epoch and kept after it (`Store.drop`): every
    epoch writes and reads exactly the same SSD bytes, so neither a new file's holes nor a kept
    file's old values cost a byte of their own, and the gradients stay exact."""
    graph = csbm_graph()
    model = models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5)
    params = model.init(jax.random.key(0))
    moved = []
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                   num_parts=3, store=tmp_path, host_budget=0, partitioner=contiguous) as ex:
        for _ in range(3):
            before = dataclasses.replace(ex.store.accounts)
            loss, grads = ex.loss_and_grad(params, jax.random.key(2))
            after = ex.store.accounts
            moved.append((after.ssd_written - before.ssd_written,
                          after.ssd_read - before.ssd_read))
            # the file bytes add the coalesced spans' gap rows to the rows used
            assert after.ssd_file_read - before.ssd_file_read >= moved[-1][1]
            assert after.ssd_file_written - before.ssd_file_written >= moved[-1][0]
    assert moved[0][0] > 0 and moved[0] == moved[1] == moved[2]
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(
        params, jax.random.key(2))
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)


@pytest.mark.parametrize("native", [True, False], ids=["native-spans", "python-spans"])
def test_file_bytes_count_what_every_call_passes(native, tmp_path, monkeypatch):
    """The store's ``ssd_file_read`` / ``ssd_file_written`` (reported through ``on_io``) are
    the bytes every read and write call passes: a coalesced span's gap rows included, per-row
    and whole-block calls too, from the native span loops and the Python ones alike."""
    from jgrind.engine.ssd import SSDFile

    if not native:
        monkeypatch.setattr(SSDFile, "_native_spans", lambda self, table: False)
    counted = collections.Counter()
    f = SSDFile(tmp_path / "g.bin", np.array([0, 50, 100]), 4, b"run",
                on_io=lambda **moved: counted.update(moved))
    row = 4 * 4
    f.write_block(0, np.ones((50, 4), np.float32))
    f.write_block(1, np.ones((50, 4), np.float32))
    rows = np.array([1, 3, 10, 60])  # gaps far under COALESCE_BYTES: one span, rows 1..60
    f.read_rows(rows)
    f.add_rows(rows, np.ones((4, 4), np.float32))
    f.read_rows(rows, per_row=True)
    f.read_block(1)
    span = 60 * row
    assert counted["ssd_file_read"] == f.bytes_read == span + span + 4 * row + 50 * row
    assert counted["ssd_file_written"] == f.bytes_written == 100 * row + span
    assert counted["ssd_read_ops"] == 1 + 1 + 4 + 1
    np.testing.assert_array_equal(f.read_rows(rows, per_row=True), np.full((4, 4), 2.0))


def test_a_lazily_zeroed_file_reads_zeros_and_writes_only_what_it_must(tmp_path):
    """`SSDFile.zero_lazily`: old values never show, and no zeros are written on their own.
    A whole-block write makes a block current; an addition writes back its span (rows between
    the added ones as zeros), reading the disk only where the span holds current rows."""
    from jgrind.engine.ssd import SSDFile

    f = SSDFile(tmp_path / "g.bin", np.array([0, 3, 7, 10]), 2, b"run")
    assert f.add_rows(np.array([5]), np.ones((1, 2), np.float32)) == 0  # a new file: no read
    assert f.bytes_read == 0
    np.testing.assert_array_equal(f.read_block(1), [[0, 0], [0, 0], [1, 1], [0, 0]])
    old = np.arange(20, dtype=np.float32).reshape(10, 2) + 1
    for b, (lo, hi) in enumerate([(0, 3), (3, 7), (7, 10)]):
        f.write_block(b, old[lo:hi])
    f.zero_lazily()
    written, read = f.bytes_written, f.bytes_read
    np.testing.assert_array_equal(f.read_rows(np.array([1, 2])), np.zeros((2, 2)))
    np.testing.assert_array_equal(f.read_block(2), np.zeros((3, 2)))
    assert f.bytes_written == written                           # nothing zeroed on disk
    new = np.full((4, 2), 5.0, np.float32)
    f.write_block(1, new)                                       # block 1 current
    # one span, rows 4..8: 4-6 current (read and kept), 7 and 8 old (zeroed, then added to)
    assert f.add_rows(np.array([4, 8]), np.ones((2, 2), np.float32)) == 2
    np.testing.assert_array_equal(f.read_rows(np.array([4, 8, 9])),
                                  [[6, 6], [1, 1], [0, 0]])
    np.testing.assert_array_equal(f.read_block(2), [[0, 0], [1, 1], [0, 0]])
    # a span with no current row is added into zeros without reading the disk
    read = f.bytes_read
    assert f.add_rows(np.array([0, 2]), np.full((2, 2), 3.0, np.float32)) == 0
    assert f.bytes_read == read
    np.testing.assert_array_equal(f.read_block(0), [[3, 3], [0, 0], [3, 3]])
    assert f.bytes_written == written + (4 + 5 + 3) * 2 * 4     # the block, two spans
    on_disk = f.as_memmap()
    np.testing.assert_array_equal(on_disk[9], old[9])           # still old: read as zeros
    np.testing.assert_array_equal(on_disk[1], [0, 0])           # a gap row, written back
    f.zero_lazily()                                             # the next epoch: all old again
    np.testing.assert_array_equal(f.read_block(1), np.zeros((4, 2)))
    f.close()


def test_without_a_host_budget_the_host_cache_fits_the_free_ram(tmp_path, monkeypatch):
    """No host budget: the host cache in front of the SSD tier would hold every SSD block.
    It takes at most half of the host RAM free (`jgrind.hostio.host_memory`, a cgroup's limit
    included), so in a small container it shrinks instead of running the job out of memory;
    the gradients stay exact either way."""
    from jgrind.hostio import host_memory

    graph = csbm_graph()
    model = models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5)
    params = model.init(jax.random.key(0))
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(
        params, jax.random.key(2))
    capacities = []
    for free in (None, 64 << 10):
        if free is not None:
            monkeypatch.setattr(host_memory, "available", lambda: free)
        with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                       num_parts=3, store=tmp_path, partitioner=contiguous) as ex:
            everything = sum(i.nbytes for i in ex.inventory)
            capacities.append(ex.store.cache.capacity)
            loss, grads = ex.loss_and_grad(params, jax.random.key(2))
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
        assert_same_gradients(grads, ref_grads)
    assert capacities == [everything, 32 << 10]


def _multilabel_csbm():
    # 5 binary targets per node, a fifth of them unknown (-1): the loss must skip exactly those
    graph = generators.csbm(num_nodes=400, num_features=8, avg_degree=6, seed=1, num_tasks=5)
    targets = np.array(graph.labels)
    targets[np.random.default_rng(3).random(targets.shape) < 0.2] = -1
    return graph.replace(labels=targets)


@pytest.mark.parametrize("model,policy,parts", [("gcn", "ssd", 7), ("gat", "host", 2),
                                                ("sage-res-ln", "grinnder", 16),
                                                ("gcn-res-ln", "recompute", 1)])
def test_multilabel_targets_every_model(model, policy, parts, tmp_path):
    graph = _multilabel_csbm()
    assert graph.multilabel and graph.labels.shape == (400, 5)
    _check(graph, _models(8, 5)[model], _policies(tmp_path)[policy], parts, tmp_path,
           partitioner=random_partition)
