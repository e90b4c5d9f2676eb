"""One model on several devices (`jgrind.devices.Sharded`) against the in-memory computation.

The test processes have one CPU device, so the checks on several run in subprocesses: one with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` that checks every configuration, the
relational models of tests/test_hetero_engine.py on 2 of its devices and a resumed run on 2,
and prints JSON (one start, not one per check), and a pair of processes of 2 devices each
joined by `jax.distributed` into one 4-device mesh. Tolerances are `test_engine`'s: the loss
within 1e-5 relative, every gradient within ``1e-4 * max|g| + 1e-7``, parameters after 20
epochs within ``rtol=1e-3, atol=1e-5``.
"""

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

HERE = pathlib.Path(__file__).resolve().parent
RTOL = 1e-4

# (model, devices, partitions): every model on 1, 2 and 4 devices; partition counts the device
# count does not divide (3 on 2, 6 on 4), and 4 devices for 3 partitions (one gets none).
# Predictions (another compilation each) are compared where the last field is True.
CASES = [("gcn", 1, 2, False), ("gcn", 2, 3, False), ("gcn", 4, 3, True),
         ("sage-res-ln", 1, 1, False), ("sage-res-ln", 2, 2, False),
         ("sage-res-ln", 4, 6, False),
         ("gat-res-ln", 1, 1, False), ("gat-res-ln", 2, 3, False), ("gat-res-ln", 4, 4, True)]


def _models(f, c):
    from jgrind import models
    return {
        "gcn": models.gcn(f, 16, c, num_layers=2, dropout=0.5),
        "sage-res-ln": models.sage(f, 16, c, num_layers=2, dropout=0.5, residual=True,
                                   layer_norm=True),
        "gat-res-ln": models.gat(f, 4, c, heads=2, num_layers=2, dropout=0.5, residual=True,
                                 layer_norm=True),
    }


def _gradient_error(grads, reference) -> float:
    """The largest error over the tensors, as a share of their bound (<= 1 passes)."""
    import jax
    worst = 0.0
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(reference)):
        g, r = np.asarray(g), np.asarray(r)
        worst = max(worst, float(np.abs(g - r).max()) / (RTOL * float(np.abs(r).max()) + 1e-7))
    return worst


# -- the subprocesses ---------------------------------------------------------------------------
def _run_cases(checkpoint_dir: str) -> dict:
    """Every case of `CASES`, 20 epochs of `train`, the relational models on 2 devices and a
    resumed run on 2 (its checkpoints in ``checkpoint_dir``), as JSON-able results."""
    import jax
    import optax

    from helpers import csbm_graph, reference
    from jgrind import models
    from jgrind.devices import Sharded
    from jgrind.train import train

    graph = csbm_graph()
    built = _models(graph.num_features, graph.num_classes)
    key = jax.random.key(42)  # dropout on
    out = {"devices": len(jax.devices()), "cases": []}
    for name, k, parts, predicts in CASES:
        model = built[name]
        params = model.init(jax.random.key(0))
        ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
        ex = Sharded(graph, model, optax.sgd(0.1), devices=k, num_parts=parts)
        loss, grads = ex.loss_and_grad(params, key)
        logits_error = float(np.abs(ex.predict(params)
                                    - reference(graph, model).predict(params)).max()) \
            if predicts else 0.0
        out["cases"].append({
            "model": name, "devices": k, "parts": parts, "loss": float(loss),
            "reference": float(ref_loss), "gradient_error": _gradient_error(grads, ref_grads),
            "logits_error": logits_error,
            "idle_devices": int(sum(not ex.placement.partitions_of(d) for d in range(k))),
            "bytes": ex.exchange_bytes_per_epoch,
            "minimum": ex.exchange_minimum_per_epoch})
    model = models.gcn(graph.num_features, 16, graph.num_classes, num_layers=2, dropout=0.5,
                       residual=True, layer_norm=True)
    opt = optax.adam(0.01)
    ref = train(jax.random.key(3), graph, model, opt, epochs=20, progress=False, eval_every=5)
    run = train(jax.random.key(3), graph, model, opt, epochs=20, progress=False, eval_every=5,
                devices=4, num_parts=5)
    out["train"] = {
        "params_close": all(np.allclose(np.asarray(a), np.asarray(b), rtol=1e-3, atol=1e-5)
                            for a, b in zip(jax.tree.leaves(run.params),
                                            jax.tree.leaves(ref.params))),
        "best_epoch": [run.best_epoch, ref.best_epoch], "test": [run.test, ref.test]}
    out["relational"] = _relational_on_two_devices()
    out["resumed"] = _resumed_on_two_devices(checkpoint_dir)
    return out


