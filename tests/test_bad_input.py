"""Bad input on the command line: one line ``jgrind: error: ...`` naming the problem and what to
do, exit status 2, no traceback, and nothing lost or left behind (no half-written run folder,
no file of the user's overwritten or moved, no store files)."""

import errno
import importlib.util
import json
import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import optax
import pytest

import jgrind
from jgrind.cli import main

from helpers import fails

SMALL = ["--dataset", "csbm", "--set", "num_nodes=300", "--epochs", "2", "--no-progress"]


@pytest.mark.parametrize("setting, needle", [
    ("hidden=-1", "hidden must be at least 1"),
    ("heads=0", "heads must be at least 1"),
    ("dropout=1", "dropout must be in [0, 1)"),
    ("layers=0", "layers must be at least 1"),
    ("eval_every=0", "eval_every must be at least 1"),
    ("lr=nan", "lr must be a finite number above 0"),
    ("lr=-1", "lr must be a finite number above 0"),
    ("weight_decay=inf", "weight_decay must be a finite number"),
    ("seeds=0", "seeds must be at least 1"),
    ("seed=-1", "seed must be 0 or more"),
    ("patience=-1", "patience must be 0 (off) or more"),
    ("checkpoint_every=-1", "checkpoint_every must be 0 (off) or more"),
    ("num_nodes=0", "num_nodes must be at least 1"),
    ("avg_degree=nan", "avg_degree must be a finite number"),
    ("num_nodes=2", "cannot generate csbm with num_nodes=2"),   # the generator's own check
    ("split=3", "has 1 split(s)"),                              # checked against the graph
])
def test_out_of_range_settings_fail_before_anything_is_written(tmp_path, capsys, setting,
                                                               needle):
    out = tmp_path / "run"
    fails(capsys, ["train", "--model", "gat", *SMALL, "--set", setting, "--out", str(out)],
          needle)
    assert not out.exists()


def test_sizes_too_large_to_hold_are_an_error(capsys, tmp_path):
    fails(capsys, ["train", *SMALL, "--device-budget", "1e400", "--out", str(tmp_path / "r")],
          "cannot read '1e400' as a size")


def test_a_failed_run_leaves_the_last_run_in_its_folder_as_it_was(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *SMALL, "--out", str(out)]) == 0
    files = lambda: {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}  # noqa: E731
    before = files()
    assert any("params" in p.relative_to(out).parts for p in before)  # saved parameters too
    fails(capsys, ["train", *SMALL, "--dataset", "nosuch", "--out", str(out)], "nosuch")
    assert files() == before
    # the engine's own checks come later, once the graph is partitioned: still before writing
    fails(capsys, ["train", *SMALL, "--policy", "ssd", "--store", str(tmp_path / "none"),
                   "--out", str(out)], "does not exist")
    fails(capsys, ["train", *SMALL, "--policy", "grinnder", "--device-budget", "1KiB",
                   "--host-budget", "1KiB", "--store", str(tmp_path), "--out", str(out)],
          "budget")
    assert files() == before
    if shutil.disk_usage("/proc").total == 0:
        fails(capsys, ["train", *SMALL, "--policy", "ssd", "--store", "/proc", "--out",
                       str(out)], "virtual file system, not a disk")
    # a successful run into it replaces the earlier run's files, stale seeds' logs included
    assert main(["train", *SMALL, "--seeds", "2", "--out", str(out)]) == 0
    assert main(["train", *SMALL, "--out", str(out)]) == 0
    assert not (out / "metrics-seed1.jsonl").exists()
    assert [p.name for p in (out / "params").iterdir()] == ["seed0"]
    assert json.loads((out / "summary.json").read_text())["seeds"] == [0]


def test_the_output_folder_must_be_a_run_folder_or_new(tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    fails(capsys, ["train", *SMALL, "--out", str(other)], "not a jgrind run's")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]
    afile = tmp_path / "afile"
    afile.write_text("mine")
    fails(capsys, ["train", *SMALL, "--out", str(afile)], "is a file")
    fails(capsys, ["train", *SMALL, "--out", ""], "is empty")
    fails(capsys, ["plan", "--set", "num_nodes=300", "--out", str(afile / "sub")],
          f"{afile} is a file")
    assert afile.read_text() == "mine"


