"""Training-time augmentation of one item's features, drawn from a generator seeded per item and epoch.

Pure functions of their inputs and a ``numpy.random.Generator`` that
:class:`specstore.infer.data.StoreDataset` seeds from ``(seed, epoch, index)``, so a
resumed run, a worker process or another rank draws exactly what an
uninterrupted single-process run would.  Masks stay inside each clip's real
frames: padding is added later by the collate and stays zero.

* :class:`SpecAugment`: time and frequency masks;
* :class:`Augment`: a gain offset (dB), a spectral tilt (an equaliser's
  shelves: a ramp across each feature's bins), a pitch shift as a roll of the
  CQT rows (one bin = one semitone at 12 bins per octave), then SpecAugment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Augment", "SpecAugment", "fill_column"]


def fill_column(fill: float | Sequence[float], n_bins: int) -> np.ndarray:
    """``fill`` as an ``(n_bins, 1)`` float32 column (a scalar is repeated)."""
    if isinstance(fill, int | float):
        return np.full((n_bins, 1), float(fill), dtype=np.float32)
    column = np.asarray(fill, dtype=np.float32).reshape(-1, 1)
    if column.shape[0] != n_bins:
        raise ValueError(f"fill has {column.shape[0]} values for {n_bins} bins")
    return column


@dataclass(frozen=True)
class SpecAugment:
    """SpecAugment masks drawn per item, inside its real frames (padding is never touched).

    ``time_masks`` bands of a uniform width in ``[0, time_mask_frames]``
    frames (at most a fifth of the clip) and ``freq_masks`` bands of width in
    ``[0, freq_mask_bins]`` bins, set to ``fill`` (dB; the model's input mean
    makes a masked value 0 after normalisation): one number, or one per bin
    (a per-bin input normalisation's means).
    """

    time_masks: int = 2
    time_mask_frames: int = 24
    freq_masks: int = 2
    freq_mask_bins: int = 12
    fill: float | tuple[float, ...] = -40.0

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Mask ``x`` ``(n_bins, n_frames)`` in place; returns it."""
        n_bins, length = x.shape
        column = fill_column(self.fill, n_bins)
        for _ in range(self.time_masks):
            width = int(rng.integers(0, min(self.time_mask_frames, length // 5) + 1))
            if width:
                t0 = int(rng.integers(0, length - width + 1))
                x[:, t0:t0 + width] = column
        for _ in range(self.freq_masks):
            width = int(rng.integers(0, min(self.freq_mask_bins, n_bins // 2) + 1))
            if width:
                f0 = int(rng.integers(0, n_bins - width + 1))
                x[f0:f0 + width, :] = column[f0:f0 + width]
        return x


@dataclass(frozen=True)
class Augment:
    """Per-item augmentation: gain, tilt, pitch roll, then SpecAugment (each off when 0 / None).

    ``gain_db``: add one offset drawn uniformly in ``[-gain_db, gain_db]`` dB
    to every value (a louder or quieter recording: the store holds absolute
    dB).  ``tilt_db``: add a linear ramp from ``a`` dB at the lowest bin to
    ``b`` dB at the highest of each part (``parts``: the row ranges of the
    stacked features), ``a`` and ``b`` drawn uniformly in ``[-tilt_db,
    tilt_db]`` once per item (a recording's equalisation).  ``pitch_bins``:
    roll rows ``pitch_rows = (start, stop)`` (the CQT part of the stacked
    features) by a whole number of bins drawn uniformly
    in ``[-pitch_bins, pitch_bins]``; rows rolled in from outside are set to
    ``fill``.  ``spec_augment``: masks, last.
    """

    gain_db: float = 0.0
    tilt_db: float = 0.0
    parts: tuple[tuple[int, int], ...] = ()
    pitch_bins: int = 0
    pitch_rows: tuple[int, int] | None = None
    fill: float | tuple[float, ...] = -40.0
    spec_augment: SpecAugment | None = None

    def __call__(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Augment ``x`` ``(n_bins, n_frames)`` in place; returns it."""
        if self.gain_db > 0:
            x += np.float32(rng.uniform(-self.gain_db, self.gain_db))
        if self.tilt_db > 0:
            low, high = rng.uniform(-self.tilt_db, self.tilt_db, size=2)
            for lo, hi in self.parts or ((0, x.shape[0]),):
                x[lo:hi] += np.linspace(low, high, hi - lo, dtype=np.float32)[:, None]
        if self.pitch_bins > 0 and self.pitch_rows is not None:
            shift = int(rng.integers(-self.pitch_bins, self.pitch_bins + 1))
            lo, hi = self.pitch_rows
            if shift and hi - lo > abs(shift):
                column = fill_column(self.fill, x.shape[0])[lo:hi]
                part = x[lo:hi]
                if shift > 0:  # up: row r takes row r - shift
                    part[shift:] = part[:-shift].copy()
                    part[:shift] = column[:shift]
                else:
                    part[:shift] = part[-shift:].copy()
                    part[shift:] = column[shift:]
        if self.spec_augment is not None:
            self.spec_augment(x, rng)
        return x
