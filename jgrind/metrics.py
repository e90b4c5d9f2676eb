"""Evaluation metrics on host NumPy arrays (evaluation happens once per epoch, off the hot path)."""

from __future__ import annotations

import numpy as np


def accuracy(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """Fraction of masked nodes whose argmax logit is the label."""
    if not mask.any():
        return float("nan")
    return float(np.mean(np.argmax(logits[mask], -1) == labels[mask]))


def roc_auc(scores: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` (higher = class 1) on the masked nodes.

    The Mann-Whitney U statistic with average ranks for ties, equal to sklearn's
    ``roc_auc_score``. NaN when the mask holds one class only.
    """
    s, y = scores[mask].astype(np.float64), labels[mask]
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_s = s[order]
    ranks = np.empty(s.size, np.float64)
    # average rank over runs of equal scores
    boundaries = np.flatnonzero(np.diff(sorted_s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [s.size]])
    avg = (starts + ends + 1) / 2.0  # 1-based average rank of each run
    ranks[order] = np.repeat(avg, ends - starts)
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def macro_f1(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """The unweighted mean over classes of each class's F1 (argmax predictions), over the
    classes present among the masked labels or predictions, as sklearn's
    ``f1_score(average="macro")`` (a class with no true and no predicted node is left out)."""
    if not mask.any():
        return float("nan")
    y, p = labels[mask], np.argmax(logits[mask], -1)
    classes = np.union1d(y, p)
    tp = np.array([np.sum((p == c) & (y == c)) for c in classes], np.float64)
    predicted = np.array([np.sum(p == c) for c in classes], np.float64)
    actual = np.array([np.sum(y == c) for c in classes], np.float64)
    f1 = np.divide(2 * tp, predicted + actual, out=np.zeros_like(tp),
                   where=predicted + actual > 0)
    return float(f1.mean())


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def cross_entropy(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    if not mask.any():
        return float("nan")
    z = logits[mask] - logits[mask].max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.mean(logp[np.arange(z.shape[0]), labels[mask]]))


def default_metric(num_classes: int) -> str:
    """ROC-AUC for binary tasks (the heterophilous benchmarks' protocol), else accuracy."""
    return "roc_auc" if num_classes == 2 else "accuracy"


def evaluate(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray, metric: str) -> float:
    if metric == "roc_auc":
        return roc_auc(softmax(logits)[:, 1], labels, mask)
    if metric == "accuracy":
        return accuracy(logits, labels, mask)
    raise ValueError(f"unknown metric {metric!r}; use 'accuracy' or 'roc_auc'")
