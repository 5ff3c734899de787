"""The default recipe adapts to the training data: options left to ``auto`` get values derived from it.

:func:`data_facts` measures the training split (clips, works, classes,
seconds); :func:`resolve` turns every ``auto`` option of a
:class:`~specstore.infer.train.TrainConfig` into a value by a fixed rule of those facts
and says why, in words that go to the training log and ``MODEL.config.json``.
A value the user sets is kept as it is.

The rules, and why they are rules rather than choices made per run: a
choice made on a validation split of a dozen clips is noise (the run that
motivated this module picked epoch 5 of 15 at 100 % on 13 clips, and lost
13 points on new works).  So nothing here looks at validation figures: the
rules were chosen by grouped cross-validation on the training splits of
several corpora (docs/model.md), and validation reports (with one bounded
exception, ``stats_weight`` below).

* ``val_fraction`` (:func:`resolve_validation`): 10 % of the works when
  that holds at least 60 clips; else nothing is held out, since a smaller
  split neither measures nor chooses anything and a small corpus needs every
  clip (``specstore-cv`` measures such a corpus honestly).
* ``val_every``: with ``select=best`` every epoch, since the validation
  figures choose the kept epoch; with ``select=last`` (the default) every
  third of the schedule and after the last epoch (epochs 5, 10 and 15 of
  15): validation then only reports, and one pass over the held-out clips
  costs as much as a few dozen training steps (on realcorpus full, 195
  whole clips took about 13 s against about 0.5 s per training step on 2
  cores), so validating every epoch would cost more than an epoch in all.
* ``crops_per_epoch`` and ``crops_per_clip``: every epoch trains
  :data:`CROPS_PER_EPOCH` random crops (30 batches of 16), a fresh random
  subset each epoch of ``crops_per_clip`` crops of every clip (the fewest
  that reach it, at most :data:`MAX_CROPS_PER_CLIP`), so a corpus of 150
  clips gets as many optimiser steps an epoch as one of 480, and its epoch
  costs the same; a larger corpus costs one pass per epoch.  Grouped
  cross-validation on the long corpus (184 clips; 4 of its 5 folds): 2 crops
  of each clip an epoch (about 290 crops, 19 steps) lost 5 of 144
  out-of-fold clips against 3 (about 440); a few dozen steps an epoch
  under-fits.
* ``stats_head``: on for the built-in models (a logistic regression on band
  statistics beside the CNN, :mod:`.stats_head`): on a few hundred clips it is
  often the better expert, on thousands the CNN is, and their product keeps
  both; its strength is chosen by cross-validation inside the training split.
  Off for a user's own model.
* ``pool_seconds``: the length of the crops training sees (10 s by
  default).  The model is trained on crops but classifies whole clips; with
  this it classifies each window of that length as it was trained to and
  averages the windows' logits, instead of pooling a 3-minute clip's
  statistics at once (which differ from a 10-second crop's).
* ``stats_weight``: how much the statistics head counts against the CNN.  It
  is the one choice made on validation figures, and only where they can carry
  it: when training ends, the weight with the least log-loss on the
  validation split (a smooth figure of every clip, five candidates) if it
  holds at least :data:`~.stats_head.MIN_VALIDATION_CLIPS` clips; otherwise
  :data:`~.stats_head.DEFAULT_WEIGHT`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from specstore.store import Store

from ..models import ARCHS
from .config import TrainConfig
from .stats_head import DEFAULT_WEIGHT, MIN_VALIDATION_CLIPS, WEIGHTS

__all__ = [
    "CROPS_PER_EPOCH", "MAX_CROPS_PER_CLIP", "VAL_FRACTION", "DataFacts", "Resolved", "data_facts", "resolve",
    "resolve_validation",
]

CROPS_PER_EPOCH = 480
"""Random crops an epoch when ``crops_per_epoch`` is auto and the corpus has fewer clips (30 batches of 16)."""
MAX_CROPS_PER_CLIP = 8
"""Most crops of one clip an epoch may draw from when ``crops_per_clip`` is auto."""
VAL_FRACTION = 0.1
"""The validation share when ``val_fraction`` is auto and the corpus is large enough for it."""


def resolve_validation(config: TrainConfig, n_labelled: int) -> tuple[TrainConfig, str | None]:
    """``config`` with ``val_fraction`` set when it is auto, and the rule's sentence (None when it was set).

    10 % of the works when that is at least :data:`~.stats_head.MIN_VALIDATION_CLIPS` clips; else none.  A
    smaller split measures nothing (40 clips put one clip at 2.5 points and the interval at +-14) and costs the
    training data that a small corpus lacks most.
    """
    if config.val_fraction is not None:
        return config, None
    expected = VAL_FRACTION * n_labelled
    if expected >= MIN_VALIDATION_CLIPS:
        return dataclasses.replace(config, val_fraction=VAL_FRACTION), (
            f"{VAL_FRACTION:g}: about {expected:.0f} of the {n_labelled} labelled clips held out (by work) to "
            "report on and to choose stats_weight")
    return dataclasses.replace(config, val_fraction=0.0), (
        f"0: {VAL_FRACTION:.0%} of {n_labelled} labelled clips would be about {expected:.0f}, fewer than "
        f"{MIN_VALIDATION_CLIPS}, too few to measure or choose anything; every clip trains (for an honest "
        "figure on this corpus, run specstore-cv)")


@dataclass(frozen=True)
class DataFacts:
    """What the auto rules look at: the training split (validation clips excluded).

    ``clips``: distinct training clips; ``groups``: works (or contents);
    ``classes``: labels with training clips; ``smallest_class``: clips of
    the rarest of them; ``median_seconds`` / ``total_seconds``: clip
    durations.
    """

    clips: int
    groups: int
    classes: int
    smallest_class: int
    median_seconds: float
    total_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def data_facts(store: Store, rows: np.ndarray, keys: list[str]) -> DataFacts:
    """:class:`DataFacts` of the training ``rows`` of ``specstore.store`` (``keys``: every row's split key)."""
    rows = np.asarray(rows, dtype=np.int64)
    counts = np.bincount(store.labels[rows].astype(np.int64)) if len(rows) else np.zeros(0, dtype=np.int64)
    present = counts[counts > 0]
    seconds = store.durations[rows].astype(np.float64)
    return DataFacts(
        clips=int(len(rows)), groups=len({keys[int(r)] for r in rows}), classes=int(len(present)),
        smallest_class=int(present.min()) if len(present) else 0,
        median_seconds=float(np.median(seconds)) if len(seconds) else 0.0,
        total_seconds=float(seconds.sum()))


@dataclass(frozen=True)
class Resolved:
    """A config with no ``auto`` left, and one sentence per rule that set a value."""

    config: TrainConfig
    rules: dict[str, str]


def _crops(config: TrainConfig, clips: int, rules: dict[str, str]) -> dict[str, int]:
    """``crops_per_clip`` and ``crops_per_epoch`` where auto (see the module docstring); their rules into
    ``rules``."""
    n = max(clips, 1)
    if config.crop_seconds is None:
        # one pass of the clips an epoch: prepare_data repeats no uncut clip; clips it must cut (over the memory
        # budget, or a model of equal windows) give this many of their crops_per_clip windows
        crops, epoch = config.crops_per_clip or 1, n
        why_clip = why_epoch = "whole clips (no crop): one pass per epoch"
    else:
        wanted = config.crops_per_epoch or (n * config.crops_per_clip if config.crops_per_clip else
                                             max(n, CROPS_PER_EPOCH))
        crops = config.crops_per_clip or min(MAX_CROPS_PER_CLIP, -(-wanted // n))
        epoch = min(wanted, n * crops)
        why_clip = (f"{crops}: the fewest random crops of each of the {n} training clips that hold "
                    f"crops_per_epoch (at most {MAX_CROPS_PER_CLIP})")
        if config.crops_per_clip:
            why_epoch = f"{epoch}: every crop of every clip (crops_per_clip was set)"
        elif epoch < n * crops:
            batches = f"about {epoch / config.run.max_batch:.0f} batches of {config.run.max_batch}"
            why_epoch = (f"{epoch}: random crops an epoch ({batches}), a fresh subset each epoch of {crops} "
                         f"crop(s) of each of the {n} training clips")
        elif crops == 1:
            why_epoch = f"{epoch}: each of the {n} training clips once an epoch (at least {CROPS_PER_EPOCH} clips)"
        else:
            why_epoch = (f"{epoch}: all {crops} crops of each of the {n} training clips (at most "
                         f"{MAX_CROPS_PER_CLIP} per clip, short of {CROPS_PER_EPOCH})")
    out: dict[str, int] = {}
    if config.crops_per_epoch is None:
        out["crops_per_epoch"], rules["crops_per_epoch"] = epoch, why_epoch
    if config.crops_per_clip is None:
        out["crops_per_clip"], rules["crops_per_clip"] = crops, why_clip
    return out


def resolve(config: TrainConfig, facts: DataFacts, *, builtin: bool | None = None) -> Resolved:
    """Every ``auto`` (None) option of ``config`` set from ``facts`` (see the module docstring).

    ``builtin``: whether the model is a built-in one (default: the config's ``arch`` is).
    """
    changes: dict[str, Any] = {}
    rules: dict[str, str] = {}
    if config.val_every is None:
        if config.select == "best":
            changes["val_every"], rules["val_every"] = 1, "1: select=best chooses the kept epoch by validation"
        else:
            every = max(1, -(-config.epochs // 3))
            changes["val_every"] = every
            rules["val_every"] = (f"{every}: validation after every {every} epochs and after the last (it only "
                                  "reports with select=last; each pass costs a few dozen training steps)")
    changes.update(_crops(config, facts.clips, rules))
    if builtin is None:
        builtin = config.arch in ARCHS
    if config.stats_head is None:
        changes["stats_head"] = builtin
        rules["stats_head"] = (
            "on: a logistic regression on band statistics beside the CNN, their logits added (C by grouped "
            "cross-validation on the training clips)" if builtin else
            "off: the statistics head belongs to the built-in models")
    if config.pool_seconds is None:
        if not builtin or config.crop_seconds is None:
            changes["pool_seconds"] = 0.0
            rules["pool_seconds"] = ("0: the whole clip at once (" + (
                "training sees whole clips)" if builtin else "a user model pools as it likes)"))
        else:
            changes["pool_seconds"] = config.crop_seconds
            rules["pool_seconds"] = (f"{config.crop_seconds:g} s windows, as long as the training crops: a clip is "
                                     "classified window by window, as training saw it, and the windows' logits are "
                                     "averaged (weighted by their frames)")
    if changes.get("stats_head", config.stats_head) and config.stats_weight is None:
        rules["stats_weight"] = (f"chosen when training ends: the least log-loss on the validation split among "
                                 f"{', '.join(f'{w:g}' for w in WEIGHTS)} when it holds {MIN_VALIDATION_CLIPS} clips "
                                 f"or more, else {DEFAULT_WEIGHT:g}")
    return Resolved(dataclasses.replace(config, **changes), rules)
