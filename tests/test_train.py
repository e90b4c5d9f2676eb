import json

import jax
import numpy as np
import optax
import pytest

from jgrind import from_edges, metrics, models
from jgrind.train import InMemory, run_trials, train

from helpers import community_graph


def _setup(**kw):
    g = community_graph(num_nodes=300, **kw)
    return g, models.gcn(g.num_features, 16, g.num_classes, dropout=0.3)


def test_learns_and_selects_on_validation(tmp_path):
    g, model = _setup()
    r = train(jax.random.key(0), g, model, optax.adam(0.02), epochs=60, progress=False,
              log_path=tmp_path / "log.jsonl")
    assert r.val > 0.8 and r.test > 0.8
    assert r.history[0]["loss"] > 2 * r.history[-1]["loss"]
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(lines) == 60 and json.loads(lines[5])["epoch"] == 5
    best = max(h["val"] for h in r.history)
    assert r.val == best and r.history[r.best_epoch]["test"] == r.test


def test_same_seed_same_numbers_other_seed_differs():
    g, model = _setup()
    run = lambda s: train(jax.random.key(s), g, model, optax.adam(0.01), epochs=5,  # noqa
                          progress=False)
    a, b, c = run(1), run(1), run(2)
    assert [h["loss"] for h in a.history] == [h["loss"] for h in b.history]
    assert a.history[-1]["loss"] != c.history[-1]["loss"]


def test_loss_is_mean_over_training_nodes():
    g, model = _setup()
    ex = InMemory(g, model, optax.sgd(0.1))
    params = model.init(jax.random.key(0))
    loss, _ = ex.loss_and_grad(params, None)
    logits = ex.predict(params)
    mask = g.train_mask[0]
    assert float(loss) == pytest.approx(metrics.cross_entropy(logits, g.labels, mask), rel=1e-5)


def test_resume_ends_with_same_parameters(tmp_path):
    g, model = _setup()
    opt = optax.adam(0.01)
    straight = train(jax.random.key(4), g, model, opt, epochs=9, progress=False)
    ckpt = tmp_path / "ckpt"
    train(jax.random.key(4), g, model, opt, epochs=5, progress=False, checkpoint_dir=ckpt,
          checkpoint_every=2)  # "interrupted" after epoch 4 (last checkpoint: 4)
    resumed = train(jax.random.key(4), g, model, opt, epochs=9, progress=False,
                    checkpoint_dir=ckpt, checkpoint_every=2)
    assert len(resumed.history) == 9
    for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert resumed.test == straight.test


