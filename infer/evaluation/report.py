"""``make eval``'s report: :class:`Report` (``report.json``, ``report.txt``) and :func:`write_report`.

The figures come from :func:`specstore.infer.evaluation.evaluate.evaluate`; this module only holds and writes
them: ``report.json`` (every figure), ``report.txt`` (a readable table), ``confusion.png`` and ``heldout.csv``
(the clips scored), each written atomically.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specstore.common import write_atomic
from specstore.infer.errors import PlotError
from specstore.infer.evaluation.plots import plot_confusion
from specstore.infer.models.calibration import ECE_BINS, calibration_text

__all__ = ["CLIP_COLUMNS", "Report", "write_report"]

log = logging.getLogger(__name__)

CLIP_COLUMNS = ("path", "hash", "label", "prediction", "prob")
"""The columns of ``heldout.csv``: each scored clip's path, content hash, true label, predicted label and its
probability (0..1)."""


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
