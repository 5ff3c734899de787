"""Classification metrics, the one place they are computed: confusion matrix, accuracy, precision/recall/F1.

``make eval`` (:mod:`specstore.infer.evaluation.evaluate`) and the notebook helpers
(:mod:`specstore.infer.explore`) report figures from these functions (scikit-learn
underneath).  Classes are indices into a label list; counts are clips.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["classification_metrics", "confusion", "metrics_from_confusion"]


def confusion(truth: np.ndarray, pred: np.ndarray, n_classes: int) -> np.ndarray:
    """``cm[i, j]``: clips of true class ``i`` predicted as ``j`` (int64, ``n_classes`` square; scikit-learn)."""
    from sklearn.metrics import confusion_matrix

    if not len(truth):
        return np.zeros((n_classes, n_classes), dtype=np.int64)
    return confusion_matrix(truth, pred, labels=list(range(n_classes))).astype(np.int64)


def classification_metrics(truth: np.ndarray, pred: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
    """Accuracy and per-class and averaged precision / recall / F1 (scikit-learn).

    ``truth``/``pred`` index ``label_names``.  Per class: precision, recall,
    F1 (``zero_division=0``: a class never predicted has precision 0, an
    absent class recall 0), ``support`` and ``predicted`` counts.  Macro
    averages are unweighted means over the classes that occur in the truth or
    the predictions (scikit-learn's default label set), so a model label
    absent from a test set and never predicted does not drag the average
    down, while wrong predictions into it do; ``weighted_f1`` weights by
    support.
    """
    from sklearn.metrics import precision_recall_fscore_support

    truth = np.asarray(truth, dtype=np.int64)
    pred = np.asarray(pred, dtype=np.int64)
    k = len(label_names)
    every = list(range(k))
    cm = confusion(truth, pred, k)
    support, predicted = cm.sum(axis=1), cm.sum(axis=0)
    present = sorted(set(truth.tolist()) | set(pred.tolist()))
    if present:
        p, r, f, _ = precision_recall_fscore_support(truth, pred, labels=every, zero_division=0)
        macro = precision_recall_fscore_support(truth, pred, labels=present, average="macro", zero_division=0)
        weighted = precision_recall_fscore_support(truth, pred, labels=present, average="weighted", zero_division=0)
    else:
        p = r = f = np.zeros(k)
        macro = weighted = (0.0, 0.0, 0.0, None)
    per_class = {name: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]),
                        "support": int(support[i]), "predicted": int(predicted[i])}
                 for i, name in enumerate(label_names)}
    return {
        "accuracy": float((truth == pred).mean()) if len(truth) else 0.0,
        "n": int(len(truth)),
        "macro_precision": float(macro[0]),
        "macro_recall": float(macro[1]),
        "macro_f1": float(macro[2]),
        "weighted_f1": float(weighted[2]),
        "per_class": per_class,
    }


def metrics_from_confusion(cm: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
    """:func:`classification_metrics` of the clips a confusion matrix counts.

    ``cm[i, j]`` counts clips of true class ``i`` predicted as ``j``.
    """
    m = np.asarray(cm)
    n = len(label_names)
    if m.shape != (n, n):
        raise ValueError(f"confusion matrix must be {n}x{n} for {n} labels, got shape {m.shape}")
    if m.size and (m.min() < 0 or not np.all(np.equal(np.mod(m, 1), 0))):
        raise ValueError("confusion matrix entries must be non-negative counts")
    counts = m.astype(np.int64).ravel()
    cells = np.repeat(np.arange(n * n), counts)
    return classification_metrics(cells // max(n, 1), cells % max(n, 1), label_names)
