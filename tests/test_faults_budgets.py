"""Budgets at and above the minimum an error states run (issue 36, item 4).

The built-in budget-aware policies (`policies.grinnder`, the engine's default, `policies.auto`)
leave room on the device for the working set the engine will check, and a budget error states
budgets that work: taking the figure an error states and running again trains, and so does
every budget between it and a comfortable one. Before, grinnder filled the device with blocks
and was then refused for the working set beside them, and each minimum it stated moved when
followed.
"""

import re

import jax
import optax
import pytest

from jgrind import generators, models
from jgrind.cli import main
from jgrind.config import parse_bytes
from jgrind.engine import BudgetError, OutOfCore
from jgrind.partition import contiguous
from jgrind.plan import policies
from jgrind.plan.budgets import UNLIMITED
from jgrind.plan.cost import format_minimum
from jgrind.plan.planner import PlanError
from jgrind.train import InMemory, make_executor

from helpers import community_graph
from test_planner import fixed_profile

GRAPHS = {
    "csbm": lambda: generators.csbm(num_nodes=600, num_features=12, avg_degree=6, seed=3),
    "rmat": lambda: generators.rmat(num_nodes=512, num_edges=4096, num_features=12,
                                    num_classes=5, seed=3),
    "community": lambda: community_graph(num_nodes=480, num_features=12),
}
# The budget-aware policies as the command line builds them (grinnder with no budgets of its
# own: the run's hold), the engine's default, and the planner.
POLICIES = {
    "grinnder": lambda: policies.grinnder(UNLIMITED, UNLIMITED),
    "default": lambda: None,
    "auto": lambda: policies.auto(profile=fixed_profile()),
    "auto without recompute": lambda: policies.auto(profile=fixed_profile(), recompute=False),
}


def _stated(error: Exception, tier: str) -> int:
    """The budget for ``tier`` ("device" or "host") an error message tells the user to use."""
    text = str(error)
    before = r"(?:device budget (?:of |to )?|raise it to )" if tier == "device" else \
        r"host budget to "
    found = re.search(before + r"at least ([\d.]+) ([KMG]iB|bytes)", text)
    assert found, f"no {tier} budget stated in: {text}"
    number, unit = found.groups()
    return parse_bytes(number + ("" if unit == "bytes" else unit))


def _executor(graph, model, policy, parts, device, host, store=None):
    return make_executor(graph, model, optax.sgd(0.1), policy=policy, num_parts=parts,
                         device_budget=device, host_budget=host, store=store,
                         partitioner=contiguous)


def _trains(graph, model, ex, exact=False):
    """One epoch runs out of core within the budgets (``exact``: its loss is the in-memory
    one; compiling the in-memory step costs as much again, so only where it is asked)."""
    params = model.init(jax.random.key(0))
    key = jax.random.key(1)
    try:
        assert isinstance(ex, OutOfCore)
        assert ex.memory.device <= ex.device_budget and ex.memory.host <= ex.host_budget
        loss, _ = ex.loss_and_grad(params, key)
        assert ex.store.accounts.peak_device + ex.memory.device_working_set <= ex.device_budget
        assert ex.store.accounts.peak_host <= ex.host_budget
    finally:
        ex.close()
    if exact:
        ref_loss, _ = InMemory(graph, model, optax.sgd(0.1)).loss_and_grad(params, key)
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)


def _comfortable(graph, model, parts) -> int:
    """A device budget that holds every block beside the working set."""
    with OutOfCore(graph, model, None, policy=policies.in_memory(), num_parts=parts,
                   partitioner=contiguous) as ex:
        return ex.memory.device


# Every graph with every policy, part counts spread over them. Compiling a run's steps is what
# takes the time, so one case per policy trains an epoch; in the others the engine's budget
# check (the step that refused before) passes.
CASES = [("csbm", 16, "grinnder", True), ("rmat", 8, "grinnder", False),
         ("community", 4, "grinnder", False), ("rmat", 16, "default", True),
         ("community", 8, "default", False), ("csbm", 4, "default", False),
         ("community", 16, "auto", True), ("rmat", 4, "auto", False),
         ("csbm", 8, "auto", False)]


