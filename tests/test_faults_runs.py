"""Faults around a run's lasting state: damaged checkpoints, two runs on one output folder,
repeated signals during cleanup and during a checkpoint save, a full disk under --out, and the
store folders of killed runs. Each ends in one warning or one ``jgrind: error:`` line, with no
traceback and nothing half-written left behind."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import optax
import pytest

from jgrind import checkpoint as ckpt, interrupts, models
from jgrind.hostio import disk_space
from jgrind.cli import main
from jgrind.train import train

from helpers import community_graph, fails

SMALL = ["--dataset", "csbm", "--set", "num_nodes=300", "--epochs", "2", "--no-progress", "--no-compile-cache"]
REPO = pathlib.Path(__file__).resolve().parents[1]


def _jgrind(args, preexec_fn=None, **kwargs):
    """``jgrind ARGS`` in a child process (the real command line: signal handlers installed)."""
    return subprocess.Popen([sys.executable, "-m", "jgrind.cli", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=preexec_fn, **kwargs)


# -- item 2: a damaged checkpoint ------------------------------------------------------------------
def _run(ckpt_dir, epochs):
    # weights large enough (64 x 256) that orbax writes them apart from its checksummed index
    g = community_graph(num_nodes=300, num_features=64)
    model = models.gcn(g.num_features, 256, g.num_classes, dropout=0.3)
    return train(jax.random.key(3), g, model, optax.adam(0.01), epochs=epochs, progress=False,
                 checkpoint_dir=ckpt_dir, checkpoint_every=1)


def _largest_array_file(step: pathlib.Path) -> pathlib.Path:
    """The largest data file of the step's arrays: compressed array chunks, which no checksum
    of TensorStore's covers (a flipped bit there reads back as other numbers)."""
    return max((p for p in (step / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


def _flip(path: pathlib.Path, bits: int) -> None:
    data = bytearray(path.read_bytes())
    rng = np.random.default_rng(bits)
    for i in rng.choice(len(data) * 8, bits, replace=False):
        data[i // 8] ^= 1 << (i % 8)
    path.write_bytes(bytes(data))


def _truncate(path: pathlib.Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Checkpoints of epochs 2 and 3 (a run of 4 epochs), and the parameters of a run that
    resumed from epoch 2 to epoch 6: what resuming past a damaged epoch 3 must give."""
    root = tmp_path_factory.mktemp("saved")
    _run(root / "ck", 4)
    older = root / "older"
    shutil.copytree(root / "ck", older)
    shutil.rmtree(older / "3")
    return root / "ck", _run(older, 6)


@pytest.mark.parametrize("damage", [lambda p: _flip(p, 1), lambda p: _flip(p, 10), _truncate],
                         ids=["1 bit", "10 bits", "truncated"])
def test_a_damaged_checkpoint_is_set_aside_and_the_older_one_resumed(saved, tmp_path, damage):
    original, reference = saved
    ck = tmp_path / "ck"
    shutil.copytree(original, ck)
    damage(_largest_array_file(ck / "3"))
    with pytest.warns(UserWarning, match=r"the checkpoint .*/3 is damaged .* resuming from "
                                         r"epoch 2") as caught:
        resumed = _run(ck, 6)
    assert len(caught) == 1
    assert resumed.first_epoch == 3 and (ck / "3.damaged").is_dir()
    for a, b in zip(jax.tree.leaves(reference.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # bit-exact
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in reference.history]


def test_a_damaged_meta_is_caught_too(saved, tmp_path):
    original, _ = saved
    ck = tmp_path / "ck"
    shutil.copytree(original, ck)
    meta = ck / "3" / "meta" / "metadata"
    meta.write_text(meta.read_text().replace('"epoch": 1,', '"epoch": 7,', 1))  # still JSON
    with pytest.warns(UserWarning, match="3 is damaged .its meta differs"):
        assert _run(ck, 6).first_epoch == 3


def test_every_checkpoint_damaged_is_one_clear_error(saved, tmp_path, capsys):
    original, _ = saved
    ck = tmp_path / "ck"
    shutil.copytree(original, ck)
    for step in ("2", "3"):
        _flip(_largest_array_file(ck / step), 10)
    with pytest.raises(ckpt.CheckpointError, match=r"every checkpoint in .* is damaged "
                                                   r"\(epoch 3: .*; epoch 2: .*\); remove"):
        _run(ck, 6)
    assert sorted(p.name for p in ck.iterdir()) == ["2", "3"]  # nothing moved


def test_damaged_saved_parameters_are_an_error_for_predict(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *SMALL, "--out", str(out)]) == 0
    capsys.readouterr()
    _flip(_largest_array_file(out / "params" / "seed0" / "1"), 1)
    fails(capsys, ["predict", "--run", str(out), "--save", str(tmp_path / "p.npy")],
          "params/seed0 (epoch 1) are damaged", "train the run again")
    assert not (tmp_path / "p.npy").exists()


# -- item 5: two runs on one output folder ---------------------------------------------------------
def test_a_second_run_on_a_held_output_folder_is_refused_and_changes_nothing(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *SMALL, "--out", str(out)]) == 0
    capsys.readouterr()
    files = lambda: {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}  # noqa: E731
    before = files()
    # the first run, still training: it holds the folder (written as `jgrind train` writes it)
    holder = subprocess.Popen([sys.executable, "-c", f"""
import os, sys, time
from jgrind import experiment
with experiment.hold_output_folder(experiment.pathlib.Path({str(out)!r})):
    print("holding", flush=True)
    time.sleep(60)
"""], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        owner = json.loads((out / ".jgrind-owner.json").read_text())
        fails(capsys, ["train", *SMALL, "--set", "checkpoint_every=1", "--out", str(out)],
              f"the output folder {out} is in use by another jgrind run", "wait for it or "
              "choose another --out")
        assert files() == before
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    assert owner["pid"] == os.getpid()  # the record of the run that wrote the folder


def test_the_refusal_names_the_run_that_holds_the_folder(tmp_path, capsys):
    from jgrind import experiment
    out = tmp_path / "run"
    with experiment.hold_output_folder(out):
        experiment.start_out(out, experiment.RunConfig())
        child = subprocess.run([sys.executable, "-m", "jgrind.cli", "train", *SMALL, "--out",
                                str(out)], cwd=REPO, capture_output=True, text=True)
    assert child.returncode == 2, child.stderr
    err = child.stderr.strip()
    assert err.startswith("jgrind: error: ") and "\n" not in err, err
    assert f"in use by another jgrind run (pid {os.getpid()}, started " in err
    # released with the run: the folder takes the next one
    assert main(["train", *SMALL, "--out", str(out)]) == 0


# -- item 6: a second signal during cleanup; folders of killed runs --------------------------------
@pytest.mark.parametrize("second, gap_ms", [(signal.SIGINT, 2), (signal.SIGTERM, 8),
                                            (signal.SIGINT, 20)],
                         ids=["SIGINT 2 ms later", "SIGTERM 8 ms later", "SIGINT 20 ms later"])
def test_a_second_signal_does_not_cut_the_cleanup_short(tmp_path, second, gap_ms):
    store = tmp_path / "store"
    store.mkdir()
    run = _jgrind(["train", "--dataset", "csbm", "--set", "num_nodes=300", "--epochs", "100000", "--no-progress",
                   "--no-compile-cache", "--policy", "ssd", "--host-budget", "1MiB", "--store",
                   str(store), "--out", str(tmp_path / "run")])
    deadline = time.monotonic() + 60
    while not list(store.glob("jgrind-run-*/*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # in the epochs
    run.send_signal(signal.SIGINT)
    time.sleep(gap_ms / 1000)
    run.send_signal(second)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    assert err.strip().splitlines()[-1] == "jgrind: interrupted", err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert list(store.iterdir()) == []


def test_folders_of_killed_runs_of_this_machine_are_removed(tmp_path):
    from jgrind.engine.store import make_run_dir
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def left_by(machine, name):
        folder = tmp_path / f"jgrind-run-{dead.pid}-{name}"
        folder.mkdir()
        (folder / "activation-1.bin").write_bytes(b"\0" * 4096)
        (folder / disk_space.RESERVATION).write_text(json.dumps(
            {"bytes": 4096, "pid": dead.pid, "started": 1, "machine": machine}))
        return folder

    ours = left_by(disk_space.machine_id(), "0123456789ab")
    theirs = left_by("another-boot pid:[1]", "ba9876543210")  # another machine's, same pid
    with pytest.warns(UserWarning) as caught:
        run_dir = make_run_dir(tmp_path, 0, b"x" * 16)
    said = [str(w.message) for w in caught]
    assert not ours.exists() and theirs.exists() and run_dir.exists()
    assert any(f"removed 1 folder(s) of earlier runs of this machine whose process is gone "
               f"({ours.name}" in s for s in said), said
    assert any(f"whose process is gone hold 0.00 GiB there ({theirs.name})" in s
               for s in said), said
    disk_space.release(run_dir)
    assert json.loads((run_dir / disk_space.RESERVATION).read_text())["machine"] \
        == disk_space.machine_id()


# -- item 7: a signal during a checkpoint save -----------------------------------------------------
@pytest.fixture
def signal_handlers(monkeypatch):
    """jgrind's SIGINT / SIGTERM handlers, as the command line installs them, for one test."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(interrupts, "_requested", None)
    monkeypatch.setattr(interrupts, "_raised", False)
    interrupts.install()
    yield
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])


def test_a_signal_during_a_save_waits_for_the_step_to_be_written(tmp_path, monkeypatch, capfd,
                                                                 signal_handlers):
    import orbax.checkpoint as ocp
    original = ocp.CheckpointManager.save

    def save_with_ctrl_c(self, step, *args, **kwargs):
        if step == 1:
            os.kill(os.getpid(), signal.SIGINT)  # lands inside orbax's save
        return original(self, step, *args, **kwargs)
    monkeypatch.setattr(ocp.CheckpointManager, "save", save_with_ctrl_c)
    ck = tmp_path / "ck"
    with pytest.raises(KeyboardInterrupt):
        _run(ck, 4)
    assert sorted(p.name for p in ck.iterdir()) == ["0", "1"]  # whole; no *.orbax-checkpoint-tmp
    assert "Traceback" not in capfd.readouterr().err
    monkeypatch.setattr(interrupts, "_requested", None)
    monkeypatch.setattr(interrupts, "_raised", False)
    monkeypatch.setattr(ocp.CheckpointManager, "save", original)
    (ck / "7.orbax-checkpoint-tmp" / "state").mkdir(parents=True)  # as SIGKILL would leave it
    assert _run(ck, 4).first_epoch == 2  # and it resumes
    assert sorted(p.name for p in ck.iterdir()) == ["2", "3"]  # the half-written step removed


# -- item 8: a full disk under --out ---------------------------------------------------------------
def _with_file_size_limit(limit, args):
    """``jgrind ARGS`` in a child whose writes past ``limit`` bytes fail (EFBIG), as on a full
    disk (ENOSPC), with no root or small file system needed (Python ignores SIGXFSZ, so the
    write fails rather than the process being killed)."""
    launch = ("import os, resource, sys; "
              f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit})); "
              "os.execv(sys.executable, [sys.executable, '-m', 'jgrind.cli', *sys.argv[1:]])")
    return subprocess.run([sys.executable, "-c", launch, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("limit", [12_000, 60_000], ids=["checkpoint", "plot"])
def test_a_full_disk_under_out_is_one_line_and_leaves_nothing_partial(tmp_path, limit):
    out = tmp_path / "run"
    run = _with_file_size_limit(limit, ["train", *SMALL, "--set", "checkpoint_every=1",
                                        "--out", str(out)])
    assert run.returncode == 2, run.stderr
    err = run.stderr.strip()
    assert err.startswith("jgrind: error:") and "\n" not in err, err
    assert "is full (file too large)" in err
    partial = [p for p in out.rglob("*") if "tmp" in p.name or "partial" in p.name]
    assert partial == []


def test_a_failed_saves_late_writes_do_not_leave_its_folder_behind(tmp_path):
    """A failed save's writes still running on TensorStore's threads recreate the step's
    temporary folder after the first removal (the full-disk test above left it so, now and
    then): the removal after a failure keeps at it until the folder stays gone."""
    import threading
    partial = tmp_path / "0.orbax-checkpoint-tmp" / "state"
    partial.mkdir(parents=True)

    def late_write():
        while partial.parent.exists():  # the first removal
            time.sleep(0.005)
        time.sleep(0.1)
        try:
            partial.mkdir(parents=True)  # as a write still in flight makes its folder again
            (partial / "chunk").write_bytes(b"x")
        except FileNotFoundError:  # a removal came between the two, as it may for a real
            pass                   # write (on a loaded machine, in the suite)
    writer = threading.Thread(target=late_write)
    writer.start()
    ckpt.remove_partial(tmp_path, settle_s=0.5)
    writer.join()
    assert list(tmp_path.iterdir()) == []


# -- item 13: what a resumed, a multi-seed and a predict run say -----------------------------------
def test_resuming_finished_seeds_says_so_for_every_seed(tmp_path, capsys):
    args = ["train", *SMALL, "--epochs", "1", "--seeds", "2", "--policy", "host", "--set",
            "checkpoint_every=1", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    first = [line for line in capsys.readouterr().out.splitlines() if line.startswith("store")]
    assert [line.split(":")[0] for line in first] == ["store, seed 0", "store, seed 1"]
    assert main(args) == 0  # every seed's checkpoint is of its last epoch
    again = [line for line in capsys.readouterr().out.splitlines() if line.startswith("store")]
    assert len(again) == 2
    assert all("0 epochs (the resumed run had already finished)" in line for line in again)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_predict_into_a_folder_it_cannot_write_names_save(tmp_path, capsys):
    err = fails(capsys, ["predict", "--run", str(tmp_path), "--save", "/proc/jgrind/p.npy"],
                "cannot write the output folder /proc/jgrind", "(--save)")
    assert "--out" not in err
