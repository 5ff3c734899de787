"""Training's batches: the memory budget turned into a crop length, the augmentation, the dataset and the
budgeted batch sampler (:func:`prepare_data`), before the first step.

Split from :mod:`.prepare` (which re-exports these names): :func:`~.prepare.prepare_run` and
:func:`~.prepare.prepare_model` give the run and the model this module plans batches for; :mod:`.loop` iterates
:meth:`TrainData.batches` every epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader

from specstore.infer.batching.budget import Budget
from specstore.infer.data.augment import Augment, SpecAugment
from specstore.infer.models.contract import ModelSpec, masks_padding, time_stride, window_frames
from specstore.store import FeatureSpec

from ..data import BudgetBatchSampler, PadCollate, StoreDataset, prefetch
from ..errors import TrainError
from .config import TrainConfig
from .distributed import smallest_budget
from .steps import class_weights

if TYPE_CHECKING:  # annotations only: .prepare imports this module at run time
    from .prepare import Learner, Run

__all__ = ["TrainData", "augment_for", "prepare_data", "stride_frames"]

log = logging.getLogger("specstore.infer.train")


def stride_frames(seconds: float, frame_seconds: float, stride: int) -> int:
    """``seconds`` in frames, rounded down to a multiple of the model's time ``stride`` (at least one stride): the
    training crop, and the pooling window that matches it."""
    return max(stride, int(round(seconds / frame_seconds)) // stride * stride)


@dataclass
class TrainData:
    """The epoch's items and batches: the cropped, augmented dataset, the budgeted sampler, the collate.

    ``budget``: training memory; ``eval_budget``: validation's; ``weights``:
    class weights of the loss (None unless ``class_weighted``).
    """

    dataset: StoreDataset
    sampler: BudgetBatchSampler
    collate: PadCollate
    budget: Budget
    eval_budget: Budget
    weights: torch.Tensor | None

    def batches(self, workers: int, pin: bool) -> Iterable[Any]:
        """This epoch's batches (call the sampler's ``set_epoch`` first): a prefetch thread or worker processes."""
        if workers:
            return DataLoader(self.dataset, batch_sampler=self.sampler, collate_fn=self.collate,
                              num_workers=workers, pin_memory=pin)
        return prefetch(self.dataset, list(self.sampler), self.collate, pin=pin)


def augment_for(cfg: TrainConfig, spec: ModelSpec, specs: dict[str, FeatureSpec], mean: float) -> Augment | None:
    """The per-item augmentation the config asks for (None when it asks for none).

    Masked and rolled-in values are set to the model's input mean (per bin
    with a per-bin normalisation), which the model maps to 0.
    """
    bin_mean = spec.kwargs.get("bin_mean")
    fill: float | tuple[float, ...] = (tuple(float(v) for v in bin_mean) if bin_mean is not None
                                       else float(spec.kwargs.get("input_mean", mean)))
    spec_augment = SpecAugment(cfg.time_masks, cfg.time_mask_frames, cfg.freq_masks, cfg.freq_mask_bins, fill) \
        if (cfg.time_masks or cfg.freq_masks) else None
    pitch_rows: tuple[int, int] | None = None
    pitch_bins = 0
    start = 0
    parts: list[tuple[int, int]] = []
    for part in specs.values():
        octave_bins = part.kind_info.octave_bins  # log-frequency bins: a pitch shift is a roll along them
        if octave_bins is not None and cfg.pitch_shift:
            pitch_rows = (start, start + part.n_bins)
            pitch_bins = int(round(cfg.pitch_shift * octave_bins(part) / 12))
        parts.append((start, start + part.n_bins))
        start += part.n_bins
    if cfg.pitch_shift and pitch_rows is None:
        log.warning("pitch_shift needs a CQT in the training feature (%s); no pitch shift", "+".join(specs))
    if spec_augment is None and not cfg.gain_db and not cfg.tilt_db and not pitch_bins:
        return None
    return Augment(gain_db=cfg.gain_db, tilt_db=cfg.tilt_db, parts=tuple(parts), pitch_bins=pitch_bins,
                   pitch_rows=pitch_rows, fill=fill, spec_augment=spec_augment)


def _crop_frames(run: Run, net: nn.Module, budget: Budget) -> tuple[int | None, int | None]:
    """``(crop, pad_to)`` in frames: the training crop (None: whole clips) and the equal window of a model
    that does not mask padding (None for masking models)."""
    cfg, stride = run.cfg, time_stride(net)
    if masks_padding(net):
        limit = budget.max_window
        if cfg.crop_seconds is not None:
            limit = min(limit, stride_frames(cfg.crop_seconds, run.frame_seconds, stride))
        pad_to = None
    else:  # equal windows: every training item is one window (short clips padded to it)
        limit = pad_to = window_frames(net)
        if not budget.fits(1, limit):
            raise TrainError(f"one training window of {limit} frames does not fit the memory budget; raise it")
    cut = int((run.store.lengths[run.train_rows] > budget.max_window).sum())
    if cut:
        log.warning("%d training clip(s) exceed the memory budget whole; they are trained on random crops of "
                    "%d frames", cut, budget.max_window)
    crop = limit if (cfg.crop_seconds is not None or cut or pad_to is not None) else None
    return crop, pad_to


def prepare_data(run: Run, learner: Learner) -> TrainData:
    """Budget -> crop -> augmentation -> dataset (each clip ``crops_per_clip`` times) -> sampler (``crops_per_epoch``
    of them an epoch)."""
    cfg, net = run.cfg, learner.net
    budget = run.engine.budget(net, run.n_bins, training=True)
    eval_budget = run.engine.budget(net, run.n_bins)
    if run.dist is not None:  # every rank plans the same epoch (and windows a long clip alike): the smallest budget
        budget = smallest_budget(budget, run.dist)
        eval_budget = smallest_budget(eval_budget, run.dist)
    crop, pad_to = _crop_frames(run, net, budget)
    augment = augment_for(cfg, learner.spec, run.specs, learner.frames.mean)
    repeats = (cfg.crops_per_clip or 1) if crop is not None else 1
    dataset = StoreDataset(run.store, run.feature, rows=np.repeat(run.train_rows, repeats), crop_frames=crop,
                           spec_augment=augment, seed=cfg.seed)
    sampler = BudgetBatchSampler(dataset, budget, shuffle=True, seed=cfg.seed, pad_to=pad_to,
                                 epoch_items=cfg.crops_per_epoch if crop is not None else None,
                                 num_replicas=run.dist.world if run.dist else 1,
                                 rank=run.dist.rank if run.dist else 0)
    weights = torch.tensor(class_weights(run.train_labels, run.n_classes), dtype=torch.float32,
                           device=run.device) if cfg.class_weighted else None
    return TrainData(dataset, sampler, PadCollate(time_stride(net), pad_to=pad_to), budget, eval_budget, weights)
