"""The out-of-core engine over several devices (`jgrind.devices.ShardedOutOfCore`) against the
in-memory computation, with host, SSD and device fates.

As in test_devices.py, one subprocess with ``--xla_force_host_platform_device_count=4`` checks
every case and prints JSON; the tolerances are that file's. The exchange through host memory
is also compared with the device-to-device one (`Sharded`) on the same partitions and
devices. Blocks with the device fate live on their partition's device, and each layer's halo
rows move by its route: device to device, or through host memory, in one run.
"""

import pathlib
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from test_devices import _environment, _gradient_error, _last_json, _models  # noqa: E402

# (model, devices, partitions, fate): host and SSD fates on 2 and 4 devices; 3 partitions on
# 4 devices leaves one device without any; partition counts the device count does not divide.
# "device": every block on its partition's device, halo rows device to device; "device via
# host": the same blocks, halo rows through host memory (exchange=ThroughHost()); "grinnder":
# `policies.grinnder` under `GRINNDER_BUDGET`, which keeps layer 1's input on the devices and
# the features on the host: one run with both routes, and a table with blocks on both tiers;
# "alternate": every table's blocks on the device and the host by turns (rows of the device
# tier read into host memory and added from there).
CASES = [("gcn", 2, 3, "host"), ("gcn", 4, 3, "ssd"), ("sage-res-ln", 2, 4, "ssd"),
         ("gat-res-ln", 2, 3, "device via host"), ("gcn", 2, 3, "device"),
         ("gcn", 2, 4, "grinnder"), ("gcn", 2, 3, "alternate")]
GRINNDER_BUDGET = 110_000
EPOCHS = 3
# Host blocks in a lossy storage dtype on 2 devices of this one process, against in-memory
# training and the same run in float32 (`LOSSY_BASE`, a case of `CASES`): the loader gathers a
# step's input as stored words, which are decoded on the partition's device.
LOSSY = ("bfloat16", "int8")
LOSSY_BASE = ("gcn", 2, 3, "host")


def _policy(fate: str, folder) -> dict:
    """`ShardedOutOfCore`'s arguments for ``fate``."""
    from jgrind.devices import ThroughHost
    from jgrind.plan import policies
    from jgrind.plan.budgets import UNLIMITED
    return {"host": lambda: {"policy": policies.host_offload()},
            "ssd": lambda: {"policy": policies.ssd_offload(folder), "store": folder},
            "device": lambda: {"policy": policies.in_memory()},
            "device via host": lambda: {"policy": policies.in_memory(),
                                        "exchange": ThroughHost()},
            "grinnder": lambda: {"policy": policies.grinnder(GRINNDER_BUDGET, UNLIMITED),
                                 "device_budget": GRINNDER_BUDGET},
            "alternate": lambda: {"policy": _alternate}}[fate]()


def _alternate(info):
    """Even partitions' blocks on the device, odd ones' on the host; no kept aggregation."""
    from jgrind.plan.fates import AGGREGATION, Fate
    if info.name == AGGREGATION:
        return Fate.RECOMPUTE
    return Fate.DEVICE if info.partition % 2 == 0 else Fate.HOST


def _run_cases(folder: str) -> dict:
    import jax
    import optax

    from helpers import csbm_graph, reference
    from jgrind.devices import Sharded, ShardedOutOfCore

    graph = csbm_graph()
    built = _models(graph.num_features, graph.num_classes)
    key = jax.random.key(42)  # dropout on
    out = {"devices": len(jax.devices()), "cases": []}
    for name, k, parts, fate in CASES:
        model = built[name]
        params = model.init(jax.random.key(0))
        ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
        with ShardedOutOfCore(graph, model, optax.sgd(0.1), devices=k, num_parts=parts,
                              max_shapes=1, **_policy(fate, folder)) as ex:
            loss, grads = ex.loss_and_grad(params, key)
            if (name, k, parts, fate) == LOSSY_BASE:
                out["lossy"] = _lossy_storage(graph, model, params, key, grads)
            case = {"model": name, "devices": k, "parts": parts, "fate": fate,
                    "loss": float(loss), "reference": float(ref_loss),
                    "gradient_error": _gradient_error(grads, ref_grads),
                    "idle_devices": int(sum(not ex.placement.partitions_of(d)
                                            for d in range(k))),
                    "tiers": sorted({f.value for f in ex.fates.values()}),
                    "bytes": ex.exchange_bytes_per_epoch,
                    "minimum": ex.exchange_minimum_per_epoch,
                    "routes": [str(r) for r in ex.exchanges if r is not None],
                    "predicted": ex.exchange_bytes_by_route,
                    "measured": dict(ex.device_tiers.moved),  # the one epoch's
                    "device_peaks": [int(b) for b in ex.device_tiers.peak]}
            if fate == "host" and k == 2:  # the same partitions exchanged device to device
                sharded = Sharded(graph, model, devices=k, partitioned=ex.engine.pg)
                g2g_loss, g2g_grads = sharded.loss_and_grad(params, key)
                case["g2g_loss"] = float(g2g_loss)
                case["g2h_vs_g2g"] = _gradient_error(grads, g2g_grads)
                case["logits_error"] = float(np.abs(ex.predict(params) - reference(
                    graph, model).predict(params)).max())
        out["cases"].append(case)
        if name == "sage-res-ln":  # a few optimizer steps, against in-memory training
            out["train"] = _steps_against_in_memory(graph, model, params, folder, k, parts)
    out["command_line"] = _command_line(folder)
    out["store_left"] = sorted(p.name for p in pathlib.Path(folder).iterdir())
    return out


