"""``make eval``: accuracy, top-5, per-class precision/recall/F1 and a confusion matrix.

:func:`metrics_from_confusion` is the pure part (a confusion matrix in, the
CCMusic-style table out).  :func:`evaluate` runs a checkpoint over a store's
labelled clips (optionally only the training or the held-out split the
checkpoint recorded), and writes ``report.json``, ``report.txt`` and
``confusion.png`` to an output folder.

Predictions come from the same pieces as ``make infer`` (:mod:`infer.predict`):
the memory cost is measured, distinct contents are planned into length-sorted
batches under the budget, clips too long for any batch run in windows, and a
CUDA out-of-memory splits the batch (:func:`infer.predict.logits_for_rows`, the
one prediction loop, which training's validation uses too).

Labels are matched **by name**: a store may order its labels differently from
the checkpoint or lack some.  Rows whose label the model does not know count
as errors (they are in the denominator, never correct) and are listed in the
report; unlabelled rows are skipped and counted.  Every indexed row (path)
counts once, duplicates included.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from store import Store

from .checkpoint import Checkpoint
from .plots import PlotError, plot_confusion
from .predict import PredictOptions, RunSetup, logits_for_rows, open_inputs
from .split import SPLITS, SplitError, SplitRule

__all__ = ["EvaluateError", "Report", "evaluate", "metrics_from_confusion",
           "write_report"]

log = logging.getLogger(__name__)

TOPK = 5


class EvaluateError(ValueError):
    """Nothing to evaluate (no labelled clips), or a split the checkpoint cannot reproduce."""


# -- the pure part ---------------------------------------------------------------------------

def _ratio(num: float, den: float) -> float:
    """``num / den``, and 0.0 when ``den`` is 0 (the zero-division convention of this module)."""
    return float(num) / float(den) if den else 0.0


def metrics_from_confusion(cm: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
    """Accuracy and per-class / macro precision, recall and F1 from a confusion matrix.

    ``cm[i, j]`` counts clips of true class ``i`` predicted as ``j`` (square,
    one row per name).  Per class: ``precision = tp / predicted``,
    ``recall = tp / support``, ``f1 = 2 p r / (p + r)``; **any 0/0 is 0**
    (a class never predicted has precision 0, an absent class recall 0).
    Macro averages are unweighted means over the classes that occur, in the
    truth or in the predictions (scikit-learn's default label set), so a
    model label absent from a test set and never predicted does not drag the
    average down, while wrong predictions into it do.  ``weighted_f1`` weights
    by support.  Returns ``accuracy``, ``n``, ``macro_precision``,
    ``macro_recall``, ``macro_f1``, ``weighted_f1`` and ``per_class``
    (name -> ``precision``, ``recall``, ``f1``, ``support``, ``predicted``).
    """
    m = np.asarray(cm)
    n = len(label_names)
    if m.shape != (n, n):
        raise ValueError(f"confusion matrix must be {n}x{n} for {n} labels, got shape {m.shape}")
    if m.size and (m.min() < 0 or not np.all(np.equal(np.mod(m, 1), 0))):
        raise ValueError("confusion matrix entries must be non-negative counts")
    m = m.astype(np.int64)
    support = m.sum(axis=1)
    predicted = m.sum(axis=0)
    tp = np.diag(m)
    per_class: dict[str, dict[str, float | int]] = {}
    present: list[str] = []
    for k, name in enumerate(label_names):
        p = _ratio(tp[k], predicted[k])
        r = _ratio(tp[k], support[k])
        per_class[name] = {"precision": p, "recall": r, "f1": _ratio(2 * p * r, p + r),
                           "support": int(support[k]), "predicted": int(predicted[k])}
        if support[k] or predicted[k]:
            present.append(name)
    total = int(support.sum())

    def macro(key: str) -> float:
        return float(np.mean([per_class[c][key] for c in present])) if present else 0.0

    weighted = _ratio(sum(per_class[c]["f1"] * per_class[c]["support"] for c in present), total)
    return {
        "accuracy": _ratio(int(tp.sum()), total),
        "n": total,
        "macro_precision": macro("precision"),
        "macro_recall": macro("recall"),
        "macro_f1": macro("f1"),
        "weighted_f1": weighted,
        "per_class": per_class,
    }


# -- predictions for a subset of rows -------------------------------------------------------

# -- evaluation of a checkpoint on a store ---------------------------------------------------

@dataclass
class Report:
    """What ``make eval`` reports; :meth:`to_dict` is ``report.json``, :meth:`text` is ``report.txt``.

    ``label_names``: the checkpoint's labels, then any store labels the model
    does not know (their rows count as errors); ``confusion`` is square over
    them (rows: truth, columns: prediction).  ``n_clips``: labelled rows
    evaluated; ``n_unlabelled``: rows of the split skipped for lack of a
    label; ``n_unknown_label``: evaluated rows whose label the model lacks.
    """

    accuracy: float
    top5_accuracy: float
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
    seconds: float = 0.0
    misclassified: list[dict[str, Any]] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}

    def text(self) -> str:
        """A readable table (precision/recall/F1/support per class, averages, confusion)."""
        width = max([len(n) for n in self.label_names] + [12])
        lines = [
            f"specstore evaluation of {self.model} on {self.store} (split: {self.split})",
            f"{self.n_clips} labelled clips; {self.n_unlabelled} unlabelled skipped; "
            f"{self.n_unknown_label} with labels unknown to the model"
            + (f" ({', '.join(self.unknown_labels)}; counted as errors)" if self.unknown_labels else ""),
            "",
            f"{'':>{width}}  precision  recall  f1-score  support",
        ]
        for name in self.label_names:
            c = self.per_class[name]
            lines.append(f"{name:>{width}}  {c['precision']:9.3f}  {c['recall']:6.3f}  {c['f1']:8.3f}  "
                         f"{c['support']:7d}")
        lines += [
            "",
            f"{'accuracy':>{width}}  {'':9}  {'':6}  {self.accuracy:8.3f}  {self.n_clips:7d}",
            f"{'macro avg':>{width}}  {self.macro_precision:9.3f}  {self.macro_recall:6.3f}  "
            f"{self.macro_f1:8.3f}  {self.n_clips:7d}",
            f"{'weighted avg':>{width}}  {'':9}  {'':6}  {self.weighted_f1:8.3f}  {self.n_clips:7d}",
            f"{f'top-{self.topk} acc.':>{width}}  {'':9}  {'':6}  {self.top5_accuracy:8.3f}  {self.n_clips:7d}",
            "",
            "confusion matrix (rows: true label, columns: predicted label):",
        ]
        cell = max(4, len(str(max((max(r) for r in self.confusion), default=0))) + 1)
        short = [n[:cell - 1] for n in self.label_names]
        lines.append(f"{'':>{width}} " + "".join(f"{s:>{cell}}" for s in short))
        for name, row in zip(self.label_names, self.confusion):
            lines.append(f"{name:>{width}} " + "".join(f"{v:>{cell}d}" for v in row))
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """One line for the terminal."""
        return (f"accuracy {self.accuracy:.1%} (top-{self.topk} {self.top5_accuracy:.1%}, "
                f"macro F1 {self.macro_f1:.3f}) on {self.n_clips} clips of split {self.split!r}")


def _checkpoint_split(ckpt: Checkpoint, split: str) -> SplitRule | None:
    if split not in SPLITS:
        raise SplitError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
    if split == "all":
        return None
    record = ckpt.extra.get("split")
    if not isinstance(record, dict):
        raise EvaluateError(f"the checkpoint records no train/validation split (not made by `make train`); "
                            f"cannot select split {split!r}, use split 'all'")
    return SplitRule.from_dict(record)


def evaluate(
    store: str | Store,
    model: str | os.PathLike[str] | Checkpoint,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    split: str = "all",
    options: PredictOptions | None = None,
    **overrides: Any,
) -> Report:
    """Evaluate a checkpoint on the labelled clips of ``store`` (all, or the recorded train/val split).

    ``options``/``overrides`` are :class:`infer.predict.PredictOptions`
    (device, budget_mb, max_batch, precision, threads, progress).  With
    ``out_dir``, writes ``report.json``, ``report.txt`` and ``confusion.png``
    there.  Raises :class:`EvaluateError` when the selection holds no labelled
    clip, ``StoreError``/``CheckpointError`` for bad inputs.
    """
    t0 = time.perf_counter()
    opts, s, ckpt = open_inputs(store, model, options, overrides)
    rule = _checkpoint_split(ckpt, split)

    rows = np.arange(len(s), dtype=np.int64) if rule is None else rule.select(s.hashes, split)
    labels = s.labels[rows]
    n_unlabelled = int((labels < 0).sum())
    rows, labels = rows[labels >= 0], labels[labels >= 0]
    if not len(rows):
        raise EvaluateError(f"no labelled clips in split {split!r} of {s.location} "
                            f"({n_unlabelled} unlabelled); nothing to evaluate")

    known = {name: k for k, name in enumerate(ckpt.label_names)}
    unknown_names = sorted({s.label_names[l] for l in np.unique(labels)} - set(known))
    names = list(ckpt.label_names) + unknown_names
    index = {name: k for k, name in enumerate(names)}
    truth = np.array([index[s.label_names[l]] for l in labels.tolist()], dtype=np.int64)
    n_classes = len(ckpt.label_names)

    run = RunSetup.for_checkpoint(ckpt, opts)
    res = logits_for_rows(run.model, s.feature(ckpt.feature), rows, device=run.device, budget_bytes=run.budget.bytes,
                          max_batch=opts.max_batch, autocast=run.autocast, channels_last=run.channels_last,
                          hashes=s.hashes, progress=opts.progress)
    probs = torch.softmax(torch.from_numpy(res.logits), dim=1).numpy()
    pred = probs.argmax(axis=1)
    k = min(TOPK, n_classes)
    top = np.argsort(-probs, axis=1, kind="stable")[:, :k]
    top_hit = (top == truth[:, None]).any(axis=1)

    cm = np.zeros((len(names), len(names)), dtype=np.int64)
    np.add.at(cm, (truth, pred), 1)
    metrics = metrics_from_confusion(cm, names)
    wrong = np.flatnonzero(pred != truth)
    misclassified = [{"path": s.paths[int(rows[i])], "truth": names[truth[i]], "pred": names[pred[i]],
                      "prob": round(float(probs[i, pred[i]]), 4)} for i in wrong]
    model_name = str(model) if not isinstance(model, Checkpoint) else "<checkpoint>"
    report = Report(
        accuracy=metrics["accuracy"], top5_accuracy=float(top_hit.mean()), topk=k,
        macro_precision=metrics["macro_precision"], macro_recall=metrics["macro_recall"],
        macro_f1=metrics["macro_f1"], weighted_f1=metrics["weighted_f1"], per_class=metrics["per_class"],
        confusion=cm.tolist(), label_names=names, n_clips=len(rows), n_unlabelled=n_unlabelled,
        n_unknown_label=int((truth >= n_classes).sum()), unknown_labels=unknown_names, split=split,
        store=str(s.location), model=model_name, misclassified=misclassified,
    )
    log.info("evaluated %d clips (%d distinct) in %d batches, padding efficiency %.3f, %d windowed",
             len(rows), res.distinct, res.batches, res.efficiency, res.windowed)
    report.seconds = time.perf_counter() - t0
    if out_dir is not None:
        write_report(report, out_dir)
    return report


def write_report(report: Report, out_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Write ``report.json``, ``report.txt`` and ``confusion.png`` into ``out_dir`` (each atomically).

    Without matplotlib the PNG is skipped with a warning (the numbers are
    still written).  Returns name -> path of what was written, also stored in
    ``report.files``.
    """
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}
    try:
        files["confusion"] = str(plot_confusion(np.asarray(report.confusion), report.label_names,
                                                d / "confusion.png", title=f"{Path(report.model).name} "
                                                f"on split {report.split!r}"))
    except PlotError as e:
        log.warning("%s", e)
    files["json"] = str(d / "report.json")
    files["text"] = str(d / "report.txt")
    report.files = files
    for name, content in ((files["json"], json.dumps(report.to_dict(), indent=2) + "\n"),
                          (files["text"], report.text())):
        p = Path(name)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(content, encoding="utf-8")
        os.replace(tmp, p)
    return files
