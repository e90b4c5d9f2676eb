"""The planner over several devices: the device budget held per device, `auto` with
``devices``, and `jgrind plan --devices K` (`jgrind.plan.planner.plan_run`'s ``devices``,
`jgrind.devices.ShardedOutOfCore`).

The runs on several devices share one subprocess with
``--xla_force_host_platform_device_count=4`` (as tests/test_devices_out_of_core.py), which
prints JSON; the tolerances are tests/test_devices.py's. The planner's own checks run here:
planning runs nothing on a device.
"""

import functools
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_devices import _environment, _gradient_error, _last_json  # noqa: E402

PARTS = 6
# the share of a device's blocks (every tensor on the devices) that the auto runs' budget
# leaves room for beside the working set: the plan then keeps layer 0's input on the devices
# and layer 1's on the host, so the two layers take different routes
ROOM = 0.6


@functools.cache
def _graph_and_model():
    from jgrind import generators, models
    graph = generators.csbm(num_nodes=800, num_features=32, avg_degree=6, seed=1)
    model = models.gcn(graph.num_features, 32, graph.num_classes, num_layers=2, dropout=0.5)
    return graph, model


def _profile(**overrides):
    """`test_planner.fixed_profile` with slow transfers, so that the planner keeps on the
    devices whatever their budget holds, and host RAM to spare."""
    from test_planner import fixed_profile
    slow = 2e7
    figures = dict(host_free=1 << 33, to_device_bw=slow, to_device_small_bw=slow,
                   link_to_device_bw=slow, link_to_host_bw=slow, to_host_bw=slow,
                   pageable_to_host_bw=slow)
    return fixed_profile(**{**figures, **overrides})


@functools.cache
def _auto_budget(graph, model) -> int:
    """The device budget of the auto runs (with `_profile`): the fullest device's working set
    and `ROOM` of the fullest device's blocks when every tensor is on the devices."""
    from jgrind.plan.planner import plan_run
    profile = _profile()
    roomy = plan_run(graph, model, profile, device_budget=1 << 40, num_parts=PARTS, devices=2)
    m = roomy.prediction.memory
    return int(max(m.device_working_sets) + ROOM * max(m.device_tables_each))


# -- the subprocess -------------------------------------------------------------------------
def _run_cases(folder: str) -> dict:
    import time

    import jax
    graph, model = _graph_and_model()
    out = {"devices": len(jax.devices()), "seconds": {}}
    for name, case in (("fixed", _fixed_policy), ("auto", _auto), ("train", _train),
                       ("command_line", _command_line), ("chosen", _chosen)):
        start = time.process_time()
        out[name] = case(folder) if name == "command_line" else \
            case(graph, model, folder) if name == "chosen" else case(graph, model)
        out["seconds"][name] = time.process_time() - start
    return out


def _fixed_policy(graph, model) -> dict:
    """Every block on the devices (`policies.in_memory`) under a device budget that each
    device's own blocks and working set fit and all devices' blocks together do not."""
    import jax
    import optax

    from helpers import reference
    from jgrind.devices import ShardedOutOfCore
    from jgrind.engine import OutOfCore
    from jgrind.plan import policies
    from jgrind.engine.store import BudgetError
    arguments = dict(devices=2, num_parts=PARTS, max_shapes=1, policy=policies.in_memory())
    with ShardedOutOfCore(graph, model, optax.sgd(0.1), **arguments) as roomy:
        tables, working = roomy.predicted_device_peaks, roomy.device_working_sets
        pg = roomy.engine.pg
    budget = int(np.max(tables + working))
    try:  # the same partitions and fates on one device: its blocks are all of them
        OutOfCore(graph, model, optax.sgd(0.1), policy=policies.in_memory(), partitioned=pg,
                  device_budget=budget, max_shapes=1).close()
        one_device = "admitted"
    except BudgetError as err:
        one_device = str(err)
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with ShardedOutOfCore(graph, model, optax.sgd(0.1), device_budget=budget,
                          **arguments) as ex:
        loss, grads = ex.loss_and_grad(params, key)
        return {"budget": budget, "one_device": one_device, "loss": float(loss),
                "reference": float(ref_loss),
                "gradient_error": _gradient_error(grads, ref_grads),
                "tiers": sorted({f.value for f in ex.fates.values()}),
                "predicted": [int(b) for b in ex.predicted_device_peaks],
                "working_sets": [int(b) for b in ex.device_working_sets],
                "measured": [int(b) for b in ex.device_tiers.peak]}


