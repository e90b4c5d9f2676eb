"""How hard XLA works on the engine's partition steps (`jgrind.engine.compile_effort`).

The GPU autotuning that `QUICK` turns off only exists on a GPU (its effect is measured by
``bash tools/bench_gpu.sh 10``); on the CPU these tests check that the effort's options reach
every partition step's compile, and that either effort gives the in-memory numbers.
"""

import jax
import optax
import pytest

from jgrind import models
from jgrind.engine import OutOfCore
from jgrind.engine.compile_effort import FULL, QUICK, CompileEffort, by_name
from jgrind.plan import policies

from helpers import csbm_graph, reference
from test_engine import assert_same_gradients


def _model(graph):
    return models.gcn(graph.num_features, 8, graph.num_classes, num_layers=2, dropout=0.5)


@pytest.mark.parametrize("effort", [FULL, QUICK], ids=str)
def test_either_effort_gives_the_in_memory_numbers(effort, tmp_path):
    graph = csbm_graph()
    model = _model(graph)
    params, key = model.init(jax.random.key(0)), jax.random.key(1)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(), num_parts=3,
                   store=tmp_path, compile_effort=effort) as ex:
        loss, grads = ex.loss_and_grad(params, key)
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert_same_gradients(grads, ref_grads)


def test_the_effort_reaches_the_partition_steps(tmp_path):
    """An option XLA does not know fails the first step's compile: so the effort's options are
    what the steps compile with (XLA's defaults otherwise)."""
    graph = csbm_graph()
    unknown = CompileEffort("unknown", (("xla_jgrind_no_such_option", 1),))
    model = _model(graph)
    with OutOfCore(graph, model, optax.sgd(0.1), policy=policies.host_offload(), num_parts=2,
                   store=tmp_path, compile_effort=unknown) as ex:
        with pytest.raises(Exception, match="xla_jgrind_no_such_option"):
            ex.loss_and_grad(model.init(jax.random.key(0)), jax.random.key(1))


def test_quick_is_the_engines_default_and_turns_gpu_autotuning_off(tmp_path):
    graph = csbm_graph()
    with OutOfCore(graph, _model(graph), optax.sgd(0.1), policy=policies.host_offload(),
                   num_parts=2, store=tmp_path) as ex:
        assert ex.built.steps[0].forward is not None
        assert ex.compile_effort is QUICK
    assert QUICK.compiler_options() == {"xla_gpu_autotune_level": 0}
    assert FULL.compiler_options() is None


def test_efforts_by_name():
    assert by_name("quick") is QUICK and by_name("full") is FULL
    with pytest.raises(ValueError, match="unknown compile effort 'fast'; choose one of full, "
                                         "quick"):
        by_name("fast")
