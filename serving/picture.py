"""The axes of a clip's log-mel picture on the upload page: time (s), frequency (Hz) and the dB colour bar.

:func:`specstore.serving.clips.mel_picture` draws ``(n_bins, n_frames)`` dB values
as a PNG: one row per bin (low bins at the bottom), frames averaged in
groups of ``g`` so it is at most :data:`~specstore.serving.clips.PICTURE_WIDTH`
columns wide, colours fixed by the kind's dB limits (:mod:`specstore.store.kinds`).
:class:`PictureScale` says where the page draws its tick labels, as
fractions of the picture's width (time, from the left) and height
(frequency and dB, from the bottom):

* time: frame ``j`` covers ``[j, j + 1)`` hops (``librosa.display.specshow``'s
  frame edges), so the picture spans ``ceil(n / g) * g`` frames of
  ``hop / sr`` seconds;
* frequency: row ``k``'s centre is bin ``k``'s centre frequency, as the
  kind gives them (:attr:`~specstore.store.kinds.FeatureKind.frequencies`:
  ``librosa.mel_frequencies(n_bins + 2, fmin, fmax)[1:-1]`` for the mel
  filters' centres, Slaney scale as the features use, ``librosa.cqt_frequencies``
  for the CQT), and a tick between two centres is placed on the kind's warp
  (the mel scale, log2), on which the centres are evenly spaced;
* dB: linear from the kind's lower limit (bottom) to its upper limit (top),
  drawn with the colour map's stops.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from specstore.store import FeatureSpec

from .clips import PICTURE_WIDTH

__all__ = ["CMAP", "PictureScale", "frequency_ticks", "picture_frames", "time_ticks"]

#: The colour map :func:`specstore.serving.clips.mel_picture` draws with.
CMAP = "magma"

Scale = Callable[[float], float]
"""Hz -> a value linear in bins (the mel scale, ``log2``)."""

Tick = dict[str, Any]
"""``{"at": fraction of the axis from its start, "label": text}``."""

_TIME_STEPS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0)


def picture_frames(n_frames: int, width: int = PICTURE_WIDTH) -> int:
    """Frames the picture of an ``n_frames`` clip spans: ``ceil(n / g) * g`` for its group ``g`` (the last
    column averages what is left)."""
    group = max(1, -(-n_frames // width))
    return -(-n_frames // group) * group


def _seconds(x: float) -> str:
    return f"{x:.1f} s" if abs(x - round(x)) > 1e-9 else f"{round(x)} s"


def time_ticks(n_frames: int, frame_seconds: float, *, most: int = 8) -> list[Tick]:
    """Ticks every 1, 2, 5, 10, 15, 30 ... seconds (at most ``most``) across a picture of ``n_frames`` frames."""
    span = picture_frames(n_frames) * frame_seconds
    if span <= 0:
        return []
    step = next((s for s in _TIME_STEPS if span / s <= most), _TIME_STEPS[-1] * math.ceil(span / most / 3600))
    return [{"at": k * step / span, "label": _seconds(k * step)} for k in range(int(span / step + 1e-9) + 1)]


def _warp(spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray, Scale] | None:
    """The bins' centre frequencies (Hz), their places on the kind's warp and the warp (its display fact
    :attr:`~specstore.store.kinds.FeatureKind.frequencies`); None for a kind without one."""
    frequencies = spec.kind_info.frequencies
    if frequencies is None:
        return None
    bins = frequencies(spec)
    centres = np.asarray(bins.centres, dtype=np.float64)
    return centres, np.array([bins.warp(float(c)) for c in centres], dtype=np.float64), bins.warp


def frequency_ticks(spec: FeatureSpec, *, min_gap: float = 0.12) -> list[Tick]:
    """Ticks at round frequencies (100, 1000 Hz first, then 2x and 5x) inside the bins' centres, each at
    least ``min_gap`` of the height from the others; row ``k``'s centre is ``(k + 0.5) / n_bins``."""
    warp = _warp(spec)
    if warp is None:
        return []
    centres, pos_of, scale = warp
    n = len(centres)
    lo, hi = float(centres[0]), float(centres[-1])
    candidates = [m * 10.0 ** e for m in (1, 2, 5) for e in range(0, 6)]
    candidates.sort(key=lambda f: (0 if str(int(f)).strip("0") == "1" else 1, -f))
    kept: list[tuple[float, float]] = []
    for f in candidates:
        if not lo <= f <= hi:
            continue
        b = float(np.interp(float(scale(f)), pos_of, np.arange(n)))
        at = (b + 0.5) / n
        if all(abs(at - a) >= min_gap for a, _ in kept):
            kept.append((at, f))
    return [{"at": at, "label": f"{f:.0f} Hz"} for at, f in sorted(kept)]


def _colours(stops: int) -> list[str]:
    from matplotlib import colormaps, colors

    cmap = colormaps[CMAP]
    return [colors.to_hex(cmap(k / (stops - 1))) for k in range(stops)]


@dataclass(frozen=True)
class PictureScale:
    """What the page needs to label one model's pictures: frequency and dB ticks, the colour bar's stops
    (bottom to top, hex), the frame length (s)."""

    frequency: list[Tick]
    db: list[Tick]
    colours: list[str]
    frame_seconds: float

    @classmethod
    def of(cls, spec: FeatureSpec, limits: tuple[float, float], *, stops: int = 16) -> PictureScale:
        """The scale of pictures of ``spec``'s feature drawn with dB ``limits``."""
        lo, hi = limits
        step = next(s for s in (5.0, 10.0, 20.0, 25.0, 50.0, 100.0, 1e9) if (hi - lo) / s <= 6)
        first = math.ceil(lo / step) * step
        levels = [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]
        db = [{"at": (v - lo) / (hi - lo), "label": f"{v:g} dB"} for v in levels]
        return cls(frequency_ticks(spec), db, _colours(stops), spec.frame_seconds)

    def axes(self, n_frames: int) -> dict[str, Any]:
        """``{"time", "frequency", "db": [ticks], "colours": [hex]}`` for a picture of ``n_frames`` frames."""
        return {"time": time_ticks(n_frames, self.frame_seconds), "frequency": self.frequency, "db": self.db,
                "colours": self.colours}
