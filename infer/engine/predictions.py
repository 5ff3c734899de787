"""Predictions and their CSV: the one place that writes and reads the ``make infer`` file.

Core: :func:`specstore.infer.engine.predict` writes it, :mod:`specstore.infer.explore` reads it (never the other way
round).

:class:`Predictions` holds per-row class probabilities (rows as in the store,
one per indexed path) with the run's figures.  :func:`write_predictions_csv`
and :func:`read_predictions_csv` share one column list, :data:`COLUMNS`:

``path,pred,prob,topk,truth,calibration``

* ``pred``/``prob``: the best label and its probability (4 decimals); with
  ``unknown_below=P``, ``pred`` is ``unknown`` where ``prob`` is below P
  (``prob`` and ``topk`` are unchanged, so nothing is lost);
* ``topk``: ``label:prob`` pairs joined by ``;``, best first.  In labels
  written there, ``%``, ``:`` and ``;`` are percent-escaped (``%25``,
  ``%3A``, ``%3B``), so any label round-trips and the column is never
  ambiguous; ``pred`` and ``truth`` hold labels as they are;
* ``truth``: the store's label for the path when predicting (empty if none);
* ``calibration``: how the probabilities were made, the same on every row:
  ``temperature=T`` (softmax of the logits divided by the temperature fitted
  on the model's validation clips) or ``uncalibrated`` (plain softmax; see
  :mod:`specstore.infer.models.calibration`).  Readers need only the first five columns
  (:data:`REQUIRED_COLUMNS`), so files written before it still read.

A multi-label tagger (``outputs == "tags"``, e.g. a shipped musicnn, :mod:`specstore.infer.models.shipped`) has no
single answer: its scores are independent sigmoids, several high per clip.  Its file has the columns
:data:`TAG_COLUMNS`, ``path,tags,truth``, ``tags`` holding the top-k ``tag:score`` pairs as ``topk`` does; there is no
``pred``, no ``prob`` and no ``unknown``.  ``labels`` (:func:`select_labels`) restricts either file to a subset of the
model's labels.

The file is standard CSV (RFC 4180 quoting), UTF-8, written atomically, or straight through a FIFO or
``/dev/stdout`` (:func:`specstore.common.atomic.open_output`).
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specstore.common import open_output
from specstore.infer.errors import PredictionsError
from specstore.infer.options.cli_options import check_unknown_below

__all__ = [
    "COLUMNS", "NO_UNKNOWN_FOR_TAGS", "REQUIRED_COLUMNS", "TAG_COLUMNS", "UNKNOWN", "CsvPrediction", "Predictions",
    "PredictionsError", "answer", "check_unknown_below", "escape_label", "read_predictions_csv",
    "select_labels", "unescape_label", "write_predictions_csv",
]

COLUMNS = ("path", "pred", "prob", "topk", "truth", "calibration")
"""The predictions CSV's header, in order."""

REQUIRED_COLUMNS = COLUMNS[:5]
"""The columns a predictions CSV must start with (``calibration`` came later: older files lack it)."""

TAG_COLUMNS = ("path", "tags", "truth")
"""The header of a multi-label tagger's predictions file (see the module docstring): no calibration column."""

UNKNOWN = "unknown"
"""The answer of a single-label output whose top probability is below ``unknown_below``."""

_ESCAPES = (("%", "%25"), (":", "%3A"), (";", "%3B"))


def escape_label(label: str) -> str:
    """``label`` with ``%``, ``:`` and ``;`` percent-escaped, for the ``topk`` column."""
    for raw, coded in _ESCAPES:
        label = label.replace(raw, coded)
    return label


def unescape_label(text: str) -> str:
    """Inverse of :func:`escape_label`."""
    for raw, coded in reversed(_ESCAPES):
        text = text.replace(coded, raw)
    return text


def select_labels(label_names: list[str], wanted: str | list[str] | None) -> np.ndarray:
    """Indices into ``label_names`` of ``wanted`` (a comma-separated string or a list; None: all of them), in
    the order given; :class:`PredictionsError` in one line naming any label the model does not have."""
    if wanted is None:
        return np.arange(len(label_names))
    names = [w.strip() for w in (wanted.split(",") if isinstance(wanted, str) else wanted) if w.strip()]
    if not names:
        raise PredictionsError("labels must name at least one of the model's labels")
    index = {name: i for i, name in enumerate(label_names)}
    unknown = [n for n in names if n not in index]
    if unknown:
        shown = ", ".join(label_names[:12]) + (", ..." if len(label_names) > 12 else "")
        raise PredictionsError(f"the model has no label {', '.join(map(repr, unknown))}; it has {shown} "
                               "(`specstore classify --list-tags --model M` lists them all)")
    return np.array(list(dict.fromkeys(index[n] for n in names)), dtype=np.int64)


