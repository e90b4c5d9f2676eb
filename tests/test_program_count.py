"""How many programs an out-of-core run compiles, and that a later epoch compiles none.

On a GPU each program costs a fraction of a second to compile (about 0.24 s on an H200 without
autotuning), so the first epoch's time is mostly its program count (issue 39, target 5). The
counts here are of a small run on the CPU backend, listed by `jgrind.engine.program_log`; a
count that grows means a shape bucket or a merged program was lost (the assertion prints the
programs by name).
"""

import types

import jax
import optax
import pytest

from jgrind import generators, models
from jgrind.engine import OutOfCore, build, pipeline, spares
from jgrind.engine.build import shape_count
from jgrind.engine.program_log import ProgramLog, report
from jgrind.hostio import transfers
from jgrind.partition import random as random_partition, shape_groups
from jgrind.plan import Fate, policies
from jgrind.plan.cost import Workload

from helpers import reference
from test_engine import assert_same_gradients


def _spread(info):
    """Blocks on the device, in host RAM and on SSD, by partition."""
    return (Fate.DEVICE, Fate.HOST, Fate.SSD)[info.partition % 3]


def _epochs(ex, model, count: int) -> list:
    """The programs each of ``count`` training epochs compiled (the parameters' init and the
    optimizer's state before them are not counted)."""
    params = model.init(jax.random.key(0))
    optimizer = optax.adam(0.01)
    opt_state = optimizer.init(params)
    compiled = []
    with ProgramLog() as log:
        for epoch in range(count):
            log.mark(f"epoch {epoch}")
            params, opt_state, loss = ex.step(params, opt_state, jax.random.key(epoch))
            jax.block_until_ready((params, loss))
            compiled.append(log.phase(f"epoch {epoch}"))
    return compiled


def _graph_and_model():
    graph = generators.csbm(num_nodes=600, num_features=8, avg_degree=6, seed=3)
    return graph, models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5)


# The first epoch's programs on the CPU backend for the run below (3-layer GCN, 6 partitions
# in 2 padded shapes, blocks on the device, in host RAM and on SSD): 12 partition steps, 19
# table operations of the device tier (takes, sets and adds, per table and index length),
# and one each for the epoch's zeros and dropout keys, the loss's sum and the optimizer's
# update. The steps' waits cost none (`jgrind.engine.pipeline._marker`: their accumulators
# and, this small, their outputs are copied): 42 while every wait was a one-element slice,
# a program per shape; 37 while a device block read to the host was a slice outside jit,
# a program per table and block size (`jgrind.engine.tiers.device.DeviceTier.read_block`).
FIRST_EPOCH = 34


def test_a_small_out_of_core_run_compiles_a_known_number_of_programs(tmp_path):
    graph, model = _graph_and_model()
    with OutOfCore(graph, model, optax.adam(0.01), policy=_spread, num_parts=6,
                   store=tmp_path, partitioner=random_partition) as ex:
        first, second = _epochs(ex, model, 2)
    assert len(first) <= FIRST_EPOCH, report(first, shapes=True)
    assert not second, report(second, shapes=True)


def _gpu_paths(ex) -> None:
    """The transfer paths the engine takes off the CPU backend, forced on it: device rows
    kept on the device, outputs stored through ``pinned_host`` memory, large inputs sent in
    row ranges joined on the device (and, set by the test, spare buffers made on the device)."""
    ex.keep_device_rows = True
    ex.pinned_host = transfers.pinned_host()
    ex.staging_pieces = 4


