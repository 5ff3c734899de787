"""A checkpoint ready to classify decoded clips: the model on infer's Engine, its budget and its labels.

:class:`Classifier` is the one piece ``specstore classify`` and the server
share on the inference side.  It loads the checkpoint through
:mod:`specstore.infer.models.checkpoint` (its FeatureSpecs say how to decode), measures the
model's memory cost once with :meth:`specstore.infer.engine.runtime.Engine.budget`, and runs
clips with :meth:`specstore.infer.engine.runtime.Engine.clip_logits`: the planner's
length-sorted batches under the budget (or the batch the online batcher
closed, as it planned it), windows for clips too long for any batch, a
CUDA out-of-memory split and retried.  The engine owns the live budget and
the planner's price of a batch.  Nothing here knows the architecture: only
the model contract (``forward(x, lengths)``).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specstore.common import ConfigError
from specstore.infer.batching.budget import Budget
from specstore.infer.batching.constraints import BatchConstraint
from specstore.infer.batching.planner import Plan
from specstore.infer.data import ArrayDataset
from specstore.infer.engine.predictions import PredictionsError, select_labels
from specstore.infer.engine.runtime import Engine, RunOptions, RunStats
from specstore.infer.models.calibration import Calibration, probabilities
from specstore.infer.models.checkpoint import Checkpoint
from specstore.infer.models.shipped import resolve_checkpoint
from specstore.infer.models.trust import Trust
from specstore.store import FeatureSpec
from specstore.store.kinds import picture_feature

__all__ = ["Classifier", "ClipResults", "top_k"]

log = logging.getLogger(__name__)


@dataclass
class ClipResults:
    """Probabilities ``(n_clips, n_labels)`` float32 for a run of clips (a softmax over the classes, or a tagger's
    independent sigmoid scores), with the engine's figures."""

    probs: np.ndarray
    run: RunStats


def top_k(probs: np.ndarray, labels: Sequence[str], k: int) -> list[tuple[str, float]]:
    """The ``k`` most probable ``(label, probability)`` pairs of one clip, best first (ties: label order)."""
    order = np.argsort(-probs, kind="stable")[:k]
    return [(labels[i], float(probs[i])) for i in order]


