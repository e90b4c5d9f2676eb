"""Multi-label node classification (ogbn-proteins, PPI, Yelp): ``[N, T]`` binary targets, the
binary cross-entropy loss, per-task ROC-AUC and F1, the OGB loader, and the command line.
(The engine's exactness on multi-label targets is in test_engine.py.)"""

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jgrind import datasets as D, from_edges, generators, metrics, models
from jgrind.graph import GraphError
from jgrind.loss import binary_cross_entropy, node_weights, weighted_loss
from jgrind.train import train


def _targets_graph(targets, **kw):
    n = np.asarray(targets).shape[0]
    src, dst = np.arange(n), np.roll(np.arange(n), 1)
    return from_edges(src, dst, np.ones((n, 2)), targets, **kw)


# -- the Graph ---------------------------------------------------------------------------------
def test_targets_are_stored_as_int8_with_unknowns():
    floats = np.array([[1.0, 0.0, np.nan], [0.0, 1.0, 1.0], [np.nan, np.nan, 0.0]])
    g = _targets_graph(floats, train_mask=[True, True, True])
    assert g.multilabel and g.num_classes == 3 and g.labels.dtype == np.int8
    np.testing.assert_array_equal(g.labels, [[1, 0, -1], [0, 1, 1], [-1, -1, 0]])
    assert "tasks=3" in repr(g)
    booleans = _targets_graph(np.array([[True, False], [False, False]]))
    np.testing.assert_array_equal(booleans.labels, [[1, 0], [0, 0]])


def test_a_column_of_class_ids_is_not_multi_label():
    # PyG's and OGB's y for ogbn-arxiv is [N, 1] class ids
    g = _targets_graph(np.array([[0], [4], [2]]))
    assert not g.multilabel and g.num_classes == 5
    np.testing.assert_array_equal(g.labels, [0, 4, 2])


def test_bad_targets_are_named():
    with pytest.raises(GraphError, match="target 2 of node 1, task 0 is not 0 or 1"):
        _targets_graph(np.array([[0, 1], [2, 0]]))
    with pytest.raises(GraphError, match=r"shape \(2, 2\), expected \[2, num_classes=3\]"):
        _targets_graph(np.array([[0, 1], [1, 1]]), num_classes=3)
    with pytest.raises(GraphError, match="node 1 is in a mask of split 0 but has every target unknown"):
        _targets_graph(np.array([[0, 1], [-1, -1]]), train_mask=[True, True])
    with pytest.raises(GraphError, match="targets are <U1"):
        _targets_graph(np.array([["a", "b"], ["c", "d"]]))
    with pytest.raises(GraphError, match=r"\(transposed\? a row per node\)"):
        from_edges([0], [1], np.ones((2, 2)), np.zeros((3, 2)), num_classes=3)


def test_one_hot_labels_read_as_targets_are_warned_about():
    with pytest.warns(UserWarning, match=r"exactly one 1 in every row.*labels.argmax\(1\)"):
        g = _targets_graph(np.eye(3, dtype=np.int64)[[0, 2, 1, 1]])
    assert g.multilabel


def test_a_model_must_predict_every_target():
    g = generators.csbm(200, num_tasks=4)
    models.gcn(g.num_features, 8, 4).check_fits(g)
    with pytest.raises(GraphError, match="4 binary targets per node"):
        models.gcn(g.num_features, 8, 5).check_fits(g)


# -- the loss ----------------------------------------------------------------------------------
def test_binary_cross_entropy_matches_optax_and_skips_unknown_targets():
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(6, 4)) * 3, jnp.float32)
    targets = rng.integers(0, 2, (6, 4)).astype(np.int8)
    want = optax.sigmoid_binary_cross_entropy(logits, targets.astype(np.float32)).mean(-1)
    np.testing.assert_allclose(binary_cross_entropy(logits, jnp.asarray(targets)), want,
                               rtol=1e-6)
    # unknown targets: the node's loss is the mean over its known ones, whatever the logit
    targets[0, 1:] = -1
    targets[1] = -1
    got = binary_cross_entropy(logits, jnp.asarray(targets))
    assert float(got[0]) == pytest.approx(float(optax.sigmoid_binary_cross_entropy(
        logits[0, 0], float(targets[0, 0]))), rel=1e-6)
    assert float(got[1]) == 0.0
    moved = logits.at[0, 2].set(100.0).at[1].set(-50.0)
    np.testing.assert_allclose(binary_cross_entropy(moved, jnp.asarray(targets)), got)


