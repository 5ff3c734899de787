"""``make eval``: accuracy, top-k, per-class precision/recall/F1 and a confusion matrix, honestly.

:func:`evaluate` runs a checkpoint over a store's labelled clips with the
engine (:mod:`specstore.infer.engine.runtime`, the loop ``make infer`` uses; with a backend, on a
cluster's workers as ``make infer BACKEND=...`` does) and scores them
with :mod:`specstore.infer.evaluation.metrics` (scikit-learn metrics), and measures how well its
probabilities are calibrated (top-label expected calibration error, 15
equal-width bins, before and after the checkpoint's temperature;
:mod:`specstore.infer.models.calibration`).  It writes
``report.json``, ``report.txt``, ``confusion.png`` and ``heldout.csv`` (the
clips it scored: path, content hash, label, prediction) to an output folder.

Honest by default: on the store a model was trained on (same location, or
the same training data), ``split="auto"`` scores only the held-out split the
checkpoint recorded; elsewhere it scores every labelled clip.  Asking for
``split="all"`` or ``"train"`` on the training store is allowed, and the
report says how many of the scored clips the model was trained on
(``n_trained_on``).

Labels are matched **by name**: a store may order its labels differently from
the checkpoint or lack some.  Rows whose label the model does not know count
as errors (they are in the denominator, never correct) and are listed in the
report; unlabelled rows are skipped and counted.  Every indexed row (path)
counts once, duplicates included.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from specstore.common import ConfigError, check_output_path
from specstore.infer.data.split import (
    SplitRule,
    split_keys,
    training_fingerprint,
    training_rows,
    ungrouped_split_warning,
)
from specstore.infer.engine.predict import LoadedModel, ModelLike, open_inputs
from specstore.infer.engine.runtime import Engine, RunOptions
from specstore.infer.errors import EvaluateError, SplitError
from specstore.infer.evaluation.baselines import BaselineResult, bootstrap_ci, fit_baselines
from specstore.infer.evaluation.metrics import classification_metrics, confusion
from specstore.infer.evaluation.report import Report, write_report
from specstore.infer.models.calibration import calibration_report, probabilities
from specstore.infer.models.trust import Trust
from specstore.infer.options.cluster_options import ClusterOptions
from specstore.infer.options.defaults import EVAL_SPLITS
from specstore.store import Store, open_store

if TYPE_CHECKING:
    from specstore.common.executors import Executor
    from specstore.infer.engine.distributed import ClusterRun

__all__ = ["EVAL_SPLITS", "EvaluateError", "Report", "evaluate", "resolve_split", "write_report"]

log = logging.getLogger(__name__)

TOPK = 5
"""Top-k accuracy is reported for k = min(TOPK, number of model classes)."""


def _trained_on(ckpt: LoadedModel, store: Store) -> bool:
    """Whether ``ckpt`` was trained on ``specstore.store``: the same location, or the same training data."""
    if ckpt.extra.get("store") == str(store.location):
        return True
    record, fingerprint = ckpt.extra.get("split"), ckpt.extra.get("data_fingerprint")
    if not isinstance(record, dict) or not fingerprint:
        return False
    return training_fingerprint(store, SplitRule.from_dict(record), ckpt.feature) == fingerprint


def resolve_split(ckpt: LoadedModel, store: Store, split: str) -> tuple[str, SplitRule | None, bool]:
    """``(split to score, the checkpoint's split rule or None, whether the model was trained on store)``.

    ``auto`` is ``val`` on the store the model was trained on, ``all``
    elsewhere.  ``val``/``train`` need a checkpoint that recorded its split.
    """
    if split not in EVAL_SPLITS:
        raise SplitError(f"split must be one of {', '.join(EVAL_SPLITS)}, not {split!r}")
    record = ckpt.extra.get("split")
    rule = SplitRule.from_dict(record) if isinstance(record, dict) else None
    trained_here = rule is not None and _trained_on(ckpt, store)
    if split == "auto":
        split = "val" if trained_here else "all"
    if split in ("val", "train") and rule is None:
        raise EvaluateError(f"the checkpoint records no train/validation split (not made by `make train`); "
                            f"cannot select split {split!r}, use split 'all'")
    if split == "val" and rule is not None and rule.val_fraction <= 0:
        raise EvaluateError("the model held out no validation clips (val_fraction 0: every labelled clip of this "
                            "store trained it); evaluate a store of other works (split 'all'), train with a "
                            "validation share (VAL=0.2), or measure the recipe with specstore-cv")
    return split, rule, trained_here


def _topk_hits(probs: np.ndarray, truth: np.ndarray, k: int) -> np.ndarray:
    """Whether each clip's true class is among its ``k`` most probable (unknown labels never are)."""
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    return (top == truth[:, None]).any(axis=1)


def evaluate(
    store: str | os.PathLike[str] | Store,
    model: ModelLike,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    split: str = "auto",
    model_args: dict[str, Any] | None = None,
    trust_model_code: Trust = False,
    baselines: bool = False,
    baseline_store: str | os.PathLike[str] | Store | None = None,
    options: RunOptions | None = None,
    executor: Executor | None = None,
    cluster: ClusterOptions | None = None,
    **overrides: Any,
) -> Report:
    """Evaluate a checkpoint on the labelled clips of ``specstore.store`` (see the module docstring for ``split``).

    ``model``: a checkpoint, an ``nn.Module`` or an import path (see
    :func:`specstore.infer.engine.predict.load_model`; a checkpoint naming an import path
    needs ``trust_model_code``, see :mod:`specstore.infer.models.trust`).  ``options``/``overrides`` are
    :class:`specstore.infer.engine.runtime.RunOptions` (device,
    budget_mb, max_batch, precision, threads, progress).  With ``out_dir``,
    writes ``report.json``, ``report.txt``, ``confusion.png`` and ``heldout.csv`` there.
    ``baselines``: also fit the simple baselines of :mod:`specstore.infer.evaluation.baselines` on
    the model's training clips (those of ``baseline_store``, by default the
    store recorded in the checkpoint, restricted to its training split when
    it is the model's training data) and score them on the same clips.
    ``executor`` or ``cluster`` with a backend (dask, ray; ``model`` must then be a checkpoint file) runs the
    model on workers as ``predict`` does (:mod:`specstore.infer.engine.distributed`), journalled in
    ``<out_dir>/heldout.csv.journal`` so that a rerun resumes; the report is the one-process run's.
    Raises :class:`EvaluateError` when the selection holds no labelled clip,
    ``StoreError``/``CheckpointError`` for bad inputs.
    """
    t0 = time.perf_counter()
    if out_dir is not None:  # a folder that cannot hold the report is one line before any work
        check_output_path(Path(out_dir) / "report.json", what="report", stream=False)
    opts, s, ckpt = open_inputs(store, model, options, overrides, model_args, trust_model_code)
    if ckpt.outputs == "tags":
        raise ConfigError(f"{ckpt.name} is a tagger (independent scores over {len(ckpt.label_names)} tags), not a "
                          "classifier of the store's labels: `make infer` lists its tags; to score it on your "
                          "labels, train a head on it (make train ARCH=musicnn) and evaluate that")
    split, rule, trained_here = resolve_split(ckpt, s, split)
    if split == "val" and (why := ungrouped_split_warning(s)):
        log.warning("%s", why)
    rows, n_unlabelled = _labelled_rows(s, rule, split)
    names, truth = _truth(ckpt, s, rows)

    run = _EvalRun(s, model, ckpt, opts, rows, out_dir, executor, cluster)
    logits = run.logits()
    probs = probabilities(logits, ckpt.calibration)
    n_trained_on = None
    if trained_here and rule is not None:
        keys = split_keys(s)
        n_trained_on = int((~rule.is_val([keys[int(r)] for r in rows])).sum())
    paths = [s.paths[int(r)] for r in rows]
    report = _score(probs, truth, names, len(ckpt.label_names), paths,
                    n_unlabelled=n_unlabelled, split=split, store=str(s.location), model=ckpt.name,
                    n_trained_on=n_trained_on)
    for key, value in calibration_report(logits, truth, ckpt.calibration).items():
        setattr(report, key, value)
    report.clips = _clip_rows(names, probs, truth, paths, [s.hashes[int(r)] for r in rows])
    if baselines:
        report.baselines = [b.to_dict() for b in _baselines(ckpt, s, rows, [names[t] for t in truth], rule,
                                                            baseline_store)]
    if n_trained_on:
        log.warning(
            "%d of the %d clips scored were training clips: the figures are optimistic", n_trained_on, len(rows)
        )
    log.info("evaluated %d clips %s", len(rows), run.line)
    report.seconds = time.perf_counter() - t0
    if out_dir is not None:
        write_report(report, out_dir)
    run.finish()
    return report


class _EvalRun:
    """Where ``evaluate``'s logits come from: this process's engine loop, or, given an executor or a backend, a
    :class:`~specstore.infer.engine.distributed.ClusterRun` over the split's rows (journalled beside
    ``heldout.csv``); :attr:`line` describes the run for the log, :meth:`finish` removes the journal."""

    def __init__(self, s: Store, model: ModelLike, ckpt: LoadedModel, opts: RunOptions, rows: np.ndarray,
                 out_dir: str | os.PathLike[str] | None, executor: Executor | None,
                 cluster: ClusterOptions | None) -> None:
        self.s, self.ckpt, self.opts, self.rows, self.executor = s, ckpt, opts, rows, executor
        self.run: ClusterRun | None = None
        self.line = ""
        if executor is not None or (cluster is not None and cluster.backend is not None):
            from specstore.infer.engine.distributed import ClusterRun

            out = None if out_dir is None else Path(out_dir) / "heldout.csv"
            self.run = ClusterRun(s, model, ckpt, opts, cluster or ClusterOptions(), out, rows=rows,
                                  desc="evaluating")

    def logits(self) -> np.ndarray:
        """The rows' logits ``(len(rows), C)``."""
        engine = Engine(self.opts)
        model = engine.prepare(self.ckpt.module)
        if self.run is not None:
            logits = self.run.logits(model, engine, self.executor)
            f = self.run.figures()
            self.line = (f"on {f['where']}: {f['units']} units ({f['resumed']} resumed from the journal), "
                         f"{f['batches']} batches")
            return logits
        res = engine.logits(model, self.s, self.rows, feature=self.ckpt.feature, desc="evaluating")
        self.line = (f"({res.distinct} distinct) in {res.batches} batches, padding efficiency {res.efficiency:.3f}, "
                     f"{res.windowed} windowed")
        return res.logits

    def finish(self) -> None:
        """The report is written: nothing is left to resume."""
        if self.run is not None:
            self.run.finish()


def _labelled_rows(s: Store, rule: SplitRule | None, split: str) -> tuple[np.ndarray, int]:
    """The labelled store rows of ``split``, and how many rows of it were skipped for lack of a label."""
    rows = np.arange(len(s), dtype=np.int64) if rule is None or split == "all" else rule.select(split_keys(s), split)
    labels = s.labels[rows]
    n_unlabelled = int((labels < 0).sum())
    rows = rows[labels >= 0]
    if not len(rows):
        raise EvaluateError(f"no labelled clips in split {split!r} of {s.location} "
                            f"({n_unlabelled} unlabelled); nothing to evaluate")
    return rows, n_unlabelled


def _truth(ckpt: LoadedModel, s: Store, rows: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The report's label names (the model's, then the store's labels it lacks) and each row's true index."""
    labels = s.labels[rows]
    unknown_names = sorted({s.label_names[label] for label in np.unique(labels)} - set(ckpt.label_names))
    names = list(ckpt.label_names) + unknown_names
    index = {name: k for k, name in enumerate(names)}
    return names, np.array([index[s.label_names[label]] for label in labels.tolist()], dtype=np.int64)


def _score(probs: np.ndarray, truth: np.ndarray, names: list[str], n_classes: int, paths: list[str],
           **facts: Any) -> Report:
    """A report from the model's probabilities (``n_classes`` columns) and the true indices into ``names``
    (those past ``n_classes`` are labels the model lacks); ``paths``: each clip's path; ``facts``: the
    report's fields about the run (split, store, model, counts)."""
    pred = probs.argmax(axis=1)
    k = min(TOPK, n_classes)
    metrics = classification_metrics(truth, pred, names)
    misclassified = [{"path": paths[i], "truth": names[truth[i]], "pred": names[pred[i]],
                      "prob": round(float(probs[i, pred[i]]), 4)} for i in np.flatnonzero(pred != truth)]
    return Report(
        accuracy=metrics["accuracy"],
        topk_accuracy=float(_topk_hits(probs, truth, k).mean()),
        topk=k,
        macro_precision=metrics["macro_precision"],
        macro_recall=metrics["macro_recall"],
        macro_f1=metrics["macro_f1"],
        weighted_f1=metrics["weighted_f1"],
        per_class=metrics["per_class"],
        confusion=confusion(truth, pred, len(names)).tolist(),
        label_names=names,
        n_clips=len(truth),
        n_unknown_label=int((truth >= n_classes).sum()),
        unknown_labels=names[n_classes:],
        misclassified=misclassified,
        accuracy_ci=bootstrap_ci(pred == truth),
        **facts,
    )


def _clip_rows(names: list[str], probs: np.ndarray, truth: np.ndarray, paths: list[str],
               hashes: list[str]) -> list[dict[str, Any]]:
    """One row per scored clip (``heldout.csv``): path, content hash, true label, prediction and its probability."""
    pred = probs.argmax(axis=1)
    return [{"path": paths[i], "hash": hashes[i], "label": names[truth[i]],
             "prediction": names[pred[i]], "prob": round(float(probs[i, pred[i]]), 4)}
            for i in range(len(truth))]


def _baselines(ckpt: LoadedModel, s: Store, rows: np.ndarray, truth: list[str], rule: SplitRule | None,
               baseline_store: str | os.PathLike[str] | Store | None) -> list[BaselineResult]:
    """Fit the baselines on the model's training clips and score them on ``rows`` of ``s``."""
    source = baseline_store if baseline_store is not None else ckpt.extra.get("store")
    if source is None:
        raise EvaluateError("the baselines need training clips: give baseline_store (--baseline-store); the "
                            "checkpoint records no training store")
    train_store = source if isinstance(source, Store) else open_store(source)
    train_rows = np.flatnonzero(train_store.labels >= 0)
    if rule is not None and _trained_on(ckpt, train_store):
        train_rows = training_rows(train_store, rule)[0]  # what the model learned from, nothing held out
    if str(train_store.location) == str(s.location) and set(train_rows.tolist()) & set(rows.tolist()):
        log.warning("the baselines are fitted on some of the clips they are scored on (split 'all' on the training "
                    "store): their figures are optimistic too")
    return fit_baselines(train_store, train_rows, s, rows, truth)
