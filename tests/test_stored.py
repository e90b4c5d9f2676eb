"""Graphs saved as .npy folders (`jgrind.datasets.stored`): round trips, memory maps, exact
out-of-core training from a mapped graph, and every way a save or a load can go wrong."""

import json
import os
import pathlib

import jax
import numpy as np
import optax
import pytest

import jgrind
import jgrind.datasets as D
from jgrind.cli import main
from jgrind.datasets import stored
from jgrind.datasets.stored import is_memory_mapped
from jgrind.graph import GraphError
from jgrind.plan import policies

from helpers import community_graph

FIELDS = ("indptr", "indices", "features", "labels", "train_mask", "val_mask", "test_mask")


def assert_same(a, b):
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and x.shape == y.shape, f
        np.testing.assert_array_equal(x, y, err_msg=f)
    assert a.num_classes == b.num_classes and a.name == b.name


def test_cora_round_trip_is_memory_mapped(data_file, tmp_path):
    data_file("planetoid/ind.cora.x")
    cora = D.load("cora")
    folder = D.save_graph(cora, tmp_path / "cora")
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [f"{f}.npy" for f in FIELDS] + ["graph.json"])
    mapped = D.load(f"npy:{folder}")
    assert_same(cora, mapped)
    assert all(is_memory_mapped(getattr(mapped, f)) for f in FIELDS)
    assert not mapped.features.flags.writeable
    read = D.load_saved(folder, mmap=False, name="copy")
    assert not is_memory_mapped(read.features) and read.name == "copy"
    np.testing.assert_array_equal(read.features, cora.features)
    # standard .npy files: NumPy reads them without jgrind
    np.testing.assert_array_equal(np.load(folder / "labels.npy"), cora.labels)


def test_round_trip_keeps_weights_splits_and_wide_dtypes(tmp_path):
    g = community_graph(num_nodes=300, splits=3, name="toy-3")
    rng = np.random.default_rng(0)
    g = g.replace(edge_weight=rng.random(g.num_edges).astype(np.float32))
    back = D.load_saved(D.save_graph(g, tmp_path / "g"))
    assert_same(g, back)
    np.testing.assert_array_equal(back.edge_weight, g.edge_weight)
    assert back.num_splits == 3 and is_memory_mapped(back.edge_weight)
    assert not is_memory_mapped(g.features)


def test_out_of_core_training_from_a_mapped_graph_is_exact(tmp_path):
    g = community_graph(num_nodes=500, num_features=16)
    mapped = D.load_saved(D.save_graph(g, tmp_path / "g"))
    model = jgrind.models.gcn(g.num_features, 16, g.num_classes, dropout=0.5)
    runs = []
    for graph in (g, mapped):
        for policy in (policies.host_offload(), policies.ssd_offload(str(tmp_path))):
            r = jgrind.train(jax.random.key(3), graph, model, optax.adam(0.01), epochs=3,
                             policy=policy, num_parts=3, progress=False)
            runs.append([h["loss"] for h in r.history])
    assert runs[0] == runs[2] and runs[1] == runs[3]  # same bits, mapped or in memory
    assert np.allclose(runs[0], runs[1], rtol=1e-5)


def _saved(tmp_path, **graph_kwargs):
    g = community_graph(num_nodes=120, **graph_kwargs)
    return g, D.save_graph(g, tmp_path / "g")


