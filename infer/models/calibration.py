"""Honest confidence for single-label models: temperature scaling and the expected calibration error.

A classifier trained on few clips is over-confident: its softmax says 1.000
on files it gets wrong.  Temperature scaling (Guo et al., 2017, "On
Calibration of Modern Neural Networks") divides the logits by one scalar
``T > 0`` fitted after training on the held-out validation clips, by
minimising their negative log-likelihood: ``T > 1`` softens over-confident
probabilities, ``T < 1`` sharpens under-confident ones.  The ranking, hence
every prediction and accuracy figure, is unchanged.

:class:`Calibration` is what a checkpoint records (``extra["calibration"]``,
plain JSON values); a checkpoint without it (older ones, or a model that held
out no validation clip) is *uncalibrated* (``T`` absent, probabilities are the
plain softmax).  :func:`probabilities` is the one place logits become
probabilities: ``make infer``, ``make eval``, ``specstore classify`` and
``specstore serve`` all go through it with the checkpoint's calibration.

Multi-label tag models (``outputs == "tags"``, independent sigmoid scores)
are not calibrated: temperature scaling applies to single-label softmax
heads only.  :func:`probabilities` gives them plain sigmoids, their
:attr:`~specstore.infer.models.checkpoint.Checkpoint.calibration` is always uncalibrated, and
their outputs carry no calibration column or key at all (no
``uncalibrated`` marker either: their scores are not one distribution).

:func:`expected_calibration_error` measures calibration: the top-label ECE
over 15 equal-width confidence bins.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from specstore.common import ConfigError
from specstore.common.limits import Limit

__all__ = ["ECE_BINS", "TEMPERATURE_BOUNDS", "TEMPERATURE_LIMIT", "UNCALIBRATED", "Calibration", "calibration_fields",
           "calibration_report", "calibration_text", "expected_calibration_error", "fit_temperature", "probabilities"]

log = logging.getLogger(__name__)

UNCALIBRATED = "uncalibrated"
"""What outputs say of a model without a fitted temperature (no validation clips, or an older checkpoint)."""

ECE_BINS = 15
"""Equal-width confidence bins of :func:`expected_calibration_error` (the common choice since Guo et al.)."""

TEMPERATURE_BOUNDS = (0.05, 20.0)
"""The range :func:`fit_temperature` searches: a fit at a bound means the validation clips pull it further
(e.g. every one right with a wide margin), which a few clips cannot support."""

TEMPERATURE_LIMIT = Limit(0.01, 100.0, "a positive scale dividing the logits: a tiny one makes them infinite and "
                                       "the probabilities NaN, below 0.01 every answer is a certainty, above 100 a "
                                       "uniform guess; fits search 0.05-20", float)
"""The temperatures a checkpoint may record (its own, and each member's of a sum of models), checked when it is
read: one line naming the value and the bound, never NaN probabilities later."""


@dataclass(frozen=True)
class Calibration:
    """How a checkpoint's logits become probabilities.

    ``temperature``: the fitted ``T`` (None: uncalibrated, plain softmax);
    ``n_clips``: validation clips it was fitted on; ``nll_before`` /
    ``nll_after``: their mean negative log-likelihood (nats) at ``T = 1``
    and at ``T``.
    """

    temperature: float | None = None
    n_clips: int = 0
    nll_before: float | None = None
    nll_after: float | None = None

    def __post_init__(self) -> None:
        if self.temperature is not None:
            TEMPERATURE_LIMIT.check("the calibration temperature", self.temperature)

    @property
    def calibrated(self) -> bool:
        return self.temperature is not None

    def label(self) -> str:
        """Short, for a CSV cell: ``temperature=1.7000`` or ``uncalibrated``."""
        return UNCALIBRATED if self.temperature is None else f"temperature={self.temperature:.4f}"

    def describe(self) -> str:
        """One line for people: the temperature and what it was fitted on, or why there is none."""
        if self.temperature is None:
            return (f"probabilities are {UNCALIBRATED} (plain softmax: the model held out no validation clips "
                    "to fit a temperature on); read them as scores, not chances")
        return (f"probabilities are temperature-scaled: T = {self.temperature:.3f}, fitted on {self.n_clips} "
                "validation clips")

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's ``extra["calibration"]`` (JSON values)."""
        return {"method": "temperature", "temperature": self.temperature, "n_clips": self.n_clips,
                "nll_before": self.nll_before, "nll_after": self.nll_after}

    @classmethod
    def of(cls, extra: Mapping[str, Any] | None, outputs: str = "classes") -> Calibration:
        """A checkpoint's calibration: :meth:`from_extra` for a single-label model; always uncalibrated for a
        tagger (``outputs == "tags"``: independent sigmoid scores take no temperature, whatever ``extra`` says)."""
        return cls() if outputs == "tags" else cls.from_extra(extra)

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> Calibration:
        """The calibration a checkpoint's ``extra`` records; uncalibrated when it records none."""
        record = (extra or {}).get("calibration")
        if not isinstance(record, Mapping) or record.get("temperature") is None:
            return cls()
        try:
            return cls(float(record["temperature"]), int(record.get("n_clips") or 0),
                       _opt_float(record.get("nll_before")), _opt_float(record.get("nll_after")))
        except ConfigError:
            raise
        except (TypeError, ValueError) as e:
            raise ConfigError(f"unreadable calibration record {dict(record)!r}: {e}") from None


def calibration_fields(temperature: float | None, outputs: str = "classes") -> dict[str, Any]:
    """The ``calibration`` (``temperature`` or ``uncalibrated``) and ``temperature`` (None when uncalibrated) keys
    that classify's JSON, the server's answers and health, and an export's sidecar carry for a single-label model;
    none for a tagger (``outputs == "tags"``: its independent scores take no temperature)."""
    if outputs == "tags":
        return {}
    return {"calibration": UNCALIBRATED if temperature is None else "temperature", "temperature": temperature}


def _opt_float(v: Any) -> float | None:
    return None if v is None else float(v)


def probabilities(logits: np.ndarray, calibration: Calibration | None = None, outputs: str = "classes") -> np.ndarray:
    """Probabilities ``(n, n_labels)`` float32 of ``logits``; the one place logits become probabilities.

    ``outputs == "classes"`` (a single-label model): ``softmax(logits / T)``
    with ``calibration``'s temperature, or the plain softmax when
    ``calibration`` is None or uncalibrated.  ``outputs == "tags"`` (a
    multi-label tagger, :mod:`specstore.infer.models.shipped`): each label's own sigmoid,
    never temperature-scaled (``calibration`` is ignored).  A subset of the
    labels (``--labels``) is taken from these columns afterwards, so it
    never changes a softmax's normalisation.
    """
    x = torch.from_numpy(np.ascontiguousarray(logits, dtype=np.float32))
    if not len(x):
        return np.zeros(x.shape, dtype=np.float32)
    if outputs == "tags":
        return torch.sigmoid(x).numpy()
    if calibration is not None and calibration.temperature is not None:
        x = x / calibration.temperature
    return torch.softmax(x, dim=1).numpy()


def _nll(logits: torch.Tensor, truth: torch.Tensor, temperature: float) -> float:
    return float(F.cross_entropy(logits / temperature, truth))


def fit_temperature(logits: np.ndarray, truth: np.ndarray) -> Calibration:
    """The temperature minimising the mean negative log-likelihood of ``softmax(logits / T)`` on ``truth``.

    ``logits``: ``(n, n_classes)``; ``truth``: ``(n,)`` class indices.  A
    bounded 1-D search over ``log T`` in :data:`TEMPERATURE_BOUNDS`
    (scipy's ``minimize_scalar``, Brent's method on an interval: no random
    start, so the same logits always give the same ``T``), in float64.  A fit
    at a bound is logged as a warning.
    """
    from scipy.optimize import minimize_scalar  # scipy comes with scikit-learn; imported only to fit

    x = torch.from_numpy(np.asarray(logits, dtype=np.float64))
    y = torch.from_numpy(np.asarray(truth, dtype=np.int64))
    if x.ndim != 2 or y.shape != (x.shape[0],) or not len(y):
        raise ConfigError(f"fit_temperature needs (n, classes) logits and n labels, got {tuple(x.shape)} and "
                          f"{tuple(y.shape)}")
    lo, hi = np.log(TEMPERATURE_BOUNDS)
    res = minimize_scalar(lambda u: _nll(x, y, float(np.exp(u))), bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-5})
    t = float(np.exp(res.x))
    if min(abs(res.x - lo), abs(res.x - hi)) < 1e-3:
        log.warning("the temperature fit reached its bound (T = %.3g) on %d validation clips: they say little "
                    "about the model's confidence", t, len(y))
    return Calibration(t, len(y), _nll(x, y, 1.0), _nll(x, y, t))


