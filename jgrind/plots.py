"""Figures a person would rather look at than read: loss and validation curves.

Matplotlib with the Agg backend (no display needed); every function writes a PNG and returns
its path.
"""

from __future__ import annotations

import pathlib
from typing import Sequence


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def plot_training(histories: Sequence[list], path: str | pathlib.Path, *, metric: str,
                  labels: Sequence[str] | None = None, title: str = "") -> pathlib.Path:
    """Training loss (left) and validation/test metric (right) per epoch, one line per run."""
    plt = _pyplot()
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(11, 4))
    labels = labels or [f"run {i}" for i in range(len(histories))]
    for history, label in zip(histories, labels):
        ax_loss.plot([r["epoch"] for r in history], [r["loss"] for r in history], label=label)
        evaluated = [r for r in history if "val" in r]
        line, = ax_metric.plot([r["epoch"] for r in evaluated], [r["val"] for r in evaluated],
                               label=f"{label} val")
        ax_metric.plot([r["epoch"] for r in evaluated], [r["test"] for r in evaluated],
                       linestyle="--", color=line.get_color(), alpha=0.6)
    ax_loss.set(xlabel="epoch", ylabel="training loss", yscale="log", title="loss")
    ax_metric.set(xlabel="epoch", ylabel=metric, title=f"{metric} (solid val, dashed test)")
    for ax in (ax_loss, ax_metric):
        ax.grid(alpha=0.3)
    if len(histories) <= 10:
        ax_loss.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
