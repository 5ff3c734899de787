"""Looking at a model's results: outcomes per clip, metrics, confusion matrix, most-confused clips.

Predictions come either as a :class:`~specstore.infer.engine.predictions.Predictions`
object (full class probabilities) or as the CSV ``make infer`` writes (only
the top-k probabilities).  Both are joined to the store by path and turned
into :class:`Outcomes`, one entry per labelled clip, with the truth taken
from the store's current labels.  From there:

* :meth:`Outcomes.confusion` and :meth:`Outcomes.metrics` (accuracy and
  per-class / macro precision, recall, F1 from :mod:`specstore.infer.evaluation.metrics`, the one
  place metrics are computed, ``make eval`` included) and
  :func:`confusion_figure`;
* :func:`most_confused`: the clips whose true class got the lowest
  probability, or the wrong predictions made with the highest confidence, as
  a :class:`Table` that a notebook renders as HTML; its ``rows`` are store
  rows, ready for :func:`specstore.infer.explore.show_clip`.

Labels are matched by name, as in ``make eval``: the confusion matrix's
classes are the model's labels, then any store label the model does not know
(such clips can only be wrong).  From a CSV the model's full label list is
unknown, so the classes are the store's labels, then any other predicted name.
A true class missing from a CSV row's top-k has an unknown probability; its
upper bound (the smaller of the last listed probability and the mass the list
leaves) is used and marked ``<=``.
"""

from __future__ import annotations

import html
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from specstore.infer.engine.predictions import Predictions, read_predictions_csv
from specstore.infer.errors import PredictionsError as ExploreError
from specstore.infer.evaluation.metrics import classification_metrics, confusion, metrics_from_confusion
from specstore.infer.evaluation.plots import confusion_matrix_figure
from specstore.store import Store

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "Outcomes",
    "Table",
    "classification_metrics",
    "confusion",
    "confusion_figure",
    "load_outcomes",
    "metrics_from_confusion",
    "most_confused",
    "outcomes_from_csv",
    "outcomes_from_predictions",
    "per_class_table",
]

ORDERS = ("truth", "wrong")


# -- outcomes ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcomes:
    """One entry per labelled, predicted clip: the store row, truth and prediction, their probabilities.

    ``truth``/``pred`` index ``label_names``; ``pred_prob`` is the predicted
    class's probability, ``truth_prob`` the true class's (an upper bound where
    ``truth_exact`` is False: a CSV whose top-k missed the truth).
    ``n_unlabelled``: predicted clips skipped for want of a label.
    """

    label_names: list[str]
    rows: np.ndarray
    paths: list[str]
    truth: np.ndarray
    pred: np.ndarray
    pred_prob: np.ndarray
    truth_prob: np.ndarray
    truth_exact: np.ndarray
    durations: np.ndarray
    n_unlabelled: int = 0
    source: str = ""

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def correct(self) -> np.ndarray:
        return self.truth == self.pred

    @property
    def accuracy(self) -> float:
        return float(self.correct.mean()) if len(self) else 0.0

    def confusion(self) -> np.ndarray:
        """``cm[i, j]``: clips of true class ``i`` predicted as ``j`` (int64, square over ``label_names``)."""
        return confusion(self.truth, self.pred, len(self.label_names))

    def metrics(self) -> dict[str, Any]:
        """Accuracy and per-class / macro precision, recall, F1 (:func:`classification_metrics`)."""
        return classification_metrics(self.truth, self.pred, self.label_names)

    def describe(self) -> str:
        """One line: accuracy, clips, skipped unlabelled clips, where the predictions came from."""
        m = self.metrics()
        return (
            f"accuracy {m['accuracy']:.1%}, macro F1 {m['macro_f1']:.3f} on {len(self)} labelled clips"
            + (f" ({self.n_unlabelled} unlabelled skipped)" if self.n_unlabelled else "")
            + (f"; predictions from {self.source}" if self.source else "")
        )


def _store_rows(store: Store, paths: Sequence[str], what: str) -> np.ndarray:
    """Store row of every path; raise when some path is not in the store."""
    if list(paths) == store.paths:
        return np.arange(len(store), dtype=np.int64)
    index = {p: i for i, p in enumerate(store.paths)}
    missing = [p for p in paths if p not in index]
    if missing:
        raise ExploreError(
            f"{what} lists {len(missing)} path(s) not in the store {store.location} "
            f"(e.g. {missing[0]!r}); were they made from another store?"
        )
    return np.fromiter((index[p] for p in paths), dtype=np.int64, count=len(paths))


def _class_names(first: Sequence[str], more: Sequence[str]) -> list[str]:
    names = list(first)
    seen = set(names)
    names += sorted({n for n in more if n not in seen})
    return names