@dataclass
class Predictions:
    """Per-row probabilities ``(n_rows, n_classes)`` (rows as in the store), the labels, and run figures.

    ``truth[i]`` is the store's label name of row ``i`` (None if unlabelled); ``stats`` are the run's figures
    (:class:`specstore.infer.engine.predict.PredictStats` for :func:`specstore.infer.engine.predict`); ``outputs``:
    ``"classes"`` (a softmax) or ``"tags"`` (independent sigmoid scores); ``calibration``: the CSV's ``calibration``
    cell, ``temperature=T`` or ``uncalibrated`` (:meth:`specstore.infer.models.calibration.Calibration.label`; not
    written for a tagger).
    """

    paths: list[str]
    probs: np.ndarray
    label_names: list[str]
    truth: list[str | None]
    stats: Any = field(default=None)
    outputs: str = "classes"
    calibration: str = "uncalibrated"

    def subset(self, labels: str | list[str] | None) -> Predictions:
        """These predictions restricted to ``labels`` (:func:`select_labels`; None: all)."""
        if labels is None:
            return self
        idx = select_labels(self.label_names, labels)
        return Predictions(self.paths, self.probs[:, idx], [self.label_names[i] for i in idx], self.truth,
                           self.stats, self.outputs, self.calibration)

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices ``(n_rows, k)`` and probabilities of the ``k`` best classes, best first."""
        k = min(k, self.probs.shape[1])
        idx = np.argsort(-self.probs, axis=1, kind="stable")[:, :k]
        return idx, np.take_along_axis(self.probs, idx, axis=1)


NO_UNKNOWN_FOR_TAGS = ("unknown_below is for single-label models; a tagger's scores are independent (several "
                       "tags may be high at once), so there is no single answer to withhold")
"""The one-line refusal of ``unknown_below`` for a multi-label tagger."""


def answer(label: str, prob: float, unknown_below: float | None) -> str:
    """The single-label answer: ``label``, or :data:`UNKNOWN` when its probability ``prob`` is below
    ``unknown_below`` (None: off)."""
    return UNKNOWN if unknown_below is not None and prob < unknown_below else label


def write_predictions_csv(pred: Predictions, out: str | os.PathLike[str], *, topk: int = 5,
                          unknown_below: float | None = None) -> Path:
    """Write the predictions CSV (see the module docstring) to ``out`` (atomically, or straight through a FIFO or
    ``/dev/stdout``: :func:`specstore.common.atomic.open_output`); return its path.

    ``unknown_below``: ``pred`` is ``unknown`` where the top probability is below it (None: off).
    """
    unknown_below = check_unknown_below(unknown_below)
    tags = pred.outputs == "tags"
    if tags and unknown_below is not None:
        raise PredictionsError(NO_UNKNOWN_FOR_TAGS)
    idx, pr = pred.top(topk)
    with open_output(out, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(TAG_COLUMNS if tags else COLUMNS)
        for i, path in enumerate(pred.paths):
            names = [pred.label_names[j] for j in idx[i]]
            pairs = ";".join(f"{escape_label(n)}:{q:.4f}" for n, q in zip(names, pr[i], strict=True))
            if tags:
                w.writerow([path, pairs, pred.truth[i] or ""])
                continue
            w.writerow([path, answer(names[0], float(pr[i, 0]), unknown_below), f"{pr[i, 0]:.4f}", pairs,
                        pred.truth[i] or "", pred.calibration])
    return Path(out)


@dataclass(frozen=True)
class CsvPrediction:
    """One row of a predictions CSV: ``topk`` as (label, probability) pairs, best first; ``truth`` or None."""

    path: str
    pred: str
    prob: float
    topk: tuple[tuple[str, float], ...]
    truth: str | None


def _parse_prob(text: str, where: str) -> float:
    try:
        p = float(text)
    except ValueError:
        raise PredictionsError(f"{where}: probability {text!r} is not a number") from None
    if not (math.isfinite(p) and 0.0 <= p <= 1.0 + 1e-6):
        raise PredictionsError(f"{where}: probability {text!r} is not in [0, 1]")
    return p


def read_predictions_csv(path: str | os.PathLike[str]) -> list[CsvPrediction]:
    """Parse a predictions CSV written by :func:`write_predictions_csv` (``make infer``)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PredictionsError(f"cannot read predictions {p}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise PredictionsError(f"{p} is not a predictions CSV: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader, None)
    if header is not None and tuple(h.strip() for h in header[:len(TAG_COLUMNS)]) == TAG_COLUMNS:
        raise PredictionsError(f"{p} holds a tagger's scores (path,tags,truth: several tags per clip), not one "
                               "label per clip; it cannot be read as single-label predictions")
    if header is None or tuple(h.strip() for h in header[:len(REQUIRED_COLUMNS)]) != REQUIRED_COLUMNS:
        raise PredictionsError(f"{p} is not a predictions CSV: its header must start with "
                               f"{','.join(REQUIRED_COLUMNS)}")
    out: list[CsvPrediction] = []
    for rec in reader:
        if not rec:
            continue
        where = f"{p} line {reader.line_num}"
        if len(rec) < len(REQUIRED_COLUMNS):
            raise PredictionsError(f"{where}: expected at least {len(REQUIRED_COLUMNS)} columns, got {len(rec)}")
        pairs: list[tuple[str, float]] = []
        for item in filter(None, rec[3].split(";")):
            name, sep, prob = item.rpartition(":")
            if not sep or not name:
                raise PredictionsError(f"{where}: top-k entry {item!r} is not label:probability")
            pairs.append((unescape_label(name), _parse_prob(prob, where)))
        if not pairs:
            pairs = [(rec[1], _parse_prob(rec[2], where))]
        out.append(CsvPrediction(rec[0], rec[1], _parse_prob(rec[2], where), tuple(pairs), rec[4] or None))
    return out
