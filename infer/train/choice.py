"""The recipe's choice between a model trained from scratch and a head on a pretrained backbone.

``make train`` with a built-in architecture (the default ``cnn``, or ``resnet``) and ``--backbone`` auto asks
:func:`choose_backbone` before anything trains.  When the store holds no shipped backbone's feature (``make features
FEATURES=musicnn`` adds it) the CNN trains from scratch, as always, and the rule says so.  When it does, the
choice is made on the training clips alone, by grouped cross-validation (folds by work, the statistics head's
folds, :func:`~specstore.infer.train.stats_head.fit_linear_head`) of two closed-form models on the same folds:

* the transfer head: a logistic regression on the backbone's clip embeddings (the backbone runs once per
  training clip; its embeddings are cached beside the model, so a transfer chosen here costs no second pass);
* the band statistics: a logistic regression on each clip's per-bin mean, standard deviation and change
  (:func:`specstore.infer.evaluation.baselines.clip_stats`) of the from-scratch features.

* their sum: the two regressions' out-of-fold probabilities averaged, as the saved sum averages the two
  models' (:mod:`specstore.infer.train.ensemble`).

Cross-validating the CNN itself would train it once per fold, several times the recipe's time budget, so the
band-statistics figure stands for it: the default recipe (CNN plus a statistics head) scored at or above that
logistic regression on every corpus of ``docs/model.md``, so it is a floor of the from-scratch recipe.
:func:`decide` is the rule: the CNN from scratch unless the transfer head or the sum beats that floor by more
than :data:`MARGIN`; then the sum when its figure is at least the head's (its from-scratch half is the floor,
which the CNN it stands for beats), else the head alone.  The extra time is the backbone's one pass over the
training clips (measured and recorded) plus seconds of logistic regressions; a sum also trains the CNN, the
recipe's usual time.  A sum needs the backbone's feature and the CNN's on one frame grid, in one store
(``make features FEATURES=mel,cqt,musicnn`` puts all three on musicnn's 16 kHz / hop 256 grid); a store of
the default features alone holds no backbone's feature, and the CNN trains from scratch.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specstore.infer.data.split import SplitRule, split_keys, training_rows
from specstore.infer.engine.runtime import Engine
from specstore.infer.errors import CheckpointError
from specstore.infer.evaluation.baselines import clip_stats
from specstore.infer.models.checkpoint import Checkpoint, check_store_matches
from specstore.infer.models.shipped import SHIPPED, load_shipped
from specstore.store import Store, open_store

from .config import TrainConfig
from .distributed import one_process_only
from .ensemble import sum_feature
from .recipe import resolve_validation
from .stats_head import StatsFit, fit_linear_head
from .transfer import BACKBONES, EmbeddingCache, _cache_key, clip_embeddings, embeddings_path_for

__all__ = ["MARGIN", "BackboneChoice", "choose_backbone", "decide", "record_choice", "store_backbone"]

log = logging.getLogger(__name__)

MARGIN = 0.02
"""Cross-validated accuracy a transfer head must gain over the band statistics to be chosen (2 points: about one
clip in 50, below which the two are a tie and the from-scratch recipe, measured on every corpus, is kept)."""


@dataclass
class BackboneChoice:
    """The backbone to train a head on (None: the CNN from scratch), whether the head is summed with the CNN
    (``combine``), the rule's sentence (None when the user chose), the figures it compared, its seconds (the
    backbone's pass included) and, when the rule ran, the feature the CNN reads (the store's less the
    backbone's, whose band statistics stood for it; None: the config's)."""

    backbone: str | None
    why: str | None
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    combine: bool = False
    feature: str | None = None


def decide(scratch: float, transfer: float, both: float, margin: float = MARGIN) -> str:
    """``"scratch"``, ``"transfer"`` or ``"sum"`` from three cross-validated accuracies: the band statistics
    (standing for the CNN from scratch), the transfer head and their sum (see the module docstring)."""
    if not max(transfer, both) > scratch + margin:
        return "scratch"
    return "sum" if both >= transfer else "transfer"


def store_backbone(store: Store) -> Checkpoint | None:
    """The first shipped model whose input feature ``specstore.store`` holds with the same spec (None: none does, or no
    shipped model is available in this install)."""
    for name in SHIPPED:
        try:
            shipped = load_shipped(name)
            check_store_matches(shipped, store)
        except CheckpointError:
            continue
        if callable(getattr(shipped.build(), "embed", None)):
            return shipped
    return None


def _cv_accuracy(z: np.ndarray, y: np.ndarray, keys: list[str], n_classes: int, seed: int) -> tuple[float, StatsFit]:
    """Grouped cross-validated accuracy of a logistic regression on standardised ``z`` (its best ``C``)."""
    from threadpoolctl import threadpool_limits

    z = (z - z.mean(axis=0)) / np.maximum(z.std(axis=0), 1e-6)
    with threadpool_limits(limits=1, user_api="blas"):
        fit = fit_linear_head(torch.nn.Linear(z.shape[1], n_classes), z, y, keys, seed=seed, what="recipe choice")
    return (fit.cv[f"{fit.c:g}"]["accuracy"] if fit.cv else float("nan")), fit


def choose_backbone(store: str | os.PathLike[str] | Store, model_path: str | os.PathLike[str], cfg: TrainConfig, *,
                    progress: bool = False) -> BackboneChoice:
    """What ``cfg`` trains: a head on a shipped backbone or the CNN from scratch (see the module docstring).

    A ``backbone`` the user set (``none``: from scratch) or an ``arch`` that means one (``musicnn``) is kept
    with no rule; a user's own model (an import path ``arch``) trains as it is.  The from-scratch side is
    whichever built-in ``arch`` the config names."""
    if cfg.backbone is not None:
        return BackboneChoice(None if cfg.backbone == "none" else cfg.backbone, None)
    if cfg.arch in BACKBONES:
        return BackboneChoice(BACKBONES[cfg.arch], None)
    if cfg.model is None:  # a user's own model (an import path): theirs to train, no rule
        return BackboneChoice(None, None)
    s = store if isinstance(store, Store) else open_store(store)
    shipped = store_backbone(s)
    if shipped is None:
        return BackboneChoice(None, "none: the store holds no shipped backbone's feature (`make features "
                                    "FEATURES=musicnn` adds one); the CNN trains from scratch")
    one_process_only(f"choosing between the CNN and a head on the store's {shipped.extra['shipped']} backbone (auto)")
    t0 = time.perf_counter()
    name = str(shipped.extra["shipped"])
    cfg, _ = resolve_validation(cfg, int((s.labels >= 0).sum()))
    rows, _ = training_rows(s, SplitRule(cfg.val_fraction or 0.0, cfg.seed, cfg.val_offset))
    cache = EmbeddingCache.open(embeddings_path_for(model_path), _cache_key(shipped))
    emb, embedded, backbone_seconds = clip_embeddings(shipped.build(), s, shipped.feature, rows,
                                                      Engine(cfg.run), cache)
    every_key = split_keys(s)
    keys = [every_key[int(r)] for r in rows]
    y = s.labels[rows].astype(np.int64)
    n_classes = len(s.label_names)
    transfer_acc, head_fit = _cv_accuracy(emb.astype(np.float64), y, keys, n_classes, cfg.seed)
    own, _ = sum_feature(s, shipped.feature, cfg.feature)  # the CNN's features (the backbone's if alone)
    stats_acc, fit = _cv_accuracy(clip_stats(s, rows, own.split("+")), y, keys, n_classes, cfg.seed)
    both_acc = _sum_accuracy(head_fit, fit, y)
    seconds = time.perf_counter() - t0
    figures = {"backbone": name, "transfer_cv_accuracy": transfer_acc, "band_statistics_cv_accuracy": stats_acc,
               "sum_cv_accuracy": both_acc, "folds": fit.folds, "clips": int(len(rows)), "backbone_clips": embedded,
               "backbone_seconds": round(backbone_seconds, 2), "seconds": round(seconds, 2)}
    said = (f"grouped {fit.folds}-fold cross-validation on the {len(rows)} training clips: a head on {name} "
            f"{transfer_acc:.3f}, band statistics of {own} {stats_acc:.3f} (the from-scratch recipe's "
            f"floor), their sum {both_acc:.3f}; {seconds:.1f} s, {backbone_seconds:.1f} s of it the backbone's pass "
            f"over {embedded} clips")
    verdict = decide(stats_acc, transfer_acc, both_acc)
    if verdict == "sum":
        return BackboneChoice(name, f"{name} summed with the CNN: {said}; the sum gains more than {MARGIN:.2f} "
                                    "and is at least the head's", figures, seconds, combine=True,
                              feature=own)
    if verdict == "transfer":
        return BackboneChoice(name, f"{name}: {said}; the head gains more than {MARGIN:.2f} and beats the sum",
                              figures, seconds)
    return BackboneChoice(None, f"none (the CNN from scratch): {said}; neither the head nor the sum gains more "
                                f"than {MARGIN:.2f}", figures, seconds, feature=own)


def _sum_accuracy(a: StatsFit, b: StatsFit, y: np.ndarray) -> float:
    """Accuracy of two cross-validated fits' averaged out-of-fold probabilities (same rows, same folds); NaN
    when either had too few works to cross-validate."""
    if a.oof_log_proba is None or b.oof_log_proba is None:
        return float("nan")
    classes = np.unique(y)  # the out-of-fold columns (fit_linear_head)
    return float((classes[(np.exp(a.oof_log_proba) + np.exp(b.oof_log_proba)).argmax(1)] == y).mean())


def record_choice(model_path: str | os.PathLike[str], choice: BackboneChoice) -> None:
    """Record the rule's sentence and figures in a from-scratch model's checkpoint and ``MODEL.config.json``
    (``recipe.rules.backbone``, ``backbone_choice``), beside the other automatic rules."""
    import json

    from specstore.common import write_atomic
    from specstore.infer.models.checkpoint import load_checkpoint, save_checkpoint

    from .loop import config_path_for

    if choice.why is None:
        return
    ckpt = load_checkpoint(model_path)
    ckpt.extra.setdefault("recipe", {}).setdefault("rules", {})["backbone"] = choice.why
    ckpt.extra["backbone_choice"] = choice.figures
    save_checkpoint(ckpt, model_path)
    path = config_path_for(model_path)
    record = json.loads(path.read_text()) if path.is_file() else {}
    record.setdefault("recipe", {}).setdefault("rules", {})["backbone"] = choice.why
    record["backbone_choice"] = choice.figures
    write_atomic(path, json.dumps(record, indent=2) + "\n")
