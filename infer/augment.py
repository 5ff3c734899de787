"""Training-time augmentation of one item's features, drawn from a generator seeded per item and epoch.

Pure functions of their inputs and a ``numpy.random.Generator`` that
:class:`infer.data.StoreDataset` seeds from ``(seed, epoch, index)``, so a
resumed run, a worker process or another rank draws exactly what an
uninterrupted single-process run would.  Masks stay inside each clip's real
frames: padding is added later by the collate and stays zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["SpecAugment"]


@dataclass(frozen=True)
class SpecAugment:
    """SpecAugment masks drawn per item, inside its real frames (padding is never touched).

    ``time_masks`` bands of a uniform width in ``[0, time_mask_frames]``
    frames (at most a fifth of the clip) and ``freq_masks`` bands of width in
    ``[0, freq_mask_bins]`` bins, set to ``fill`` (dB; the model's input mean
    makes a masked value 0 after normalisation).
    """

    time_masks: int = 2
    time_mask_frames: int = 24
    freq_masks: int = 2
    freq_mask_bins: int = 12
    fill: float = -40.0

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Mask ``x`` ``(n_bins, n_frames)`` in place; returns it."""
        n_bins, length = x.shape
        for _ in range(self.time_masks):
            width = int(rng.integers(0, min(self.time_mask_frames, length // 5) + 1))
            if width:
                t0 = int(rng.integers(0, length - width + 1))
                x[:, t0:t0 + width] = self.fill
        for _ in range(self.freq_masks):
            width = int(rng.integers(0, min(self.freq_mask_bins, n_bins // 2) + 1))
            if width:
                f0 = int(rng.integers(0, n_bins - width + 1))
                x[f0:f0 + width, :] = self.fill
        return x