def expected_calibration_error(probs: np.ndarray, truth: np.ndarray, n_bins: int = ECE_BINS) -> float:
    """Top-label expected calibration error (0..1) of ``probs`` ``(n, n_classes)`` against ``truth`` ``(n,)``.

    Each clip's confidence is its top probability; clips are put in
    ``n_bins`` equal-width bins ``(k/n_bins, (k+1)/n_bins]`` (a confidence of
    exactly 0 goes to the first); ECE is the clip-weighted mean over bins of
    ``|accuracy - mean confidence|``.  A true index the model has no column
    for (a label it does not know) counts as wrong.  0 for no clips.
    """
    p = np.asarray(probs, dtype=np.float64)
    y = np.asarray(truth)
    if not len(y):
        return 0.0
    conf = p.max(axis=1)
    right = (p.argmax(axis=1) == y).astype(np.float64)
    bins = np.clip(np.ceil(conf * n_bins).astype(np.int64) - 1, 0, n_bins - 1)
    gap = np.abs(np.bincount(bins, right, minlength=n_bins) - np.bincount(bins, conf, minlength=n_bins))
    return float(gap.sum() / len(y))


def calibration_report(logits: np.ndarray, truth: np.ndarray, calibration: Calibration) -> dict[str, Any]:
    """``make eval``'s calibration figures on the scored clips: ``calibration`` (``temperature`` or
    ``uncalibrated``), ``temperature`` (None when uncalibrated), ``ece_bins``, ``ece_before`` (the plain
    softmax's top-label ECE) and ``ece_after`` (with the checkpoint's temperature; None when uncalibrated)."""
    before = expected_calibration_error(probabilities(logits), truth)
    after = (expected_calibration_error(probabilities(logits, calibration), truth) if calibration.calibrated
             else None)
    return {"calibration": "temperature" if calibration.calibrated else UNCALIBRATED,
            "temperature": calibration.temperature, "ece_bins": ECE_BINS, "ece_before": before, "ece_after": after}


def calibration_text(figures: Mapping[str, Any], *, fitted_here: bool = False) -> str:
    """One line of ``report.txt`` from :func:`calibration_report`'s ``figures``; ``fitted_here``: the scored
    clips are the validation clips the temperature was fitted on (then the after figure is optimistic)."""
    ece = f"top-label ECE ({figures['ece_bins']} equal-width bins)"
    if figures.get("ece_after") is None:
        return (f"calibration: {UNCALIBRATED} (the model held out no validation clips to fit a temperature on); "
                f"{ece} {figures['ece_before']:.3f}")
    note = "; T was fitted on these very clips, so the after figure is optimistic" if fitted_here else ""
    return (f"calibration: temperature scaling, T = {figures['temperature']:.3f}; {ece} "
            f"{figures['ece_before']:.3f} before, {figures['ece_after']:.3f} after{note}")
