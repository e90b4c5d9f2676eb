"""How many programs an out-of-core run compiles, and that a later epoch compiles none.

On a GPU each program costs a fraction of a second to compile (about 0.24 s on an H200 without
autotuning), so the first epoch's time is mostly its program count (issue 39, target 5). The
counts here are of a small run on the CPU backend, listed by `jgrind.engine.program_log`; a
count that grows means a shape bucket or a merged program was lost (the assertion prints the
programs by name).
"""

import jax
import optax
import pytest

from jgrind import generators, models
from jgrind.engine import OutOfCore, build, pipeline
from jgrind.engine.program_log import ProgramLog, report
from jgrind.hostio import transfers
from jgrind.partition import random as random_partition
from jgrind.plan import Fate


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
# in 2 padded shapes, blocks on the device, in host RAM and on SSD): 12 partition steps, 22
# table operations of the device tier (takes, sets and adds, per table and index length),
# and one each for the epoch's zeros and dropout keys, the loss's sum and the optimizer's
# update. The steps' waits cost none (`jgrind.engine.pipeline._marker`: their accumulators
# and, this small, their outputs are copied): 42 while every wait was a one-element slice,
# a program per shape.
FIRST_EPOCH = 37


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
    row ranges joined on the device."""
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