def test_a_resumed_run_stops_early_where_an_uninterrupted_one_does(tmp_path):
    """The early-stopping count is part of the checkpoint: a run interrupted while its
    validation metric was not improving, then resumed, stops at the same epoch as one that ran
    straight through, and a run that had stopped stays stopped when it is run again."""
    g, model = _setup()
    opt = optax.adam(0.05)
    run = lambda epochs, ckpt=None: train(  # noqa: E731
        jax.random.key(0), g, model, opt, epochs=epochs, patience=3, progress=False,
        checkpoint_dir=ckpt, checkpoint_every=1)
    straight = run(300)
    stopped = len(straight.history)
    assert stopped < 300 and straight.history[-1]["epoch"] - straight.best_epoch == 3
    ckpt = tmp_path / "ckpt"
    run(stopped - 2, ckpt)  # interrupted two evaluations without improvement in
    resumed = run(300, ckpt)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in straight.history]
    again = run(300, ckpt)  # the finished run, run again: nothing more to do
    assert len(again.history) == stopped and again.test == straight.test
    for a, b in zip(jax.tree.leaves(straight.params), jax.tree.leaves(again.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # the epochs before the resume count in the run's time
    assert again.seconds == pytest.approx(sum(h["seconds"] for h in again.history))


def test_optimizers_that_take_the_loss_get_it(tmp_path):
    """optax.contrib.reduce_on_plateau reads the loss (update(..., value=)); in memory and out
    of core alike."""
    g, model = _setup()
    # rtol=0.5: a loss that falls by less than half counts as a plateau, so the rate is cut
    opt = optax.chain(optax.adam(0.05), optax.contrib.reduce_on_plateau(patience=1,
                                                                         factor=0.1, rtol=0.5))
    a = train(jax.random.key(0), g, model, opt, epochs=12, progress=False)
    b = train(jax.random.key(0), g, model, opt, epochs=12, progress=False,
              policy=__import__("jgrind").policies.host_offload(), num_parts=3)
    np.testing.assert_allclose([h["loss"] for h in a.history],
                               [h["loss"] for h in b.history], rtol=1e-5)
    plain = train(jax.random.key(0), g, model, optax.adam(0.05), epochs=12, progress=False)
    assert [h["loss"] for h in a.history] != [h["loss"] for h in plain.history]


def test_multi_split_and_trials():
    g, model = _setup(splits=3)
    trials = run_trials(lambda s: train(jax.random.key(s), g, model, optax.adam(0.02),
                                        epochs=20, split=s % 3, progress=False), [0, 1, 2])
    assert len(trials.results) == 3 and 0 < trials.mean <= 1
    tests = [r.test for r in trials.results]
    assert len(set(tests)) > 1  # else the std below cannot tell ddof 1 from ddof 0
    # the sample std (ddof 1), as torch.std and PyG's / OGB's example scripts report it
    assert trials.std == pytest.approx(np.std(tests, ddof=1))
    assert trials.val_mean == pytest.approx(np.mean([r.val for r in trials.results]))
    assert "3 seeds" in trials.summary()
    one = run_trials(lambda s: trials.results[0], [0])
    assert one.std == 0.0 and one.val_std == 0.0
    with pytest.raises(ValueError, match="split 3 does not exist"):
        train(jax.random.key(0), g, model, optax.adam(0.01), epochs=1, split=3,
              progress=False)


def test_roc_auc_matches_pair_counting_with_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 5, 200).astype(float)
    labels = rng.integers(0, 2, 200)
    mask = np.ones(200, bool)
    pos, neg = scores[labels == 1], scores[labels == 0]
    pairs = (pos[:, None] > neg[None]).mean() + 0.5 * (pos[:, None] == neg[None]).mean()
    assert metrics.roc_auc(scores, labels, mask) == pytest.approx(pairs)
    assert np.isnan(metrics.roc_auc(scores, np.ones(200, int), mask))


def test_binary_tasks_use_roc_auc():
    g = community_graph(num_nodes=200, num_classes=2)
    model = models.gcn(g.num_features, 8, 2)
    r = train(jax.random.key(0), g, model, optax.adam(0.02), epochs=10, progress=False)
    assert r.metric == "roc_auc" and 0.5 < r.test <= 1.0


def test_selection_by_validation_loss_and_min_delta():
    # a weak signal and no dropout: the validation loss turns up after about 15 epochs
    g = community_graph(num_nodes=300, homophily=0.5, num_features=4)
    model = models.gcn(g.num_features, 32, g.num_classes, dropout=0.0)
    run = lambda **kw: train(jax.random.key(0), g, model, optax.adam(0.05), epochs=60,  # noqa
                             progress=False, **kw)
    by_loss = run(select="val_loss")
    losses = [h["val_loss"] for h in by_loss.history]
    assert by_loss.best_epoch == int(np.argmin(losses))
    assert by_loss.val == by_loss.history[by_loss.best_epoch]["val"]
    by_metric = run()
    assert by_metric.best_epoch == int(np.argmax([h["val"] for h in by_metric.history]))
    assert by_metric.best_epoch != by_loss.best_epoch  # so the test tells the two apart
    # patience watches the same score; min_delta asks for more than a hair's improvement
    stopped = run(select="val_loss", patience=3)
    best = stopped.best_epoch
    assert len(stopped.history) == best + 4
    assert all(h["val_loss"] >= stopped.history[best]["val_loss"]
               for h in stopped.history[best + 1:])
    strict = run(select="val_loss", min_delta=0.05)
    kept = [strict.history[0]["val_loss"]]  # each new best beats the last by more than 0.05
    for h in strict.history[1:]:
        if h["val_loss"] < kept[-1] - 0.05:
            kept.append(h["val_loss"])
    assert strict.history[strict.best_epoch]["val_loss"] == kept[-1]
    assert strict.best_epoch < by_loss.best_epoch
    with pytest.raises(ValueError, match="unknown select 'loss'"):
        run(select="loss")
    with pytest.raises(ValueError, match="min_delta must be a finite number"):
        run(min_delta=-1)


def _smoothed(logits, labels, eps=0.2):
    """Label-smoothed cross entropy per node: a loss other than the default."""
    import jax.numpy as jnp
    logp = jax.nn.log_softmax(logits, axis=-1)
    onehot = jax.nn.one_hot(labels, logits.shape[-1])
    target = (1 - eps) * onehot + eps / logits.shape[-1]
    return -jnp.sum(target * logp, axis=-1)


def test_a_custom_node_loss_trains_the_same_in_memory_and_out_of_core():
    import jgrind
    from jgrind.engine import OutOfCore
    g, model = _setup()
    params = model.init(jax.random.key(1))
    key = jax.random.key(2)
    want_loss, want = InMemory(g, model, optax.sgd(0.1), loss=_smoothed).loss_and_grad(params,
                                                                                       key)
    with OutOfCore(g, model, optax.sgd(0.1), policy=jgrind.policies.host_offload(),
                   num_parts=3, loss=_smoothed) as engine:
        got_loss, got = engine.loss_and_grad(params, key)
    assert float(got_loss) == pytest.approx(float(want_loss), rel=1e-5)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0,
                                   atol=1e-4 * float(np.abs(np.asarray(b)).max()) + 1e-7)
    default_loss, _ = InMemory(g, model, optax.sgd(0.1)).loss_and_grad(params, key)
    assert abs(float(default_loss) - float(want_loss)) > 1e-3  # the hook is what ran
    # through train: the same history both ways, and val_loss is the same node loss
    run = lambda **kw: train(jax.random.key(0), g, model, optax.adam(0.02), epochs=4,  # noqa
                             progress=False, loss=_smoothed, **kw)
    a, b = run(), run(policy=jgrind.policies.host_offload(), num_parts=3)
    np.testing.assert_allclose([h["loss"] for h in a.history], [h["loss"] for h in b.history],
                               rtol=1e-5)
    logits = InMemory(g, model, optax.sgd(0.1)).predict(a.params)
    val = g.val_mask[0] & (g.labels >= 0)
    assert a.history[-1]["val_loss"] == pytest.approx(
        float(np.mean(_smoothed(logits[val], g.labels[val]))), rel=1e-5)


