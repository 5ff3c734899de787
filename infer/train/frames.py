"""Statistics of the training frames: what the built-in models' input normalisation is fitted on.

:func:`frame_stats` samples up to 128 training clips (a window of 2048
frames each, about 48 s at 43 frames/s) and sums in float64, so the
figures are the same on every machine for a seed.  Training turns them into
the model's ``input_mean``/``input_std`` (dB) or, with
``normalization=bin``, its ``bin_mean``/``bin_std``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..data import StoreDataset
from .steps import epoch_seed

__all__ = ["FrameStats", "frame_stats"]


@dataclass(frozen=True)
class FrameStats:
    """Mean and standard deviation (dB) of a sample of training frames: overall, and per bin."""

    mean: float
    std: float
    bin_mean: np.ndarray
    bin_std: np.ndarray


def frame_stats(dataset: StoreDataset, seed: int, max_clips: int = 128, max_frames: int = 2048) -> FrameStats:
    """:class:`FrameStats` of up to ``max_clips`` items (a window of ``max_frames`` each), float64 sums."""
    rng = np.random.default_rng(epoch_seed(seed, 0, 99))
    n = len(dataset)
    pick = np.arange(n) if n <= max_clips else rng.choice(n, size=max_clips, replace=False)
    total = np.zeros(dataset.n_bins)
    total_sq = np.zeros(dataset.n_bins)
    count = 0
    for i in pick.tolist():
        length = int(dataset.full_lengths[i])
        start = int(rng.integers(0, length - max_frames + 1)) if length > max_frames else 0
        a = dataset.window(i, start, min(length, start + max_frames)).astype(np.float64)
        total += a.sum(axis=1)
        total_sq += np.square(a).sum(axis=1)
        count += a.shape[1]
    bin_mean = total / count
    bin_std = np.sqrt(np.maximum(total_sq / count - bin_mean**2, 0.0))
    mean = float(total.sum() / (count * dataset.n_bins))
    std = math.sqrt(max(float(total_sq.sum() / (count * dataset.n_bins)) - mean * mean, 0.0))
    return FrameStats(mean, max(std, 1e-3), bin_mean, np.maximum(bin_std, 1e-3))
