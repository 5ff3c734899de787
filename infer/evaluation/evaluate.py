"""``make eval``: accuracy, top-k, per-class precision/recall/F1 and a confusion matrix, honestly.

:func:`evaluate` runs a checkpoint over a store's labelled clips with the
engine (:mod:`specstore.infer.engine.runtime`, the loop ``make infer`` uses) and scores them
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

import csv
import io
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specstore.common import ConfigError, write_atomic
from specstore.infer.data.split import (
    SplitRule,
    split_keys,
    training_fingerprint,
    training_rows,
    ungrouped_split_warning,
)
from specstore.infer.engine.predict import LoadedModel, ModelLike, open_inputs
from specstore.infer.engine.runtime import Engine, RunOptions
from specstore.infer.errors import EvaluateError, PlotError, SplitError
from specstore.infer.evaluation.baselines import BaselineResult, bootstrap_ci, fit_baselines
from specstore.infer.evaluation.metrics import classification_metrics, confusion
from specstore.infer.evaluation.plots import plot_confusion
from specstore.infer.models.calibration import ECE_BINS, calibration_report, calibration_text, probabilities
from specstore.infer.models.trust import Trust
from specstore.infer.options.defaults import EVAL_SPLITS
from specstore.store import Store, open_store

__all__ = ["EVAL_SPLITS", "EvaluateError", "Report", "evaluate", "resolve_split", "write_report"]

log = logging.getLogger(__name__)

TOPK = 5
CLIP_COLUMNS = ("path", "hash", "label", "prediction", "prob")
"""The columns of ``heldout.csv``: each scored clip's path, content hash, true label, predicted label and its
probability (0..1)."""
"""Top-k accuracy is reported for k = min(TOPK, number of model classes)."""


@dataclass
class Report:
    """What ``make eval`` reports; :meth:`to_dict` is ``report.json``, :meth:`text` is ``report.txt``.

    ``label_names``: the checkpoint's labels, then any store labels the model
    does not know (their rows count as errors); ``confusion`` is square over
    them (rows: truth, columns: prediction).  ``topk_accuracy`` is the share
    of clips whose true label is among the ``topk`` most probable.
    ``n_clips``: labelled rows evaluated; ``n_unlabelled``: rows of the split
    skipped for lack of a label; ``n_unknown_label``: evaluated rows whose
    label the model lacks; ``split``: the split scored (``auto`` resolved);
    ``n_trained_on``: evaluated rows the model was trained on (None when the
    store is not the one the model was trained on); ``accuracy_ci``: the 95%
    bootstrap interval of ``accuracy`` over the clips; ``baselines``: simple
    baselines fitted on the model's training clips and scored on the same
    clips (:mod:`specstore.infer.evaluation.baselines`), when asked for.
    """

    accuracy: float
    topk_accuracy: float
    topk: int
    macro_precision: float
    macro_recall: float
    macro_f1: float
    weighted_f1: float
    per_class: dict[str, dict[str, float | int]]
    confusion: list[list[int]]
    label_names: list[str]
    n_clips: int
    n_unlabelled: int
    n_unknown_label: int
    unknown_labels: list[str]
    split: str
    store: str
    model: str
    n_trained_on: int | None = None
    accuracy_ci: tuple[float, float] = (0.0, 0.0)
    baselines: list[dict[str, Any]] = field(default_factory=list)
    calibration: str = "uncalibrated"
    temperature: float | None = None
    ece_bins: int = ECE_BINS
    ece_before: float = 0.0
    ece_after: float | None = None
    seconds: float = 0.0
    misclassified: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    clips: list[dict[str, Any]] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """``report.json``: every field but ``clips`` (those are ``heldout.csv``, named in ``files``)."""
        d = asdict(self)
        d.pop("clips")
        return d

    def text(self) -> str:
        """A readable table (precision/recall/F1/support per class, averages, confusion)."""
        width = max([len(n) for n in self.label_names] + [12])
        trained = ("" if self.n_trained_on is None else
                   f"; {self.n_trained_on} of them were training clips" if self.n_trained_on else
                   "; none of them were training clips")
        lines = [
            f"specstore evaluation of {self.model} on {self.store} (split: {self.split})",
            f"{self.n_clips} labelled clips{trained}; {self.n_unlabelled} unlabelled skipped; "
            f"{self.n_unknown_label} with labels unknown to the model"
            + (f" ({', '.join(self.unknown_labels)}; counted as errors)" if self.unknown_labels else ""),
            "",
            f"{'':>{width}}  precision  recall  f1-score  support",
        ]
        for name in self.label_names:
            lines.append(f"{name:>{width}}  {_class_row(self.per_class[name])}")
        lines += [
            "",
            f"{'accuracy':>{width}}  {'':9}  {'':6}  {self.accuracy:8.3f}  {self.n_clips:7d}",
            f"{'macro avg':>{width}}  {self.macro_precision:9.3f}  {self.macro_recall:6.3f}  "
            f"{self.macro_f1:8.3f}  {self.n_clips:7d}",
            f"{'weighted avg':>{width}}  {'':9}  {'':6}  {self.weighted_f1:8.3f}  {self.n_clips:7d}",
            f"{f'top-{self.topk} acc.':>{width}}  {'':9}  {'':6}  {self.topk_accuracy:8.3f}  {self.n_clips:7d}",
            f"{'95% CI (acc.)':>{width}}  {self.accuracy_ci[0]:.3f} .. {self.accuracy_ci[1]:.3f} "
            "(bootstrap over clips)",
            self.calibration_line(),
            "",
            "confusion matrix (rows: true label, columns: predicted label):",
        ]
        if "clips" in self.files:
            lines[2:2] = [f"the clips scored (path, content hash, label, prediction): {self.files['clips']}"]
        cell = max(4, len(str(max((max(r) for r in self.confusion), default=0))) + 1)
        short = [n[:cell - 1] for n in self.label_names]
        lines.append(f"{'':>{width}} " + "".join(f"{s:>{cell}}" for s in short))
        for name, row in zip(self.label_names, self.confusion, strict=True):
            lines.append(f"{name:>{width}} " + "".join(f"{v:>{cell}d}" for v in row))
        if self.baselines:
            lines += ["", "the model against simple baselines on the same clips (accuracy, 95% bootstrap interval):",
                      f"  {'model':<52} {self.accuracy:.3f}  [{self.accuracy_ci[0]:.3f}, {self.accuracy_ci[1]:.3f}]"
                      f"  macro F1 {self.macro_f1:.3f}"]
            for b in self.baselines:
                lo, hi = b["accuracy_ci"]
                lines.append(f"  {b['name']:<52} {b['accuracy']:.3f}  [{lo:.3f}, {hi:.3f}]  macro F1 "
                             f"{b['macro_f1']:.3f}")
            best = max(b["accuracy"] for b in self.baselines)
            lines.append(f"  margin over the best baseline: {self.accuracy - best:+.3f}")
        return "\n".join(lines) + "\n"

    def calibration_line(self) -> str:
        """The temperature and the expected calibration error before and after it, in one line."""
        return calibration_text(self.to_dict(), fitted_here=self.split == "val" and self.n_trained_on is not None)

    def summary(self) -> str:
        """One line for the terminal."""
        trained = "" if not self.n_trained_on else f"; {self.n_trained_on} were training clips"
        return (f"accuracy {self.accuracy:.1%} (top-{self.topk} {self.topk_accuracy:.1%}, "
                f"macro F1 {self.macro_f1:.3f}) on {self.n_clips} clips of split {self.split!r}{trained}")


def _class_row(c: dict[str, Any]) -> str:
    """One class's ``precision recall f1 support`` cells of ``report.txt``.

    A class with no clips in the scored set has no recall or F1 (nothing to
    find), and no precision either when the model never predicted it: those
    cells read ``-`` and the row says why, rather than ``0.000`` (which would
    read as a failure).
    """
    if c["support"]:
        return f"{c['precision']:9.3f}  {c['recall']:6.3f}  {c['f1']:8.3f}  {c['support']:7d}"
    precision = f"{c['precision']:9.3f}" if c.get("predicted") else f"{'-':>9}"
    note = f"  (no clips of this class here; predicted {c['predicted']} times)" if c.get("predicted") else \
        "  (no clips of this class here)"
    return f"{precision}  {'-':>6}  {'-':>8}  {c['support']:7d}{note}"


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
    Raises :class:`EvaluateError` when the selection holds no labelled clip,
    ``StoreError``/``CheckpointError`` for bad inputs.
    """
    t0 = time.perf_counter()
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

    engine = Engine(opts)
    res = engine.logits(engine.prepare(ckpt.module), s, rows, feature=ckpt.feature, desc="evaluating")
    probs = probabilities(res.logits, ckpt.calibration)
    n_trained_on = None
    if trained_here and rule is not None:
        keys = split_keys(s)
        n_trained_on = int((~rule.is_val([keys[int(r)] for r in rows])).sum())
    paths = [s.paths[int(r)] for r in rows]
    report = _score(probs, truth, names, len(ckpt.label_names), paths,
                    n_unlabelled=n_unlabelled, split=split, store=str(s.location), model=ckpt.name,
                    n_trained_on=n_trained_on)
    for key, value in calibration_report(res.logits, truth, ckpt.calibration).items():
        setattr(report, key, value)
    report.clips = _clip_rows(names, probs, truth, paths, [s.hashes[int(r)] for r in rows])
    if baselines:
        report.baselines = [b.to_dict() for b in _baselines(ckpt, s, rows, [names[t] for t in truth], rule,
                                                            baseline_store)]
    if n_trained_on:
        log.warning(
            "%d of the %d clips scored were training clips: the figures are optimistic", n_trained_on, len(rows)
        )
    log.info("evaluated %d clips (%d distinct) in %d batches, padding efficiency %.3f, %d windowed",
             len(rows), res.distinct, res.batches, res.efficiency, res.windowed)
    report.seconds = time.perf_counter() - t0
    if out_dir is not None:
        write_report(report, out_dir)
    return report


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