def _auto(graph, model) -> dict:
    """`auto` on 2 devices under a budget that keeps some layers on the devices and others
    on the host: its loss and gradients, fates, routes and peaks."""
    import jax
    import optax

    from helpers import reference
    from jgrind.devices import ShardedOutOfCore
    from jgrind.plan import policies
    profile = _profile()
    budget = _auto_budget(graph, model)
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with ShardedOutOfCore(graph, model, optax.sgd(0.1), devices=2, num_parts=PARTS,
                          max_shapes=1, policy=policies.auto(profile=profile),
                          device_budget=budget, host_budget=1 << 30) as ex:
        loss, grads = ex.loss_and_grad(params, key)
        return {"budget": budget, "loss": float(loss), "reference": float(ref_loss),
                "gradient_error": _gradient_error(grads, ref_grads),
                "planned": ex.plan is not None and not ex.plan.in_memory,
                "layer_tiers": [sorted({f.value for (name, layer, _), f in ex.fates.items()
                                        if name == "activation" and layer == l})
                                for l in range(len(ex.engine.built.model.layers))],
                "routes": [str(r) for r in ex.exchanges if r is not None],
                "moved": dict(ex.device_tiers.moved),
                "by_route": dict(ex.exchange_bytes_by_route),
                "predicted": [int(b) for b in ex.predicted_device_peaks],
                "working_sets": [int(b) for b in ex.device_working_sets],
                "measured": [int(b) for b in ex.device_tiers.peak]}


def _train(graph, model) -> dict:
    """`train(..., devices=2, policy=auto(...))` for a few epochs against in-memory training,
    and what it records of the devices' peaks."""
    import jax
    import optax

    import jgrind
    from jgrind.plan import policies
    profile = _profile()
    budget = _auto_budget(graph, model)
    common = dict(epochs=2, eval_every=2, progress=False)
    ours = jgrind.train(jax.random.key(5), graph, model, optax.adam(0.01), devices=2,
                        num_parts=PARTS, policy=policies.auto(profile=profile),
                        device_budget=budget, host_budget=1 << 30, **common)
    theirs = jgrind.train(jax.random.key(5), graph, model, optax.adam(0.01), **common)
    return {"budget": budget,
            "losses": [r["loss"] for r in ours.history],
            "reference_losses": [r["loss"] for r in theirs.history],
            "params_close": all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
                                for a, b in zip(jax.tree.leaves(ours.params),
                                                jax.tree.leaves(theirs.params))),
            "devices": {k: v for k, v in ours.devices.items() if k != "placement"}}


def _command_line(folder: str) -> dict:
    """`jgrind train --devices 2 --policy auto`: the line it prints on the devices' peaks and
    its summary's record of them."""
    import contextlib
    import io

    from jgrind.cli import main
    from jgrind.plan import profile as hw
    path = hw.save(_profile(), pathlib.Path(folder) / "profile.json")
    run = pathlib.Path(folder) / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["train", "--dataset", "csbm", "--set", "num_nodes=300", "--devices", "2",
                     "--policy", "auto", "--set", f"profile={path}", "--parts", "4",
                     "--epochs", "1", "--out", str(run), "--no-progress"])
    assert code == 0, printed.getvalue()
    summary = json.loads((run / "summary.json").read_text())
    return {"printed": printed.getvalue(), "device_peaks": summary.get("device_peaks")}