def test_more_metrics_are_logged_per_split():
    g, model = _setup()
    r = train(jax.random.key(0), g, model, optax.adam(0.02), epochs=3, progress=False,
              metrics={"f1": metrics.macro_f1})
    last = r.history[-1]
    logits = InMemory(g, model, optax.sgd(0.1)).predict(r.params)
    for part, mask in (("train", g.train_mask[0]), ("val", g.val_mask[0]),
                       ("test", g.test_mask[0])):
        assert last[f"{part}_f1"] == pytest.approx(metrics.macro_f1(logits, g.labels, mask))
    with pytest.raises(TypeError, match="metrics must map names to functions"):
        train(jax.random.key(0), g, model, optax.adam(0.02), epochs=1, progress=False,
              metrics={"f1": 0.5})


def test_macro_f1_by_hand():
    labels = np.array([0, 0, 1, 1, 2, 5])
    logits = np.eye(6)[[0, 1, 1, 1, 0, 5]]  # predictions 0 1 1 1 0 5
    mask = np.array([True] * 5 + [False])
    # class 0: tp 1, predicted 2, actual 2 -> 0.5; class 1: tp 2, 3, 2 -> 0.8; class 2: 0
    assert metrics.macro_f1(logits, labels, mask) == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert np.isnan(metrics.macro_f1(logits, labels, np.zeros(6, bool)))


def test_smoothed_cross_entropy_matches_the_formula_and_is_the_cli_setting():
    from jgrind.config import RunConfig, build_loss
    from jgrind.loss import SmoothedCrossEntropy
    logits = jax.random.normal(jax.random.key(0), (5, 4))
    labels = np.array([0, 3, 1, 1, 2])
    np.testing.assert_allclose(np.asarray(SmoothedCrossEntropy(0.2)(logits, labels)),
                               np.asarray(_smoothed(logits, labels, 0.2)), rtol=1e-6)
    g = community_graph(num_nodes=60)
    assert build_loss(RunConfig(), g) is None
    assert build_loss(RunConfig(label_smoothing=0.1), g) == SmoothedCrossEntropy(0.1)


