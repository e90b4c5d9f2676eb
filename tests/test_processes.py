"""Several processes through `jax.distributed` (`jgrind.devices.processes`, `jgrind launch`):
each test starts real local processes (gloo collectives on the CPU), so there are few and they
are small."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Optional

import pytest

from jgrind.devices import processes
from test_devices import FAST_COMPILE

# one process of the group: starts, agrees, then does what its argument says
MEMBER = textwrap.dedent("""
    import os, sys, time
    from jgrind.devices import processes
    coordinator, count, me, then = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    try:
        joined = processes.start(coordinator, count, me, timeout_s=float(sys.argv[5]),
                                 heartbeat_timeout_s=2)
        print(joined, flush=True)
        processes.agree("the same graph")
        print("agreed", flush=True)
        if then == "differ":
            processes.agree(f"settings of {me}" if me == 1 else "settings", "settings")
        elif then == "wait":
            time.sleep(60)
    except processes.ProcessError as err:
        print(f"jgrind: error: {err}", file=sys.stderr, flush=True)
        sys.exit(2)
""")


def _environment(devices: int) -> dict:
    env = dict(os.environ, JAX_NUM_CPU_DEVICES=str(devices), PYTHONUNBUFFERED="1")
    env.pop("XLA_FLAGS", None)
    return env


def _group(tmp_path, then: str, count: int = 2, devices: int = 2, timeout_s: float = 30):
    """``count`` processes of `MEMBER`, started at once."""
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    coordinator = f"127.0.0.1:{processes.free_port()}"
    return [subprocess.Popen([sys.executable, str(script), coordinator, str(count), str(me),
                              then, str(timeout_s)], env=_environment(devices),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for me in range(count)]


def _quick_environment(devices: int, **more) -> dict:
    """`_environment` with XLA's cheapest optimisation level (tests/conftest.py's flags): the
    runs compared are all compiled so, and most of a small run's time is compiling."""
    return dict(_environment(devices), XLA_FLAGS=FAST_COMPILE, **more)


def _errors(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("jgrind: error:")]


def test_processes_start_agree_and_refuse_other_settings(tmp_path):
    group = _group(tmp_path, "differ")
    results = [p.communicate(timeout=120) for p in group]
    for me, (p, (out, err)) in enumerate(zip(group, results)):
        assert f"process {me} of 2 (coordinator 127.0.0.1:" in out and "2 of 4 devices" in out
        assert "agreed" in out  # the same fingerprint passes
        assert p.returncode == 2, err
        # and another one is refused, in every process, naming the one that differs
        assert _errors(err) == [_errors(err)[0]]
        assert "process 1 (" in _errors(err)[0] and "other settings than process 0" in err


def test_an_unreachable_coordinator_is_one_line_within_the_timeout(tmp_path):
    script = tmp_path / "member.py"
    script.write_text(MEMBER)
    nobody = f"127.0.0.1:{processes.free_port()}"  # free: nothing listens there
    started = time.monotonic()
    member = subprocess.run([sys.executable, str(script), nobody, "2", "1", "none", "2"],
                            env=_environment(1), capture_output=True, text=True, timeout=60)
    assert member.returncode == 2
    (line,) = _errors(member.stderr)
    assert f"cannot reach the coordinator at {nobody} within 2 s" in line
    assert time.monotonic() - started < 2 + 20  # the timeout, and starting Python and JAX


def test_a_killed_process_stops_the_others_within_the_heartbeat_timeout(tmp_path):
    group = _group(tmp_path, "wait", count=2, devices=1)
    victim, survivor = group[1], group[0]
    try:
        for p in group:  # both joined and agreed (gloo writes lines of its own to stdout)
            assert any(line.strip() == "agreed" for line in iter(p.stdout.readline, ""))
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = survivor.communicate(timeout=60)
        stopped_after = time.monotonic() - killed
    finally:
        for p in group:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert survivor.returncode == processes.EXIT_FAILED
    (line,) = _errors(err)
    assert "process 1 of 2 has shown no sign of life for 2 s" in line
    # the heartbeat timeout (2 s) and a beat; JAX's own would take 30 s more
    assert stopped_after < 2 + 4, stopped_after


