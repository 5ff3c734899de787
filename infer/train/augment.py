"""Training-time augmentation: random crops and SpecAugment masks, drawn from a seeded generator.

Pure functions of their inputs and a ``numpy.random.Generator`` (seeded per
epoch by the training loop), so a resumed run draws what an uninterrupted
one would.  Masks stay inside each clip's real frames: padding stays zero
and the model's masking is unaffected.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

__all__ = ["crop_starts", "spec_augment"]


def crop_starts(lengths: np.ndarray, crop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform random start frame of a ``crop``-frame window inside each clip of ``lengths`` frames."""
    room = np.asarray(lengths, dtype=np.int64) - np.asarray(crop, dtype=np.int64)
    if (room < 0).any():
        raise ValueError("crops must not be longer than their clips")
    return np.floor(rng.random(len(room)) * (room + 1)).astype(np.int64)


def spec_augment(
    x: Tensor,
    lengths: Tensor,
    rng: np.random.Generator,
    *,
    time_masks: int,
    time_mask_frames: int,
    freq_masks: int,
    freq_mask_bins: int,
    fill: float,
) -> Tensor:
    """SpecAugment-style masking of ``x (B, 1, n_bins, T)`` in place; returns ``x``.

    Per clip, ``time_masks`` bands of a uniform width in ``[0, time_mask_frames]``
    (at most a fifth of the clip) set to ``fill`` inside the clip's real
    frames ``[0, length)``, and ``freq_masks`` bands of width in
    ``[0, freq_mask_bins]`` bins across the real frames.  Padding stays zero,
    so the model's masking is unaffected.  ``fill`` is the model's input mean
    (dB): a masked value becomes 0 after normalisation.
    """
    n_bins = x.shape[2]
    for b, length in enumerate(lengths.tolist()):
        for _ in range(time_masks):
            width = int(rng.integers(0, min(time_mask_frames, length // 5) + 1))
            if width:
                t0 = int(rng.integers(0, length - width + 1))
                x[b, :, :, t0:t0 + width] = fill
        for _ in range(freq_masks):
            width = int(rng.integers(0, min(freq_mask_bins, n_bins // 2) + 1))
            if width:
                f0 = int(rng.integers(0, n_bins - width + 1))
                x[b, :, f0:f0 + width, :length] = fill
    return x