def _lossy_storage(graph, model, params, key, float32_grads) -> list:
    """`LOSSY_BASE` with its host blocks (activations and gradients) in each dtype of
    `LOSSY`: the gradients' error against in-memory training as a share of the largest
    gradient (`test_store_dtype.gradient_bound`'s measure), and against the float32 run."""
    import jax
    import optax

    from helpers import reference
    from jgrind.devices import ShardedOutOfCore
    from jgrind.hostio import codecs
    from jgrind.plan import policies
    from test_store_dtype import _fan_in, gradient_bound

    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
    ref, f32 = jax.tree.leaves(ref_grads), jax.tree.leaves(float32_grads)
    scale = max(float(np.abs(np.asarray(r)).max()) for r in ref)
    _, k, parts, _ = LOSSY_BASE
    out = []
    for name in LOSSY:
        codec = codecs.by_name(name)
        policy = policies.with_storage(policies.host_offload(), activations=codec,
                                       gradients=codec)
        with ShardedOutOfCore(graph, model, optax.sgd(0.1), devices=k, num_parts=parts,
                              max_shapes=1, policy=policy) as ex:
            loss, grads = ex.loss_and_grad(params, key)
            got = [np.asarray(g) for g in jax.tree.leaves(grads)]
            out.append({
                "dtype": name, "loss": float(loss), "reference": float(ref_loss),
                "error": max(float(np.abs(g - np.asarray(r)).max())
                             for g, r in zip(got, ref)) / scale,
                "bound": gradient_bound(codec, len(model.layers), _fan_in(graph)),
                "from_float32": max(float(np.abs(g - np.asarray(r)).max())
                                    for g, r in zip(got, f32)),
                "tiers": sorted({f.value for f in ex.fates.values()}),
                "stored_as": ex.store.accounts.storage})
    return out


def _steps_against_in_memory(graph, model, params, folder, k, parts) -> dict:
    """`EPOCHS` adam steps on ``k`` devices (host fates) and in memory, from ``params``."""
    import jax
    import optax

    from jgrind.devices import ShardedOutOfCore
    from jgrind.train import InMemory
    opt = optax.adam(0.01)
    with ShardedOutOfCore(graph, model, opt, devices=k, num_parts=parts, max_shapes=1,
                          **_policy("host", folder)) as ex:
        ours, ours_state = jax.tree.map(jax.numpy.array, params), opt.init(params)
        ref, ref_state = jax.tree.map(jax.numpy.array, params), opt.init(params)
        memory = InMemory(graph, model, opt)
        for epoch in range(EPOCHS):
            key = jax.random.fold_in(jax.random.key(3), epoch)
            ours, ours_state, _ = ex.step(ours, ours_state, key)
            ref, ref_state, _ = memory.step(ref, ref_state, key)
    return {"params_close": all(
        np.allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
        for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(ref)))}


def _command_line(folder: str) -> str:
    """What `jgrind train --devices 2 --policy host` prints."""
    import contextlib
    import io

    from jgrind.cli import main
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["train", "--dataset", "csbm", "--set", "num_nodes=300", "--devices", "2",
                     "--policy", "host", "--epochs", "1", "--out",
                     str(pathlib.Path(folder) / "run"), "--no-progress"])
    assert code == 0
    return printed.getvalue()


@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    folder = tmp_path_factory.mktemp("store")
    done = subprocess.run([sys.executable, __file__, "cases", str(folder)],
                          env=_environment(4), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return _last_json(done.stdout)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{m}-{k}dev-{p}parts-{f}"
                                                         for m, k, p, f in CASES])