def test_the_full_graph_loss_is_the_mean_over_node_target_pairs():
    # with every target known: OGB's BCEWithLogitsLoss over train nodes x tasks
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(size=(10, 3)), jnp.float32)
    targets = rng.integers(0, 2, (10, 3)).astype(np.int8)
    train = np.arange(10) % 3 != 0
    loss = weighted_loss(None, logits, jnp.asarray(targets), jnp.asarray(node_weights(train)))
    pairs = optax.sigmoid_binary_cross_entropy(logits[train], targets[train].astype(np.float32))
    assert float(loss) == pytest.approx(float(pairs.mean()), rel=1e-6)


# -- metrics -----------------------------------------------------------------------------------
def test_roc_auc_is_the_mean_over_tasks_with_both_classes():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(40, 3))
    targets = rng.integers(0, 2, (40, 3)).astype(np.int8)
    targets[:, 2] = 1          # one class only: left out, as OGB's Evaluator does
    targets[5, 0] = -1         # unknown: left out of its task
    mask = np.arange(40) < 30
    want = np.mean([metrics.roc_auc(scores[:, t], targets[:, t], mask & (targets[:, t] >= 0))
                    for t in (0, 1)])
    assert metrics.roc_auc(scores, targets, mask) == pytest.approx(want)
    assert metrics.evaluate(scores, targets, mask, "roc_auc") == pytest.approx(want)
    # a hand case: task 0 ranks perfectly, task 1 perfectly wrong
    s = np.array([[0.9, 0.1], [0.1, 0.9]])
    assert metrics.roc_auc(s, np.array([[1, 1], [0, 0]]), np.array([True, True])) == 0.5
    assert np.isnan(metrics.roc_auc(s, np.array([[1, 1], [1, 1]]), np.array([True, True])))


def test_roc_auc_task_by_task():
    """Each task's ROC-AUC as a binary task's, NaN where the masked targets hold one class;
    `roc_auc` is the mean of the others. The command line's line names the weakest task."""
    from jgrind.cli import _per_task_line
    rng = np.random.default_rng(9)
    scores = rng.normal(size=(50, 4))
    targets = rng.integers(0, 2, (50, 4)).astype(np.int8)
    targets[:, 2] = 1  # one class only
    targets[rng.random((50, 4)) < 0.2] = -1
    mask = rng.random(50) < 0.7
    per_task = metrics.roc_auc_per_task(scores, targets, mask)
    for t in (0, 1, 3):
        keep = mask & (targets[:, t] >= 0)
        two = np.stack([-scores[:, t], scores[:, t]], 1)
        assert per_task[t] == pytest.approx(metrics.evaluate(two, targets[:, t].astype(np.int32),
                                                             keep, "roc_auc"))
    assert np.isnan(per_task[2])
    assert metrics.roc_auc(scores, targets, mask) == pytest.approx(np.nanmean(per_task))
    line = _per_task_line(per_task)
    low = int(np.nanargmin(per_task))
    assert f"(3 of 4 tasks): lowest {per_task[low]:.4f} (task {low})" in line
    assert line.endswith("1 with one class only, left out")
    with pytest.raises(ValueError, match="multi-label"):
        metrics.roc_auc_per_task(scores[:, 0], targets[:, 0], mask)


