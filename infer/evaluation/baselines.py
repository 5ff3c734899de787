"""Simple baselines a model must beat, fitted on the same split, and bootstrap confidence intervals.

A baseline sees one vector per clip: per-band statistics of the stored
features over time (``mean``, ``std`` and ``delta``, the mean absolute
frame-to-frame change, of every mel and/or CQT band, in dB), standardised on
the training clips, then a scikit-learn classifier: logistic regression or
5-nearest neighbours.  These are what a careful user tries first; a model
that does not beat them widely does not earn its keep.

:func:`fit_baselines` trains them on the training rows of one store and
scores the evaluated rows of another (or the same) store, labels matched by
name.  :func:`bootstrap_ci` gives the percentile interval of an accuracy
over resampled test clips, since test sets of a few hundred clips are noisy
(one clip of 93 is 1.1 points).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specstore.common import ConfigError
from specstore.store import Store
from specstore.store.kinds import baseline_kinds

__all__ = ["STATS", "BaselineResult", "bootstrap_ci", "clip_stats", "fit_baselines"]

STATS = ("mean", "std", "delta")
"""Per-band statistics a baseline sees, in order."""


def clip_stats(store: Store, rows: Sequence[int] | np.ndarray, features: Sequence[str],
               stats: Sequence[str] = STATS) -> np.ndarray:
    """``(len(rows), bands x len(stats))`` float64: each feature's band statistics over each clip's frames."""
    unknown = [s for s in stats if s not in STATS]
    if unknown:
        raise ConfigError(f"unknown statistic(s) {unknown}; choose from {', '.join(STATS)}")
    out = []
    for r in np.asarray(rows, dtype=np.int64).tolist():
        parts = []
        for name in features:
            x = np.asarray(store.feature(name).frames(r), dtype=np.float64)  # (frames, bands)
            for stat in stats:
                if stat == "mean":
                    parts.append(x.mean(axis=0))
                elif stat == "std":
                    parts.append(x.std(axis=0))
                else:
                    parts.append(np.abs(np.diff(x, axis=0)).mean(axis=0) if len(x) > 1 else np.zeros(x.shape[1]))
        out.append(np.concatenate(parts))
    return np.asarray(out, dtype=np.float64).reshape(len(out), -1)


def bootstrap_ci(correct: np.ndarray, *, resamples: int = 2000, level: float = 0.95,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``correct`` (0/1 per test clip), resampling clips."""
    c = np.asarray(correct, dtype=np.float64)
    if not len(c):
        return (0.0, 0.0)
    rng = np.random.default_rng(seed)
    means = c[rng.integers(0, len(c), size=(resamples, len(c)))].mean(axis=1)
    tail = (1.0 - level) / 2.0
    return float(np.quantile(means, tail)), float(np.quantile(means, 1.0 - tail))


@dataclass
class BaselineResult:
    """One baseline's figures on the evaluated clips: accuracy with its bootstrap interval, macro-F1."""

    name: str
    accuracy: float
    accuracy_ci: tuple[float, float]
    macro_f1: float
    n_train: int
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "accuracy": self.accuracy, "accuracy_ci": list(self.accuracy_ci),
                "macro_f1": self.macro_f1, "n_train": self.n_train, **self.details}


def fit_baselines(train_store: Store, train_rows: np.ndarray, test_store: Store, test_rows: np.ndarray,
                  test_truth: Sequence[str], *, seed: int = 0) -> list[BaselineResult]:
    """Logistic regression and 5-NN on band statistics of the baseline kinds
    (:func:`specstore.store.kinds.baseline_kinds`): mel, and (where both stores have it) mel+CQT.

    ``train_rows``: labelled rows of ``train_store`` to fit on; ``test_rows``
    and ``test_truth`` (label names): the evaluated clips.  Labels the
    training clips never show count as errors.  Raises
    :class:`~specstore.common.ConfigError` when there is nothing to fit.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.neighbors import KNeighborsClassifier
    from sklearn.preprocessing import StandardScaler

    train_rows = np.asarray(train_rows, dtype=np.int64)
    train_rows = train_rows[train_store.labels[train_rows] >= 0]
    y_train = np.array([train_store.label_names[int(k)] for k in train_store.labels[train_rows]])
    if len(set(y_train.tolist())) < 2:
        raise ConfigError("the baselines need training clips of at least two labels")
    shared = [f for f in baseline_kinds() if f in train_store.specs and f in test_store.specs]
    if not shared:
        raise ConfigError(f"the baselines need a {' or '.join(baseline_kinds())} feature in both stores")
    feature_sets = [shared[:1]] + ([shared] if len(shared) > 1 else [])
    y_test = np.asarray(test_truth)
    results: list[BaselineResult] = []
    for feats in feature_sets:
        scaler = StandardScaler().fit(clip_stats(train_store, train_rows, feats))
        a = scaler.transform(clip_stats(train_store, train_rows, feats))
        b = scaler.transform(clip_stats(test_store, test_rows, feats))
        for kind, clf in (("logistic regression", LogisticRegression(max_iter=5000)),
                          ("5-NN", KNeighborsClassifier(n_neighbors=min(5, len(a))))):
            pred = clf.fit(a, y_train).predict(b)
            correct = pred == y_test
            results.append(BaselineResult(
                name=f"{kind} on {'+'.join(feats)} band mean/std/delta", accuracy=float(correct.mean()),
                accuracy_ci=bootstrap_ci(correct, seed=seed),
                macro_f1=float(f1_score(y_test, pred, average="macro", zero_division=0)), n_train=len(a)))
    return results