def test_loss_and_gradients_equal_in_memory(four_devices, case):
    assert four_devices["devices"] == 4
    got = four_devices["cases"][case]
    assert got["loss"] == pytest.approx(got["reference"], rel=1e-5)
    assert got["gradient_error"] <= 1.0
    if got["fate"] in ("host", "ssd"):
        assert got["fate"] in got["tiers"] and "device" not in got["tiers"]
    else:
        assert "device" in got["tiers"]


def test_through_host_equals_device_to_device(four_devices):
    both = [c for c in four_devices["cases"] if "g2g_loss" in c]
    assert both
    for c in both:
        assert c["loss"] == pytest.approx(c["g2g_loss"], rel=1e-5)
        assert c["g2h_vs_g2g"] <= 1.0
        assert c["logits_error"] < 1e-4


@pytest.mark.parametrize("dtype", LOSSY)
def test_lossy_host_blocks_on_several_devices_of_one_process(four_devices, dtype):
    """Host blocks in a lossy storage dtype on 2 devices of one process: every step's input
    is gathered as stored words and decoded on its partition's device. The gradients are
    within the dtype's bound of in-memory training (`test_store_dtype.gradient_bound`), and
    not the float32 run's: the blocks really were stored lossy."""
    (got,) = [c for c in four_devices["lossy"] if c["dtype"] == dtype]
    assert "host" in got["tiers"] and "device" not in got["tiers"], got
    assert dtype in got["stored_as"], got
    assert got["error"] <= got["bound"], got
    assert got["from_float32"] > 0, got
    assert got["loss"] == pytest.approx(got["reference"], rel=got["bound"])


def test_a_device_with_no_partition(four_devices):
    idle = [c for c in four_devices["cases"] if c["idle_devices"]]
    assert idle and all(c["gradient_error"] <= 1.0 for c in idle)


def test_exchange_bytes_counted_beside_the_minimum(four_devices):
    for c in four_devices["cases"]:
        assert c["bytes"] >= c["minimum"] > 0


def test_training_equals_in_memory(four_devices):
    assert four_devices["train"]["params_close"]
    assert four_devices["store_left"] == ["run"]  # the SSD tiers' files are all gone


def _case(four_devices, fate: str) -> dict:
    (got,) = [c for c in four_devices["cases"] if c["fate"] == fate]
    return got


def test_device_blocks_live_on_their_partitions_devices(four_devices):
    """Every device holds its partitions' device blocks only, not the whole table."""
    for fate in ("device", "device via host", "grinnder", "alternate"):
        peaks = _case(four_devices, fate)["device_peaks"]
        assert all(peaks) and max(peaks) < sum(peaks), (fate, peaks)


def test_each_layer_moves_by_its_route(four_devices):
    """The bytes the device tiers moved between devices in the epoch, per route, are those
    counted for it: all device to device where the layers' blocks are on the devices, all
    through host memory when that route is asked for the same blocks, and both routes in one
    run where the plan keeps only some layers on the devices. Without the route switch one of
    these runs moves its rows by the other route."""
    to_device, via_host = "device to device", "through host memory"
    direct = _case(four_devices, "device")
    assert direct["routes"] == [to_device, to_device]
    assert direct["measured"][to_device] == direct["predicted"][to_device] > 0
    assert direct["measured"][via_host] == direct["predicted"][via_host] == 0
    host = _case(four_devices, "device via host")
    assert set(host["routes"]) == {via_host}
    assert host["measured"][via_host] == host["predicted"][via_host] > 0
    assert host["measured"][to_device] == host["predicted"][to_device] == 0
    mixed = _case(four_devices, "grinnder")
    assert mixed["routes"] == [via_host, to_device]
    assert {"device", "host"} <= set(mixed["tiers"])
    assert mixed["measured"][to_device] == mixed["predicted"][to_device] > 0
    assert mixed["predicted"][via_host] > 0
    alternate = _case(four_devices, "alternate")  # every table on both tiers: through host
    assert alternate["routes"] == [via_host, via_host]
    assert 0 < alternate["measured"][via_host] <= alternate["predicted"][via_host]


def test_train_from_the_command_line(four_devices):
    """`jgrind train --devices 2 --policy host`: the placement, the bytes exchanged through
    host memory beside the minimum, the host tier's traffic."""
    out = four_devices["command_line"]
    assert "device 1: partitions" in out and "halo exchange per epoch: " in out, out
    assert "peak stored blocks: device 0 bytes" in out, out