def test_launch_stops_the_others_when_one_fails(tmp_path, capfd):
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent("""
        import sys, time
        me = int(sys.argv[sys.argv.index("--process-id") + 1])
        print("started", flush=True)
        if me == 1:
            time.sleep(3)  # the others have started (and said so) by then, even on a busy CPU
            print("jgrind: error: no such file", file=sys.stderr)
            sys.exit(2)
        time.sleep(60)
    """))
    started = time.monotonic()
    status = processes.launch(["train"], 3, program=[sys.executable, str(child)])
    assert status == 2 and time.monotonic() - started < 20
    out, err = capfd.readouterr()
    assert "[0] started" in out and "[2] started" in out
    assert err.strip().splitlines()[-1] == ("jgrind: error: process 1 of 3 failed (exit "
                                            "status 2: no such file); stopped the others")


def test_jgrind_launch_runs_train_in_several_processes(tmp_path):
    """End to end through the command line: the flags filled in, the processes started and
    agreed, and each refusing more devices than the 2 x 1 there are, in one line."""
    proc = subprocess.run([sys.executable, "-m", "jgrind.cli", "launch", "-n", "2", "--",
                           "train", "--dataset", "csbm", "--set", "num_nodes=200",
                           "--devices", "3", "--out", str(tmp_path / "run"), "--no-progress"],
                          capture_output=True, text=True, timeout=120,
                          env=_environment(1))
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("jgrind: error: process ") and " of 2 failed (exit status 2: " \
        "--devices 3: 2 cpu devices exist (1 in each of the 2 processes)" in last, proc.stderr


def test_launch_refuses_flags_it_fills_in():
    with pytest.raises(processes.ProcessError, match="fills in --coordinator"):
        processes.launch(["train", "--coordinator", "h:1"], 2)


def test_the_settings_fingerprint_leaves_out_paths_and_devices_reach_train():
    import dataclasses
    from jgrind.cli import settings_fingerprint
    from jgrind.config import RunConfig, build_policy
    here = RunConfig(dataset="npy:/data/a", profile="/mnt/a/profile.json", devices=4)
    there = dataclasses.replace(here, dataset="npy:/other/b", profile="/scratch/p.json")
    assert settings_fingerprint(here) == settings_fingerprint(there)
    assert settings_fingerprint(here) != settings_fingerprint(
        dataclasses.replace(here, hidden=8))
    assert build_policy(here)["devices"] == 4 and "devices" not in build_policy(RunConfig())


# -- checkpoints, a killed process, fingerprints ----------------------------------------------
def _saved_state(folder: pathlib.Path) -> tuple:
    """``(epoch, state)`` of the newest checkpoint in ``folder``, as NumPy arrays."""
    import orbax.checkpoint as ocp
    manager = ocp.CheckpointManager(folder.absolute())
    try:
        step = manager.latest_step()
        state = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore()))["state"]
    finally:
        manager.close()
    return step, state


def _assert_same_state(a: pathlib.Path, b: pathlib.Path) -> None:
    """The newest checkpoints in ``a`` and ``b``: the same epoch, and every array (parameters,
    optimizer state, best parameters) equal bit for bit."""
    import jax
    import numpy as np
    (epoch_a, state_a), (epoch_b, state_b) = _saved_state(a), _saved_state(b)
    assert epoch_a == epoch_b
    assert jax.tree.structure(state_a) == jax.tree.structure(state_b)
    for x, y in zip(jax.tree.leaves(state_a), jax.tree.leaves(state_b)):
        x, y = np.asarray(x), np.asarray(y)
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def _train(out: pathlib.Path, epochs: int) -> list:
    """``jgrind train`` on a 200-node graph, a checkpoint every epoch: what the tests launch."""
    return ["train", "--dataset", "csbm", "--set", "num_nodes=200", "--set", "hidden=8",
            "--set", "checkpoint_every=1", "--epochs", str(epochs), "--out", str(out),
            "--no-progress"]


def _pid(out: pathlib.Path, index: int) -> Optional[int]:
    """The pid of the process ``index`` of the run writing ``out``, if there is one."""
    for entry in pathlib.Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if str(out).encode() in command and \
                command[-2:] == [b"--process-id", str(index).encode()]:
            return int(entry.name)
    return None