@pytest.mark.parametrize("pinned_inputs", [False, True], ids=["pageable", "pinned-inputs"])
def test_later_epochs_compile_nothing_on_the_gpu_paths(pinned_inputs, tmp_path, monkeypatch):
    """With inputs filled into page-locked buffers and put from there (``pinned_inputs``),
    an H200 compiled programs in three epochs running (47, 33, then 1): a put to an explicit
    memory commits its result, jit compiles a committed argument apart from an uncommitted
    one, and the step outputs made from it were committed in turn (parameters, spares,
    tables). The CPU backend has a ``pinned_host`` memory too, so the path runs here."""
    monkeypatch.setattr(pipeline, "MIN_PIECE_BYTES", 256)
    monkeypatch.setattr(spares, "DEVICE_PLACEHOLDERS_ON_CPU", True)
    monkeypatch.setattr(build, "_input_staging", lambda: transfers.pinned_staging(
        per_shape=build.INPUT_BUFFERS, enabled=False))
    graph, model = _graph_and_model()
    with OutOfCore(graph, model, optax.adam(0.01), policy=_spread, num_parts=6,
                   store=tmp_path, partitioner=random_partition) as ex:
        _gpu_paths(ex)
        ex.pinned_inputs = pinned_inputs
        compiled = _epochs(ex, model, 3)
        if pinned_inputs:
            staging = ex.built.store.input_staging
            assert staging.made and staging.reused  # inputs went through pinned buffers
    for later in compiled[1:]:
        assert not later, report(later, shapes=True)


def _partitions(sizes):
    """Stand-ins for partitions: ``(owned, inputs, edges)`` each, as `shape_groups` reads them."""
    return [types.SimpleNamespace(index=i, num_owned=o, num_inputs=n, num_edges=e)
            for i, (o, n, e) in enumerate(sizes)]


# The 16 label-propagation partitions of the R-MAT graph of 200k nodes and 5.2M edges
# (tools/trace_epoch.py --rmat 200000 5200000 --parts 16): owned rows, input rows, edges.
RMAT_200K = [(12187, 36784, 304022), (12501, 44815, 349026), (12394, 43693, 341954),
             (12415, 44821, 316237), (11922, 40105, 371213), (12726, 40484, 371249),
             (10462, 42087, 371235), (12857, 38732, 320213), (12791, 39344, 338847),
             (12209, 42002, 371247), (12718, 46963, 370003), (13125, 40156, 267940),
             (13125, 40157, 274918), (12689, 39805, 371234), (13091, 38310, 344497),
             (12788, 38798, 316165)]


def test_three_shapes_that_two_would_hold_become_two(monkeypatch):
    """Three input-row groups (40960, 45056, 49152) padded to two (40960, 49152) for 0.6 %
    more input rows; none where that would cost more padding than the tolerance, or where a
    partition's output rows would change (the memory plan sums them)."""
    parts = _partitions(RMAT_200K)
    assert len(set(shape_groups(parts, 3).values())) == 3
    assert shape_count(parts, 3) == 2
    assert sorted(s[1] for s in set(shape_groups(parts, 2).values())) == [40960, 49152]
    monkeypatch.setattr(build, "SHAPE_PADDING_TOLERANCE", 0.005)
    assert shape_count(parts, 3) == 3
    monkeypatch.undo()
    # merged into the group above, the middle group's partitions would pad more output rows
    # (the memory plan sums them): one of the largest with more owned rows
    more_owned = [(14000 if n == 46963 else o, n, e) for o, n, e in RMAT_200K]
    assert shape_count(_partitions(more_owned), 3) == 3
    # a shape larger than any of the three's in some dimension (more edges and more input rows
    # than any one group's) would need a larger step: a middle partition with more edges
    more_edges = [(o, n, 420000 if n == 42002 else e) for o, n, e in RMAT_200K]
    assert shape_count(_partitions(more_edges), 3) == 3


def test_fewer_shapes_keep_the_memory_plan_and_the_gradients(tmp_path):
    """An engine asked for at most 3 shapes runs 2 where its partitions allow (`shape_count`):
    the memory plan is the one 3 shapes give (a plan made for 3 fits the same budgets), and
    the loss and gradients are the in-memory ones."""
    graph = generators.rmat(num_nodes=1000, num_edges=8000, num_features=8, seed=0)
    model = models.gcn(8, 16, graph.num_classes, num_layers=3, dropout=0.5)
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(), num_parts=8,
                   store=tmp_path, partitioner=random_partition) as ex:
        pg = ex.built.pg
        assert len(set(shape_groups(pg.partitions, 3).values())) == 3
        assert len({tuple(a.shape for a in jax.tree.leaves(p.block))
                    for p in ex.built.parts}) == 2
        three, two = Workload.build(pg, model, 3), Workload.build(pg, model, 2)
        assert two.working_set() == three.working_set()
        assert ex.built.plan.workload.working_set() == three.working_set()
        loss, grads = ex.loss_and_grad(params, key)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)