@pytest.mark.parametrize("settings, rates", [
    (dict(lr_schedule="cosine", epochs=6, warmup_epochs=2),
     [0.01 / 3, 0.02 / 3, 0.01, None, None, None]),
    (dict(warmup_epochs=3, epochs=6), [0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01]),
])
def test_cli_schedules(settings, rates):
    """`--set lr_schedule=... warmup_epochs=...`: the rate each epoch used is in the log; a
    cosine decays after its warm-up."""
    from jgrind.config import RunConfig, build_optimizer
    g, model = _setup()
    cfg = RunConfig(lr=0.01, **settings)
    logged = [h["lr"] for h in train(jax.random.key(0), g, model, build_optimizer(cfg),
                                     epochs=cfg.epochs, progress=False).history]
    for got, want in zip(logged, rates):
        if want is not None:
            assert got == pytest.approx(want, rel=1e-5)
    if cfg.lr_schedule == "cosine":
        assert np.all(np.diff(logged[2:]) < 0) and logged[-1] > 0


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_cli_optimizers_train(name):
    """`--set optimizer=...`: each optimizer the setting names trains (the loss falls)."""
    from jgrind.config import RunConfig, build_optimizer
    g, model = _setup()
    r = train(jax.random.key(0), g, model, build_optimizer(RunConfig(optimizer=name)),
              epochs=3, progress=False)
    assert r.history[-1]["loss"] < r.history[0]["loss"]


def test_a_loss_that_does_not_hash_runs_out_of_core():
    """A per-node loss written as a plain (unfrozen) dataclass cannot key the steps' cache;
    it gets steps of its own instead of a TypeError."""
    import dataclasses
    import jgrind

    @dataclasses.dataclass
    class Focal:
        gamma: float = 2.0

        def __call__(self, logits, labels):
            ce = _smoothed(logits, labels, 0.0)
            return (1 - jax.numpy.exp(-ce)) ** self.gamma * ce

    g, model = _setup()
    a = train(jax.random.key(0), g, model, optax.adam(0.02), epochs=3, progress=False,
              loss=Focal())
    b = train(jax.random.key(0), g, model, optax.adam(0.02), epochs=3, progress=False,
              loss=Focal(), policy=jgrind.policies.host_offload(), num_parts=2)
    np.testing.assert_allclose([h["loss"] for h in a.history], [h["loss"] for h in b.history],
                               rtol=1e-5)


def test_resume_keeps_the_selection_rule_and_reads_older_checkpoints(tmp_path):
    import orbax.checkpoint as ocp
    g = community_graph(num_nodes=300, homophily=0.5, num_features=4)
    model = models.gcn(g.num_features, 32, g.num_classes, dropout=0.0)
    ckpt = tmp_path / "ck"
    run = lambda epochs, **kw: train(jax.random.key(0), g, model, optax.adam(0.05),  # noqa
                                     epochs=epochs, progress=False, checkpoint_dir=ckpt,
                                     checkpoint_every=1, **kw)
    run(10)
    with pytest.raises(ValueError, match="trained with select='val'"):
        run(20, select="val_loss")
    # an older checkpoint: no select, no score, no early-stopping count in its meta
    mgr = ocp.CheckpointManager(ckpt.absolute())
    step = mgr.latest_step()
    meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    old = {**meta, "best": {k: v for k, v in meta["best"].items() if k != "score"}}
    for key in ("select", "stale", "metric", "graph", "checksum"):
        old.pop(key)
    mgr.close()
    (ckpt / str(step) / "meta" / "metadata").write_text(__import__("json").dumps(old))
    with pytest.warns(UserWarning, match="records no fingerprint"), \
            pytest.raises(ValueError, match="trained with select='val'"):  # chose by the metric
        run(20, select="val_loss")
    straight = train(jax.random.key(0), g, model, optax.adam(0.05), epochs=30, patience=4,
                     progress=False)
    with pytest.warns(UserWarning, match="records no fingerprint of its graph"):
        resumed = run(30, patience=4)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in straight.history]
    assert resumed.best_epoch == straight.best_epoch


