"""The figures say what they show: units that fit the numbers, every tier visible, the
selected epoch marked; and the learning rate logged where the optimizer exposes it."""

import jax
import numpy as np
import optax
import pytest

from jgrind import models, plots
from jgrind.train import train

from helpers import community_graph


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions make, kept open for inspection."""
    made = []
    monkeypatch.setattr(plots, "_save", lambda plt, fig, path: made.append(fig) or path)
    return made


def test_memory_plot_uses_a_unit_that_fits_and_shows_every_tier(figures, tmp_path):
    mib = 2 ** 20
    timeline = [(0.0, 0, 0, 0), (1.0, 0, 3 * mib, 5 * mib), (2.0, 0, 0, 5 * mib)]
    plots.plot_memory(timeline, tmp_path / "m.png", budgets={"host": 8 * mib, "device": None})
    ax = figures[-1].axes[0]
    assert ax.get_ylabel() == "MiB held"  # not "0.005 GiB"
    tiers = {line.get_label(): line for line in ax.get_lines() if not
             line.get_label().startswith("_")}
    assert set(tiers) == {"device (stored blocks)", "host RAM (tables + cache)", "SSD store"}
    assert len({line.get_linestyle() for line in tiers.values()}) == 3  # none hides another
    assert max(tiers["SSD store"].get_ydata()) == pytest.approx(5.0)
    plots.plot_memory([(0.0, 2 ** 31, 0, 0)], tmp_path / "g.png")
    assert figures[-1].axes[0].get_ylabel() == "GiB held"


def test_training_plot_marks_the_selected_epoch(figures, tmp_path):
    history = [{"epoch": e, "loss": 1.0 / (e + 1), "val": v, "test": t}
               for e, (v, t) in enumerate([(0.5, 0.4), (0.8, 0.7), (0.8, 0.75), (0.6, 0.9)])]
    plots.plot_training([history], tmp_path / "t.png", metric="accuracy")
    metric_axes = figures[-1].axes[1]
    stars = [line for line in metric_axes.get_lines() if line.get_marker() == "*"]
    assert len(stars) == 1  # the first epoch of the best val, as train selects
    assert list(stars[0].get_xdata()) == [1] and list(stars[0].get_ydata()) == [0.7]
    plots.plot_training([history], tmp_path / "t.png", metric="accuracy", best_epochs=[3])
    star, = [line for line in figures[-1].axes[1].get_lines() if line.get_marker() == "*"]
    assert list(star.get_xdata()) == [3]  # another selection rule (select="val_loss")


def test_training_plot_draws_the_validation_loss_that_can_choose_the_epoch(figures, tmp_path):
    history = [{"epoch": e, "loss": 1.0 / (e + 1), "val": 0.5, "test": 0.5, "val_loss": vl}
               for e, vl in enumerate([2.0, 1.0, 1.5, float("nan")])]
    plots.plot_training([history], tmp_path / "t.png", metric="accuracy", best_epochs=[1])
    loss_axes = figures[-1].axes[0]
    dashed, = [line for line in loss_axes.get_lines() if line.get_linestyle() == "--"]
    assert list(dashed.get_xdata()) == [0, 1, 2]  # NaN (an empty validation set) left out
    assert list(dashed.get_ydata()) == [2.0, 1.0, 1.5]
    star, = [line for line in loss_axes.get_lines() if line.get_marker() == "*"]
    assert list(star.get_xdata()) == [1] and list(star.get_ydata()) == [1.0]


def test_the_learning_rate_is_logged_where_the_optimizer_shows_it():
    g = community_graph(num_nodes=200)
    model = models.gcn(g.num_features, 8, g.num_classes)
    schedule = optax.linear_schedule(0.02, 0.0, 4)
    opt = optax.chain(optax.inject_hyperparams(optax.adam)(learning_rate=schedule),
                      optax.contrib.reduce_on_plateau(patience=1, rtol=0.5, factor=0.5))
    history = train(jax.random.key(0), g, model, opt, epochs=4, progress=False).history
    scales = np.array([h["lr"] for h in history]) / np.array([schedule(e) for e in range(4)])
    assert history[0]["lr"] == pytest.approx(0.02)
    assert np.all(np.diff(scales) <= 0) and scales[-1] < 1  # the plateau cut it
    plain = train(jax.random.key(0), g, model, optax.adam(0.01), epochs=1,
                          progress=False).history
    assert "lr" not in plain[0]
