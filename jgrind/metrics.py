"""Evaluation metrics on host NumPy arrays (evaluation happens once per epoch, off the hot path).

Every metric takes ``(logits [N, C], labels, mask [N])``. ``labels`` are class ids ``[N]``
(-1 unlabelled), or the binary targets ``[N, T]`` of a multi-label task (-1 unknown), where a
logit above 0 predicts 1.
"""

from __future__ import annotations

import numpy as np


def _mask(mask) -> np.ndarray:
    mask = np.asarray(mask)
    if mask.dtype != bool:  # 0/1 integers would index rows 0 and 1
        raise TypeError(f"a metric's mask must be a bool [N] array, got {mask.dtype}; pass "
                        "ids as a mask with np.isin(np.arange(N), ids)")
    return mask


def accuracy(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """Fraction of masked nodes whose argmax logit is the label (one class per node)."""
    mask = _mask(mask)
    if labels.ndim == 2:
        raise ValueError("accuracy needs one class per node, but the labels are multi-label "
                         "targets [N, T]; use roc_auc, micro_f1 or macro_f1")
    if not mask.any():
        return float("nan")
    return float(np.mean(np.argmax(logits[mask], -1) == labels[mask]))


def roc_auc(scores: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """Area under the ROC curve of ``scores`` (higher = class 1) on the masked nodes.

    The Mann-Whitney U statistic with average ranks for ties, equal to sklearn's
    ``roc_auc_score``. NaN when the mask holds one class only.

    Multi-label (``scores`` and ``labels`` ``[N, T]``): the mean over tasks of each task's
    ROC-AUC on its masked, known targets, leaving out tasks with one class only there: OGB's
    ``Evaluator`` for ogbn-proteins. NaN when no task has both.
    """
    mask = _mask(mask)
    if labels.ndim == 2:
        per_task = roc_auc_per_task(scores, labels, mask)
        per_task = per_task[~np.isnan(per_task)]
        return float(np.mean(per_task)) if per_task.size else float("nan")
    return _binary_auc(scores[mask], labels[mask])


def roc_auc_per_task(scores: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``[T]``: each task's ROC-AUC on its masked, known targets (multi-label ``scores`` and
    ``labels`` ``[N, T]``), NaN for a task with one class only there; `roc_auc` is their mean
    over the others. Which tasks a model fails shows here, not in the mean."""
    if labels.ndim != 2:
        raise ValueError("per-task ROC-AUC needs multi-label targets [N, T]")
    mask = _mask(mask)
    return np.array([_binary_auc(scores[:, t][mask], labels[:, t][mask])
                     for t in range(labels.shape[1])], np.float64)


def _binary_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    keep = labels >= 0
    s, y = scores[keep].astype(np.float64), labels[keep]
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


def micro_f1(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """F1 of every masked (node, target) decision pooled: sklearn's ``f1_score(
    average="micro")``, the metric of PPI and Yelp (GraphSAINT). Multi-label: a logit above 0
    predicts 1, unknown targets are left out, and with no true and no predicted positive it is
    0 (sklearn's ``zero_division`` default). One class per node: equal to `accuracy`."""
    mask = _mask(mask)
    if labels.ndim != 2:
        return accuracy(logits, labels, mask)
    y, known = labels[mask], labels[mask] >= 0
    if not known.any():
        return float("nan")
    predicted = logits[mask] > 0
    tp = np.sum(predicted & (y == 1) & known)
    wrong = np.sum((predicted != (y == 1)) & known)  # false positives + false negatives
    return float(2 * tp / (2 * tp + wrong)) if tp + wrong else 0.0


def macro_f1(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """The unweighted mean over classes of each class's F1 (argmax predictions), over the
    classes present among the masked labels or predictions, as sklearn's
    ``f1_score(average="macro")`` (a class with no true and no predicted node is left out):
    the Macro-F1 that HGSL (Zhao et al., AAAI 2021) and HAN report on DBLP's test nodes, beside
    `micro_f1`.
    Multi-label: the mean over tasks of each task's F1 (a logit above 0 predicts 1) on its
    known targets, a task with no true and no predicted positive scoring 0, as sklearn's
    ``f1_score(average="macro")`` on an indicator matrix; a task with no known target among
    the masked nodes is left out (NaN if every one is), as `roc_auc` leaves it out."""
    mask = _mask(mask)
    if not mask.any():
        return float("nan")
    if labels.ndim == 2:
        y, known, predicted = labels[mask], labels[mask] >= 0, logits[mask] > 0
        tp = np.sum(predicted & (y == 1) & known, axis=0).astype(np.float64)
        positives = np.sum(predicted & known, axis=0) + np.sum((y == 1) & known, axis=0)
        f1 = np.divide(2 * tp, positives, out=np.zeros_like(tp), where=positives > 0)
        scored = known.any(axis=0)
        return float(f1[scored].mean()) if scored.any() else float("nan")
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
    """The mean loss of the masked nodes: softmax cross entropy, or for multi-label targets
    `binary_cross_entropy` (what `jgrind.loss.weighted_loss` trains by default)."""
    if labels.ndim == 2:
        return binary_cross_entropy(logits, labels, mask)
    if not mask.any():
        return float("nan")
    z = logits[mask] - logits[mask].max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return float(-np.mean(logp[np.arange(z.shape[0]), labels[mask]]))


def binary_cross_entropy(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """The mean over masked nodes with a known target of each node's sigmoid cross entropy
    averaged over its known targets (`jgrind.loss.binary_cross_entropy`)."""
    known = labels[mask] >= 0
    has = known.any(axis=1)
    if not has.any():
        return float("nan")
    x = logits[mask].astype(np.float64)
    y = np.where(known, labels[mask], 0)
    per = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
    per_node = np.sum(np.where(known, per, 0.0), axis=1)[has] / known.sum(axis=1)[has]
    return float(np.mean(per_node))


# Metric names `evaluate` and `train(metric=)` take, and what each scores.
METRICS = {
    "accuracy": "fraction of nodes whose highest logit is their class (one class per node)",
    "roc_auc": "ROC-AUC: of the second class's probability (binary), or the mean over tasks "
               "(multi-label, as OGB's ogbn-proteins)",
    "micro_f1": "F1 over all (node, target) decisions pooled (multi-label: logit > 0 "
                "predicts 1; PPI, Yelp); one class per node: accuracy",
    "macro_f1": "the unweighted mean of every class's (multi-label: task's) F1",
}


# The metric a dataset's own benchmark reports where it is not the task's default: HGSL's
# Table 2 reports Macro-F1 (and Micro-F1) on DBLP.
DATASET_METRICS = {"dblp": "macro_f1"}


def default_metric(num_classes: int, multilabel: bool = False, dataset: str = "") -> str:
    """The metric of ``dataset``'s benchmark if `DATASET_METRICS` names one; else ROC-AUC for
    binary tasks (the heterophilous benchmarks' protocol) and multi-label ones (OGB's
    ogbn-proteins), else accuracy."""
    if dataset in DATASET_METRICS:
        return DATASET_METRICS[dataset]
    return "roc_auc" if num_classes == 2 or multilabel else "accuracy"


def check_metric(metric: str, num_classes: int, multilabel: bool) -> None:
    """ValueError unless ``metric`` scores this kind of task (``num_classes`` classes, or
    targets if ``multilabel``): said before training, not at the first evaluation."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    if multilabel and metric == "accuracy":
        raise ValueError("metric 'accuracy' needs one class per node, but the labels are "
                         "multi-label targets [N, T]; use 'roc_auc', 'micro_f1' or 'macro_f1'")
    if not multilabel and metric == "roc_auc" and num_classes != 2:
        raise ValueError(f"metric 'roc_auc' scores binary tasks (the second class's "
                         f"probability) and multi-label ones, but this task has {num_classes} "
                         f"class{'' if num_classes == 1 else 'es'}; use 'accuracy' or "
                         "'macro_f1'")


def evaluate(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray, metric: str) -> float:
    """``metric`` (a name in `METRICS`) of ``logits`` on the masked nodes."""
    multilabel = labels.ndim == 2
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; use one of {', '.join(METRICS)}")
    if metric == "roc_auc":
        if not multilabel and (logits.shape[-1] < 2 or labels.max(initial=0) > 1):
            raise ValueError("metric 'roc_auc' scores the second output of a binary task, but "
                             f"the logits have {logits.shape[-1]} column(s) and the labels "
                             f"reach class {int(labels.max(initial=0))}")
        return roc_auc(logits if multilabel else softmax(logits)[:, 1], labels, mask)
    return {"micro_f1": micro_f1, "macro_f1": macro_f1, "accuracy": accuracy}[metric](
        logits, labels, mask)