def _build(
    store: Store,
    rows: np.ndarray,
    names: list[str],
    pred_names: Sequence[str],
    pred_prob: np.ndarray,
    truth_prob: np.ndarray,
    truth_exact: np.ndarray,
    source: str,
) -> Outcomes:
    labels = store.labels[rows]
    keep = labels >= 0
    index = {n: k for k, n in enumerate(names)}
    truth = np.array([index[store.label_names[int(k)]] for k in labels[keep]], dtype=np.int64)
    pred = np.array([index[n] for n, k in zip(pred_names, keep, strict=False) if k], dtype=np.int64)
    kept = rows[keep]
    return Outcomes(
        label_names=names,
        rows=kept,
        paths=[store.paths[int(r)] for r in kept],
        truth=truth,
        pred=pred,
        pred_prob=np.asarray(pred_prob, dtype=np.float64)[keep],
        truth_prob=np.asarray(truth_prob, dtype=np.float64)[keep],
        truth_exact=np.asarray(truth_exact, dtype=bool)[keep],
        durations=np.asarray(store.durations, dtype=np.float64)[kept],
        n_unlabelled=int((~keep).sum()),
        source=source,
    )


def outcomes_from_predictions(pred: Predictions, store: Store, *, source: str = "") -> Outcomes:
    """Outcomes of ``pred`` (from :func:`specstore.infer.engine.predict`) for the labelled clips of ``specstore.store``
    (joined by path).

    ``source`` says where the predictions came from in :meth:`Outcomes.describe` (e.g. ``"model
    models/demo.pt"``; empty: not said).
    """
    probs = np.asarray(pred.probs, dtype=np.float64)
    if probs.shape != (len(pred.paths), len(pred.label_names)):
        raise ExploreError(
            f"predictions hold probabilities of shape {probs.shape} for {len(pred.paths)} paths "
            f"and {len(pred.label_names)} labels"
        )
    rows = _store_rows(store, pred.paths, "the predictions")
    names = _class_names(pred.label_names, store.label_names)
    model_index = {n: k for k, n in enumerate(pred.label_names)}
    best = probs.argmax(axis=1) if len(probs) else np.zeros(0, dtype=np.int64)
    pred_names = [pred.label_names[int(k)] for k in best]
    pred_prob = probs[np.arange(len(best)), best] if len(best) else np.zeros(0)
    truth_prob = np.zeros(len(rows), dtype=np.float64)
    for j, r in enumerate(rows.tolist()):
        label = int(store.labels[r])
        if label >= 0 and store.label_names[label] in model_index:
            truth_prob[j] = probs[j, model_index[store.label_names[label]]]
    return _build(store, rows, names, pred_names, pred_prob, truth_prob, np.ones(len(rows), dtype=bool), source)


def outcomes_from_csv(path: str | os.PathLike[str], store: Store) -> Outcomes:
    """Outcomes of a ``make infer`` CSV for the labelled clips of ``specstore.store`` (joined by path).

    The truth is the store's label (the CSV's ``truth`` column is what the
    store said when predicting).  See the module notes on top-k bounds.
    """
    recs = read_predictions_csv(path)
    rows = _store_rows(store, [r.path for r in recs], f"predictions {path}")
    predicted = [n for r in recs for n, _ in r.topk] + [r.pred for r in recs]
    names = _class_names(store.label_names, predicted)
    truth_prob = np.zeros(len(recs), dtype=np.float64)
    exact = np.ones(len(recs), dtype=bool)
    for j, (rec, r) in enumerate(zip(recs, rows.tolist(), strict=False)):
        label = int(store.labels[r])
        if label < 0:
            continue
        listed = dict(rec.topk)
        t = store.label_names[label]
        if t in listed:
            truth_prob[j] = listed[t]
        else:
            exact[j] = False
            truth_prob[j] = max(0.0, min(min(listed.values()), 1.0 - sum(listed.values())))
    return _build(
        store, rows, names, [r.pred for r in recs], np.array([r.prob for r in recs]), truth_prob, exact, str(path)
    )


def load_outcomes(store: Store, predictions: Predictions | str | os.PathLike[str]) -> Outcomes:
    """:func:`outcomes_from_predictions` or :func:`outcomes_from_csv`, whichever ``predictions`` calls for."""
    if isinstance(predictions, Predictions):
        return outcomes_from_predictions(predictions, store)
    return outcomes_from_csv(predictions, store)