def test_f1_scores_of_multi_label_predictions():
    # the unknown target (1, 2) has a positive logit: counted, it would be a false positive
    logits = np.array([[2.0, -1.0, 3.0, -1.0], [-2.0, 1.0, 5.0, -1.0], [1.0, 1.0, 1.0, -1.0]])
    targets = np.array([[1, 0, 0, 0], [0, 1, -1, 0], [0, 1, 1, 0]], np.int8)
    mask = np.ones(3, bool)
    # pooled over the 11 known targets: tp 4 (0,0 1,1 2,1 2,2), fp 2 (0,2 2,0), fn 0
    assert metrics.micro_f1(logits, targets, mask) == pytest.approx(2 * 4 / (2 * 4 + 2))
    # per task, as sklearn's macro F1 on an indicator matrix: task 0 tp 1 fp 1 -> 2/3; task 1
    # tp 2 -> 1; task 2 tp 1 fp 1 -> 2/3; task 3 no true or predicted positive -> 0
    assert metrics.macro_f1(logits, targets, mask) == pytest.approx((2 / 3 + 1 + 2 / 3) / 4)
    # nothing positive, nothing predicted: 0, as sklearn's zero_division default
    assert metrics.micro_f1(-np.ones((2, 2)), np.zeros((2, 2), np.int8), mask[:2]) == 0.0
    with pytest.raises(ValueError, match="accuracy needs one class per node"):
        metrics.evaluate(logits, targets, mask, "accuracy")
    with pytest.raises(TypeError, match="mask must be a bool"):
        metrics.micro_f1(logits, targets, np.ones(3, int))
    # a task with no known target among the masked nodes is left out, as roc_auc does
    hidden = targets.copy()
    hidden[:, 3] = -1
    assert metrics.macro_f1(logits, hidden, mask) == pytest.approx((2 / 3 + 1 + 2 / 3) / 3)
    assert np.isnan(metrics.macro_f1(logits, np.full_like(targets, -1), mask))
    # one class per node: micro F1 is accuracy
    ids = np.array([0, 1, 1])
    assert metrics.micro_f1(logits, ids, mask) == metrics.accuracy(logits, ids, mask)


def test_the_host_loss_matches_the_training_loss():
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(8, 3)).astype(np.float32)
    targets = rng.integers(-1, 2, (8, 3)).astype(np.int8)
    targets[0] = -1
    mask = np.ones(8, bool)
    per_node = np.asarray(binary_cross_entropy(jnp.asarray(logits), jnp.asarray(targets)))
    assert metrics.cross_entropy(logits, targets, mask) == pytest.approx(per_node[1:].mean(),
                                                                         rel=1e-5)


# -- training ----------------------------------------------------------------------------------
def test_training_learns_multi_label_targets_in_memory_and_out_of_core(tmp_path):
    from jgrind import policies
    g = generators.csbm(2000, num_features=16, num_tasks=6, avg_degree=8, seed=0)
    model = models.gcn(g.num_features, 32, g.num_classes, num_layers=2, dropout=0.2)
    kw = dict(epochs=25, progress=False)
    first = train(jax.random.key(0), g, model, optax.adam(0.02), **kw)
    assert first.metric == "roc_auc"
    chance = train(jax.random.key(0), g, model, optax.adam(0.0), **kw)
    assert first.test > 0.75 and chance.test < 0.65, (first.test, chance.test)
    offloaded = train(jax.random.key(0), g, model, optax.adam(0.02), **kw,
                      policy=policies.ssd_offload(tmp_path), num_parts=3)
    assert offloaded.test == pytest.approx(first.test, abs=1e-3)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5),
                 offloaded.params, first.params)
    f1 = train(jax.random.key(0), g, model, optax.adam(0.02), metric="micro_f1",
               **{**kw, "epochs": 2})
    assert f1.metric == "micro_f1" and 0 < f1.test < 1
    with pytest.raises(ValueError, match="'accuracy' needs one class per node"):
        train(jax.random.key(0), g, model, optax.adam(0.02), metric="accuracy", **kw)
    # a class-id loss on multi-label targets: said before training, not a JAX shape error
    from jgrind.loss import SmoothedCrossEntropy
    with pytest.raises(TypeError, match=r"fails on this graph's labels \(multi-label targets"):
        train(jax.random.key(0), g, model, optax.adam(0.02), loss=SmoothedCrossEntropy(0.1),
              **kw)
    with pytest.raises(TypeError, match=r"one float value per node.*gives \(16, 6\)"):
        train(jax.random.key(0), g, model, optax.adam(0.02), **kw,
              loss=lambda logits, y: optax.sigmoid_binary_cross_entropy(logits, y))
    # a loss that trains on -1 as a target: warned about before training
    with pytest.warns(UserWarning, match="seems to train on -1 as a target"):
        train(jax.random.key(0), g, model, optax.adam(0.02), **{**kw, "epochs": 1},
              loss=lambda logits, y: optax.sigmoid_binary_cross_entropy(logits, y).mean(-1))