def write_report(report: Report, out_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Write ``report.json``, ``report.txt``, ``confusion.png`` and ``heldout.csv`` into ``out_dir`` (each atomically).

    Without matplotlib the PNG is skipped with a warning (the numbers are
    still written).  Returns name -> path of what was written, also stored in
    ``report.files``.
    """
    d = Path(out_dir)
    files: dict[str, str] = {}
    try:
        files["confusion"] = str(
            plot_confusion(
                np.asarray(report.confusion),
                report.label_names,
                d / "confusion.png",
                title=f"{Path(report.model).name} on split {report.split!r}",
            )
        )
    except PlotError as e:
        log.warning("%s", e)
    files["json"] = str(d / "report.json")
    files["text"] = str(d / "report.txt")
    files["clips"] = str(d / "heldout.csv")
    report.files = files
    write_atomic(files["clips"], _clips_csv(report.clips))
    write_atomic(files["json"], json.dumps(report.to_dict(), indent=2) + "\n")
    write_atomic(files["text"], report.text())
    return files


def _clips_csv(clips: list[dict[str, Any]]) -> str:
    """``heldout.csv``: the clips scored, one row each (path, hash, label, prediction, prob)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(CLIP_COLUMNS), lineterminator="\n")
    w.writeheader()
    w.writerows(clips)
    return buf.getvalue()