def _chosen(graph, model, folder: str) -> dict:
    """Two devices and a device budget alone (no policy, `jgrind.devices.choose`), under the
    auto runs' budget, which the devices' whole programs exceed: the executor, its routes per
    layer and its loss and gradients against the in-memory computation."""
    import os

    import jax
    import optax

    from helpers import reference
    from jgrind.plan import profile as hw
    from jgrind.train import make_executor
    os.environ["JGRIND_PROFILE"] = str(hw.save(_profile(), pathlib.Path(folder) / "chosen.json"))
    budget = _auto_budget(graph, model)
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    with make_executor(graph, model, optax.sgd(0.1), devices=2, num_parts=PARTS,
                       device_budget=budget) as ex:
        loss, grads = ex.loss_and_grad(params, key)
        return {"executor": type(ex).__name__, "loss": float(loss),
                "reference": float(ref_loss),
                "gradient_error": _gradient_error(grads, ref_grads),
                "routes": [str(r) for r in ex.exchanges if r is not None],
                "predicted": [int(b) for b in ex.predicted_device_peaks],
                "working_sets": [int(b) for b in ex.device_working_sets], "budget": budget}


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    folder = tmp_path_factory.mktemp("devices_plan")
    done = subprocess.run([sys.executable, __file__, "cases", str(folder)],
                          env=_environment(4), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return _last_json(done.stdout)


# -- on several devices -----------------------------------------------------------------------
def test_a_budget_per_device_admits_what_one_device_refuses(two_devices):
    """Every block on the devices, under a budget that each device's blocks and working set
    fit, and the blocks of both together do not: refused on one device, run on two, with
    each device's measured blocks within its share of the budget."""
    assert two_devices["devices"] == 4
    got = two_devices["fixed"]
    assert "but the device budget is" in got["one_device"], got["one_device"]
    assert got["loss"] == pytest.approx(got["reference"], rel=1e-5)
    assert got["gradient_error"] <= 1.0
    assert "device" in got["tiers"] and not {"host", "ssd"} & set(got["tiers"])
    budget, working = got["budget"], got["working_sets"]
    assert all(0 < m <= p for m, p in zip(got["measured"], got["predicted"]))
    assert all(m + w <= budget for m, w in zip(got["measured"], working))
    assert sum(got["measured"]) + max(working) > budget  # the sum would not fit


def test_auto_on_two_devices_equals_in_memory(two_devices):
    """`auto` under a budget that keeps some layers on the devices and some on the host:
    the loss and gradients of the in-memory computation, one layer's halo rows device to
    device and the other's through host memory."""
    got = two_devices["auto"]
    assert got["planned"]
    assert got["loss"] == pytest.approx(got["reference"], rel=1e-5)
    assert got["gradient_error"] <= 1.0
    tiers = {t for layer in got["layer_tiers"] for t in layer}
    assert {"device", "host"} <= tiers, got["layer_tiers"]
    assert got["routes"] == ["device to device", "through host memory"], got["routes"]
    # both routes carry rows; the device tiers count those moved from device blocks
    to_device = "device to device"
    assert all(n > 0 for n in got["by_route"].values()), got["by_route"]
    assert got["moved"][to_device] == got["by_route"][to_device]
    budget, working = got["budget"], got["working_sets"]
    assert all(0 < m <= p for m, p in zip(got["measured"], got["predicted"]))
    assert all(p + w <= budget for p, w in zip(got["predicted"], working))
    assert sum(got["predicted"]) + max(working) > budget  # the sum would not fit


def test_training_with_auto_on_two_devices(two_devices):
    """`train(..., devices=2, policy=auto())`: the parameters of in-memory training after a
    few epochs, and each device's measured device-tier peak beside the predicted one."""
    got = two_devices["train"]
    assert got["losses"] == pytest.approx(got["reference_losses"], rel=1e-5)
    assert got["params_close"]
    devices = got["devices"]
    assert devices["device_budget"] == got["budget"]
    assert len(devices["device_peaks"]) == len(devices["predicted_device_peaks"]) == 2
    assert all(0 < m <= p for m, p in zip(devices["device_peaks"],
                                          devices["predicted_device_peaks"]))


def test_train_from_the_command_line_records_the_peaks(two_devices):
    """`jgrind train --devices 2 --policy auto`: each device's predicted peak before it
    trains, and its measured device-tier peak beside the predicted one after (printed, and
    in summary.json)."""
    got = two_devices["command_line"]
    assert "jgrind: device 1: partitions " in got["printed"], got["printed"]
    assert "device blocks at their peak, measured / predicted: device 0 " in got["printed"]
    peaks = got["device_peaks"]
    assert len(peaks["device_peaks"]) == len(peaks["predicted_device_peaks"]) == 2
    assert all(m <= p for m, p in zip(peaks["device_peaks"], peaks["predicted_device_peaks"]))


def test_a_device_budget_alone_mixes_the_routes_per_layer(two_devices):
    """Several devices and a device budget, no policy, where the devices' whole programs do
    not fit: the planner keeps what the budget holds on the devices, so layer 0 exchanges
    device to device and layer 1 through host memory (not every layer through the host), with
    the in-memory loss and gradients."""
    got = two_devices["chosen"]
    assert got["executor"] == "ShardedOutOfCore"
    assert got["routes"] == ["device to device", "through host memory"], got["routes"]
    assert got["loss"] == pytest.approx(got["reference"], rel=1e-5)
    assert got["gradient_error"] <= 1.0
    assert all(p + w <= got["budget"] for p, w in zip(got["predicted"], got["working_sets"]))


# -- the planner alone -------------------------------------------------------------------------
def test_the_planner_holds_the_budget_per_device():
    """Under the auto runs' budget, the plan for 2 devices keeps on them more than one
    device's budget holds: each device's blocks and working set within the budget, their
    sum not. Counting the sum over the devices instead refuses that plan."""
    from jgrind.plan.cost import memory
    from jgrind.plan.planner import plan_run
    graph, model = _graph_and_model()
    profile = _profile()
    budget = _auto_budget(graph, model)
    two = plan_run(graph, model, profile, device_budget=budget, num_parts=PARTS, devices=2)
    m = two.prediction.memory
    assert two.placement is not None and two.placement.num_devices == 2
    assert len(m.device_tables_each) == 2 and all(m.device_tables_each)
    assert max(m.device_peaks) == m.device <= budget
    summed = m.device_tables + max(m.device_working_sets)
    assert summed > budget
    assert m.device_tables == sum(m.device_tables_each)
    # the same fates counted for one device: over the budget
    one_device = memory(two.workload.on_devices(None), two.assignment)
    assert one_device.device > budget
    one = plan_run(graph, model, profile, device_budget=budget, num_parts=PARTS)
    assert one.prediction.memory.device_tables < m.device_tables
    assert two.epoch_seconds <= one.epoch_seconds * (1 + 1e-9)


def test_the_plan_line_gives_the_fullest_devices_peak():
    """The line `auto` prints before a run on 2 devices names the fullest device's peak, which
    the budget holds, not the devices' blocks summed beside one working set."""
    from jgrind.plan.cost import format_bytes
    from jgrind.plan.planner import plan_run
    from jgrind.plan.report import plan_line
    graph, model = _graph_and_model()
    budget = _auto_budget(graph, model)
    two = plan_run(graph, model, _profile(), device_budget=budget, num_parts=PARTS, devices=2)
    m = two.prediction.memory
    assert m.device != m.peak_device + m.device_working_set  # the two readings differ here
    assert f"peaks: device {format_bytes(m.device)} on the fullest of 2 devices, host " \
        in plan_line(two)


def test_grinnder_fills_each_device_to_the_budget():
    """The default policy on 2 devices packs each device's own partitions' blocks within the
    device budget: more blocks on the devices than one device holds, each device's predicted
    peak within the budget."""
    from jgrind.executed.split import as_executed
    from jgrind.plan.cost import Assignment, memory
    from jgrind.plan.fates import Fate
    from jgrind.plan.inventory import build_inventory
    from jgrind.plan.planner import plan_run
    from jgrind.plan.policies import bind, grinnder
    from jgrind.plan.protocols import BindContext
    graph, model = _graph_and_model()
    budget = _auto_budget(graph, model)
    two = plan_run(graph, model, _profile(), device_budget=budget, num_parts=PARTS, devices=2)
    inventory = build_inventory(as_executed(model)[0], two.partitioned)

    def on_device(workload):
        bound = bind(grinnder(budget, 1 << 40), inventory, BindContext(workload, budget, 1 << 40))
        fates = {(i.name, i.layer, i.partition): bound(i) for i in inventory}
        return fates, sum(f is Fate.DEVICE for f in fates.values())
    placed, on_two = on_device(two.workload)
    _, on_one = on_device(two.workload.on_devices(None))
    assert on_two > on_one > 0
    m = memory(two.workload, Assignment.from_fates(placed, two.workload.num_layers, PARTS))
    assert len(m.device_peaks) == 2 and max(m.device_peaks) <= budget


def test_one_device_plans_as_before():
    """``devices=1``: the same predicted epoch and device peak as without devices."""
    from jgrind.plan.planner import plan_run
    graph, model = _graph_and_model()
    profile = _profile()
    budget = _auto_budget(graph, model)
    one = plan_run(graph, model, profile, device_budget=budget, num_parts=PARTS)
    placed = plan_run(graph, model, profile, device_budget=budget, num_parts=PARTS, devices=1)
    assert placed.epoch_seconds == pytest.approx(one.epoch_seconds, rel=1e-9)
    assert placed.prediction.memory.device == one.prediction.memory.device


def test_plan_prints_each_devices_peak(capsys, tmp_path):
    """`jgrind plan --devices 2`: the partitions of each device, the fates, the route of
    every layer, each device's predicted peak and the host's, and the predicted epoch."""
    from jgrind.cli import main
    from jgrind.plan import profile as hw
    path = hw.save(_profile(directory=str(tmp_path.resolve())), tmp_path / "profile.json")
    assert main(["plan", "--dataset", "csbm", "--set", "num_nodes=600", "--devices", "2",
                 "--parts", "4", "--profile", str(path), "--device-budget", "500KiB",
                 "--out", str(tmp_path / "plan")]) == 0
    out = capsys.readouterr().out
    assert "out of core on 2 devices (--policy auto" in out, out
    peaks = [line for line in out.splitlines() if "predicted peak" in line
             and line.startswith("  device ")]
    assert len(peaks) == 2 and all("of the device budget 500.00 KiB" in p for p in peaks), out
    assert "host: predicted peak" in out and "predicted epoch: " in out
    assert out.count("exchange per layer: ") == 2  # in memory, and out of core
    # each layer's route follows its blocks' fates: device to device where every block of
    # its input is on the devices, else through host memory (which the planner chooses
    # depends on the cost model's form; the printing must agree with it either way)
    planned = out.split("out of core on 2 devices")[1]
    fates = next(line.strip() for line in planned.splitlines()
                 if line.strip().startswith("fates: "))
    routes = next(line for line in planned.splitlines() if "exchange per layer: " in line)
    for layer in (0, 1):
        whole = re.search(rf"\bH_{layer} device(,|$)", fates) is not None
        route = "device to device" if whole else "through host memory"
        assert f"layer {layer} {route}" in routes, out


def test_the_planner_holds_the_host_budget_per_process():
    """Over two processes of one device each, the host budget holds each process's share
    (its own host blocks and the halo rows it keeps of the other's, whatever their tier):
    with the devices holding their working sets only, a budget between the larger share and
    the whole plan's host bytes keeps every block in host RAM, which a budget on the whole
    plan would not; a budget below the shares is refused in one line."""
    from jgrind.plan.planner import PlanError, plan_run
    from jgrind.plan.process_shares import host_shares
    graph, model = _graph_and_model()
    profile = _profile()
    placed = dict(num_parts=PARTS, devices=2, device_processes=[0, 1])
    on_devices = plan_run(graph, model, profile, device_budget=1 << 40, host_budget=1 << 40,
                          **placed)
    # every block on the devices: the halo rows of the other process's blocks stay
    assert all(blocks == 0 < halo for blocks, halo in on_devices.host_shares)
    working_set = int(max(on_devices.prediction.memory.device_working_sets))
    roomy = plan_run(graph, model, profile, device_budget=working_set, host_budget=1 << 40,
                     **placed)
    shares = [b + h for b, h in roomy.host_shares]
    whole = roomy.prediction.memory.host
    budget = (max(shares) + whole) // 2
    assert max(shares) < budget < whole
    two = plan_run(graph, model, profile, device_budget=working_set, host_budget=budget,
                   **placed)
    assert two.processes is not None and two.processes.num_processes == 2
    assert two.host_shares == host_shares(two.workload, two.assignment, two.processes)
    assert max(b + h for b, h in two.host_shares) <= budget < two.prediction.memory.host
    assert {row["fate"] for row in two.groups() if row["name"] != "aggregation"} == {"host"}
    with pytest.raises(PlanError, match="raise the host budget to at least"):
        plan_run(graph, model, profile, device_budget=working_set,
                 host_budget=min(shares) // 4, **placed)


def test_a_host_budget_below_a_process_halo_rows_is_refused_for_what_it_is(tmp_path):
    """Over two processes with an SSD store, a host budget below the halo rows a process keeps
    of the other's blocks fits no plan, however much the store holds: the refusal says so
    (not that the store lacks space) and names a host budget that plans."""
    import re
    from jgrind.plan.planner import PlanError, plan_run
    graph, model = _graph_and_model()
    profile = _profile()
    placed = dict(num_parts=PARTS, devices=2, device_processes=[0, 1])
    on_devices = plan_run(graph, model, profile, device_budget=1 << 40, host_budget=1 << 40,
                          **placed)
    halo = min(h for _, h in on_devices.host_shares)
    working_set = int(max(on_devices.prediction.memory.device_working_sets))
    with pytest.raises(PlanError) as refused:
        plan_run(graph, model, profile, device_budget=working_set, host_budget=halo // 2,
                 directory=str(tmp_path), **placed)
    line = str(refused.value)
    assert "of the other processes' rows its partitions read" in line, line
    assert "free space" not in line, line
    enough = re.search(r"raise the host budget to at least ([0-9.]+) (KiB|MiB|GiB|bytes)", line)
    assert enough, line
    scale = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[enough.group(2)]
    fits = plan_run(graph, model, profile, device_budget=working_set,
                    host_budget=int(float(enough.group(1)) * scale) + 1,
                    directory=str(tmp_path), **placed)
    assert max(b + h for b, h in fits.host_shares) <= float(enough.group(1)) * scale + 1


def test_plan_prints_each_process_share(capsys, tmp_path):
    """`jgrind plan --devices 2 --num-processes 2`: each process's devices, partitions and
    predicted host share beside the host budget per process; a process count that does not
    divide the device count is refused in one line."""
    from jgrind.cli import main
    from jgrind.plan import profile as hw
    from jgrind.plan.cost import format_bytes
    path = hw.save(_profile(directory=str(tmp_path.resolve())), tmp_path / "profile.json")
    common = ["plan", "--dataset", "csbm", "--set", "num_nodes=600", "--parts", "4",
              "--profile", str(path), "--device-budget", "500KiB", "--host-budget", "1MiB",
              "--out", str(tmp_path / "plan")]
    assert main(common + ["--devices", "2", "--num-processes", "2"]) == 0
    out = capsys.readouterr().out
    assert "out of core on 2 devices in 2 processes (--policy auto; " in out, out
    lines = [line.strip() for line in out.splitlines() if line.startswith("  process ")]
    assert [line.split(";")[0] for line in lines] == ["process 0: devices 0",
                                                      "process 1: devices 1"], out
    parts = sorted(p for line in lines for p in
                   line.split("; partitions ")[1].split(";")[0].split(", "))
    assert parts == ["0", "1", "2", "3"]
    assert all(line.endswith(f"of the host budget per process {format_bytes(1 << 20)}")
               and "halo rows of other processes' blocks" in line for line in lines), out
    assert main(common + ["--devices", "2", "--num-processes", "3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give a process count that divides the device count" \
        in err


if __name__ == "__main__":
    if sys.argv[1] == "cases":
        print(json.dumps(_run_cases(sys.argv[2])))
