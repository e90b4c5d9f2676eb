"""Figures a person would rather look at than read: loss and validation curves.

Matplotlib with the Agg backend (no display needed); every function writes a PNG and returns
its path.
"""

from __future__ import annotations

import math
import pathlib
from typing import Sequence


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path) -> pathlib.Path:
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_training(histories: Sequence[list], path: str | pathlib.Path, *, metric: str,
                  labels: Sequence[str] | None = None, title: str = "",
                  best_epochs: Sequence[int] | None = None) -> pathlib.Path:
    """Training loss, and validation loss where evaluated (left), and validation/test metric
    (right) per epoch, one colour per run; a star at each run's selected epoch
    (``best_epochs``, default: its best validation metric), on both panels, so that a choice
    by the validation loss (``select="val_loss"``) shows what chose it."""
    plt = _pyplot()
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(11, 4))
    labels = labels or [f"run {i}" for i in range(len(histories))]
    best_epochs = best_epochs or [None] * len(histories)
    for history, label, chosen in zip(histories, labels, best_epochs):
        trained, = ax_loss.plot([r["epoch"] for r in history], [r["loss"] for r in history],
                                label=label)
        checked = [r for r in history if r.get("val_loss") is not None
                   and math.isfinite(r["val_loss"])]
        ax_loss.plot([r["epoch"] for r in checked], [r["val_loss"] for r in checked],
                     linestyle="--", color=trained.get_color(), alpha=0.6)
        evaluated = [r for r in history if "val" in r]
        line, = ax_metric.plot([r["epoch"] for r in evaluated], [r["val"] for r in evaluated],
                               label=f"{label} val")
        ax_metric.plot([r["epoch"] for r in evaluated], [r["test"] for r in evaluated],
                       linestyle="--", color=line.get_color(), alpha=0.6)
        if evaluated:  # the model selected (default: the first epoch of the best val)
            best = max(evaluated, key=lambda r: r["val"]) if chosen is None else \
                next(r for r in evaluated if r["epoch"] == chosen)
            ax_metric.plot([best["epoch"]], [best["test"]], marker="*", markersize=11,
                           color=line.get_color(), linestyle="none")
            if best in checked:
                ax_loss.plot([best["epoch"]], [best["val_loss"]], marker="*", markersize=11,
                             color=trained.get_color(), linestyle="none")
    ax_loss.set(xlabel="epoch", ylabel="loss", yscale="log",
                title="loss (solid training, dashed validation)")
    ax_metric.set(xlabel="epoch", ylabel=metric,
                  title=f"{metric}: solid val, dashed test, * selected")
    for ax in (ax_loss, ax_metric):
        ax.grid(alpha=0.3)
    if len(histories) <= 10:
        ax_loss.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return _save(plt, fig, path)


def plot_memory(timeline, path: str | pathlib.Path, *, budgets: dict | None = None,
                title: str = "") -> pathlib.Path:
    """Bytes held in each tier (device, host, SSD) over the run, from the store's accounts
    timeline ``[(seconds, device, host, ssd), ...]``: the blocks it stores (host: its tables
    and its cache), not the steps' working set; budgets drawn as dash-dot lines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4))
    shown = [v for v in (budgets or {}).values() if v]
    if timeline:
        shown += [max(max(sample[1:]) for sample in timeline)]
    unit, scale = _byte_unit(max(shown, default=0))
    if timeline:
        t, device, host, ssd = (list(c) for c in zip(*timeline))
        # distinct styles: a tier that holds nothing must not hide under another at zero
        # the blocks the store holds: the steps' working set on the device is not counted
        for values, label, style in ((device, "device (stored blocks)", "-"),
                                     (host, "host RAM (tables + cache)", "--"),
                                     (ssd, "SSD store", ":")):
            ax.step(t, [v / scale for v in values], where="post", label=label,
                    linestyle=style, linewidth=2 if style == "-" else 1.6)
    for name, value in (budgets or {}).items():
        if value:
            ax.axhline(value / scale, linestyle="-.", linewidth=1, color="gray")
            ax.annotate(f"{name} budget", (0, value / scale), fontsize=8,
                        va="bottom", color="gray")
    ax.set(xlabel="seconds since the store was created", ylabel=f"{unit} held",
           title=title or "memory per tier")
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(plt, fig, path)


def _byte_unit(largest: float) -> tuple[str, float]:
    """The binary unit a byte count reads best in: ``("MiB", 2**20)`` for 5e6."""
    for unit, power in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if largest >= 2.0 ** power:
            return unit, 2.0 ** power
    return "bytes", 1.0
