"""What a corpus consists of: styles, formats, durations and one plan per file (pure, no audio).

A corpus is ``n_per_style`` files per style.  File ``i`` of a style is fully
described by a :class:`ClipPlan`: its path, duration (seconds), format, sample
rate (Hz), channel count and the corpus seed.  Every random draw of the project
comes from :func:`rng_for`, a generator keyed by ``(seed, style, key...)``, so a
file does not depend on how many files are planned or in which process.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import ndtr, ndtri

from .errors import DemoCorpusError

__all__ = [
    "FORMATS", "LOG_SIGMA", "MAX_SECONDS", "MEDIAN_SECONDS", "MIN_SECONDS", "SAMPLE_RATES", "STYLES", "ClipPlan",
    "DemoCorpusError", "plan_corpus", "rng_for",
]


STYLES: tuple[str, ...] = ("ambient", "classical", "hiphop", "jazz", "reggae", "rock", "techno")
"""Style (label) names, also the folder names of the corpus."""

FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}
"""File extension -> (libsndfile major format, subtype)."""

SAMPLE_RATES: tuple[int, ...] = (22050, 44100)
"""Sample rates (Hz) the files cycle through."""

MIN_SECONDS = 5.0
MAX_SECONDS = 240.0
MEDIAN_SECONDS = 16.0
LOG_SIGMA = 0.72
"""Durations: log-normal, median ``MEDIAN_SECONDS`` s, sigma of ln(seconds) ``LOG_SIGMA``, truncated
to ``[MIN_SECONDS, MAX_SECONDS]`` by default."""


@dataclass(frozen=True)
class ClipPlan:
    """Everything that determines one file: its label, name, length and encoding.

    ``duration_s`` is in seconds; the file holds ``n_frames`` = round(duration_s * sample_rate)
    frames.  ``seed`` is the corpus seed: the audio is a pure function of (seed, style, index).
    """

    style: str
    index: int
    relpath: str
    duration_s: float
    ext: str
    sample_rate: int
    channels: int
    seed: int

    @property
    def n_frames(self) -> int:
        """Number of frames (samples per channel) in the file."""
        return int(round(self.duration_s * self.sample_rate))


def _style_key(style: str) -> int:
    return zlib.crc32(style.encode("utf-8"))


def rng_for(seed: int, style: str, *key: int) -> np.random.Generator:
    """Independent generator for (seed, style, key...); stable across runs and processes.

    Keys in use: ``(1,)`` draws a style's durations, ``(0, index)`` everything in file ``index``.
    """
    return np.random.default_rng(np.random.SeedSequence([seed, _style_key(style), *key]))


def _durations(n: int, lo: float, hi: float, rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """``n`` durations (s) at stratified quantiles of the truncated log-normal, shuffled.

    The quantiles run from 0 to 1 inclusive, so (for n >= 2) the shortest file is ``lo``
    and the longest ``hi``, up to a +-3 % jitter (clipped to the bounds) that keeps the
    durations of different styles from being identical.
    """
    mu = math.log(MEDIAN_SECONDS)
    a = (math.log(lo) - mu) / LOG_SIGMA
    b = (math.log(hi) - mu) / LOG_SIGMA
    u = np.linspace(0.0, 1.0, n) if n > 1 else np.array([0.5])
    pa, pb = float(ndtr(a)), float(ndtr(b))
    z = ndtri(np.clip(pa + u * (pb - pa), 1e-12, 1.0 - 1e-12))
    d = np.exp(mu + LOG_SIGMA * z)
    d = d * np.exp(rng.uniform(-0.03, 0.03, n))
    d = np.clip(d, lo, hi)
    return np.asarray(rng.permutation(d), dtype=np.float64)


def _names(given: Sequence[str], known: Collection[str], noun: str) -> tuple[str, ...]:
    """``given`` as a tuple, refused unless it is non-empty, names only ``known`` ones and repeats none."""
    names = tuple(given)
    unknown = [s for s in names if s not in known]
    if not names or unknown:
        raise DemoCorpusError(f"unknown {noun}(s) {unknown or '(none given)'}; choose from {list(known)}")
    if len(set(names)) != len(names):
        raise DemoCorpusError(f"duplicate {noun}s in {list(names)}")
    return names


def plan_corpus(
    n_per_style: int = 40,
    *,
    seed: int = 0,
    min_seconds: float | None = None,
    max_seconds: float = MAX_SECONDS,
    formats: Sequence[str] = tuple(FORMATS),
    styles: Sequence[str] = STYLES,
) -> list[ClipPlan]:
    """The files a corpus consists of, without rendering anything.

    ``min_seconds`` defaults to ``min(MIN_SECONDS, max_seconds)``.  File ``i`` of every
    style gets format ``formats[i % F]``; blocks of ``F`` files alternate the sample rate
    and pair it with mono and stereo in turn (22.05 kHz mono, 44.1 kHz stereo, 22.05 kHz
    stereo, 44.1 kHz mono), so any ``4F`` consecutive files hold every combination and
    every style holds exactly the same encodings: none of them predicts the label.
    """
    if isinstance(n_per_style, bool) or not isinstance(n_per_style, (int, np.integer)) or n_per_style < 1:
        raise DemoCorpusError(f"n_per_style must be a positive integer, got {n_per_style!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DemoCorpusError(f"seed must be a non-negative integer, got {seed!r}")
    n_per_style, seed = int(n_per_style), int(seed)
    lo = min(MIN_SECONDS, max_seconds) if min_seconds is None else float(min_seconds)
    hi = float(max_seconds)
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0.0:
        raise DemoCorpusError(f"durations must be positive and finite, got min={lo} max={hi}")
    if lo < 0.1:
        raise DemoCorpusError(f"min_seconds must be at least 0.1 s, got {lo}")
    if hi < lo:
        raise DemoCorpusError(f"max_seconds ({hi}) is below min_seconds ({lo})")
    fmts = _names(formats, FORMATS, "format")
    sty = _names(styles, STYLES, "style")

    width = max(3, len(str(n_per_style - 1)))
    n_fmt = len(fmts)
    plans: list[ClipPlan] = []
    for style in sty:
        durs = _durations(n_per_style, lo, hi, rng_for(seed, style, 1))
        for i in range(n_per_style):
            block = i // n_fmt
            ext = fmts[i % n_fmt]
            sr = SAMPLE_RATES[block % 2]
            channels = 1 + (block + block // 2) % 2
            relpath = f"{style}/{style}_{i:0{width}d}.{ext}"
            plans.append(ClipPlan(style, i, relpath, float(durs[i]), ext, sr, channels, seed))
    return plans
