"""The statistics head: a logistic regression on each clip's band statistics, fitted in closed form.

A built-in model with ``stats_head=True`` carries a second classifier beside
its CNN: a linear layer on the per-bin mean, standard deviation and mean
absolute frame-to-frame change of the clip's (normalised) input
(:meth:`~specstore.infer.models.MaskedClassifier.clip_statistics`), the statistics the
simple baselines of :mod:`specstore.infer.evaluation.baselines` use.  On a few hundred clips that
linear model is hard to beat; on thousands the CNN is far better.  In eval
mode the model adds the two experts' logits, so it keeps what each is good at
(:mod:`specstore.infer.models`).

:func:`fit_stats_head` computes the statistics of every training clip whole,
standardises them, chooses the regularisation ``C`` of a multinomial logistic
regression (scikit-learn, L2) by cross-validation grouped by work (or content)
on the training clips only, refits on all of them and writes the weights into
the model.  The result records the choice, the cross-validated accuracy and
log-loss of every candidate, and the out-of-fold log-probabilities.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specstore.infer.data.split import split_keys, split_scores
from specstore.store import Store

from ..data import StoreDataset
from ..models import MaskedClassifier

__all__ = [
    "C_GRID", "DEFAULT_WEIGHT", "MIN_VALIDATION_CLIPS", "WEIGHTS", "StatsFit", "WeightChoice", "choose_weight",
    "clip_statistics", "fit_linear_head", "fit_stats_head", "grouped_folds", "stats_logits",
]

log = logging.getLogger(__name__)

C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)
"""Inverse L2 strengths tried (on standardised statistics)."""
WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0)
"""Weights of the statistics head's logits that :func:`choose_weight` tries."""
MIN_VALIDATION_CLIPS = 60
"""Fewest validation clips on which :func:`choose_weight` chooses; below it the weight is :data:`DEFAULT_WEIGHT`."""
DEFAULT_WEIGHT = 1.0
"""The weight when the validation split is too small to choose one (chosen by grouped cross-validation on the
small corpora of docs/model.md, where the two experts are of a size)."""


@dataclass
class StatsFit:
    """How the statistics head was fitted.

    ``c``: the chosen inverse regularisation; ``cv``: per candidate ``C`` the
    grouped cross-validation accuracy and mean log-loss on the training clips;
    ``folds``: folds used (0 when too few groups: ``C`` is then the default 1);
    ``oof_log_proba``: ``(n_train, n_classes)`` out-of-fold log-probabilities
    of the chosen ``C`` (model class order; None without folds).
    """

    c: float
    folds: int
    cv: dict[str, dict[str, float]] = field(default_factory=dict)
    oof_log_proba: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        """What the checkpoint and ``MODEL.config.json`` record (no arrays)."""
        return {"C": self.c, "folds": self.folds, "cv": self.cv}


def grouped_folds(keys: Sequence[str], folds: int, seed: int) -> np.ndarray:
    """Fold number of each key: ``floor(split_score(key, seed) * folds)`` (a work never straddles folds)."""
    return np.minimum((split_scores(keys, seed) * folds).astype(np.int64), folds - 1)


@torch.no_grad()
def clip_statistics(model: MaskedClassifier, store: Store, feature: str, rows: np.ndarray) -> np.ndarray:
    """``(len(rows), 3 * n_bins)`` float64: the statistics head's input for each whole clip (one at a time,
    so memory stays one clip's frames)."""
    was = model.training
    model.eval()
    try:
        dataset = StoreDataset(store, feature, rows=np.asarray(rows, dtype=np.int64))
        device = next(model.parameters()).device
        out = []
        for i in range(len(dataset)):
            x = torch.from_numpy(np.ascontiguousarray(dataset[i].features, dtype=np.float32))[None, None].to(device)
            lengths = torch.tensor([x.shape[-1]], device=device)
            out.append(model.clip_statistics(x, lengths)[0].double().cpu().numpy())
    finally:
        model.train(was)
    return np.stack(out) if out else np.zeros((0, 3 * model.config.n_bins))


def _logistic(c: float, seed: int) -> Any:
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression(C=c, max_iter=2000, random_state=seed)


def fit_stats_head(model: MaskedClassifier, store: Store, feature: str, rows: np.ndarray, *, seed: int = 0,
                   folds: int = 5, grid: Sequence[float] = C_GRID) -> StatsFit:
    """Fit ``model``'s statistics head on the training ``rows`` of ``specstore.store`` (see the module docstring).

    Labels are the model's class indices (the store's label order, as the
    trainer uses).  Folds group clips by :func:`~specstore.infer.data.split.split_keys`, with a
    seed of their own so they do not repeat the validation split's draw.
    """
    from threadpoolctl import threadpool_limits

    assert model.stats_linear is not None, "the model has no statistics head"
    rows = np.asarray(rows, dtype=np.int64)
    y = store.labels[rows].astype(np.int64)
    stats = clip_statistics(model, store, feature, rows)
    shift = stats.mean(axis=0)
    scale = 1.0 / np.maximum(stats.std(axis=0), 1e-6)
    every_key = split_keys(store)
    keys = [every_key[int(r)] for r in rows]
    # Problems this small run several times faster on one BLAS thread than on many (docs/measurements.md), and
    # the result does not depend on it.
    with threadpool_limits(limits=1, user_api="blas"):
        fit = fit_linear_head(model.stats_linear, (stats - shift) * scale, y, keys, seed=seed, folds=folds,
                              grid=grid, what="statistics head")
    with torch.no_grad():
        model.stats_shift.copy_(torch.from_numpy(shift))
        model.stats_scale.copy_(torch.from_numpy(scale))
    return fit


