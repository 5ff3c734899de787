"""What a training run writes besides the checkpoint: ``metrics.csv``, TensorBoard scalars, the held-out report.

The held-out report (:func:`held_out_report`) scores the saved model on the
validation split and, for a model with a statistics head, each of its two
experts alone (the CNN, and the logistic regression on band statistics,
which is the simple baseline fitted on the same training clips), each with a
bootstrap interval over the held-out clips.
"""

from __future__ import annotations

import csv
import io
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specstore.infer.evaluation.baselines import bootstrap_ci

__all__ = ["METRICS_COLUMNS", "HeldOut", "Scalars", "held_out_report", "held_out_text", "macro_f1", "metrics_csv"]

METRICS_COLUMNS = ("epoch", "loss", "train_accuracy", "val_accuracy", "val_f1", "val_loss", "lr", "efficiency",
                   "batches", "seconds")
"""Columns of ``metrics.csv``, one row per finished epoch."""


def macro_f1(truth: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(truth, pred, average="macro", zero_division=0))


def metrics_csv(history: list[dict[str, Any]]) -> str:
    """``metrics.csv``: one row per epoch of ``history`` (empty cells for missing figures)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=METRICS_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for entry in history:
        w.writerow({k: ("" if entry.get(k) is None else entry.get(k)) for k in METRICS_COLUMNS})
    return buf.getvalue()


class Scalars:
    """TensorBoard scalars next to the checkpoint when ``tensorboard`` is installed; a no-op otherwise (and when
    not ``enabled``: the ranks other than 0 of a distributed run)."""

    def __init__(self, model_path: Path, enabled: bool = True) -> None:
        self.writer: Any = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.writer = None
            return
        self.writer = SummaryWriter(log_dir=str(model_path.with_name(model_path.stem + ".tensorboard")))

    def add(self, entry: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for key in METRICS_COLUMNS[1:]:
            if entry.get(key) is not None:
                self.writer.add_scalar(key, float(entry[key]), entry["epoch"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@dataclass
class HeldOut:
    """One predictor's figures on the held-out clips: accuracy with its 95 % bootstrap interval, macro-F1."""

    name: str
    accuracy: float
    accuracy_ci: tuple[float, float]
    macro_f1: float

    def text(self) -> str:
        return (f"{self.name} {self.accuracy:.3f} [{self.accuracy_ci[0]:.3f}, {self.accuracy_ci[1]:.3f}] "
                f"(macro-F1 {self.macro_f1:.3f})")


def _figures(name: str, truth: np.ndarray, logits: np.ndarray) -> HeldOut:
    pred = logits.argmax(axis=1)
    correct = pred == truth
    return HeldOut(name, float(correct.mean()), bootstrap_ci(correct), macro_f1(truth, pred))


def held_out_report(truth: np.ndarray, logits: np.ndarray, cnn: np.ndarray | None = None,
                    stats: np.ndarray | None = None) -> list[dict[str, Any]]:
    """The model's held-out figures (``logits``), and each expert's when the model has a statistics head
    (``cnn``: the CNN's logits, ``stats``: the statistics head's), JSON-ready."""
    report = [_figures("model", truth, logits)]
    if cnn is not None and stats is not None:
        report += [_figures("CNN alone", truth, cnn),
                   _figures("band-statistics logistic regression alone", truth, stats)]
    return [{**asdict(r), "accuracy_ci": list(r.accuracy_ci)} for r in report]


def held_out_text(report: list[dict[str, Any]], n_clips: int) -> str:
    """One line: every predictor of :func:`held_out_report` with its interval."""
    return f"held out ({n_clips} clips): " + "; ".join(HeldOut(**r).text() for r in report)