def _relational_on_two_devices() -> list:
    """R-GCN and RGAT (tests/test_hetero_engine.py's models and generated graph) on 2 devices:
    loss, in-memory loss and the largest gradient error relative to its tensor's largest
    entry."""
    import jax
    import optax

    from helpers import reference
    from jgrind import models
    from jgrind.train import make_executor
    from test_rgcn import hetero_graph

    graph = hetero_graph()
    f, c, r = graph.num_features, graph.num_classes, graph.num_relations
    results = []
    for name, model in [("rgcn", models.rgcn(f, 16, c, r, num_layers=2, dropout=0.5)),
                        ("rgat", models.rgat(f, 4, c, r, heads=2, num_layers=2, dropout=0.5))]:
        params = model.init(jax.random.key(0))
        key = jax.random.key(42)
        ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
        loss, grads = make_executor(graph, model, optax.sgd(0.1), devices=2).loss_and_grad(
            params, key)
        error = max(float(np.abs(np.asarray(g) - np.asarray(r)).max()
                          / (np.abs(np.asarray(r)).max() + 1e-12))
                    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)))
        results.append({"model": name, "loss": float(loss), "reference": float(ref_loss),
                        "error": error})
    return results


def _resumed_on_two_devices(checkpoint_dir: str) -> dict:
    """6 epochs on 2 devices, and 3 then resumed to 6 from checkpoints: the resumed run's
    first epoch and its parameters' largest difference from the uninterrupted run's."""
    import jax
    import optax

    from helpers import community_graph
    from jgrind import models
    from jgrind.train import train

    graph = community_graph(num_nodes=200)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=2, dropout=0.5)

    def run(epochs, **kw):
        return train(jax.random.key(0), graph, model, optax.adam(0.01), epochs=epochs,
                     devices=2, progress=False, **kw)
    whole = run(6)
    run(3, checkpoint_dir=checkpoint_dir, checkpoint_every=1)
    resumed = run(6, checkpoint_dir=checkpoint_dir, checkpoint_every=1)
    return {"first_epoch": resumed.first_epoch,
            "difference": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
                              for a, b in zip(jax.tree.leaves(whole.params),
                                              jax.tree.leaves(resumed.params)))}


def _run_process(coordinator: str, process_id: int) -> dict:
    """One of two processes of 2 CPU devices each: the sharded loss on the 4-device mesh."""
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=2,
                               process_id=process_id, initialization_timeout=60)
    import optax

    from helpers import csbm_graph, reference
    from jgrind.devices import Sharded
    graph = csbm_graph()
    model = _models(graph.num_features, graph.num_classes)["gcn"]
    params = model.init(jax.random.key(0))
    key = jax.random.key(42)
    ex = Sharded(graph, model, optax.sgd(0.1), devices=4, num_parts=4)
    loss, grads = ex.loss_and_grad(params, key)
    logits = ex.predict(params)
    result = {"process": jax.process_index(), "global_devices": len(jax.devices()),
              "local_devices": len(jax.local_devices()), "loss": float(loss)}
    if jax.process_index() == 0:  # the other's results are the same replicated values
        ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, key)
        result.update(reference=float(ref_loss),
                      gradient_error=_gradient_error(jax.tree.map(np.asarray, grads),
                                                     ref_grads),
                      logits_error=float(np.abs(logits - reference(graph, model)
                                                .predict(params)).max()))
    jax.distributed.shutdown()
    return result


# XLA's CPU backend optimising less: half the compile time, which is most of these processes'
# time; and its older fusion emitter, which compiles these small programs in about 40% less
# CPU time again (85 programs in `four_devices`, most of them compiled once). Each
# comparison's two sides compile under the same flags.
FAST_COMPILE = ("--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
                "--xla_cpu_use_fusion_emitters=false")