def test_damaged_folders_are_named_errors(tmp_path):
    g, folder = _saved(tmp_path)
    with pytest.raises(D.DatasetError, match="does not exist; write one"):
        D.load("npy:" + str(tmp_path / "nothing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(D.DatasetError, match="graph.json.*is not a saved graph"):
        D.load_saved(tmp_path / "empty")

    meta = json.loads((folder / "graph.json").read_text())
    (folder / "graph.json").write_text(json.dumps({**meta, "version": 99}))
    with pytest.raises(D.DatasetError, match="version 99.*reads version 1"):
        D.load_saved(folder)
    for bad in ({"dtype": "float99", "shape": [120, 12]}, {"dtype": "<f4", "shape": "120"},
                ["<f4", [120, 12]]):
        arrays = {**meta["arrays"], "features": bad}
        (folder / "graph.json").write_text(json.dumps({**meta, "arrays": arrays}))
        with pytest.raises(D.DatasetError, match="entry for features .* is not a dtype and a "
                                                 "shape"):
            D.load_saved(folder)
    (folder / "graph.json").write_text("{not json")
    with pytest.raises(D.DatasetError, match="cannot read .*graph.json"):
        D.load_saved(folder)
    (folder / "graph.json").write_text(json.dumps(meta))
    assert_same(g, D.load_saved(folder))

    features = folder / "features.npy"
    whole = features.read_bytes()
    features.write_bytes(whole[: len(whole) // 2])  # cut short, e.g. a copy that stopped
    for mmap in (True, False):
        with pytest.raises(D.DatasetError, match="features.npy: it is truncated"):
            D.load_saved(folder, mmap=mmap)
    features.write_bytes(whole)
    np.save(folder / "labels.npy", np.zeros(7, np.int32))  # replaced by another array
    with pytest.raises(D.DatasetError, match=r"labels.npy holds int32 \[7\] but graph.json "
                                             r"says int32 \[120\]"):
        D.load_saved(folder)
    (folder / "labels.npy").unlink()
    with pytest.raises(D.DatasetError, match="labels.npy does not exist"):
        D.load_saved(folder)


def test_nan_written_into_a_saved_file_is_found(tmp_path):
    _, folder = _saved(tmp_path)
    x = np.load(folder / "features.npy", mmap_mode="r+")
    x[77, 3] = np.nan
    x.flush()
    del x
    with pytest.raises(GraphError, match="NaN or inf in 1 rows .first: node 77"):
        D.load_saved(folder)


def test_save_never_loses_what_is_there(tmp_path, monkeypatch):
    g, folder = _saved(tmp_path)
    other = community_graph(num_nodes=90, name="other")
    with pytest.raises(D.DatasetError, match="holds a saved graph; pass overwrite=True"):
        D.save_graph(other, folder)
    D.save_graph(other, folder, overwrite=True)
    assert_same(other, D.load_saved(folder))

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for overwrite in (False, True):  # --overwrite would not help: said first
        with pytest.raises(D.DatasetError, match="will not write into .*not a saved graph"):
            D.save_graph(g, mine, overwrite=overwrite)
    assert (mine / "notes.txt").read_text() == "keep me"
    with pytest.raises(D.DatasetError, match="is a file"):
        D.save_graph(g, mine / "notes.txt")
    with pytest.raises(D.DatasetError, match="parent folder .* does not exist"):
        D.save_graph(g, tmp_path / "no" / "such")
    (tmp_path / "blank").mkdir()  # an empty folder is taken
    assert_same(g, D.load_saved(D.save_graph(g, tmp_path / "blank")))

    # a full disk is found before anything is written
    usage = stored.shutil.disk_usage(tmp_path)
    monkeypatch.setattr(stored.shutil, "disk_usage",
                        lambda p: usage._replace(free=1000))
    with pytest.raises(D.DatasetError, match=r"needs 0.00 GiB and the disk .* has 0.00 GiB "
                                             "free"):
        D.save_graph(g, tmp_path / "full")
    monkeypatch.undo()

    # a write that fails half way (here: the third file) leaves no partial folder, and an
    # existing graph as it was
    real_save, calls = np.save, []

    def failing_save(path, *a, **k):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_save(path, *a, **k)
    monkeypatch.setattr(stored.np, "save", failing_save)
    before = sorted(p.name for p in tmp_path.iterdir())
    for target, overwrite in ((tmp_path / "new", False), (folder, True)):
        calls.clear()
        with pytest.raises(D.DatasetError, match="No space left on device.*nothing was "
                                                 "written"):
            D.save_graph(g, target, overwrite=overwrite)
        assert sorted(p.name for p in tmp_path.iterdir()) == before
    monkeypatch.undo()
    assert_same(other, D.load_saved(folder))

    # the last step failing (moving the new folder into place) puts the old graph back
    real_rename = pathlib.Path.rename

    def failing_rename(self, target):
        if ".partial-" in self.name:
            raise OSError(5, "Input/output error")
        return real_rename(self, target)
    monkeypatch.setattr(pathlib.Path, "rename", failing_rename)
    with pytest.raises(D.DatasetError, match="Input/output error"):
        D.save_graph(g, folder, overwrite=True)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert_same(other, D.load_saved(folder))


def test_convert_command_then_train_from_the_folder(tmp_path, capsys):
    out = tmp_path / "csbm"
    assert main(["convert", "--dataset", "csbm", "--set", "num_nodes=400",
                 "--out", str(out)]) == 0
    assert f"--dataset npy:{out}" in capsys.readouterr().out
    assert D.load_saved(out).num_nodes == 400
    # refused before the dataset is loaded; with --overwrite replaced
    assert main(["convert", "--dataset", "nope", "--out", str(out)]) == 2
    assert "holds a saved graph" in capsys.readouterr().err
    assert main(["convert", "--dataset", "csbm", "--set", "num_nodes=300", "--out", str(out),
                 "--overwrite"]) == 0
    assert D.load_saved(out).num_nodes == 300
    run = tmp_path / "run"
    assert main(["train", "--dataset", f"npy:{out}", "--epochs", "3", "--policy", "host",
                 "--parts", "2", "--out", str(run), "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["graph"]["nodes"] == 300


def _features_in_a_scratch_file(tmp_path):
    """A graph, a scratch folder, and the graph's features in a mapped ``.npy`` file there."""
    g = community_graph(num_nodes=60)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    mapped = np.lib.format.open_memmap(scratch / "x.npy", mode="w+", dtype=np.float32,
                                       shape=g.features.shape)
    mapped[:] = g.features
    return g, scratch, mapped


def test_a_mapped_file_in_an_adopted_folder_is_moved_not_copied(tmp_path):
    """`save_graph(adopt=...)` renames a whole ``.npy`` file that an array maps (the features
    `jgrind convert` decompressed into its scratch folder) instead of writing it again; any
    other array, or the same without ``adopt``, is copied."""
    g, scratch, mapped = _features_in_a_scratch_file(tmp_path)
    inode = (scratch / "x.npy").stat().st_ino
    h = g.replace(features=mapped)
    D.save_graph(h, tmp_path / "copied")
    assert (scratch / "x.npy").exists()  # not adopted: copied
    D.save_graph(h, tmp_path / "moved", adopt=(scratch,))
    assert not (scratch / "x.npy").exists()
    assert (tmp_path / "moved/features.npy").stat().st_ino == inode
    for folder in ("copied", "moved"):
        np.testing.assert_array_equal(D.load(f"npy:{tmp_path / folder}").features, g.features)
    np.testing.assert_array_equal(h.features, g.features)  # its map still reads the file
    # a map of part of a file is copied, the file left where it is
    part = np.lib.format.open_memmap(scratch / "y.npy", mode="w+", dtype=np.float32,
                                     shape=(61, g.num_features))
    part[:60] = g.features
    D.save_graph(g.replace(features=part[:60]), tmp_path / "part", adopt=(scratch,))
    assert (scratch / "y.npy").exists()
    np.testing.assert_array_equal(D.load(f"npy:{tmp_path / 'part'}").features, g.features)


def test_an_adopted_file_goes_back_when_the_save_fails(tmp_path, monkeypatch):
    """A save that fails after moving an adopted file puts it back: nothing is lost."""
    g, scratch, mapped = _features_in_a_scratch_file(tmp_path)
    real_save = np.save

    def save(fh, a, **kw):  # the disk fills up at the labels, after the features moved
        if a is g.labels:
            raise OSError(28, "No space left on device")
        return real_save(fh, a, **kw)
    monkeypatch.setattr(np, "save", save)
    with pytest.raises(D.DatasetError, match="No space left"):
        D.save_graph(g.replace(features=mapped), tmp_path / "out", adopt=(scratch,))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["scratch"]
    np.testing.assert_array_equal(np.load(scratch / "x.npy"), g.features)


def test_a_killed_save_leaves_a_folder_the_next_save_removes(tmp_path):
    """A save killed mid-write (SIGKILL: no cleanup runs) leaves its hidden partial folder;
    the next save to the same target removes it when its owner process is gone, and keeps
    a live writer's or an unmarked folder. The saved graph holds no owner file."""
    import socket
    import subprocess
    import sys
    code = ("import os, signal, numpy as np, jgrind.datasets as D\n"
            "from helpers import community_graph\n"
            "real = np.save\n"
            "def save(fh, a, **kw):\n"
            "    real(fh, a, **kw)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "np.save = save\n"
            f"D.save_graph(community_graph(num_nodes=60), {str(tmp_path / 'g')!r})\n")
    killed = subprocess.run([sys.executable, "-c", code], cwd=pathlib.Path(__file__).parent,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]
    [left] = tmp_path.glob(".g.partial-*")
    assert (left / "indptr.npy").exists()
    alive = tmp_path / ".g.partial-a11be000"  # tags are 8 hex digits, as saves make them
    alive.mkdir()
    (alive / "owner").write_text(f"{socket.gethostname()} {os.getpid()}\n")
    (tmp_path / ".g.partial-0000beef").mkdir()  # unmarked
    D.save_graph(community_graph(num_nodes=60), tmp_path / "g")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".g.partial-0000beef",
                                                          ".g.partial-a11be000", "g"]
    assert "owner" not in {p.name for p in (tmp_path / "g").iterdir()}
    assert D.load(f"npy:{tmp_path / 'g'}").num_nodes == 60


def _save_killed_at(tmp_path, rename_number: int, *, replacing: bool):
    """Save a 70-node graph to ``tmp_path / "g"`` in a subprocess that SIGKILLs itself right
    after its ``rename_number``-th folder rename (1: the old graph moved aside when
    replacing; 2: the new graph moved into place) or, with 0, right after its first
    ``unlink`` (the owner file, after both renames)."""
    import subprocess
    import sys
    hook = ("real = pathlib.Path.rename\n"
            "count = [0]\n"
            "def rename(self, target):\n"
            "    out = real(self, target)\n"
            "    if self.is_dir() or pathlib.Path(target).is_dir():\n"
            "        count[0] += 1\n"
            f"        if count[0] == {rename_number}:\n"
            "            os.kill(os.getpid(), signal.SIGKILL)\n"
            "    return out\n"
            "pathlib.Path.rename = rename\n") if rename_number else (
            "real = pathlib.Path.unlink\n"
            "def unlink(self, *a, **kw):\n"
            "    real(self, *a, **kw)\n"
            "    os.kill(os.getpid(), signal.SIGKILL)\n"
            "pathlib.Path.unlink = unlink\n")
    code = ("import os, signal, pathlib, jgrind.datasets as D\n"
            "from helpers import community_graph\n" + hook +
            f"D.save_graph(community_graph(num_nodes=70), {str(tmp_path / 'g')!r}, "
            f"overwrite={replacing})\n")
    killed = subprocess.run([sys.executable, "-c", code], cwd=pathlib.Path(__file__).parent,
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr[-2000:]


@pytest.mark.parametrize("rename_number", [1, 2, 0])
def test_a_replacing_save_killed_between_its_renames_is_finished(tmp_path, rename_number):
    """Killed with the old graph moved aside and the new one complete but not in place (1),
    right after the new one is in place (2), or before its owner file is removed (0): the
    next load or save finds the new graph whole, with no owner file, and nothing hidden
    left behind."""
    D.save_graph(community_graph(num_nodes=50), tmp_path / "g")
    _save_killed_at(tmp_path, rename_number, replacing=True)
    names = {p.name for p in tmp_path.iterdir()}
    assert any(n.startswith(".g.old-") for n in names)
    if rename_number == 1:
        assert "g" not in names  # the state this recovers: no graph at the target at all
    g = D.load(f"npy:{tmp_path / 'g'}")
    assert g.num_nodes == 70  # the new graph, which was complete
    D.save_graph(community_graph(num_nodes=80), tmp_path / "g", overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == sorted(
        ["graph.json"] + [f"{k}.npy" for k in stored.ARRAYS])
    assert D.load(f"npy:{tmp_path / 'g'}").num_nodes == 80


def test_recover_leaves_live_and_unmarked_folders_and_a_whole_target(tmp_path):
    import socket
    D.save_graph(community_graph(num_nodes=50), tmp_path / "g")
    for name, owner in ((".g.old-a11be000", f"{socket.gethostname()} {os.getpid()}"),
                        (".g.old-e15e0000", "another-host 1"), (".g.old-0000beef", None),
                        (".g.partial-a11be000", f"{socket.gethostname()} {os.getpid()}")):
        (tmp_path / name).mkdir()
        if owner:
            (tmp_path / name / "owner").write_text(owner + "\n")
    assert stored.recover(tmp_path / "g") is None
    assert len(list(tmp_path.iterdir())) == 5
    assert D.load(f"npy:{tmp_path / 'g'}").num_nodes == 50


def test_recover_moves_the_old_graph_back_when_no_new_one_is_complete(tmp_path):
    """Killed with the old graph moved aside, and the new one's folder gone (removed by hand):
    the old graph is the only copy and comes back."""
    import shutil
    D.save_graph(community_graph(num_nodes=50), tmp_path / "g")
    _save_killed_at(tmp_path, 1, replacing=True)
    for partial in tmp_path.glob(".g.partial-*"):
        shutil.rmtree(partial)
    assert D.load(f"npy:{tmp_path / 'g'}").num_nodes == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]
    assert "owner" not in {p.name for p in (tmp_path / "g").iterdir()}


def _left_behind(tmp_path, kind: str, tag: str, num_nodes: int, *, owner="dead"):
    """A hidden working folder of target ``g`` holding a whole saved graph, as a killed save
    leaves it, owned by a process that has exited (or by this one, with owner="alive")."""
    import shutil
    import socket
    import subprocess
    import sys
    folder = tmp_path / f".g.{kind}-{tag}"
    shutil.copytree(D.save_graph(community_graph(num_nodes=num_nodes), tmp_path / "src"),
                    folder)
    shutil.rmtree(tmp_path / "src")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    pid = os.getpid() if owner == "alive" else gone.pid
    (folder / "owner").write_text(f"{socket.gethostname()} {pid}\n")
    return folder


def test_recover_never_takes_a_broken_new_graph_for_a_finished_one(tmp_path):
    """A save interrupted twice (its rollback killed while deleting the new graph) leaves the
    old graph aside and a new one with graph.json but a file gone; or a first save killed
    while writing graph.json leaves it torn. Neither is moved into place: the old graph
    comes back, the broken folders go."""
    _left_behind(tmp_path, "old", "0000aaaa", 50)
    broken = _left_behind(tmp_path, "partial", "0000bbbb", 70)
    (broken / "features.npy").unlink()
    torn = _left_behind(tmp_path, "partial", "0000cccc", 80)
    (torn / "graph.json").write_text('{"format": "jgrind-gr')
    assert D.load(f"npy:{tmp_path / 'g'}").num_nodes == 50
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]


def test_recover_leaves_everything_when_something_else_is_at_the_target(tmp_path):
    """An empty folder (a script's mkdir -p) or a file at the target: neither the finished
    new graph nor the old one may be removed."""
    _left_behind(tmp_path, "old", "0000aaaa", 50)
    _left_behind(tmp_path, "partial", "0000bbbb", 70)
    (tmp_path / "g").mkdir()
    assert stored.recover(tmp_path / "g") is None
    assert len(list(tmp_path.iterdir())) == 3
    (tmp_path / "g").rmdir()
    (tmp_path / "g").write_text("not a graph")
    with pytest.raises(D.DatasetError, match="it is a file"):
        D.save_graph(community_graph(num_nodes=60), tmp_path / "g", overwrite=True)
    assert len(list(tmp_path.iterdir())) == 3


def test_recover_matches_only_its_own_target_name(tmp_path):
    """Names are matched literally: ``g[1]`` (a glob pattern for ``g1``) takes nothing of
    ``g1``'s, and ``g1`` finds its own leftovers."""
    import shutil
    folder = _left_behind(tmp_path, "partial", "0000bbbb", 70)
    folder.rename(tmp_path / ".g1.partial-0000bbbb")
    with pytest.raises(D.DatasetError, match="does not exist"):
        D.load(f"npy:{tmp_path / 'g[1]'}")
    assert (tmp_path / ".g1.partial-0000bbbb").is_dir()
    assert D.load(f"npy:{tmp_path / 'g1'}").num_nodes == 70
    shutil.rmtree(tmp_path / "g1")
    # another target whose own hidden folders look like ours: g.old-1 beside g
    _left_behind(tmp_path, "partial", "0000dddd", 40).rename(
        tmp_path / ".g.old-1.partial-0000dddd")
    D.save_graph(community_graph(num_nodes=50), tmp_path / "g")
    assert stored.recover(tmp_path / "g") is None
    assert (tmp_path / ".g.old-1.partial-0000dddd").is_dir()


def test_an_owner_whose_pid_is_not_visible_but_holds_the_lock_is_alive(tmp_path):
    """A save in another container that shares this host's name runs under a pid this process
    cannot see; the lock `mark_owner` holds on its owner file shows it is alive. Its folders
    are left alone until it exits, then recovered."""
    import subprocess
    import sys
    import textwrap
    folder = _left_behind(tmp_path, "partial", "0000aaaa", 60)  # its pid: gone
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, sys
            fh = open({str(folder / "owner")!r}, "rb")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            print("locked", flush=True)
            sys.stdin.read()
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert stored.recover(tmp_path / "g") is None
        assert stored.sweep_abandoned(tmp_path / "g", "partial") == []
        assert folder.exists() and not (tmp_path / "g").exists()
    finally:
        holder.communicate("", timeout=60)
    assert stored.recover(tmp_path / "g") == folder  # moved into place
    assert D.load(f"npy:{tmp_path / 'g'}").num_nodes == 60


def test_mark_owner_holds_its_lock_while_open(tmp_path):
    import subprocess
    import sys
    folder = tmp_path / ".g.scratch-0000aaaa"
    folder.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with stored.mark_owner(folder) as owner:
        host, pid = (folder / "owner").read_text().split()
        assert int(pid) == os.getpid()
        # the same owner seen from where its pid means nothing (another pid namespace)
        (folder / "owner").write_text(f"{host} {gone.pid}\n")
        assert not owner.closed
        assert stored.sweep_abandoned(tmp_path / "g", "scratch") == []
    assert stored.sweep_abandoned(tmp_path / "g", "scratch") == [folder]


def test_a_save_holds_its_owner_lock_while_it_writes(tmp_path, monkeypatch):
    from jgrind.hostio.owner_locks import held_by_another
    seen = []
    real_save = np.save

    def save(fh, a, **kw):
        [partial] = tmp_path.glob(".g.partial-*")
        seen.append(held_by_another(partial / "owner"))
        return real_save(fh, a, **kw)
    monkeypatch.setattr(np, "save", save)
    D.save_graph(community_graph(num_nodes=60), tmp_path / "g")
    assert seen and all(seen)