def test_checkpoints_of_another_experiment_are_not_resumed(tmp_path, capsys):
    out = tmp_path / "ck"
    run = ["train", *SMALL, "--set", "checkpoint_every=1", "--out", str(out)]
    assert main([*run, "--set", "hidden=16"]) == 0
    fails(capsys, [*run, "--set", "hidden=32"], "another experiment (hidden 16 -> 32)")
    fails(capsys, [*run, "--set", "hidden=16", "--set", "num_nodes=400"],
          "num_nodes 300 -> 400")
    fails(capsys, [*run, "--set", "hidden=16", "--set", "dataset_options=homophily:0.5"],
          "dataset_options '' -> 'homophily:0.5'")
    fails(capsys, [*run, "--set", "hidden=16", "--set", "store_dtype=int8"],
          "store_dtype '' -> 'int8'")
    fails(capsys, [*run, "--set", "hidden=16", "--epochs", "1"], "reach epoch 1, past this "
          "run's 1 epochs")
    # a config.json written before a setting existed holds that setting's default
    config = json.loads((out / "config.json").read_text())
    del config["dataset_options"]
    (out / "config.json").write_text(json.dumps(config))
    # the same experiment, trained longer, resumes
    assert main([*run, "--set", "hidden=16", "--epochs", "3"]) == 0
    log = (out / "metrics-seed0.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in log] == [0, 1, 2]


def test_a_run_that_fails_before_its_first_epoch_leaves_no_store_files(tmp_path):
    """The engine's store is made after the parameters and the log file: an error in those
    used to leave the run's SSD files behind."""
    graph = jgrind.generators.csbm(num_nodes=300, seed=0)
    model = jgrind.models.gcn(graph.num_features, 8, graph.num_classes)
    store = tmp_path / "store"
    store.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(OSError):  # the log's folder cannot be made: it is a file
        jgrind.train(jax.random.key(0), graph, model, optax.adam(0.01), epochs=2,
                     progress=False, policy=jgrind.policies.ssd_offload(store), num_parts=2,
                     log_path=afile / "log.jsonl")
    assert list(store.iterdir()) == []


def test_profile_paths_that_are_not_profiles_are_left_alone(tmp_path, capsys):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    fails(capsys, ["plan", "--set", "num_nodes=300", "--profile", str(notes), "--out",
                   str(tmp_path / "plan")], "pass a hardware profile file")
    fails(capsys, ["profile", "--quick", "--out", str(notes)], "is not a jgrind hardware profile")
    assert notes.read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
    fails(capsys, ["profile", "--show", "--out", str(tmp_path)], "is a folder")


def test_plan_takes_budgets_and_parts_from_set_too(tmp_path, capsys):
    from jgrind.plan import profile
    from test_planner import fixed_profile
    path = profile.save(fixed_profile(), tmp_path / "profile.json")
    fails(capsys, ["plan", "--set", "num_nodes=300", "--set", "device_budget=1KiB",
                   "--set", "host_budget=1KiB", "--profile", str(path), "--out",
                   str(tmp_path / "plan")], "budget")


def test_partition_takes_its_settings_from_set_and_checks_them(capsys):
    assert main(["partition", "--set", "num_nodes=600", "--set", "parts=3"]) == 0
    assert "3 partitions" in capsys.readouterr().out
    fails(capsys, ["partition", "--set", "num_nodes=600", "--seed", "-1"], "seed must be")
    fails(capsys, ["partition", "--set", "num_nodes=600", "--parts", "0"], "at least 1")


def test_a_missing_optional_partitioner_is_an_error_naming_its_extra(capsys):
    if importlib.util.find_spec("pymetis") is not None:
        pytest.skip("pymetis is installed here")
    fails(capsys, ["partition", "--set", "num_nodes=600", "--partitioner", "metis"],
          "pip install 'jgrind[metis]'")


def _edge_list(folder, labels):
    folder.mkdir()
    (folder / "edges.txt").write_text("0 1\n1 2\n2 3\n3 0\n")
    np.save(folder / "features.npy", np.eye(4, 3, dtype=np.float32))
    np.save(folder / "labels.npy", np.asarray(labels))
    return f"edgelist:{folder / 'edges.txt'}"


def test_graphs_without_training_nodes_or_with_stray_class_ids(tmp_path, capsys):
    unlabelled = _edge_list(tmp_path / "unlabelled", [-1, -1, -1, -1])
    fails(capsys, ["train", "--dataset", unlabelled, "--epochs", "2", "--no-progress",
                   "--out", str(tmp_path / "r1")], "no training node")
    stray = _edge_list(tmp_path / "stray", [0, 1, 0, 10**9])
    fails(capsys, ["train", "--dataset", stray, "--epochs", "2", "--no-progress",
                   "--out", str(tmp_path / "r2")], "class ids (0-1, 1000000000)")
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()


def _heterophilous(path, labels):
    """A file in the heterophilous-graphs format (Platonov et al.) with these labels."""
    n = len(labels)
    masks = np.zeros((10, n), bool)
    masks[:, : n // 2] = True
    val = np.zeros((10, n), bool)
    val[:, n // 2: 3 * n // 4] = True
    np.savez(path, node_features=np.random.default_rng(0).normal(size=(n, 4)).astype(
        np.float32), node_labels=np.asarray(labels), edges=np.stack(
        [np.arange(n), (np.arange(n) + 1) % n], 1), train_masks=masks, val_masks=val,
        test_masks=~(masks | val))
    return path


@pytest.mark.parametrize("fmt", ["edgelist", "heterophilous"])
def test_a_stray_label_is_refused_until_num_classes_is_stated(tmp_path, capsys, fmt):
    """One label of 99 among 7 classes made a 100-class task without a word: the error says
    which ids are used and which are not, and the run trains once num_classes is stated."""
    labels = np.arange(40) % 7
    labels[5] = 99
    if fmt == "edgelist":
        folder = tmp_path / "g"
        folder.mkdir()
        (folder / "edges.txt").write_text("".join(f"{i} {(i + 1) % 40}\n" for i in range(40)))
        np.save(folder / "features.npy", np.eye(40, 3, dtype=np.float32))
        np.save(folder / "labels.npy", labels)
        dataset = f"edgelist:{folder / 'edges.txt'}"
    else:
        from jgrind.datasets import load_heterophilous
        path = str(_heterophilous(tmp_path / "h.npz", labels))
        with pytest.raises(jgrind.GraphError, match=r"7-98\) label no node"):
            load_heterophilous(path)
        assert load_heterophilous(path, num_classes=100).num_classes == 100
        dataset = f"npz:{path}"
    base = ["train", "--dataset", dataset, "--epochs", "1", "--no-progress"]
    fails(capsys, [*base, "--out", str(tmp_path / "r1")],
          "the labels use 8 class ids (0-6, 99)", "100 classes of which 92 (7-98) label no "
          "node", "--set num_classes=100")
    fails(capsys, [*base, "--out", str(tmp_path / "r2"), "--set", "num_classes=50"],
          "num_classes=50, but the labels run up to class id 99")
    assert main([*base, "--out", str(tmp_path / "r3"), "--set", "num_classes=100"]) == 0
    summary = json.loads((tmp_path / "r3" / "summary.json").read_text())
    assert summary["graph"]["classes"] == 100


def test_an_adjacency_index_out_of_range_is_named(tmp_path):
    from jgrind.datasets import DatasetError, load_gnn_benchmark
    np.savez(tmp_path / "g.npz", adj_data=np.ones(2, np.float32),
             adj_indices=np.array([1, 10**6]), adj_indptr=np.array([0, 1, 2]),
             adj_shape=np.array([2, 2]), attr_data=np.ones(2, np.float32),
             attr_indices=np.array([0, 0]), attr_indptr=np.array([0, 1, 2]),
             attr_shape=np.array([2, 1]), labels=np.array([0, 1]))
    with pytest.raises(DatasetError, match="do not form a CSR matrix"):
        load_gnn_benchmark(tmp_path / "g.npz")


def test_an_unwritable_kernel_cache_builds_privately_and_leaves_nothing(tmp_path):
    """The kernels compile into a temporary folder, which is removed once they are loaded
    (every run used to leave one in /tmp), and a warning says why and what to set."""
    afile = tmp_path / "afile"
    afile.write_text("")
    temp = tmp_path / "tmp"
    temp.mkdir()
    code = ("import numpy as np; from jgrind import _kernels; from jgrind.hostio import rows; "
            "assert _kernels.available(), _kernels.unavailable_reason(); "
            "print(rows.take_rows(np.ones((4, 3), np.float32), np.array([1, 2])).shape)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "JGRIND_CACHE": str(afile / "cache"),
                                            "TMPDIR": str(temp)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "(2, 3)"
    assert "is not writable" in proc.stderr and "JGRIND_CACHE" in proc.stderr
    assert list(temp.iterdir()) == []


def test_paths_of_the_wrong_kind_and_features_that_are_not_real_numbers(tmp_path):
    from jgrind.datasets import DatasetError
    from jgrind.graph import GraphError, from_edges
    afile = tmp_path / "afile"
    afile.write_text("")
    for prefix in ("ogb", "npy"):
        with pytest.raises(DatasetError, match="is a file"):
            jgrind.datasets.load(f"{prefix}:{afile}")
    with pytest.raises(GraphError, match="features are complex64; they must be real numbers"):
        from_edges([0], [1], np.ones((2, 3), np.complex64), [0, 1])


def test_a_disk_that_fills_during_the_run_is_an_error_and_the_store_is_removed(
        tmp_path, capsys, monkeypatch):
    """Free space is checked before the run; if something else takes it meanwhile, the write
    that fails says so (not an OSError traceback) and the run's files are removed."""
    store = tmp_path / "store"
    store.mkdir()
    real, calls = os.pwritev, []

    def fills_up(fd, buffers, offset):
        calls.append(offset)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", fills_up)
    fails(capsys, ["train", *SMALL, "--policy", "ssd", "--store", str(store), "--parts", "2",
                   "--out", str(tmp_path / "run")], f"the disk of the store ({store}) is full",
          "choose another disk (--store)")
    assert list(store.iterdir()) == []


def test_the_native_span_loops_report_a_full_disk_too(tmp_path, monkeypatch):
    from jgrind.engine import ssd

    class FullDisk:  # the native library, as it answers when pwrite fails with ENOSPC
        def jgrind_add_spans_f32(self, *args):
            return -errno.ENOSPC

    f = ssd.SSDFile(tmp_path / "g.bin", np.array([0, 4, 8]), 2, b"run")
    monkeypatch.setattr(ssd._kernels, "library", lambda: FullDisk())
    with pytest.raises(ssd.StoreFullError, match="is full"):
        f.add_rows(np.array([1, 5]), np.ones((2, 2), np.float32))
    f.close()


# -- the Python API ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    graph = jgrind.generators.csbm(num_nodes=300, num_features=8, num_classes=3, seed=0)
    return graph, jgrind.models.gcn(8, 8, 3)


@pytest.mark.parametrize("build, needle", [
    (lambda: jgrind.models.gcn(8, -4, 3), "hidden_channels must be a whole number"),
    (lambda: jgrind.models.gcn(8, 8.5, 3), "hidden_channels must be a whole number"),
    (lambda: jgrind.models.sage(0, 8, 3), "in_channels (the graph's number of features)"),
    (lambda: jgrind.models.gcn(8, 8, 0), "out_channels (the number of classes)"),
    (lambda: jgrind.models.gcn(8, 8, 3, num_layers=2.5), "num_layers must be"),
    (lambda: jgrind.models.gcn(8, 8, 3, activation="relu"), "activation must be a function"),
    (lambda: jgrind.models.gcn(8, 8, 3, dropout=1.0), "dropout must be in [0, 1)"),
    (lambda: jgrind.models.gat(8, 8, 3, heads=0), "heads must be a whole number"),
    (lambda: jgrind.models.gat(8, 8, 3, output_heads=0), "output_heads must be"),
    (lambda: jgrind.models.gat(8, 8, 3, attention_dropout=-1), "attention_dropout must be"),
])
def test_model_arguments_are_checked_when_the_model_is_built(build, needle):
    with pytest.raises(ValueError) as err:
        build()
    assert needle in str(err.value)


def _train(graph, model, **kwargs):
    args = dict(key=jax.random.key(0), optimizer=optax.adam(0.01), epochs=2, progress=False)
    args.update(kwargs)
    key, optimizer = args.pop("key"), args.pop("optimizer")
    return jgrind.train(key, graph, model, optimizer, **args)


@pytest.mark.parametrize("change, error, needle", [
    (dict(model=jgrind.models.gcn(16, 8, 3)), jgrind.GraphError, "takes 16 input features"),
    (dict(model=jgrind.models.gcn(8, 8, 2)), jgrind.GraphError, "has 2 outputs but"),
    (dict(key=0), TypeError, "key must be a JAX random key"),
    (dict(optimizer=None), TypeError, "optimizer must be an optax transformation"),
    (dict(epochs=2.5), ValueError, "epochs must be a whole number"),
    (dict(eval_every=0), ValueError, "eval_every must be a whole number, at least 1"),
    (dict(patience=0), ValueError, "patience (None: no early stopping)"),
    (dict(split=0.0), ValueError, "split 0.0 does not exist"),
    (dict(num_parts=0), ValueError, "num_parts (None: 4"),
    (dict(policy="host"), jgrind.plan.PolicyError, "must be a function from a TensorInfo"),
    (dict(policy=jgrind.Fate.HOST), jgrind.plan.PolicyError, "a Fate is what a policy returns"),
    (dict(policy=jgrind.policies.host_offload(), partitioner="random"), ValueError,
     "partitioner must be a function"),
    (dict(policy=jgrind.policies.host_offload(), device_budget="1GB"),
     jgrind.plan.PolicyError, "device_budget must be a whole number of bytes"),
])
def test_train_arguments_are_checked_before_any_work(small, tmp_path, change, error, needle):
    graph, model = small
    change = dict(change)
    model = change.pop("model", model)
    with pytest.raises(error) as err:
        _train(graph, model, log_path=tmp_path / "log.jsonl", **change)
    assert needle in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_policy_arguments_are_checked_when_the_policy_is_made(tmp_path):
    P, PolicyError = jgrind.policies, jgrind.plan.PolicyError
    for make, needle in [(lambda: P.ssd_offload(None), "ssd_offload needs the store directory"),
                         (lambda: P.naive(123), "naive needs the store directory"),
                         (lambda: P.ssd_offload(tmp_path, gradients="ssd"), "gradients' fate"),
                         (lambda: P.by_layer(), "at least one policy"),
                         (lambda: P.by_layer(P.host_offload(), "ssd"), "layer 1"),
                         (lambda: P.ByKind(None, P.host_offload()), "activations policy"),
                         (lambda: P.grinnder(-1, 0), "device_budget"),
                         (lambda: P.auto(host_budget="x"), "host_budget")]:
        with pytest.raises(PolicyError, match=None) as err:
            make()
        assert needle in str(err.value)


def test_ssd_offload_sends_gradients_where_it_is_told(tmp_path):
    """``ssd_offload(dir, gradients=...)`` was ignored: every gradient went to SSD."""
    from jgrind.plan.fates import TensorInfo
    policy = jgrind.policies.ssd_offload(tmp_path, gradients=jgrind.Fate.HOST)
    fields = {f: 0 for f in TensorInfo.__dataclass_fields__}
    gradient = TensorInfo(**{**fields, "name": "gradient", "layer": 1})
    activation = TensorInfo(**{**fields, "name": "activation", "layer": 1})
    assert policy(gradient) is jgrind.Fate.HOST and policy(activation) is jgrind.Fate.SSD
    assert jgrind.policies.ssd_offload(tmp_path)(gradient) is jgrind.Fate.SSD


def test_engine_arguments_are_checked(small, tmp_path):
    from jgrind.engine import OutOfCore
    from jgrind.partition import label_propagation, partition_graph
    graph, model = small
    opt = optax.adam(0.01)
    for kwargs, needle in [(dict(split=3), "split 3 does not exist"),
                           (dict(max_shapes=0), "max_shapes must be"),
                           (dict(seed=-1), "seed must be"),
                           (dict(num_parts=0), "num_parts must be")]:
        with pytest.raises(ValueError) as err:
            OutOfCore(graph, model, opt, policy=jgrind.policies.host_offload(), **kwargs)
        assert needle in str(err.value)
    with pytest.raises(ValueError, match="two store directories"):
        OutOfCore(graph, model, opt, policy=jgrind.policies.ssd_offload(tmp_path / "a"),
                  store=tmp_path / "b")
    other = jgrind.generators.csbm(num_nodes=200, num_features=8, num_classes=3, seed=1)
    normalized = model.normalize(other)
    pg = partition_graph(normalized, label_propagation(normalized, 2), num_parts=2)
    with pytest.raises(ValueError, match="a partitioning of another graph"):
        OutOfCore(graph, model, opt, partitioned=pg)


def test_labels_are_class_ids_not_truncated_or_wrapped():
    from jgrind.graph import GraphError, from_edges
    x = np.ones((3, 2), np.float32)
    for labels, needle in [([0.7, 1.2, 0.0], "whole numbers"), ([0, np.nan, 1], "NaN"),
                           ([0, 2**32, 1], "int32 range"), (["a", "b", "c"], "integer class")]:
        with pytest.raises(GraphError) as err:
            from_edges([0, 1], [1, 2], x, np.asarray(labels))
        assert needle in str(err.value)
    assert from_edges([0], [1], x, np.array([0.0, 1.0, -1.0])).labels.tolist() == [0, 1, -1]


def test_trials_need_a_seed():
    with pytest.raises(ValueError, match="at least one seed"):
        jgrind.run_trials(lambda seed: None, seeds=[])


def test_a_checkpoint_of_another_model_is_named_not_an_orbax_traceback(small, tmp_path):
    graph, _ = small
    run = dict(checkpoint_dir=tmp_path / "ck", checkpoint_every=1)
    _train(graph, jgrind.models.gcn(8, 16, 3), **run)
    with pytest.raises(ValueError, match="saved for another model or optimizer"):
        _train(graph, jgrind.models.gcn(8, 32, 3), **run)


def test_edge_ids_are_integers_and_an_empty_list_is_no_edges():
    from jgrind.graph import GraphError, from_edges
    x, y = np.ones((3, 2), np.float32), [0, 1, 0]
    assert from_edges([], [], x, y).num_edges == 0
    assert from_edges([0.0, 1.0], [1.0, 2.0], x, y).num_edges == 2
    with pytest.raises(GraphError, match="edge sources are <U1; they must be integer"):
        from_edges(["a"], ["b"], x, y)
    with pytest.raises(GraphError, match="must be integer"):
        from_edges([0.5], [1], x, y)


def test_unknown_dataset_options_name_the_ones_it_takes():
    from jgrind.datasets import DatasetError
    with pytest.raises(DatasetError, match="generated dataset 'csbm' takes no option 'nope'; "
                                           "it takes num_classes, num_features, homophily"):
        jgrind.datasets.load("csbm", num_nodes=300, nope=1)
    with pytest.raises(DatasetError, match="loading npy:PATH takes no option 'zz'; it takes "
                                           "mmap, name"):
        jgrind.datasets.load("npy:/nowhere", zz=1)
    assert jgrind.datasets.load("csbm", num_nodes=300).num_nodes == 300


@pytest.mark.parametrize("dataset, option, message", [
    ("csbm", {"homophily": "high"}, "homophily must be a number; got 'high'"),
    ("rmat", {"num_edges": 1.5}, "num_edges must be a whole number; got 1.5"),
    ("rmat", {"undirected": 1}, "undirected must be true or false; got 1"),
])
def test_a_generator_option_of_the_wrong_kind_is_named(dataset, option, message):
    """A word where a number goes (``--set dataset_options=homophily:high``) is named, not a
    TypeError from a comparison deep in the generator; whole numbers pass where a float goes."""
    with pytest.raises(ValueError, match=message):
        jgrind.datasets.load(dataset, num_nodes=300, **option)
    assert jgrind.datasets.load("csbm", num_nodes=300, homophily=1).num_nodes == 300


def test_a_graphs_tuple_whose_parts_disagree_is_refused():
    import jraph
    from jgrind.graph import GraphError
    from jgrind.interop import from_graphs_tuple
    x, y = np.ones((3, 2), np.float32), np.array([0, 1, 0])

    def tup(**changes):
        parts = dict(nodes=x, edges=None, senders=np.array([0, 1]), receivers=np.array([1, 2]),
                     n_node=np.array([3]), n_edge=np.array([2]), globals=None)
        return jraph.GraphsTuple(**{**parts, **changes})

    column = from_graphs_tuple(tup(edges=np.array([[0.5], [2.0]], np.float32)), y)
    assert sorted(column.edge_weight.tolist()) == [0.5, 2.0]      # [E, 1]: kept, not dropped
    for changes, needle in [(dict(edges=np.ones(3, np.float32)), "edges of shape (3,)"),
                            (dict(edges=np.ones((2, 4), np.float32)), "edges=None"),
                            (dict(n_edge=np.array([99])), "n_edge=99"),
                            (dict(nodes=None), "nodes must be a [N, F]")]:
        with pytest.raises(GraphError) as err:
            from_graphs_tuple(tup(**changes), y)
        assert needle in str(err.value)
    with pytest.raises(GraphError, match="expected a jraph.GraphsTuple"):
        from_graphs_tuple((x, None), y)


def test_a_metric_the_model_cannot_give_is_named(small):
    graph, _ = small
    with pytest.raises(ValueError, match="unknown metric 'f1'"):
        _train(graph, jgrind.models.gcn(8, 8, 3), metric="f1")
    one = graph.replace(labels=np.zeros(graph.num_nodes, np.int32), num_classes=1)
    with pytest.raises(ValueError, match="roc_auc' scores binary tasks.* has 1 class;"):
        _train(one, jgrind.models.gcn(8, 8, 1), metric="roc_auc")


def test_a_checkpoint_past_the_last_epoch_is_named(small, tmp_path):
    graph, model = small
    run = dict(checkpoint_dir=tmp_path / "ck", checkpoint_every=1)
    _train(graph, model, epochs=3, **run)
    assert len(_train(graph, model, epochs=3, **run).history) == 3   # done: nothing to run
    with pytest.raises(ValueError, match="is of epoch 2, past this run's 1 epochs"):
        _train(graph, model, epochs=1, **run)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
@pytest.mark.parametrize("command", [["train", *SMALL], ["plan"], ["profile", "--quick"]])
def test_an_output_folder_that_cannot_be_made_is_named_before_any_work(capsys, command):
    """/proc refuses a new folder even to root, which passes every permission check; the bare
    "[Errno 2] No such file or directory" used to come after the graph was loaded."""
    target = "/proc/jgrind-out/p.json" if command[0] == "profile" else "/proc/jgrind-out"
    fails(capsys, [*command, "--out", target], "cannot write the output folder /proc/jgrind-out",
          "name a folder you can write (--out)")


def test_plan_with_more_parts_than_it_considers_says_so(tmp_path, capsys, monkeypatch):
    """Named before a hardware profile is measured (which takes 10-30 s), not as "no partition
    count fits the budgets" after."""
    profile = tmp_path / "profile.json"
    monkeypatch.setenv("JGRIND_PROFILE", str(profile))
    fails(capsys, ["plan", "--set", "num_nodes=300", "--parts", "100000", "--out",
                   str(tmp_path / "plan")], "cannot plan 100,000 partitions",
          "the graph has 300 nodes; ask for at most 300 (--parts)")
    assert not profile.exists()


@pytest.mark.parametrize("options, needle", [
    ("num_features", "expected key:value pairs joined by commas, found 'num_features'"),
    (":3", "found ':3'"),
    ("num_nodes:100", "num_nodes is a setting of its own; pass --set num_nodes=... instead"),
])
def test_malformed_dataset_options(tmp_path, capsys, options, needle):
    out = tmp_path / "run"
    fails(capsys, ["train", *SMALL, "--set", f"dataset_options={options}", "--out", str(out)],
          needle)
    assert not out.exists()


@pytest.mark.parametrize("name, status, said", [("SIGTERM", 143, "jgrind: terminated"),
                                                 ("SIGINT", 130, "jgrind: interrupted")])
def test_sigterm_removes_the_runs_store_files(tmp_path, name, status, said):
    """A batch scheduler's time limit sends SIGTERM: the run stops as for Ctrl-C, and its
    store folder is removed (before, SIGTERM left it behind)."""
    import signal
    import time
    store = tmp_path / "store"
    store.mkdir()
    log = tmp_path / "stderr.txt"
    with open(log, "w") as err:  # a file, not a pipe: nothing blocks on a full pipe
        proc = subprocess.Popen(
            [sys.executable, "-m", "jgrind.cli", "train", "--dataset", "csbm", "--set", "num_nodes=3000",
             "--epochs", "100000", "--policy", "ssd", "--store", str(store), "--parts", "3",
             "--no-progress", "--out", str(tmp_path / "run")], stderr=err)
        try:
            deadline = time.monotonic() + 120
            while not list(store.glob("jgrind-run-*/*.bin")) and time.monotonic() < deadline:
                assert proc.poll() is None, log.read_text()
                time.sleep(0.2)
            assert list(store.glob("jgrind-run-*/*.bin")), "the run never wrote its files"
            proc.send_signal(getattr(signal, name))
            assert proc.wait(timeout=60) == status, log.read_text()
        finally:
            proc.kill()
            proc.wait()
    assert said in log.read_text()
    assert list(store.iterdir()) == []


def test_a_signal_while_the_engine_is_priced_removes_its_store_files(tmp_path, monkeypatch):
    """A signal that lands after the engine made its store files but before `train` holds the
    engine (while a fixed policy's epochs are priced: seconds under load) still removes them;
    the SIGTERM test above left the folder behind now and then at a load of 10."""
    from jgrind.plan import check, policies
    from jgrind.train import train

    def interrupted(*args, **kwargs):
        assert list(tmp_path.glob("jgrind-run-*/*.bin")), "priced before the store was made"
        raise KeyboardInterrupt
    monkeypatch.setattr(check, "engine_prediction", interrupted)
    graph = jgrind.generators.csbm(num_nodes=300, seed=0)
    model = jgrind.models.gcn(graph.num_features, 8, graph.num_classes)
    with pytest.raises(KeyboardInterrupt):
        train(jax.random.key(0), graph, model, optax.adam(0.01), epochs=1, progress=False,
              policy=policies.ssd_offload(str(tmp_path)), num_parts=2)
    assert list(tmp_path.iterdir()) == []


def test_folders_of_killed_runs_in_the_store_are_reported(tmp_path):
    """A run killed outright (SIGKILL) cannot clean up: the next run names its folder and
    size, and counts it in the free-space error, but leaves it alone (on a shared disk the
    process may be another machine's)."""
    from jgrind.engine.store import StoreError, make_run_dir
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = tmp_path / f"jgrind-run-{dead.pid}-0123456789ab"
    left.mkdir()
    (left / "activation-1.bin").write_bytes(b"\0" * 4096)
    mine = tmp_path / f"jgrind-run-{os.getpid()}-ba9876543210"  # a live process's: not named
    mine.mkdir()
    with pytest.warns(UserWarning, match=rf"1 folder\(s\) of earlier runs whose process is "
                                         rf"gone hold 0.00 GiB there \({left.name}\)"):
        run_dir = make_run_dir(tmp_path, 0, b"x" * 16)
    assert left.exists() and run_dir.exists()
    with pytest.warns(UserWarning), pytest.raises(StoreError, match=left.name):
        make_run_dir(tmp_path, 1 << 60, b"y" * 16)


def test_a_sigterm_whose_exception_was_lost_still_stops_the_run(tmp_path, monkeypatch):
    """The handler's exception is lost when SIGTERM lands in a garbage-collection callback
    (seen: "Exception ignored in: <function _xla_gc_callback>", and the run went on); the
    request it recorded stops the trainer and the engine at their next check."""
    from jgrind import interrupts
    from jgrind.engine import OutOfCore
    monkeypatch.setattr(interrupts, "_requested", None)
    graph = jgrind.generators.csbm(num_nodes=300, seed=0)
    model = jgrind.models.gcn(graph.num_features, 8, graph.num_classes)
    store = tmp_path / "store"
    store.mkdir()
    with OutOfCore(graph, model, optax.adam(0.01), num_parts=2,
                   policy=jgrind.policies.ssd_offload(store)) as engine:
        params = model.init(jax.random.key(0))
        engine.loss_and_grad(params, jax.random.key(1))  # runs while nothing is requested
        monkeypatch.setattr(interrupts, "_requested", interrupts.Terminated())
        with pytest.raises(interrupts.Terminated):
            engine.loss_and_grad(params, jax.random.key(1))  # stops at a partition step
    with pytest.raises(interrupts.Terminated):
        jgrind.train(jax.random.key(0), graph, model, optax.adam(0.01), epochs=3,
                     progress=False, policy=jgrind.policies.ssd_offload(store), num_parts=2)
    assert list(store.iterdir()) == []


def test_resume_checks_read_older_run_folders_and_schedules(tmp_path, monkeypatch, capsys):
    """A config.json from before run folders recorded absolute paths still resumes from the
    same directory; a cosine schedule, laid over the run's epochs, is another experiment with
    another epoch count."""
    monkeypatch.chdir(tmp_path)
    assert main(["convert", "--dataset", "csbm", "--set", "num_nodes=300", "--out", "g"]) == 0
    run = ["train", "--dataset", "npy:g", "--no-progress", "--set", "checkpoint_every=1",
           "--out", "run"]
    assert main([*run, "--epochs", "2"]) == 0
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    config["dataset"] = "npy:g"  # as an older jgrind wrote it: relative
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    assert main([*run, "--epochs", "3"]) == 0
    cosine = [*run[:-1], "cos", "--set", "lr_schedule=cosine"]
    assert main([*cosine, "--epochs", "2"]) == 0
    fails(capsys, [*cosine, "--epochs", "4"], "another experiment (epochs 2 -> 4)")


@pytest.fixture(autouse=True)
def _release_run_folders():
    """Run folders made here by `make_run_dir` alone (no store closes them): drop their
    reservation locks after each test."""
    yield
    from jgrind.hostio import disk_space
    for folder in list(disk_space._HELD):
        disk_space.release(folder)


def test_space_promised_to_a_running_run_is_not_free(tmp_path):
    """Two runs on one store directory: the second counts what the first's plan will still
    write (its files are sparse, so the disk's free space shows only what is written)."""
    import shutil
    from jgrind.hostio import disk_space
    from jgrind.engine.store import StoreError, make_run_dir
    free = shutil.disk_usage(tmp_path).free
    first = make_run_dir(tmp_path, free * 3 // 4, b"a" * 16)  # this process: alive
    with pytest.raises(StoreError, match=rf"GiB is promised to 1 other running jgrind run\(s\) "
                                         rf"that have not written it yet \({first.name}"):
        make_run_dir(tmp_path, free // 2, b"b" * 16)
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # the refused run left nothing
    second = make_run_dir(tmp_path, free // 8, b"c" * 16)  # what is left still fits
    assert second.exists()
    # a sparse file holds no blocks: still promised in full; written bytes are on the disk's
    # books already, so the promise shrinks by them
    with open(first / "activation-1.bin", "wb") as f:
        f.truncate(free // 4)
    promised = dict(disk_space.promised(tmp_path))
    assert promised[first] >= free * 3 // 4 - 4096
    (first / "gradient-1.bin").write_bytes(b"\1" * (1 << 20))
    shrunk = dict(disk_space.promised(tmp_path))[first]
    assert promised[first] - (1 << 20) - 65536 <= shrunk <= promised[first] - (1 << 20)
    # a reservation whose process has ended, or whose pid another process has taken since
    # (another start time), promises nothing: its lock went with the process
    import json
    disk_space.release(first)
    record = json.loads((first / "reserved.json").read_text())
    (first / "reserved.json").write_text(json.dumps({**record, "started": -1}))
    assert first not in dict(disk_space.promised(tmp_path))
    with pytest.warns(UserWarning, match=f"process is gone .*{first.name}"):
        assert make_run_dir(tmp_path, free // 2, b"d" * 16).exists()


def test_two_runs_starting_together_cannot_claim_the_same_space(tmp_path, monkeypatch):
    """The check and the reservation happen under a lock on the store directory: with the
    window between them widened, one of two simultaneous runs still sees the other's claim."""
    import shutil
    import threading
    import time
    from jgrind.hostio import disk_space
    from jgrind.engine.store import StoreError, make_run_dir
    real = disk_space.promised

    def slow(root):
        found = real(root)
        time.sleep(0.3)  # both would pass the check here without the lock
        return found
    monkeypatch.setattr(disk_space, "promised", slow)
    free = shutil.disk_usage(tmp_path).free
    outcomes, barrier = [], threading.Barrier(2)

    def start(tag):
        barrier.wait()
        try:
            outcomes.append(make_run_dir(tmp_path, free * 3 // 4, tag))
        except StoreError as err:
            outcomes.append(err)
    threads = [threading.Thread(target=start, args=(bytes([65 + i]) * 16,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(type(o).__name__ for o in outcomes) == ["PosixPath", "StoreError"]


def test_a_moved_dataset_resumes_and_a_changed_one_is_refused(tmp_path, capsys):
    """A saved graph moved to another folder may resume its run's checkpoints (their graph
    fingerprint says it is the same graph); a different graph under the old settings may
    not, and nothing of the run is replaced."""
    import shutil
    first, second = tmp_path / "a", tmp_path / "b"
    assert main(["convert", "--dataset", "csbm", "--set", "num_nodes=300", "--out",
                 str(first)]) == 0
    out = tmp_path / "run"
    run = ["train", "--epochs", "2", "--set", "checkpoint_every=1", "--out", str(out)]
    assert main([*run, "--dataset", f"npy:{first}"]) == 0
    shutil.move(first, second)
    run[2] = "4"
    assert main([*run, "--dataset", f"npy:{second}"]) == 0
    assert len((out / "metrics-seed0.jsonl").read_text().splitlines()) == 4
    capsys.readouterr()
    assert main(["convert", "--dataset", "csbm", "--set", "num_nodes=300", "--set",
                 "avg_degree=6", "--out", str(second), "--overwrite"]) == 0
    before = (out / "summary.json").read_text()
    run[2] = "6"
    fails(capsys, [*run, "--dataset", f"npy:{second}"], "was trained on another graph",
          "edges 2828 -> 1740")
    assert (out / "summary.json").read_text() == before


def test_a_run_folder_whose_pid_was_reused_is_a_leftover(tmp_path):
    """A killed run's pid taken since by another process: its reservation's start time tells
    them apart, so the folder is reported as left over and promises no space."""
    import json
    from jgrind.hostio import disk_space
    from jgrind.engine.store import leftover_runs
    folder = tmp_path / f"jgrind-run-{os.getpid()}-0123456789ab"  # a live pid: this process
    folder.mkdir()
    (folder / "reserved.json").write_text(json.dumps(
        {"bytes": 1 << 30, "pid": os.getpid(), "started": -1}))  # another process's start
    (folder / "activation-1.bin").write_bytes(b"\0" * 4096)
    assert [p for p, _ in leftover_runs(tmp_path)] == [folder]
    assert disk_space.promised(tmp_path) == []
    started = disk_space.process_start(os.getpid())
    (folder / "reserved.json").write_text(json.dumps(
        {"bytes": 1 << 30, "pid": os.getpid(), "started": started}))
    assert leftover_runs(tmp_path) == [] and len(disk_space.promised(tmp_path)) == 1


def test_a_run_whose_pid_is_not_visible_but_holds_its_lock_still_counts(tmp_path):
    """A run in another container on this machine (another pid namespace) has a folder whose
    pid is gone from here; the lock on its reservation shows it runs: its unwritten bytes
    still count against the disk, and its folder is no leftover."""
    import json
    import shutil
    import subprocess
    import sys
    import textwrap
    from jgrind.hostio import disk_space
    from jgrind.engine.store import leftover_runs
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    folder = tmp_path / f"jgrind-run-{gone.pid}-0123456789ab"
    folder.mkdir()
    (folder / disk_space.RESERVATION).write_text(json.dumps({"bytes": 1 << 40,
                                                            "pid": gone.pid}))
    assert disk_space.promised(tmp_path) == [] and len(leftover_runs(tmp_path)) == 1
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, sys
            fh = open({str(folder / disk_space.RESERVATION)!r}, "rb")
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            print("locked", flush=True)
            sys.stdin.read()
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert disk_space.promised(tmp_path) == [(folder, 1 << 40)]
        assert leftover_runs(tmp_path) == []
    finally:
        holder.communicate("", timeout=60)
    shutil.rmtree(folder)


def test_a_store_holds_its_reservation_locked_until_it_closes(tmp_path):
    from jgrind.hostio import disk_space
    from jgrind.engine.store import Store
    from jgrind.hostio.owner_locks import held_by_another
    store = Store([10, 10], tmp_path, host_cache_bytes=0, ssd_bytes_needed=1 << 20)
    folder = store.run_dir
    assert held_by_another(folder / disk_space.RESERVATION)
    store.close()
    assert not folder.exists() and folder not in disk_space._HELD