def test_resume_refuses_a_checkpoint_of_another_graph(tmp_path):
    from jgrind.checkpoint import CheckpointMismatch
    from jgrind.datasets import load_saved, save_graph
    g = community_graph(num_nodes=300, homophily=0.5, num_features=4)
    model = models.gcn(g.num_features, 16, g.num_classes, dropout=0.0)
    ckpt = tmp_path / "ck"
    run = lambda graph, epochs: train(jax.random.key(0), graph, model, optax.adam(0.05),  # noqa
                                      epochs=epochs, progress=False, checkpoint_dir=ckpt,
                                      checkpoint_every=1)
    run(g, 2)
    # same sizes, other contents: only a fingerprint of the arrays tells
    features = np.array(g.features)
    features[17, 2] += 1.0
    labels = np.array(g.labels)
    labels[g.train_mask[0]] = (labels[g.train_mask[0]] + 1) % g.num_classes
    for other, part in ((g.replace(features=features), "features"),
                        (g.replace(labels=labels), "labels"),
                        (g.replace(val_mask=g.test_mask, test_mask=g.val_mask), "masks")):
        with pytest.raises(CheckpointMismatch, match=f"another graph .*its {part} differ"):
            run(other, 4)
    src, dst = np.array(g.indices), np.repeat(np.arange(300), np.diff(g.indptr))
    src[5] = (src[5] + 1) % 300  # one edge rewired: same sizes
    rewired = from_edges(src, dst, g.features, g.labels, num_classes=g.num_classes,
                         train_mask=g.train_mask, val_mask=g.val_mask, test_mask=g.test_mask)
    with pytest.raises(CheckpointMismatch, match="its edges differ"):
        run(rewired, 4)
    smaller = community_graph(num_nodes=290, homophily=0.5, num_features=4)
    with pytest.raises(CheckpointMismatch, match="nodes 300 -> 290"):
        run(smaller, 4)
    # other features: another graph, said as such (not "another model": the shapes differ too)
    wider = community_graph(num_nodes=300, homophily=0.5, num_features=5)
    with pytest.raises(CheckpointMismatch, match="another graph .*features 4 -> 5"):
        train(jax.random.key(0), wider, models.gcn(5, 16, g.num_classes, dropout=0.0),
              optax.adam(0.05), epochs=4, progress=False, checkpoint_dir=ckpt,
              checkpoint_every=1)
    # another metric would mix two scores in one log and one choice of the best epoch
    with pytest.raises(CheckpointMismatch, match="trained with metric='accuracy'"):
        train(jax.random.key(0), g, model, optax.adam(0.05), epochs=4, progress=False,
              checkpoint_dir=ckpt, checkpoint_every=1, metric="macro_f1")
    # the same graph, memory-mapped from a saved copy: resumed
    save_graph(g, tmp_path / "copy")
    resumed = run(load_saved(tmp_path / "copy"), 4)
    assert resumed.first_epoch == 2 and len(resumed.history) == 4


def test_a_graph_without_edges_has_a_fingerprint():
    g = from_edges([], [], np.ones((4, 3)), [0, 1, 0, 1], train_mask=[True, True, False, False])
    assert g.fingerprint()["edges"] == 0
    assert g.fingerprint() != g.replace(features=np.zeros((4, 3))).fingerprint()


def test_an_undefined_validation_score_is_warned_about():
    g = community_graph(num_nodes=120, num_classes=2)
    val = np.array(g.val_mask)
    val[0] &= g.labels == 0  # one class only in validation: ROC-AUC is undefined
    g = g.replace(val_mask=val)
    model = models.gcn(g.num_features, 8, 2)
    with pytest.warns(UserWarning, match=r"the validation roc_auc \(split 0\), is undefined"
                                         r".*every validation node has one class"):
        train(jax.random.key(0), g, model, optax.adam(0.01), epochs=2, progress=False)
    empty = g.replace(val_mask=np.zeros_like(g.val_mask))
    with pytest.warns(UserWarning, match=r"the validation loss \(split 0\).*mask is empty;"):
        train(jax.random.key(0), empty, model, optax.adam(0.01), epochs=2, progress=False,
              select="val_loss")
    with pytest.raises(ValueError, match="'roc_auc' scores binary tasks .* 3 classes"):
        g3 = community_graph(num_nodes=120, num_classes=3)
        train(jax.random.key(0), g3, models.gcn(g3.num_features, 8, 3), optax.adam(0.01),
              epochs=1, progress=False, metric="roc_auc")