class Classifier:
    """A checkpoint on an :class:`~specstore.infer.engine.runtime.Engine`; see the module docstring.

    ``model``: a checkpoint path or object, or a shipped model's name (``musicnn-msd``,
    :mod:`specstore.infer.models.shipped`). ``outputs``: ``"classes"`` (probabilities are a softmax) or
    ``"tags"`` (a tagger's independent sigmoid scores, several high per clip).  ``calibration``: the checkpoint's
    temperature a softmax is divided by (:mod:`specstore.infer.models.calibration`; uncalibrated for a tagger).
    ``labels`` (comma-separated or a list; None: all): the results keep only these of the model's labels (one
    line naming any it lacks), taken after the (calibrated) probabilities.  ``options``: device, precision,
    memory budget, ``max_batch``, the planner's price of a batch (:class:`~specstore.infer.engine.runtime.RunOptions`;
    the engine resolves them on this machine). ``trust_model_code``: build a checkpoint that names a user model
    class (:mod:`specstore.infer.models.trust`; a built-in model needs nothing).  Raises ``CheckpointError``,
    ``DeviceError`` and ``ConfigError`` with one-line messages.  :meth:`run` is safe to call from one thread at a
    time."""

    def __init__(self, model: str | os.PathLike[str] | Checkpoint, options: RunOptions | None = None, *,
                 trust_model_code: Trust = False, labels: str | list[str] | None = None) -> None:
        ckpt = model if isinstance(model, Checkpoint) else resolve_checkpoint(model)
        self.name = (ckpt.source or "<checkpoint>") if isinstance(model, Checkpoint) else os.fspath(model)
        try:
            self._columns = select_labels(list(ckpt.label_names), labels)
        except PredictionsError as e:
            raise ConfigError(str(e)) from None
        self.all_labels = list(ckpt.label_names)
        """Every label of the model (its vocabulary), whatever ``labels`` kept."""
        self.label_names = [self.all_labels[i] for i in self._columns]
        self.outputs = ckpt.outputs
        self.feature = ckpt.feature
        self.specs: dict[str, FeatureSpec] = dict(ckpt.specs)
        self.calibration: Calibration = ckpt.calibration
        self.engine = Engine(options or RunOptions())
        self.model = self.engine.prepare(ckpt.build(trust_model_code=trust_model_code))
        self.budget = self.engine.budget(self.model, ckpt.n_bins)
        """The budget measured at start-up (:meth:`current_budget` is the one for the next batch)."""
        self._lock = threading.Lock()
        log.info("%s on %s: %s", self.name, self.engine.device, self.budget.describe())

    @property
    def batch_overhead_frames(self) -> float:
        """The planner's price of one more batch, padded frames: the engine's (the options', or its device's)."""
        return self.engine.batch_overhead_frames

    @property
    def n_bins(self) -> int:
        return sum(s.n_bins for s in self.specs.values())

    @property
    def frame_seconds(self) -> float:
        """Seconds of audio per frame."""
        return next(iter(self.specs.values())).frame_seconds

    @property
    def window_align(self) -> int:
        """Frames a clip's segments start on (:mod:`specstore.serving.segments`): the model's window alignment (its time
        stride or pooling window, as for ``make infer``'s windows), 1 for a model that does not say."""
        return int(getattr(self.model, "window_align", 1))

    def picture_part(self) -> tuple[str, tuple[float, float]]:
        """The feature part a clip's picture shows (the log-mel if there is one) and its fixed dB colour limits."""
        name = picture_feature(self.specs)
        return name, self.specs[name].kind_info.db_limits

    def current_budget(self) -> Budget:
        """The budget for the next batch (:meth:`specstore.infer.engine.runtime.Engine.live_budget` of the
        start-up one): on CUDA the free memory now (minus the margin), else the fixed one."""
        return self.engine.live_budget(self.budget)

    def run(self, clips: Sequence[np.ndarray], *, plan: Plan | None = None, constraint: BatchConstraint | None = None,
            budget: Budget | None = None, progress: bool = False, desc: str = "classifying") -> ClipResults:
        """Probabilities of ``clips`` (``(n_bins, n_frames)`` float32 each), in their order.

        ``plan`` (a :class:`~specstore.infer.batching.planner.Plan` of these clips, e.g. the batch the online
        batcher closed) is run as it is; without one the engine cuts them into batches by ``constraint``
        (:mod:`specstore.infer.batching.constraints`, e.g. the server's fixed batches; default: the planner's
        length-sorted batches under ``budget``, itself by default the plan's or :meth:`current_budget`).  A
        model that does not mask padding runs equal tiles, which ``constraint`` cuts into batches.
        """
        if any(c.shape[0] != self.n_bins for c in clips):
            raise ConfigError(f"clips must have {self.n_bins} bins for {self.name}")
        with self._lock:
            budget = budget or (plan.budget if plan is not None else None) or self.current_budget()
            res = self.engine.clip_logits(self.model, ArrayDataset(clips), budget=budget, constraint=constraint,
                                          plan=plan, progress=progress, desc=desc)
        if len(clips) and res.logits.shape[1] != len(self.all_labels):
            raise ConfigError(f"{self.name} gives {res.logits.shape[1]} classes for {len(self.all_labels)} labels")
        # every label's (calibrated) probability first, then the --labels columns: a subset never renormalises
        probs = (probabilities(res.logits, self.calibration, self.outputs)[:, self._columns] if len(clips)
                 else np.zeros((0, len(self.label_names)), dtype=np.float32))
        return ClipResults(probs, res.run_stats())