def test_a_run_over_processes_prints_each_process_share():
    """What `jgrind train --policy auto` prints and writes (plan.txt) of a plan over several
    processes (`jgrind.experiment.plan_lines`): each process prints its own predicted host
    share, the line `jgrind plan --devices K --num-processes P` prints for it; plan.txt
    has every process's; a plan in one process has none."""
    from helpers import community_graph
    from jgrind import models
    from jgrind.experiment import plan_lines
    from jgrind.plan.planner import plan_run
    from jgrind.plan.sharded import process_share_lines
    from test_planner import fixed_profile
    graph = community_graph(num_nodes=120)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    over = plan_run(graph, model, fixed_profile(), devices=2, device_processes=[0, 1])
    shares = process_share_lines(over)
    assert [line.split(":")[0] for line in shares] == ["process 0", "process 1"]
    assert "predicted host share" in shares[1] and "host budget per process" in shares[1]
    printed = plan_lines(over, 1)
    assert shares[1] in printed and shares[0] not in printed
    assert printed[0].startswith("device 0: partitions")  # after each device's peak
    assert set(shares) <= set(plan_lines(over))
    alone = plan_run(graph, model, fixed_profile(), devices=2)
    assert not any(line.startswith("process ") for line in plan_lines(alone))


def test_a_route_the_blocks_do_not_allow_is_refused():
    import optax

    from helpers import community_graph
    from jgrind import models
    from jgrind.devices import DeviceToDevice, Sharded, ShardedOutOfCore, ThroughHost
    from jgrind.plan import policies
    graph = community_graph(num_nodes=60)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    with pytest.raises(ValueError, match="layer 0's halo rows cannot go device to device"):
        ShardedOutOfCore(graph, model, optax.sgd(0.1), devices=1, exchange=DeviceToDevice(),
                         policy=policies.host_offload())
    with pytest.raises(ValueError, match="device to device; .*through host memory"):
        Sharded(graph, model, devices=1, exchange=[ThroughHost(), None])
    with pytest.raises(ValueError, match="exchange names 1 layers; the model has 2"):
        Sharded(graph, model, devices=1, exchange=[DeviceToDevice()])


def test_the_planner_chooses_the_route_of_every_layer():
    """`choose_exchanges`: the faster of the links given, for every aggregating layer."""
    from helpers import community_graph
    from jgrind import models
    from jgrind.devices import DeviceToDevice, ThroughHost
    from jgrind.plan.exchange import exchange_plan
    from jgrind.plan.sharded import Link, choose_exchanges
    graph = community_graph(num_nodes=60)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    normalized = model.normalize(graph)
    plan = exchange_plan(normalized.indptr, normalized.indices,
                         (np.arange(graph.num_nodes) % 2).astype(np.int32), 2)
    direct = Link("direct", 100e9)
    host = Link("host", 10e9, 10e9, through_host=True)
    fast_host = Link("host", 1e15, 1e15, through_host=True)

    def chosen(links):
        return choose_exchanges(plan, normalized.indptr, model, graph.num_features, None,
                                links=links)
    assert chosen((direct, host)) == (DeviceToDevice(), DeviceToDevice())
    assert chosen((direct, fast_host)) == (ThroughHost(), ThroughHost())
    assert chosen((host,)) == (ThroughHost(), ThroughHost())


def test_a_device_budget_alone_chooses_the_route(monkeypatch, tmp_path):
    """``devices`` with only a device budget: every row on its device while the devices'
    programs fit it (`Sharded`), else the planner's fates under it (`ShardedOutOfCore` with
    `auto`, pricing with the saved profile; tests/test_devices_plan.py has the per-layer mix
    this gives on two devices)."""
    import optax

    from helpers import community_graph
    from jgrind import models
    from jgrind.plan import profile as hw
    from jgrind.train import make_executor
    from test_planner import fixed_profile
    monkeypatch.setenv("JGRIND_PROFILE", str(hw.save(fixed_profile(), tmp_path / "p.json")))
    graph = community_graph(num_nodes=600)  # the whole program's peak: 314 KiB
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    roomy = make_executor(graph, model, optax.sgd(0.1), devices=1, num_parts=4,
                          device_budget=2**30)
    assert type(roomy).__name__ == "Sharded"
    with make_executor(graph, model, optax.sgd(0.1), devices=1, num_parts=4,
                       device_budget=2**18) as tight:
        assert type(tight).__name__ == "ShardedOutOfCore"
        assert tight.plan is not None and not tight.plan.in_memory
        assert tight.plan.prediction.memory.device <= 2**18


if __name__ == "__main__":
    import json
    if sys.argv[1] == "cases":
        print(json.dumps(_run_cases(sys.argv[2])))
