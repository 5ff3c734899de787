"""Grouped k-fold cross-validation of a training recipe: how to choose anything without a test set.

A recipe (a :class:`~specstore.infer.train.TrainConfig`) is judged on the training
store alone: its labelled clips are cut into ``folds`` folds by the split
rule of :mod:`specstore.infer.data.split` (fold ``k`` holds the works, or contents, whose
split score lies in ``[k / folds, (k + 1) / folds)``: a work never straddles
two folds, duplicates never either), the recipe trains ``folds`` times, each
time on the other folds, and predicts the fold it did not see.  Every
labelled clip is predicted once by a model that never saw its work, so the
pooled out-of-fold accuracy (with a bootstrap interval over clips) compares
recipes on the data a user has, and the test set stays untouched until the
end.  The simple baselines of :mod:`specstore.infer.evaluation.baselines` (logistic regression on
band statistics) are scored on the same folds, side by side.

Each fold trains with :func:`specstore.infer.train.train` into ``out_dir/fold-<k>.pt``,
so an interrupted run resumes fold by fold.  The fold is also the run's
validation set; with ``select="best"`` the fold then chooses its own epoch and
the estimate is optimistic (logged): use the default ``select="last"``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from specstore.common import check_output_path, write_atomic
from specstore.infer.data.split import SplitRule, split_keys, training_rows
from specstore.infer.engine.runtime import Engine
from specstore.infer.errors import CrossValError
from specstore.infer.evaluation.baselines import STATS, bootstrap_ci, clip_stats
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.infer.models.trust import Trust
from specstore.infer.train import TrainConfig, train
from specstore.store import Store, open_store
from specstore.store.kinds import baseline_kinds

__all__ = ["CVResult", "CrossValError", "cross_validate", "oof_baseline"]

log = logging.getLogger(__name__)


@dataclass
class CVResult:
    """Out-of-fold figures of a recipe on a training store.

    ``accuracy`` / ``macro_f1`` over every labelled clip, each predicted by
    the fold model that did not train on it; ``accuracy_ci``: 95 % bootstrap
    interval over clips; ``fold_accuracy``: per fold; ``baselines``: name ->
    out-of-fold accuracy of the simple baselines on the same folds;
    ``seconds``: wall time of the whole run.
    """

    folds: int
    n_clips: int
    accuracy: float
    accuracy_ci: tuple[float, float]
    macro_f1: float
    fold_accuracy: list[float]
    baselines: dict[str, float] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line: the recipe's out-of-fold accuracy with its interval, and the best baseline's."""
        best = max(self.baselines.items(), key=lambda kv: kv[1]) if self.baselines else None
        return (f"{self.folds}-fold grouped cross-validation on {self.n_clips} clips: accuracy {self.accuracy:.3f} "
                f"[{self.accuracy_ci[0]:.3f}, {self.accuracy_ci[1]:.3f}], macro-F1 {self.macro_f1:.3f}"
                + (f"; best baseline {best[0]}: {best[1]:.3f}" if best else "")
                + f" ({self.seconds:.0f} s)")


def _fold_rows(store: Store, k: int, folds: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    return training_rows(store, SplitRule.fold(k, folds, seed))


def oof_baseline(store: Store, folds: int, seed: int, features: list[str]) -> dict[str, np.ndarray]:
    """Out-of-fold predicted label indices of the baselines (name -> one per labelled row, in row order)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    labelled = np.flatnonzero(store.labels >= 0)
    x = clip_stats(store, labelled, features)
    y = store.labels[labelled].astype(np.int64)
    position = {int(r): i for i, r in enumerate(labelled)}
    pred = np.full(len(labelled), -1, dtype=np.int64)
    for k in range(folds):
        train_rows, val_rows = _fold_rows(store, k, folds, seed)
        a = np.array([position[int(r)] for r in train_rows], dtype=np.int64)
        b = np.array([position[int(r)] for r in val_rows], dtype=np.int64)
        if not len(b):
            continue
        scaler = StandardScaler().fit(x[a])
        clf = LogisticRegression(max_iter=5000).fit(scaler.transform(x[a]), y[a])
        pred[b] = clf.predict(scaler.transform(x[b]))
    return {f"logistic regression on {'+'.join(features)} band {'/'.join(STATS)}": pred}


def _oof_csv(s: Store, labelled: np.ndarray, fold_of: np.ndarray, truth: np.ndarray, pred: np.ndarray) -> str:
    """``cv.csv``: ``row,path,fold,truth,pred`` for every labelled clip (pred empty for a label the fold's
    model did not know)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["row", "path", "fold", "truth", "pred"])
    for i, r in enumerate(labelled.tolist()):
        w.writerow([r, s.paths[r], int(fold_of[i]), s.label_names[int(truth[i])],
                    s.label_names[int(pred[i])] if pred[i] >= 0 else ""])
    return buf.getvalue()