# -- loading -----------------------------------------------------------------------------------
def _write_gz(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.write("".join(",".join(str(v) for v in row) + "\n" for row in rows))


def _tiny_proteins(tmp_path, name="ogbn_proteins", n=30, tasks=3):
    """The layout of the ogbn-proteins download: no node features, 8 -> here 2 edge features,
    `tasks` binary targets a node, each undirected edge stored once."""
    rng = np.random.default_rng(0)
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, n, (80, 2)) if a < b}
    edges = np.array(sorted(pairs))
    edge_feat = rng.random((len(edges), 2)).round(3)
    targets = rng.integers(0, 2, (n, tasks)).astype(float)
    targets[3, 1] = np.nan
    d = tmp_path / name
    _write_gz(d / "raw/edge.csv.gz", edges.tolist())
    _write_gz(d / "raw/edge-feat.csv.gz", edge_feat.tolist())
    _write_gz(d / "raw/node-label.csv.gz",
              [["nan" if np.isnan(v) else int(v) for v in row] for row in targets])
    _write_gz(d / "raw/num-node-list.csv.gz", [[n]])
    _write_gz(d / "raw/node_species.csv.gz", [[1]] * n)
    for part, ids in zip(("train", "valid", "test"), np.split(rng.permutation(n), [18, 24])):
        _write_gz(d / "split/species" / f"{part}.csv.gz", [[i] for i in ids])
    return d, edges, edge_feat, targets


def test_ogbn_proteins_layout(tmp_path):
    d, edges, edge_feat, targets = _tiny_proteins(tmp_path)
    with pytest.raises(D.DatasetError, match="node_features=edge_mean"):
        D.load(f"ogb:{d}")
    g = D.load(f"ogb:{d}", node_features="edge_mean")
    assert g.multilabel and g.num_classes == 3 and g.labels[3, 1] == -1
    np.testing.assert_array_equal(g.labels[~np.isnan(targets)], targets[~np.isnan(targets)])
    # OGB adds the reverse of every ogbn-proteins edge (add_inverse_edge)
    assert g.num_edges == 2 * len(edges)
    # a node's features: the mean of its incident edges' features, both ends counting
    for node in (0, 7, 19):
        incident = (edges[:, 0] == node) | (edges[:, 1] == node)
        want = edge_feat[incident].mean(0) if incident.any() else np.zeros(2)
        np.testing.assert_allclose(g.features[node], want, rtol=1e-6)
    summed = D.load_ogb_raw(d, node_features="edge_sum")
    incident = (edges[:, 0] == 7) | (edges[:, 1] == 7)
    np.testing.assert_allclose(summed.features[7], edge_feat[incident].sum(0), rtol=1e-6)
    directed = D.load_ogb_raw(d, node_features="edge_mean", to_undirected=False)
    assert directed.num_edges == len(edges)
    with pytest.raises(D.DatasetError, match="node_features='mean': use one of edge_mean"):
        D.load_ogb_raw(d, node_features="mean")


def test_ogb_stores_products_once_and_arxiv_directed(tmp_path):
    # the folder's name says which: OGB's own master.csv add_inverse_edge
    for name, both in (("ogbn_products", True), ("products", True), ("ogbn_arxiv", False)):
        d, edges, *_ = _tiny_proteins(tmp_path, name=name)
        (d / "raw/edge-feat.csv.gz").rename(d / "raw/node-feat-unused.csv.gz")
        _write_gz(d / "raw/node-feat.csv.gz", np.ones((30, 2)).tolist())
        g = D.load_ogb_raw(d)
        assert g.num_edges == (2 if both else 1) * len(edges), name


def test_an_ogb_folder_of_another_name_is_kept_directed_with_a_warning(tmp_path):
    d, edges, *_ = _tiny_proteins(tmp_path, name="my_copy")
    with pytest.warns(UserWarning, match="'my_copy' is not named after an OGB dataset.*"
                                         "to_undirected=True"):
        g = D.load_ogb_raw(d, node_features="edge_mean")
    assert g.num_edges == len(edges)
    assert D.load_ogb_raw(d, node_features="edge_mean", to_undirected=np.True_).num_edges \
        == 2 * len(edges)
    link = tmp_path / "links" / "ogbn_proteins"  # a link named after the dataset: its name counts
    link.parent.mkdir()
    link.symlink_to(d)
    assert D.load_ogb_raw(link, node_features="edge_mean").num_edges == 2 * len(edges)
    (d / "raw/edge-feat.csv.gz").rename(d / "raw/node-feat.csv.gz")
    with pytest.raises(D.DatasetError, match="has no raw/edge-feat.csv.gz; leave node_features"):
        D.load_ogb_raw(d, node_features="edge_mean", to_undirected=False)