# -- tables and figures --------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    """A small table that prints as text and renders as HTML in a notebook (no pandas needed).

    ``records``: one dict per row with the ``columns`` as keys; ``rows``: the
    store row of each record (for ``show_clip``), when the records are clips.
    """

    columns: tuple[str, ...]
    records: tuple[dict[str, Any], ...]
    rows: tuple[int, ...] = ()
    caption: str = ""
    formats: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.records)

    def cell(self, i: int, column: str) -> str:
        v = self.records[i][column]
        fmt = self.formats.get(column)
        return format(v, fmt) if fmt and not isinstance(v, str) else str(v)

    def text(self) -> str:
        cells = [[self.cell(i, c) for c in self.columns] for i in range(len(self))]
        widths = [max([len(c)] + [len(r[k]) for r in cells]) for k, c in enumerate(self.columns)]
        lines = [self.caption] if self.caption else []
        lines.append("  ".join(c.ljust(w) for c, w in zip(self.columns, widths, strict=False)).rstrip())
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=False)).rstrip() for r in cells]
        if not cells:
            lines.append("(no rows)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        e = html.escape
        head = "".join(f"<th>{e(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(f"<td>{e(self.cell(i, c))}</td>" for c in self.columns) + "</tr>" for i in range(len(self))
        )
        cap = f"<caption>{e(self.caption)}</caption>" if self.caption else ""
        empty = "" if self.records else f"<tr><td colspan='{len(self.columns)}'>(no rows)</td></tr>"
        return f"<table>{cap}<thead><tr>{head}</tr></thead><tbody>{body}{empty}</tbody></table>"


def most_confused(outcomes: Outcomes, n: int = 10, *, by: str = "truth") -> Table:
    """The ``n`` clips the model got most wrong, as a :class:`Table`.

    ``by="truth"``: lowest probability of the true class first (right or
    wrong; ties: most confident prediction first).  ``by="wrong"``: only
    misclassified clips, most confident prediction first (ties: lowest
    true-class probability).  Columns: store ``row``, ``path``, ``seconds``,
    ``truth``, ``pred``, ``p(pred)``, ``p(truth)`` (``<=`` marks a bound).
    """
    if by not in ORDERS:
        raise ExploreError(f"by must be one of {', '.join(ORDERS)}, not {by!r}")
    if n < 0:
        raise ExploreError(f"n must be >= 0, got {n}")
    o = outcomes
    idx = np.arange(len(o))
    paths = np.array(o.paths, dtype=object)
    if by == "truth":
        order = np.lexsort((paths, -o.pred_prob, o.truth_prob)) if len(o) else idx
        caption = f"{min(n, len(o))} clips with the lowest true-class probability"
    else:
        wrong = idx[~o.correct]
        order = wrong[np.lexsort((paths[wrong], o.truth_prob[wrong], -o.pred_prob[wrong]))] if len(wrong) else wrong
        caption = f"{min(n, len(wrong))} of {len(wrong)} misclassified clips, most confident first"
    chosen = order[:n]
    records = tuple(
        {
            "row": int(o.rows[i]),
            "path": o.paths[i],
            "seconds": float(o.durations[i]),
            "truth": o.label_names[int(o.truth[i])],
            "pred": o.label_names[int(o.pred[i])],
            "p(pred)": float(o.pred_prob[i]),
            "p(truth)": f"{o.truth_prob[i]:.3f}" if o.truth_exact[i] else f"<={o.truth_prob[i]:.3f}",
        }
        for i in chosen.tolist()
    )
    return Table(
        columns=("row", "path", "seconds", "truth", "pred", "p(pred)", "p(truth)"),
        records=records,
        rows=tuple(int(o.rows[i]) for i in chosen.tolist()),
        caption=caption,
        formats={"seconds": ".1f", "p(pred)": ".3f"},
    )


def per_class_table(outcomes: Outcomes) -> Table:
    """Precision, recall, F1, support and predicted count per class (from :meth:`Outcomes.metrics`)."""
    m = outcomes.metrics()
    records = tuple(
        {"label": name, **{k: m["per_class"][name][k] for k in ("precision", "recall", "f1", "support", "predicted")}}
        for name in outcomes.label_names
    )
    return Table(
        columns=("label", "precision", "recall", "f1", "support", "predicted"),
        records=records,
        caption=outcomes.describe(),
        formats={"precision": ".3f", "recall": ".3f", "f1": ".3f"},
    )


def confusion_figure(outcomes: Outcomes, *, title: str = "Confusion matrix", ax: Axes | None = None) -> Figure:
    """The confusion matrix of ``outcomes``, drawn by :func:`specstore.infer.explore.figures.confusion_matrix_figure`.
    """
    return confusion_matrix_figure(outcomes.confusion(), outcomes.label_names, title=title, ax=ax)