@pytest.mark.parametrize("graph_name,parts,policy,train", CASES)
def test_the_stated_device_minimum_runs_without_host_ram_or_store(graph_name, parts, policy,
                                                                  train):
    """Host budget 0 and no store (the issue's csbm case): every block has to be on the
    device. The minimum stated for a far too small budget runs at once, and so does every
    budget above it up to one that holds everything comfortably."""
    graph = GRAPHS[graph_name]()
    model = models.gcn(graph.num_features, 16, graph.num_classes)
    with pytest.raises((BudgetError, PlanError)) as info:
        _executor(graph, model, POLICIES[policy](), parts, 1000, 0)
    least = _stated(info.value, "device")
    ex = _executor(graph, model, POLICIES[policy](), parts, least, 0)
    if train:
        _trains(graph, model, ex)
    else:
        ex.close()
    top = max(_comfortable(graph, model, parts), least) * 5 // 4
    for step in range(1, 5):
        budget = least + (top - least) * step // 4
        _executor(graph, model, POLICIES[policy](), parts, budget, 0).close()
    if policy != "auto":  # the planner's figure is the first of a few it tries that fits
        with pytest.raises((BudgetError, PlanError)):
            _executor(graph, model, POLICIES[policy](), parts, least * 99 // 100, 0)


@pytest.mark.parametrize("graph_name,parts", [("rmat", 16), ("csbm", 8)])
def test_grinnder_leaves_room_for_the_working_set_at_any_budget(graph_name, parts, tmp_path):
    """The issue's rmat case, small: a store, a host budget for a quarter of the blocks, and any
    device budget from one partition's working set up: grinnder keeps blocks on the device
    only beside the working set, so none is refused."""
    graph = GRAPHS[graph_name]()
    model = models.gcn(graph.num_features, 32, graph.num_classes)
    with OutOfCore(graph, model, None, policy=policies.host_offload(), num_parts=parts,
                   partitioner=contiguous) as ex:
        working_set, blocks = ex.memory.device_working_set, ex.memory.host
    for share in (0, 1, 2, 3, 5, 8):
        device = working_set + blocks * share // 8
        policy = policies.grinnder(device, blocks // 4, tmp_path)
        ex = _executor(graph, model, policy, parts, device, blocks // 4, tmp_path)
        if share == 3 and graph_name == "rmat":
            _trains(graph, model, ex, exact=True)
        else:
            ex.close()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("policy", ["grinnder", "auto without recompute"])
def test_the_stated_host_minimum_trains(policy):
    """A device budget of one working set, host budget 0, no store: the error states a host
    budget that trains (the planner's, when it may not recompute, counts every layer: with
    four, more than the two copies of one it counted for recomputing)."""
    graph = GRAPHS["csbm"]()
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=4)
    with OutOfCore(graph, model, None, policy=policies.host_offload(), num_parts=8,
                   partitioner=contiguous) as ex:
        working_set = ex.memory.device_working_set
    with pytest.raises((BudgetError, PlanError)) as info:
        _executor(graph, model, POLICIES[policy](), 8, working_set, 0)
    host = _stated(info.value, "host")
    _trains(graph, model, _executor(graph, model, POLICIES[policy](), 8, working_set, host),
            exact=policy == "grinnder")


def test_a_fixed_policys_stated_minimum_counts_the_masks_it_lets_in():
    """in_memory keeps every block on the device; below its working set the engine drops the
    output masks, at the budget it then states they fit again. The figure stated counts them,
    so it is not refused once more with a larger one."""
    graph = GRAPHS["csbm"]()
    model = models.gcn(graph.num_features, 32, graph.num_classes, num_layers=3)
    with pytest.raises(BudgetError) as info:
        _executor(graph, model, policies.in_memory(), 4, 1000, None)
    least = _stated(info.value, "device")
    _executor(graph, model, policies.in_memory(), 4, least, None).close()


def test_a_stated_minimum_as_written_is_not_below_it():
    """Figures are written to 0.01 of a unit; a minimum is rounded up, so the figure read back
    is at least the minimum (12.134 MiB is written 12.14 MiB, not 12.13 MiB)."""
    for n in [900, 1023, 1024, 1025, 12_723_000, 3 * 2**20 + 1, 2**30 - 1, 5 * 2**30 + 7]:
        text = format_minimum(n)  # read back as written, "900 bytes" too
        assert n <= parse_bytes(text) < n + 0.0101 * 2**30, text
    assert format_minimum(int(12.134 * 2**20)) == "12.14 MiB"


def test_cli_follows_the_stated_minimum(tmp_path, capsys):
    """The issue's csbm command, small: host budget 0, 16 parts, a device budget far too small;
    the budget the one-line error states trains."""
    def run(device):
        return main(["train", "--dataset", "csbm", "--set", "num_nodes=400", "--set",
                     "hidden=8", "--policy", "grinnder", "--parts", "16", "--device-budget",
                     device, "--host-budget", "0", "--epochs", "1", "--no-progress",
                     "--no-compile-cache", "--out", str(tmp_path / "run")])
    assert run("64KiB") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("jgrind: error: ") and "\n" not in err and "Traceback" not in err
    device = _stated(RuntimeError(err), "device")
    assert run(str(device)) == 0, capsys.readouterr().err