def test_a_process_killed_mid_run_stops_launch_and_a_second_launch_resumes_it(
        tmp_path, capfd, monkeypatch):
    """SIGKILL of process 1 in mid-run: `jgrind launch` stops process 0 and exits with status 2
    and one line naming process 1, within its grace period; `jgrind launch` again on the same
    --out resumes from the last checkpoint (process 0 writes them and sends the state to the
    others) and ends with the parameters and optimizer state of a run that was never stopped,
    bit for bit. (`processes.launch` runs here, as `jgrind launch` would, and the three
    launches share their compiled programs.)"""
    monkeypatch.setenv("XLA_FLAGS", _quick_environment(1)["XLA_FLAGS"])
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "cache"))
    epochs = 10
    assert processes.launch(_train(tmp_path / "straight", epochs), 2) == 0
    capfd.readouterr()

    run = tmp_path / "killed"
    steps = run / "checkpoints" / "seed0"
    killed = []

    def kill_process_1_after_the_checkpoint_of_epoch_2():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(s.name.isdigit() and int(s.name) >= 2
                   for s in (steps.iterdir() if steps.is_dir() else ())):
                victim = _pid(run, 1)
                if victim is not None:
                    os.kill(victim, signal.SIGKILL)
                    killed.append(time.monotonic())
                return
            time.sleep(0.02)
    killer = threading.Thread(target=kill_process_1_after_the_checkpoint_of_epoch_2)
    killer.start()
    try:
        status = processes.launch(_train(run, epochs), 2)
    finally:
        killer.join()
    stopped_after = time.monotonic() - killed[0] if killed else None
    err = capfd.readouterr().err
    assert killed and status == processes.EXIT_FAILED, err
    assert err.strip().splitlines()[-1] == ("jgrind: error: process 1 of 2 failed (killed by "
                                            "SIGKILL); stopped the others")
    assert stopped_after < processes._GRACE_S + 5, stopped_after
    saved = sorted(int(s.name) for s in steps.iterdir() if s.name.isdigit())
    assert saved[-1] < epochs - 1, "the kill came after the run's end"
    before = [json.loads(line) for line in
              (run / "metrics-seed0.jsonl").read_text().splitlines()][: saved[-1] + 1]

    assert processes.launch(_train(run, epochs), 2) == 0, capfd.readouterr().err
    _assert_same_state(tmp_path / "straight" / "checkpoints" / "seed0", steps)
    after = [json.loads(line) for line in (run / "metrics-seed0.jsonl").read_text().splitlines()]
    # the epochs up to the checkpoint are the killed run's own (resumed, not run again)
    assert after[: len(before)] == before and len(after) == epochs


def test_processes_started_with_other_settings_are_refused_before_training(tmp_path):
    """`jgrind train` in two processes whose settings differ (a hidden width): both stop with
    one line naming the process that differs, exit status 2, and no run folder is made."""
    coordinator = f"127.0.0.1:{processes.free_port()}"
    group = [subprocess.Popen(
        [sys.executable, "-m", "jgrind.cli", "train", "--dataset", "csbm", "--set",
         "num_nodes=200", "--set", f"hidden={8 if me == 0 else 16}", "--out",
         str(tmp_path / "run"), "--no-progress", "--coordinator", coordinator,
         "--num-processes", "2", "--process-id", str(me)], env=_quick_environment(1),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for me in range(2)]
    for p in group:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2, err
        (line,) = _errors(err)
        assert line.startswith("jgrind: error: process 1 (") \
            and "holds other settings than process 0" in line, line
    assert not (tmp_path / "run").exists()


def test_processes_given_other_graphs_are_refused_before_training(tmp_path):
    """Two processes with the same flags, `--dataset npy:FOLDER`, each finding another graph
    in its FOLDER (as on two machines): the graphs' fingerprints differ, and both stop with one
    line naming the process that differs, exit status 2, before training."""
    from jgrind import generators
    from jgrind.datasets import save_graph
    coordinator = f"127.0.0.1:{processes.free_port()}"
    group = []
    for me in range(2):
        folder = save_graph(generators.csbm(num_nodes=100, num_features=4, seed=me),
                            tmp_path / f"graph{me}")
        group.append(subprocess.Popen(
            [sys.executable, "-m", "jgrind.cli", "train", "--dataset", f"npy:{folder}",
             "--out", str(tmp_path / f"run{me}"), "--no-progress", "--coordinator",
             coordinator, "--num-processes", "2", "--process-id", str(me)],
            env=_quick_environment(1), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    for p in group:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 2, err
        (line,) = _errors(err)
        assert line.startswith("jgrind: error: process 1 (") \
            and "holds other graph data than process 0" in line, line
    assert not (tmp_path / "run0").exists()