def _environment(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {FAST_COMPILE} " \
                       f"--xla_force_host_platform_device_count={devices}".strip()
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    # The forced device count applies to the CPU platform only: on a machine with one GPU the
    # subprocesses would otherwise see that GPU alone and refuse 2 or 4 devices
    env["JAX_PLATFORMS"] = "cpu"
    return env


def _last_json(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def _run_processes(argv_of, env: dict, count: int = 2, timeout: float = 240) -> list:
    """Start ``count`` processes, ``argv_of(coordinator, i)`` each, joined at a free local
    port; the last JSON line each printed, in process order (each must exit 0 within
    ``timeout`` seconds; a group that fails is killed, not left running)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(argv_of(f"127.0.0.1:{port}", i), env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(count)]
    results = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            assert p.returncode == 0, stderr[-4000:]
            results.append(_last_json(stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return results


# -- the tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def four_devices(tmp_path_factory):
    checkpoints = tmp_path_factory.mktemp("devices") / "ckpt"
    done = subprocess.run([sys.executable, __file__, "cases", str(checkpoints)],
                          env=_environment(4), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return _last_json(done.stdout)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{m}-{k}dev-{p}parts"
                                                         for m, k, p, _ in CASES])
def test_loss_and_gradients_equal_in_memory(four_devices, case):
    assert four_devices["devices"] == 4
    got = four_devices["cases"][case]
    assert got["loss"] == pytest.approx(got["reference"], rel=1e-5)
    assert got["gradient_error"] <= 1.0
    assert got["logits_error"] < 1e-4


def test_a_device_with_no_partition(four_devices):
    idle = [c for c in four_devices["cases"] if c["idle_devices"]]
    assert idle and all(c["gradient_error"] <= 1.0 for c in idle)


def test_exchange_bytes_at_least_the_minimum(four_devices):
    for c in four_devices["cases"]:
        assert c["bytes"] >= c["minimum"]
        assert (c["bytes"] == 0) == (c["devices"] == 1)


def test_parameters_equal_after_20_epochs(four_devices):
    got = four_devices["train"]
    assert got["params_close"]
    assert got["best_epoch"][0] == got["best_epoch"][1]
    assert got["test"][0] == pytest.approx(got["test"][1])


def test_two_processes_of_two_devices():
    results = _run_processes(
        lambda coordinator, i: [sys.executable, __file__, "process", coordinator, str(i)],
        _environment(2))
    assert [r["process"] for r in results] == [0, 1]
    assert all(r["global_devices"] == 4 and r["local_devices"] == 2 for r in results)
    first = results[0]
    assert results[1]["loss"] == first["loss"]
    assert first["loss"] == pytest.approx(first["reference"], rel=1e-5)
    assert first["gradient_error"] <= 1.0
    assert first["logits_error"] < 1e-4


def test_more_devices_than_exist():
    import jax

    from jgrind.devices import resolve_devices
    have = len(jax.devices())
    hint = (rf".*xla_force_host_platform_device_count={have + 1}"
            if jax.devices()[0].platform == "cpu" else "$")
    with pytest.raises(ValueError, match=rf"{have + 1} devices asked for, but {have} "
                                         rf"{jax.devices()[0].platform} .*{hint}"):
        resolve_devices(have + 1)
    with pytest.raises(ValueError, match="1 or more"):
        resolve_devices(0)
    with pytest.raises(TypeError, match="jax.Device"):
        resolve_devices(["cpu"])
    assert resolve_devices(jax.devices()[:1]) == jax.devices()[:1]


def test_out_of_core_arguments_choose_the_executor_with_devices(tmp_path):
    """With devices, a policy and a store give the partitioned engine on those devices
    (`ShardedOutOfCore`, tests/test_devices_out_of_core.py checks its numbers), a device
    budget the programs fit in gives `Sharded`, and the naive policy is refused."""
    import optax

    from helpers import community_graph
    from jgrind import models
    from jgrind.devices import Sharded, ShardedOutOfCore
    from jgrind.plan import policies
    from jgrind.train import make_executor
    graph = community_graph(num_nodes=60)
    model = models.gcn(graph.num_features, 8, graph.num_classes)
    executor = make_executor(graph, model, optax.adam(0.01), devices=1,
                             policy=policies.host_offload(), store=tmp_path)
    assert isinstance(executor, ShardedOutOfCore)
    executor.close()
    assert list(tmp_path.iterdir()) == []
    assert isinstance(make_executor(graph, model, optax.adam(0.01), devices=1,
                                    device_budget=2**30), Sharded)
    with pytest.raises(ValueError, match="naive policy"):
        make_executor(graph, model, optax.adam(0.01), devices=1,
                      policy=policies.naive(tmp_path))


def test_one_device_in_this_process():
    import jax
    import optax

    from helpers import community_graph, reference
    from jgrind import models
    from jgrind.train import make_executor
    graph = community_graph(num_nodes=120)
    model = models.gcn(graph.num_features, 8, graph.num_classes, num_layers=2)
    ex = make_executor(graph, model, optax.sgd(0.1), devices=1, num_parts=3)
    assert type(ex).__name__ == "Sharded" and ex.exchange_bytes_per_epoch == 0
    params = model.init(jax.random.key(0))
    loss, grads = ex.loss_and_grad(params, jax.random.key(1))
    ref_loss, ref_grads = reference(graph, model).loss_and_grad(params, jax.random.key(1))
    assert float(loss) == pytest.approx(float(ref_loss), rel=1e-5)
    assert _gradient_error(grads, ref_grads) <= 1.0


def test_relational_models_on_two_devices_are_exact(four_devices):
    got = four_devices["relational"]
    assert [r["model"] for r in got] == ["rgcn", "rgat"]
    for r in got:
        assert r["loss"] == pytest.approx(r["reference"], rel=1e-5)
        assert r["error"] <= 1e-4, r


def test_a_run_on_two_devices_resumed_from_its_checkpoint_ends_as_an_uninterrupted_one(
        four_devices):
    got = four_devices["resumed"]
    assert got["first_epoch"] == 3 and got["difference"] == 0.0

# -- the command line -------------------------------------------------------------------------
def test_two_processes_train_through_the_command_line_then_predict_on_one(tmp_path):
    """`jgrind launch -n 2 -- train`: two processes of one device each train one model; the
    run's in-memory check trains it again in one process and prints the same loss; the saved
    parameters (process 0's, replicated over both devices when trained) are read back and
    predicted with on this single device, scoring what the run scored."""
    import json as json_

    from jgrind.experiment import predict_run
    env = _environment(1)
    env.pop("XLA_FLAGS", None)  # the launcher gives each process its own devices
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "jgrind.cli", "launch", "-n", "2", "--",
                           "train", "--dataset", "csbm", "--set", "num_nodes=300",
                           "--epochs", "3", "--set", "check_in_memory=true", "--out", str(run),
                           "--no-progress"], env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("[0] ")]
    assert any("device 1: partitions" in line for line in lines), done.stdout
    assert any(line.startswith("[0] halo exchange per epoch: ") for line in lines)
    check = next(line for line in lines if "in-memory check" in line)
    assert "on 2 devices" in check and ": equal to 6 digits" in check, check
    summary = json_.loads((run / "summary.json").read_text())
    assert summary["in_memory_check"]["equal"]
    _, info = predict_run(run)
    assert info["test"] == pytest.approx(summary["test"][0])


def test_plan_places_partitions_on_devices(capsys, tmp_path):
    """`jgrind plan --devices K` places partitions on more devices than this machine has (it
    runs nothing) and prints the exchange beside its minimum."""
    from jgrind.cli import main
    from jgrind.plan import profile
    from jgrind.plan.sharded import links_for
    from test_planner import fixed_profile
    # a fixed profile "of" the store folder: measuring one would cost most of a minute
    fixed = fixed_profile(directory=str(tmp_path.resolve()))
    path = profile.save(fixed, tmp_path / "profile.json")
    assert main(["plan", "--dataset", "csbm", "--set", "num_nodes=600", "--devices", "3",
                 "--parts", "5", "--profile", str(path), "--store", str(tmp_path),
                 "--out", str(tmp_path / "plan")]) == 0
    out = capsys.readouterr().out
    assert "measuring" not in out
    placed = sorted(int(p) for line in out.splitlines() if line.startswith("device ")
                    for p in line.split("partitions ")[1].split(";")[0].split(", "))
    assert placed == [0, 1, 2, 3, 4]
    assert "device 2: partitions" in out and "halo exchange per epoch: " in out
    # the links priced depend on the platform (CPU devices share memory; GPUs have two routes)
    for link in links_for(fixed):
        assert f"3 devices, {link.name}" in out
    assert "ms per epoch" in out
    assert "exchange per layer: layer 0 device to device" in out


def test_devices_with_an_out_of_core_policy_build_the_sharded_engines_arguments():
    from jgrind.config import RunConfig, build_policy
    assert build_policy(RunConfig(devices=2, policy="auto"))["devices"] == 2
    assert build_policy(RunConfig(devices=2, policy="grinnder"))["devices"] == 2
    assert build_policy(RunConfig(devices=2, policy="host", host_budget="1GiB"))["devices"] == 2
    assert build_policy(RunConfig(devices=2, parts=4))["num_parts"] == 4


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    if sys.argv[1] == "cases":
        print(json.dumps(_run_cases(sys.argv[2])))
    else:
        print(json.dumps(_run_process(sys.argv[2], int(sys.argv[3]))))