def fit_linear_head(head: torch.nn.Linear, z: np.ndarray, y: np.ndarray, keys: list[str], *, seed: int,
                    folds: int = 5, grid: Sequence[float] = C_GRID, what: str = "linear head") -> StatsFit:
    """Choose C of a logistic regression on standardised features ``z`` (labels ``y``, class indices) by
    grouped cross-validation (``keys``: each row's work; the least mean log-loss), refit on every row and write
    the weights into ``head`` (``out_features`` classes; classes without rows get a bias of -30: never
    predicted).  The statistics head's fit, and the transfer head's (:mod:`specstore.infer.train.transfer`)."""
    from sklearn.metrics import log_loss

    classes = np.unique(y)
    fold_of = grouped_folds(keys, folds, seed + 1)
    usable = folds >= 2 and all(len(np.unique(y[fold_of != k])) >= 2 for k in range(folds)) and len(
        np.unique(fold_of)) == folds
    fit = StatsFit(c=1.0, folds=folds if usable else 0)
    if usable:
        best: tuple[float, float] | None = None
        for c in grid:
            oof = np.full((len(y), len(classes)), -30.0)
            for k in range(folds):
                train, test = fold_of != k, fold_of == k
                clf = _logistic(c, seed).fit(z[train], y[train])
                oof[np.ix_(test, np.searchsorted(classes, clf.classes_))] = clf.predict_log_proba(z[test])
            loss = float(log_loss(y, np.exp(oof), labels=classes))
            acc = float((classes[oof.argmax(1)] == y).mean())
            fit.cv[f"{c:g}"] = {"accuracy": round(acc, 4), "log_loss": round(loss, 4)}
            if best is None or loss < best[0]:
                best, fit.c, fit.oof_log_proba = (loss, c), c, oof
        log.info("%s: C=%g by %d-fold grouped cross-validation on %d training clips "
                 "(accuracy %.3f, log-loss %.3f)", what, fit.c, folds, len(y), fit.cv[f"{fit.c:g}"]["accuracy"],
                 fit.cv[f"{fit.c:g}"]["log_loss"])
    clf = _logistic(fit.c, seed).fit(z, y)
    n_classes = head.out_features
    weight = np.zeros((n_classes, z.shape[1]))
    bias = np.full(n_classes, -30.0)  # classes without training clips: never predicted by this head
    if len(clf.classes_) == 2:  # scikit-learn keeps one row for two classes: logits (-w/2, +w/2)
        weight[clf.classes_] = np.stack([-clf.coef_[0] / 2, clf.coef_[0] / 2])
        bias[clf.classes_] = [-clf.intercept_[0] / 2, clf.intercept_[0] / 2]
    else:
        weight[clf.classes_] = clf.coef_
        bias[clf.classes_] = clf.intercept_
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weight))
        head.bias.copy_(torch.from_numpy(bias))
    return fit


@torch.no_grad()
def stats_logits(model: MaskedClassifier, store: Store, feature: str, rows: np.ndarray) -> np.ndarray:
    """``(len(rows), n_classes)`` float32: the statistics head's logits for whole clips."""
    device = next(model.parameters()).device
    statistics = torch.from_numpy(clip_statistics(model, store, feature, rows)).float().to(device)
    return model.stats_logits(statistics).float().cpu().numpy()


@dataclass
class WeightChoice:
    """The statistics head's weight in the model's output, and how it was set.

    ``log_loss``: the validation log-loss of each weight tried (empty when
    the rule set it).
    """

    weight: float
    how: str
    log_loss: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"weight": self.weight, "how": self.how, "log_loss": self.log_loss}


def choose_weight(cnn: np.ndarray, stats: np.ndarray, truth: np.ndarray, *, grid: Sequence[float] = WEIGHTS,
                  min_clips: int = MIN_VALIDATION_CLIPS, default: float = DEFAULT_WEIGHT) -> WeightChoice:
    """The weight ``w`` of ``cnn + w * stats`` (logits of held-out clips) with the least mean log-loss.

    One smooth figure of every clip, over a handful of values: far steadier
    than picking an epoch by accuracy.  With fewer than ``min_clips``
    validation clips even that is noise, and the weight is ``default``.
    Ties go to the smaller weight (the CNN alone is the simpler model).
    """
    if len(truth) < min_clips:
        return WeightChoice(default, f"{default:g}: the rule for fewer than {min_clips} validation clips "
                                     f"({len(truth)} here)")
    losses: dict[str, float] = {}
    for w in grid:
        z = cnn + w * stats
        z = z - z.max(axis=1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        losses[f"{w:g}"] = round(float(-log_p[np.arange(len(truth)), truth].mean()), 4)
    best = min(grid, key=lambda w: (losses[f"{w:g}"], w))
    return WeightChoice(float(best), f"{best:g}: the least log-loss on {len(truth)} validation clips among "
                                     f"{', '.join(f'{w:g}' for w in grid)}", losses)