def _train_fold(s: Store, model_path: Path, cfg: TrainConfig, val_rows: np.ndarray, out: Path, *, progress: bool,
                threads: int | None, overwrite: bool, trust_model_code: Trust) -> np.ndarray:
    """Train one fold's model and return its logits on the fold's held-out ``val_rows``.  A head on a shipped
    backbone (:mod:`specstore.infer.train.transfer`) shares one embedding cache across the folds
    (``out/embeddings.npz``): the backbone runs once per clip for the whole cross-validation, and the held-out
    logits come from it."""
    from specstore.infer.train.transfer import backbone_for, cached_logits, train_transfer

    if backbone_for(cfg) is not None:
        shared = out / "embeddings.npz"
        train_transfer(s, model_path, cfg, progress=progress, threads=threads, overwrite=True, cache_path=shared)
        logits = cached_logits(model_path, s, val_rows, shared)
        if logits is not None:
            return logits
    else:
        train(s, model_path, cfg, progress=progress, threads=threads, overwrite=overwrite,
              trust_model_code=trust_model_code)
    ckpt = load_checkpoint(model_path)
    engine = Engine(replace(cfg.run, threads=threads))
    net = engine.prepare(ckpt.build(trust_model_code=trust_model_code))
    return engine.logits(net, s, val_rows, feature=ckpt.feature).logits


def cross_validate(
    store: str | os.PathLike[str] | Store,
    out_dir: str | os.PathLike[str],
    config: TrainConfig | None = None,
    *,
    folds: int = 5,
    progress: bool = True,
    threads: int | None = None,
    overwrite: bool = False,
    baselines: bool = True,
    trust_model_code: Trust = False,
    **overrides: Any,
) -> CVResult:
    """Cross-validate ``config`` (plus keyword ``overrides``) on ``specstore.store``'s labelled clips.

    Writes ``out_dir/fold-<k>.pt`` (each fold's model, resumable),
    ``out_dir/cv.csv`` (``row,path,fold,truth,pred``: every clip's
    out-of-fold prediction) and ``out_dir/cv.json`` (:meth:`CVResult.to_dict`).
    ``trust_model_code``: as :func:`specstore.infer.train.train`'s.  Raises
    :class:`CrossValError` for fewer than 2 folds or a fold that holds no
    clip.
    """
    from sklearn.metrics import f1_score

    if not isinstance(folds, int) or folds < 2:
        raise CrossValError(f"folds must be an integer >= 2, got {folds!r}")
    cfg = config or TrainConfig()
    if overrides:
        cfg = TrainConfig.from_dict({**cfg.to_dict(), **overrides})
    if cfg.select == "best":
        log.warning("select=best picks each fold's epoch on the fold it is scored on: the estimate is optimistic")
    out = Path(out_dir)
    check_output_path(out / "cv.json", what="cross-validation output", stream=False)  # before any work
    s = store if isinstance(store, Store) else open_store(store)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    labelled = np.flatnonzero(s.labels >= 0)
    position = {int(r): i for i, r in enumerate(labelled)}
    fold_of = np.full(len(labelled), -1, dtype=np.int64)
    pred = np.full(len(labelled), -1, dtype=np.int64)
    fold_accuracy: list[float] = []
    for k in range(folds):
        _, val_rows = _fold_rows(s, k, folds, cfg.seed)
        if not len(val_rows):
            raise CrossValError(f"fold {k + 1} of {folds} holds no clip: {len(set(split_keys(s)))} works or "
                                "contents are too few for this many folds")
        fold_cfg = replace(cfg, val_fraction=1.0 / folds, val_offset=k / folds)
        model_path = out / f"fold-{k}.pt"
        log.info("fold %d of %d: %d clips held out", k + 1, folds, len(val_rows))
        logits = _train_fold(s, model_path, fold_cfg, val_rows, out, progress=progress, threads=threads,
                             overwrite=overwrite, trust_model_code=trust_model_code)
        ckpt = load_checkpoint(model_path)
        names = [ckpt.label_names[int(i)] for i in logits.argmax(axis=1)]
        index = {n: i for i, n in enumerate(s.label_names)}
        idx = np.array([position[int(r)] for r in val_rows], dtype=np.int64)
        pred[idx] = [index.get(n, -1) for n in names]
        fold_of[idx] = k
        fold_accuracy.append(float((pred[idx] == s.labels[val_rows]).mean()))
    truth = s.labels[labelled].astype(np.int64)
    correct = pred == truth
    result = CVResult(
        folds=folds, n_clips=len(labelled), accuracy=float(correct.mean()), accuracy_ci=bootstrap_ci(correct),
        macro_f1=float(f1_score(truth, pred, average="macro", zero_division=0)), fold_accuracy=fold_accuracy,
        config=cfg.to_dict())
    if baselines:
        features: list[str] = [f for f in baseline_kinds() if f in s.specs] or list(s.specs)
        for name, p in oof_baseline(s, folds, cfg.seed, features).items():
            result.baselines[name] = float((p == truth).mean())
    result.seconds = time.perf_counter() - t0
    write_atomic(out / "cv.csv", _oof_csv(s, labelled, fold_of, truth, pred))
    write_atomic(out / "cv.json", json.dumps(result.to_dict(), indent=2) + "\n")
    log.info("%s", result.line())
    return result