def test_bad_ogb_targets_are_named(tmp_path):
    d, *_ = _tiny_proteins(tmp_path)
    _write_gz(d / "raw/node-label.csv.gz", [[0, 1, 1]] * 29 + [[0, 3, 1]])
    with pytest.raises(D.DatasetError, match="line 30 column 2 is 3.0"):
        D.load_ogb_raw(d, node_features="edge_mean")


def test_an_edge_list_with_a_target_matrix(tmp_path):
    (tmp_path / "e.txt").write_text("0 1\n1 2\n2 3\n3 0\n")
    np.save(tmp_path / "features.npy", np.eye(4, 3, dtype=np.float32))
    np.save(tmp_path / "labels.npy", np.array([[1, 0], [0, 1], [1, 1], [0, 0]], np.int64))
    g = D.load(f"edgelist:{tmp_path / 'e.txt'}")
    assert g.multilabel and g.num_classes == 2
    assert (g.train_mask | g.val_mask | g.test_mask).sum() == 4


# -- the command line --------------------------------------------------------------------------
def test_command_line_trains_and_predicts_multi_label(tmp_path, capsys):
    from jgrind.cli import main
    out = tmp_path / "run"
    base = ["train", "--dataset", "csbm", "--epochs", "3", "--out", str(out), "--set",
            "num_nodes=600", "--set", "dataset_options=num_tasks:4"]
    assert main(base + ["--set", "metric=accuracy"]) == 2
    assert "'accuracy' needs one class per node" in capsys.readouterr().err
    assert main(base + ["--set", "label_smoothing=0.1"]) == 2
    assert "label_smoothing smooths one class per node" in capsys.readouterr().err
    assert main([*base[:5], "--out", str(out), "--set", "num_nodes=600", "--set",
                 "multilabel_loss=pair_mean"]) == 2
    assert "pair_mean averages binary targets" in capsys.readouterr().err
    assert not out.exists()  # refused before anything was written
    assert main(base + ["--policy", "host", "--parts", "2", "--set",
                        "multilabel_loss=pair_mean"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metric"] == "roc_auc" and 0 < summary["test_mean"] <= 1
    # the metric the run resolved ('' -> roc_auc) may be named on resume; another may not
    ck = tmp_path / "ck"
    resumable = [*base[:5], "--out", str(ck), "--set", "num_nodes=600", "--set",
                 "dataset_options=num_tasks:4", "--set", "checkpoint_every=1"]
    assert main(resumable) == 0
    resumable[resumable.index("3")] = "4"
    assert main([*resumable, "--set", "metric=roc_auc"]) == 0
    resumable[resumable.index("4")] = "5"
    capsys.readouterr()
    assert main([*resumable, "--set", "metric=micro_f1"]) == 2
    assert "trained with metric='roc_auc'" in capsys.readouterr().err
    save = tmp_path / "logits.npy"
    assert main(["predict", "--run", str(out), "--save", str(save)]) == 0
    assert np.load(save).shape == (600, 4)
    printed = capsys.readouterr().out
    assert "roc_auc of these logits" in printed
    assert "test roc_auc per task (4 of 4 tasks): lowest" in printed


def test_a_saved_multi_label_graph_maps_back_the_same(tmp_path):
    g = generators.csbm(300, num_tasks=3)
    D.save_graph(g, tmp_path / "saved")
    back = D.load(f"npy:{tmp_path / 'saved'}")
    assert back.multilabel and back.labels.dtype == np.int8
    np.testing.assert_array_equal(back.labels, g.labels)
    assert back.fingerprint() == g.fingerprint()


def test_the_pair_mean_loss_from_the_run_settings():
    from jgrind.config import RunConfig, build_loss
    from jgrind.loss import PairMeanBinaryCrossEntropy
    g = generators.csbm(300, num_tasks=4, seed=3)
    targets = np.array(g.labels)
    targets[:100, 1:] = -1  # a third of the nodes keep one known target of four
    g = g.replace(labels=targets, train_mask=np.stack([g.train_mask[0], g.val_mask[0]]),
                  val_mask=np.stack([g.val_mask[0], g.train_mask[0]]),
                  test_mask=np.repeat(g.test_mask, 2, axis=0))
    assert build_loss(RunConfig(), g) is None  # node by node, the default
    for split in (0, 1):  # each split's own training pairs
        loss = build_loss(RunConfig(multilabel_loss="pair_mean"), g, split)
        train_nodes = g.train_mask[split]
        pairs = int(np.sum(targets[train_nodes] >= 0))
        assert loss == PairMeanBinaryCrossEntropy(train_nodes.sum() / pairs)


def test_the_pair_mean_loss_is_bce_over_known_training_pairs():
    from jgrind.loss import pair_mean_binary_cross_entropy
    g = generators.csbm(200, num_tasks=4, seed=2)
    targets = np.array(g.labels)
    targets[np.random.default_rng(5).random(targets.shape) < 0.3] = -1
    targets[:, 0] = g.labels[:, 0]  # every node keeps a known target
    g = g.replace(labels=targets)
    loss = pair_mean_binary_cross_entropy(g)
    logits = jnp.asarray(np.random.default_rng(6).normal(size=(200, 4)), jnp.float32)
    train = g.train_mask[0]
    got = weighted_loss(loss, logits, jnp.asarray(targets), jnp.asarray(node_weights(train)))
    known = train[:, None] & (targets >= 0)
    pairs = optax.sigmoid_binary_cross_entropy(logits, np.maximum(targets, 0).astype(np.float32))
    assert float(got) == pytest.approx(float(pairs[known].mean()), rel=1e-5)
    # node by node (the default) weighs a node with few known targets more: not the same
    by_node = weighted_loss(None, logits, jnp.asarray(targets), jnp.asarray(node_weights(train)))
    assert abs(float(by_node) - float(got)) > 1e-4


def test_the_planned_working_set_counts_the_targets():
    from jgrind.partition import contiguous, partition_graph
    from jgrind.plan.cost import Workload
    sizes = {}
    multi = generators.csbm(400, num_tasks=40)
    ids = multi.replace(labels=np.arange(400) % 40)  # the same graph, a class id per node
    for kind, g in (("ids", ids), ("targets", multi)):
        model = models.sage(g.num_features, 4, 40, num_layers=1)
        pg = partition_graph(g, contiguous(g, 2), num_parts=2)
        w = Workload.build(pg, model)
        sizes[kind] = (w.working_set(), int(w.pad_out.max()))
    (ids, pad), (targets, _) = sizes["ids"], sizes["targets"]
    assert targets - ids == pad * 40 * (1 + 2 * 4)  # int8 targets, the loss and its cotangent


def test_rmat_targets_on_the_same_graph():
    plain = generators.rmat(2000, 16000, num_features=8, num_classes=5)
    multi = generators.rmat(2000, 16000, num_features=8, num_classes=5, num_tasks=7)
    assert multi.multilabel and multi.labels.shape == (2000, 7) and multi.num_classes == 7
    np.testing.assert_array_equal(multi.indices, plain.indices)
    np.testing.assert_array_equal(multi.features, plain.features)
    # a target is its node's class's code, up to the noise: nodes of one class mostly agree
    cls = plain.labels
    agree = np.mean([np.mean(multi.labels[cls == c] == np.round(
        multi.labels[cls == c].mean(0))) for c in np.unique(cls)])
    assert agree > 0.85
    with pytest.raises(ValueError, match="num_tasks must be 0 .* or at least 2"):
        generators.rmat(2000, 16000, num_tasks=1)


# -- positive weights (torch's pos_weight) -------------------------------------------------------
def test_positive_weights_are_torch_pos_weight():
    """``pos_weight[t]`` times the loss of a positive target of task t, the negative term as it
    is: torch's BCEWithLogitsLoss(pos_weight=...) written out in NumPy (float64), unknown
    targets skipped, finite for large logits; all ones is the plain loss."""
    from jgrind.loss import WeightedBinaryCrossEntropy
    rng = np.random.default_rng(7)
    logits = rng.normal(size=(12, 3)) * 4
    logits[0, 0], logits[1, 1] = 60.0, -60.0
    targets = rng.integers(-1, 2, (12, 3)).astype(np.int8)
    targets[0, 0], targets[1, 1] = 0, 1
    pos_weight = (3.0, 0.5, 1.0)
    got = np.asarray(WeightedBinaryCrossEntropy(pos_weight)(jnp.asarray(logits, jnp.float32),
                                                             jnp.asarray(targets)))
    x, y, p = logits, np.maximum(targets, 0), np.asarray(pos_weight)
    log_sig = -np.logaddexp(0, -x)  # log sigmoid(x)
    log_one_minus = -np.logaddexp(0, x)
    pair = -(p * y * log_sig + (1 - y) * log_one_minus)
    known = targets >= 0
    want = np.where(known, pair, 0).sum(1) / np.maximum(known.sum(1), 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.isfinite(got).all()
    assert WeightedBinaryCrossEntropy(np.array([3, 0.5, 1])) == WeightedBinaryCrossEntropy(
        pos_weight)  # any sequence, kept as a hashable tuple of floats
    for bad in ([], [1.0, -2.0], [np.inf]):
        with pytest.raises(ValueError, match="pos_weight must be one finite number above 0"):
            WeightedBinaryCrossEntropy(bad)
    ones = WeightedBinaryCrossEntropy((1.0,) * 3)(jnp.asarray(logits, jnp.float32),
                                                  jnp.asarray(targets))
    np.testing.assert_allclose(ones, binary_cross_entropy(jnp.asarray(logits, jnp.float32),
                                                          jnp.asarray(targets)), rtol=1e-6)


def test_positive_weights_from_the_run_settings():
    from jgrind.config import ConfigError, RunConfig, build_loss
    from jgrind.loss import (PairMeanBinaryCrossEntropy, WeightedBinaryCrossEntropy,
                             positive_weights)
    g = generators.csbm(300, num_tasks=3, seed=3)
    targets = np.array(g.labels)
    targets[:, 2] = 0  # a task without a positive keeps weight 1
    targets[:40, 0] = -1
    g = g.replace(labels=targets)
    train_targets = targets[g.train_mask[0]]
    want = [float(np.sum(train_targets[:, t] == 0) / np.sum(train_targets[:, t] == 1))
            for t in range(2)] + [1.0]
    assert positive_weights(g) == pytest.approx(want)
    assert build_loss(RunConfig(pos_weight="auto"), g) == WeightedBinaryCrossEntropy(
        positive_weights(g))
    assert build_loss(RunConfig(pos_weight="2.5"), g) == WeightedBinaryCrossEntropy(
        (2.5, 2.5, 2.5))
    pair = build_loss(RunConfig(pos_weight="auto", multilabel_loss="pair_mean"), g)
    assert isinstance(pair, PairMeanBinaryCrossEntropy)
    assert pair.pos_weight == positive_weights(g)
    single = generators.csbm(100, seed=0)
    with pytest.raises(ConfigError, match="pos_weight weights binary targets"):
        build_loss(RunConfig(pos_weight="auto"), single)
    with pytest.raises(ConfigError, match="pos_weight must be none, auto or a finite number"):
        RunConfig().with_overrides(["pos_weight=0"])


@pytest.mark.parametrize("pair_mean", [False, True])
def test_positive_weights_are_exact_out_of_core(pair_mean, tmp_path):
    """The weighted loss goes through the engine's fused top step like any other: the same
    loss and gradients in 7 partitions on the SSD tier as in memory."""
    from jgrind.engine import OutOfCore
    from jgrind.loss import WeightedBinaryCrossEntropy, pair_mean_binary_cross_entropy
    from jgrind.partition import random as random_partition
    from jgrind.plan import policies
    from jgrind.train import InMemory
    g = generators.csbm(400, num_features=8, avg_degree=6, num_tasks=4, seed=1)
    targets = np.array(g.labels)
    targets[np.random.default_rng(3).random(targets.shape) < 0.2] = -1
    g = g.replace(labels=targets)
    weights = (4.0, 0.25, 1.5, 2.0)
    loss = (pair_mean_binary_cross_entropy(g, pos_weight=weights) if pair_mean
            else WeightedBinaryCrossEntropy(weights))
    model = models.gcn(8, 16, 4, num_layers=2, dropout=0.3)
    params, key = model.init(jax.random.key(0)), jax.random.key(4)
    ref_loss, ref_grads = InMemory(g, model, optax.sgd(0.1), loss=loss).loss_and_grad(params,
                                                                                       key)
    plain_loss, _ = InMemory(g, model, optax.sgd(0.1)).loss_and_grad(params, key)
    assert abs(float(plain_loss) - float(ref_loss)) > 1e-3  # the weights change the loss
    with OutOfCore(g, model, optax.sgd(0.1), policy=policies.ssd_offload(tmp_path),
                   num_parts=7, store=tmp_path, partitioner=random_partition, loss=loss) as ex:
        got, grads = ex.loss_and_grad(params, key)
    assert float(got) == pytest.approx(float(ref_loss), rel=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 grads, ref_grads)
