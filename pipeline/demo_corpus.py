"""Deterministic synthetic music corpus: the default corpus of ``make features`` and ``make demo``.

The corpus imitates a small genre data set (GTZAN-style, one folder per label)
without shipping any audio: ``OUT_DIR/<style>/<style>_<nnn>.<ext>``.  Each style
is synthesised from the things that tell genres apart on a spectrogram:

* rhythm: four-on-the-floor kick (techno), rock backbeat, jazz swing ride,
  reggae one-drop with off-beat skank, boom-bap with swung hats (hip-hop),
  no beat at all (ambient, classical);
* instruments and timbre: detuned saw pads, distorted power chords, FM bells,
  Karplus-Strong plucked strings, additive brass / strings with vibrato,
  sub and acid bass, drums from filtered noise and pitch-swept sines;
* harmony: major / minor / modal progressions, seventh chords in jazz;
* texture: dense or sparse, dry or smeared by a long noise-tail reverb.

Inside a style every file differs: key, tempo (drawn from the style's range),
progression, instrument choice and balance, detuning, reverb, added noise and
loudness (-25..-8 dBFS RMS).  Durations follow a log-normal law (median 20 s)
truncated to ``[min_seconds, max_seconds]`` (default 5 s .. 4 min), sampled by
stratified quantiles so every style gets the same spread.  Formats cycle through
wav / flac / ogg / mp3 and sample rates (22 050 / 44 100 Hz) and channel counts
(mono / stereo) cycle too, independently of the label.

Everything is a pure function of ``(seed, style, index)``: a file does not
depend on how many files are generated or in which process, and the same seed
gives byte-identical files for every format (libsndfile picks a random Ogg
stream serial number; it is rewritten to a value derived from the file name).

Synthesis is vectorised numpy at 22 050 Hz (notes are rendered as whole arrays,
drums are one-hit samples placed by slices or FFT convolution, plucks are
Karplus-Strong computed period-wise in the frequency domain; 44.1 kHz files are
upsampled).  The default corpus (7 styles x 40 files, 2.0 h of audio) costs about
100 CPU-seconds, over half of it in libsndfile's MP3 encoder (about 30x realtime
for 44.1 kHz stereo), so about a minute on 2 idle cores.
"""

from __future__ import annotations

import argparse
import io
import logging
import math
import os
import re
import struct
import sys
import time
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soundfile as sf
from scipy import fft as sfft
from scipy import signal
from scipy.special import ndtr, ndtri
from tqdm import tqdm

__all__ = [
    "STYLES",
    "FORMATS",
    "SAMPLE_RATES",
    "MIN_SECONDS",
    "MAX_SECONDS",
    "MEDIAN_SECONDS",
    "ClipPlan",
    "CorpusSummary",
    "DemoCorpusError",
    "plan_corpus",
    "render_clip",
    "encode_clip",
    "generate_corpus",
    "main",
]

logger = logging.getLogger(__name__)

Audio = npt.NDArray[np.float64]
"""Mono signal, float64 samples (full scale 1.0)."""

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
"""Durations: log-normal, median ``MEDIAN_SECONDS``, sigma of ln(seconds) ``LOG_SIGMA``, truncated."""

LOUDNESS_DBFS = (-25.0, -8.0)
"""Range of the target RMS level of a file, dB relative to full scale."""

_WRITE_BLOCK = 65536
"""Frames per write call.  libsndfile 1.2's Vorbis encoder crashes on single writes of ~2.5 M frames."""

_SYNTH_SR = 22050
"""Sample rate (Hz) the instruments are synthesised at; other rates are resampled from it."""

_TABLE_BITS = 12
_TABLE = 1 << _TABLE_BITS
"""Wavetable length (samples per cycle); a power of two, indexed by the top bits of the phase."""

_FILE_RE = re.compile(r"^(?P<style>[a-z0-9]+)_(?P<index>\d{3,})\.(?P<ext>[a-z0-9]+)$")


class DemoCorpusError(ValueError):
    """Bad arguments or an output directory that would mix this corpus with other files."""


# --------------------------------------------------------------------------------------------
# Planning (pure)
# --------------------------------------------------------------------------------------------


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


@dataclass(frozen=True)
class CorpusSummary:
    """What :func:`generate_corpus` wrote.  ``total_seconds`` and ``elapsed_s`` in seconds."""

    out_dir: Path
    clips: tuple[ClipPlan, ...]
    elapsed_s: float

    @property
    def styles(self) -> tuple[str, ...]:
        """Style (label) names in corpus order."""
        return tuple(dict.fromkeys(c.style for c in self.clips))

    @property
    def n_files(self) -> int:
        return len(self.clips)

    @property
    def total_seconds(self) -> float:
        return float(sum(c.n_frames / c.sample_rate for c in self.clips))

    @property
    def total_hours(self) -> float:
        return self.total_seconds / 3600.0

    @property
    def files_per_format(self) -> dict[str, int]:
        return dict(Counter(c.ext for c in self.clips))

    @property
    def files_per_style(self) -> dict[str, int]:
        return dict(Counter(c.style for c in self.clips))


def _style_key(style: str) -> int:
    return zlib.crc32(style.encode("utf-8"))


def _rng(seed: int, style: str, *key: int) -> np.random.Generator:
    """Independent generator for (seed, style, key...); stable across runs and processes."""
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
    fmts = tuple(formats)
    unknown = [f for f in fmts if f not in FORMATS]
    if not fmts or unknown:
        raise DemoCorpusError(f"unknown format(s) {unknown or '(none given)'}; choose from {list(FORMATS)}")
    if len(set(fmts)) != len(fmts):
        raise DemoCorpusError(f"duplicate formats in {list(fmts)}")
    sty = tuple(styles)
    bad = [s for s in sty if s not in STYLES]
    if not sty or bad:
        raise DemoCorpusError(f"unknown style(s) {bad or '(none given)'}; choose from {list(STYLES)}")
    if len(set(sty)) != len(sty):
        raise DemoCorpusError(f"duplicate styles in {list(sty)}")

    width = max(3, len(str(n_per_style - 1)))
    n_fmt = len(fmts)
    plans: list[ClipPlan] = []
    for style in sty:
        durs = _durations(n_per_style, lo, hi, _rng(seed, style, 1))
        for i in range(n_per_style):
            block = i // n_fmt
            ext = fmts[i % n_fmt]
            sr = SAMPLE_RATES[block % 2]
            channels = 1 + (block + block // 2) % 2
            relpath = f"{style}/{style}_{i:0{width}d}.{ext}"
            plans.append(ClipPlan(style, i, relpath, float(durs[i]), ext, sr, channels, seed))
    return plans


# --------------------------------------------------------------------------------------------
# Synthesis primitives
# --------------------------------------------------------------------------------------------

_SCALES: dict[str, tuple[int, ...]] = {
    "major": (0, 2, 4, 5, 7, 9, 11),
    "minor": (0, 2, 3, 5, 7, 8, 10),
    "dorian": (0, 2, 3, 5, 7, 9, 10),
    "mixolydian": (0, 2, 4, 5, 7, 9, 10),
    "lydian": (0, 2, 4, 6, 7, 9, 11),
    "phrygian": (0, 1, 3, 5, 7, 8, 10),
    "harmonic_minor": (0, 2, 3, 5, 7, 8, 11),
}


@dataclass(frozen=True)
class _Ctx:
    """Per-file synthesis context: generator, sample rate (Hz), length (samples), tuning ratio."""

    rng: np.random.Generator
    sr: int
    n: int
    tuning: float
    tables: dict[tuple[bytes, int], Audio] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return self.n / self.sr

    def hz(self, midi: float) -> float:
        return 440.0 * self.tuning * 2.0 ** ((midi - 69.0) / 12.0)

    def zeros(self) -> Audio:
        return np.zeros(self.n, dtype=np.float64)


@dataclass
class _Stem:
    """One instrument's mono signal, its stereo position (-1 left .. 1 right) and reverb send."""

    audio: Audio
    pan: float
    send: float


def _scale_midi(root: int, scale: Sequence[int], degree: int) -> int:
    octave, step = divmod(degree, len(scale))
    return root + 12 * octave + scale[step]


def _chord_midi(root: int, scale: Sequence[int], degree: int, size: int = 3) -> list[int]:
    """Chord stacked in thirds on scale ``degree`` (0-based); size 4 gives seventh chords."""
    return [_scale_midi(root, scale, degree + 2 * j) for j in range(size)]


def _into_range(notes: Sequence[int], lo: int, hi: int) -> list[int]:
    """Move each note by octaves into [lo, hi] (hi - lo >= 12)."""
    out = []
    for m in notes:
        while m < lo:
            m += 12
        while m > hi:
            m -= 12
        out.append(m)
    return sorted(out)


def _add(buf: Audio, start: int, x: Audio) -> None:
    """Add ``x`` into ``buf`` at sample ``start``, clipping at both ends."""
    if start < 0:
        if -start >= len(x):
            return
        x = x[-start:]
        start = 0
    end = min(len(buf), start + len(x))
    if end > start:
        buf[start:end] += x[: end - start]


def _table(ctx: _Ctx, amps: npt.ArrayLike, freq: float) -> Audio:
    """One cycle (``_TABLE`` samples) of a sum of sine harmonics, band-limited below 0.45 sr.

    Cached per file by (harmonic amplitudes, number of harmonics kept).
    """
    a = np.asarray(amps, dtype=np.float64)
    h = max(1, min(len(a), int(0.45 * ctx.sr / max(freq, 1.0))))
    key = (a[:h].tobytes(), h)
    tab = ctx.tables.get(key)
    if tab is None:
        spec = np.zeros(_TABLE // 2 + 1, dtype=np.complex128)
        spec[1 : h + 1] = -0.5j * _TABLE * a[:h]
        tab = np.fft.irfft(spec, _TABLE)
        ctx.tables[key] = tab
    return tab


def _phase_index(freq: float, n: int, sr: int, phase0: float, vib: tuple[float, float] | None) -> npt.NDArray[np.uint32]:
    """Wavetable indices for ``n`` samples at ``freq`` Hz, optional vibrato (rate Hz, relative depth).

    The phase is a 32-bit fixed-point accumulator (wraps for free in uint32 arithmetic);
    its top ``log2(_TABLE)`` bits index the table.
    """
    idx = np.arange(n, dtype=np.uint32)
    idx *= np.uint32(int(round(freq / sr * 2.0**32)) & 0xFFFFFFFF)
    idx += np.uint32(int(phase0 * 2.0**32) & 0xFFFFFFFF)
    if vib is not None:
        # Phase offset of f(t) = freq * (1 + depth * sin(2 pi rate t)): periodic, so one
        # vibrato cycle (rate rounded to a whole number of samples per cycle) is tiled.
        rate, depth = vib
        period = max(2, int(round(sr / rate)))
        t = np.arange(period, dtype=np.float64)
        off = freq * depth * period / (2.0 * np.pi * sr) * (1.0 - np.cos(2.0 * np.pi * t / period))
        idx += np.resize((off * 2.0**32).astype(np.int64).astype(np.uint32), n)
    idx >>= np.uint32(32 - _TABLE_BITS)
    return idx


def _voice(
    ctx: _Ctx,
    amps: npt.ArrayLike,
    freq: float,
    n: int,
    *,
    vib: tuple[float, float] | None = None,
    dark: npt.ArrayLike | None = None,
    bright_tau: float = 0.1,
) -> Audio:
    """Wavetable oscillator, ``n`` samples; with ``dark`` the timbre fades from ``amps`` to
    ``dark`` with time constant ``bright_tau`` seconds (a cheap moving low-pass)."""
    idx = _phase_index(freq, n, ctx.sr, float(ctx.rng.random()), vib)
    x = _table(ctx, amps, freq)[idx]
    if dark is not None:
        d = _table(ctx, dark, freq)[idx]
        x -= d
        x *= np.exp(np.arange(n) * (-1.0 / (bright_tau * ctx.sr)))
        x += d
    return x


def _env_asr(n: int, sr: int, attack: float, hold: float, release: float) -> Audio:
    """Attack / sustain / release envelope over ``n`` samples: linear ramps, times in seconds."""
    a = max(1, int(attack * sr))
    h = max(int(hold * sr), a)
    r = max(1, int(release * sr))
    env = np.zeros(n)
    env[: min(a, n)] = np.linspace(0.0, 1.0, a, endpoint=False)[:n]
    if h < n:
        env[a:h] = 1.0
        tail = np.linspace(1.0, 0.0, r, endpoint=False)[: n - h]
        env[h : h + len(tail)] = tail
    else:
        env[a:n] = 1.0
    return env


def _env_decay(n: int, sr: int, tau: float, hold: float, release: float = 0.03, attack: float = 0.002) -> Audio:
    """Exponential decay (time constant ``tau`` s), damped ``release`` s after ``hold`` s."""
    t = np.arange(n, dtype=np.float64) / sr
    e = np.exp(-t / tau) * np.minimum(1.0, t / attack)
    return e * np.clip(1.0 - (t - hold) / release, 0.0, 1.0)


def _sos(kind: str, cutoff: float | tuple[float, float], sr: int, order: int = 2) -> npt.NDArray[np.float64]:
    nyq = 0.5 * sr
    if isinstance(cutoff, tuple):
        wn: float | tuple[float, float] = (max(cutoff[0], 10.0) / nyq, min(cutoff[1], 0.95 * nyq) / nyq)
    else:
        wn = min(cutoff, 0.95 * nyq) / nyq
    return np.asarray(signal.butter(order, wn, btype=kind, output="sos"))


def _filt(x: Audio, kind: str, cutoff: float | tuple[float, float], sr: int, order: int = 2) -> Audio:
    """Butterworth low/high/band-pass (cutoffs in Hz, clamped below Nyquist)."""
    return np.asarray(signal.sosfilt(_sos(kind, cutoff, sr, order), x))


def _pink(rng: np.random.Generator, n: int) -> Audio:
    """Pink (1/f) noise, unit RMS (Kellet's 3-pole approximation)."""
    b = [0.049922035, -0.095993537, 0.050612699, -0.004408786]
    a = [1.0, -2.494956002, 2.017265875, -0.522189400]
    x = np.asarray(signal.lfilter(b, a, rng.standard_normal(n + 2000)))[2000:]
    return _norm(x)


def _pluck(ctx: _Ctx, freq: float, n: int, hold: int, *, decay: float, bright: float) -> Audio:
    """Karplus-Strong plucked string, ``n`` samples, damped after ``hold`` samples.

    The string loop (delay L, two-point average, loss rho) is linear and time-invariant per
    period, so period k is the first period filtered k times: computed for all periods at
    once as irfft(P * H**k) instead of a per-sample loop.  ``decay`` is the fundamental's
    T60 in seconds; ``bright`` in (0, 1] shapes the excitation (1 = white noise).
    """
    sr = ctx.sr
    period = max(2, int(round(sr / freq - 0.5)))
    n_per = -(-n // period)
    exc = ctx.rng.uniform(-1.0, 1.0, period)
    pole = 1.0 - bright
    exc = np.asarray(signal.lfilter([1.0 - pole], [1.0, -pole], np.concatenate([exc, exc])))[period:]
    exc -= exc.mean()
    rho = 10.0 ** (-3.0 * period / (sr * decay))
    w = 2.0 * np.pi * np.arange(period // 2 + 1) / period
    h = rho * 0.5 * (1.0 + np.exp(-1j * w))
    k = np.arange(n_per, dtype=np.float64)[:, None]
    y = np.fft.irfft(np.fft.rfft(exc)[None, :] * np.power(h[None, :], k), n=period, axis=1).ravel()[:n]
    y = y / (np.max(np.abs(y[:period])) + 1e-9)
    if hold < n:
        t = np.arange(n - hold, dtype=np.float64)
        y[hold:] *= np.exp(-t / (0.02 * sr))
    return y


def _fm_bell(ctx: _Ctx, freq: float, n: int, *, decay: float, ratio: float, index: float) -> Audio:
    """Two-operator FM bell (inharmonic ``ratio``), exponential decay ``decay`` s."""
    t = np.arange(n, dtype=np.float64) / ctx.sr
    env = np.exp(-t / decay) * np.minimum(1.0, t / 0.003)
    mod = index * np.exp(-t / (0.5 * decay)) * np.sin(2.0 * np.pi * ratio * freq * t)
    return env * np.sin(2.0 * np.pi * freq * t + mod)


# ---- drums (one-hit samples) ---------------------------------------------------------------


def _kick(ctx: _Ctx, *, f_hi: float, f_lo: float, decay: float, click: float = 0.3) -> Audio:
    sr = ctx.sr
    n = int(sr * min(2.0, 4.0 * decay + 0.05))
    t = np.arange(n) / sr
    f = f_lo + (f_hi - f_lo) * np.exp(-t / 0.035)
    body = np.sin(2.0 * np.pi * np.cumsum(f) / sr) * np.exp(-t / decay)
    clk = _filt(ctx.rng.standard_normal(n), "lowpass", 3000.0, sr) * np.exp(-t / 0.004)
    return np.tanh(1.5 * (body + click * clk))


def _snare(ctx: _Ctx, *, tone: float, decay: float, band: tuple[float, float] = (1500.0, 7000.0)) -> Audio:
    sr = ctx.sr
    n = int(sr * (5.0 * decay + 0.05))
    t = np.arange(n) / sr
    noise = _filt(ctx.rng.standard_normal(n), "bandpass", band, sr) * np.exp(-t / decay)
    body = np.sin(2.0 * np.pi * tone * t) * np.exp(-t / 0.05)
    return 1.6 * noise + 0.6 * body


def _hat(ctx: _Ctx, *, decay: float, cutoff: float = 6000.0) -> Audio:
    sr = ctx.sr
    n = int(sr * (5.0 * decay + 0.01))
    t = np.arange(n) / sr
    x = _filt(ctx.rng.standard_normal(n), "highpass", min(cutoff, 0.6 * sr / 2), sr, order=4)
    return 1.5 * x * np.exp(-t / decay)


def _clap(ctx: _Ctx) -> Audio:
    sr = ctx.sr
    n = int(0.35 * sr)
    t = np.arange(n) / sr
    env = np.exp(-t / 0.09)
    for k in range(3):
        env += 0.8 * np.exp(-np.maximum(t - 0.011 * k, 0.0) / 0.004) * (t >= 0.011 * k)
    return 1.4 * _filt(ctx.rng.standard_normal(n), "bandpass", (900.0, 3500.0), sr) * env


def _ride(ctx: _Ctx, *, decay: float) -> Audio:
    """Metallic cymbal: inharmonic sine cluster plus high noise, long decay."""
    sr = ctx.sr
    n = int(sr * min(2.5, 3.0 * decay))
    t = np.arange(n) / sr
    base = ctx.rng.uniform(380.0, 520.0)
    ratios = np.array([7.2, 9.1, 10.7, 12.9, 14.3, 15.8])
    tone = np.zeros(n)
    for r in ratios:
        f = base * r
        if f < 0.45 * sr:
            tone += np.sin(2.0 * np.pi * f * t + ctx.rng.random() * 6.283)
    noise = _filt(ctx.rng.standard_normal(n), "highpass", 4500.0, sr, order=4)
    ping = np.exp(-t / 0.02)
    return (0.25 * tone + 0.8 * noise) * np.exp(-t / decay) * (0.6 + 0.4 * ping)


def _rim(ctx: _Ctx) -> Audio:
    sr = ctx.sr
    n = int(0.08 * sr)
    t = np.arange(n) / sr
    x = _filt(ctx.rng.standard_normal(n), "bandpass", (1500.0, 4500.0), sr) * np.exp(-t / 0.012)
    return 1.5 * x + 0.8 * np.sin(2.0 * np.pi * 820.0 * t) * np.exp(-t / 0.015)


def _pattern(s: str) -> npt.NDArray[np.float64]:
    """Step pattern string -> velocities: X 1.0, x 0.8, o 0.55, g 0.3 (ghost), . rest."""
    vel = {"X": 1.0, "x": 0.8, "o": 0.55, "g": 0.3, ".": 0.0}
    return np.array([vel[c] for c in s.replace(" ", "")], dtype=np.float64)


def _events(
    ctx: _Ctx,
    pattern: str,
    bar_s: float,
    *,
    swing: float = 0.0,
    jitter: float = 0.004,
    vel_jitter: float = 0.1,
    t0: float = 0.0,
) -> tuple[Audio, Audio]:
    """Onset times (s) and velocities of a one-bar step pattern repeated from ``t0`` (s).

    ``swing`` delays every odd step by that fraction of a step; ``jitter`` (s, standard
    deviation) and ``vel_jitter`` (relative) humanise timing and dynamics.
    """
    v = _pattern(pattern)
    steps = np.flatnonzero(v)
    n_bars = int(math.ceil((ctx.seconds - t0) / bar_s)) + 1
    step_s = bar_s / len(v)
    bars = np.arange(n_bars)
    times = t0 + bars[:, None] * bar_s + (steps[None, :] + swing * (steps[None, :] % 2)) * step_s
    vels = np.broadcast_to(v[steps][None, :], times.shape)
    times = times.ravel() + ctx.rng.normal(0.0, jitter, times.size)
    vels = vels.ravel() * np.clip(1.0 + vel_jitter * ctx.rng.standard_normal(times.size), 0.3, 1.5)
    ok = (vels > 0) & (times < ctx.seconds)
    return times[ok], vels[ok]


def _fftconv(x: Audio, h: Audio, n: int) -> Audio:
    """First ``n`` samples of the linear convolution x * h (one zero-padded real FFT, float32)."""
    size = sfft.next_fast_len(len(x) + len(h) - 1, real=True)
    spec = sfft.rfft(x.astype(np.float32), size)
    spec *= sfft.rfft(h.astype(np.float32), size)
    return np.asarray(sfft.irfft(spec, size)[:n], dtype=np.float64)


def _drum_track(ctx: _Ctx, hit: Audio, times: Audio, vels: Audio) -> Audio:
    """Place a one-hit sample at ``times`` (s) scaled by ``vels``.

    Sparse hits are added slice by slice; dense long hits (a ride every triplet) are an
    impulse train convolved with the hit, whichever touches fewer samples.
    """
    idx = np.clip(np.round(times * ctx.sr).astype(np.int64), 0, ctx.n - 1)
    if len(idx) * len(hit) <= 30 * ctx.n:
        out = ctx.zeros()
        for i, v in zip(idx.tolist(), vels.tolist()):
            end = min(ctx.n, i + len(hit))
            out[i:end] += v * hit[: end - i]
        return out
    imp = np.zeros(ctx.n)
    np.add.at(imp, idx, vels)
    return _fftconv(imp, hit, ctx.n)


Note = tuple[float, float, float, float]
"""(onset s, held duration s, MIDI pitch, velocity 0..1)."""
Instrument = Callable[[float, int, int], Audio]
"""(frequency Hz, total samples incl. release, held samples) -> samples."""


def _render(ctx: _Ctx, notes: Sequence[Note], inst: Instrument, tail: float) -> Audio:
    """Render ``notes`` with ``inst`` into one stem; each note rings ``tail`` s after release."""
    out = ctx.zeros()
    sr = ctx.sr
    for t, dur, midi, vel in notes:
        start = int(round(t * sr))
        if start >= ctx.n or vel <= 0.0:
            continue
        hold = max(1, int(dur * sr))
        total = min(hold + int(tail * sr), ctx.n - start)
        if start + total <= 0:
            continue
        _add(out, start, vel * inst(ctx.hz(midi), total, hold))
    return out


def _saw(h: int) -> Audio:
    return 1.0 / np.arange(1, h + 1)


def _square(h: int) -> Audio:
    k = np.arange(1, h + 1)
    return np.where(k % 2 == 1, 1.0 / k, 0.0)


_ORGAN = np.array([1.0, 0.8, 0.6, 0.5, 0.0, 0.35, 0.0, 0.3])
_FLUTE = np.array([1.0, 0.25, 0.08, 0.03])
_DARK = np.array([1.0, 0.3, 0.1, 0.04])


def _power_chord(h: int) -> Audio:
    """Saw root + fifth + octave, as harmonics of half the root frequency (2k, 3k, 4k)."""
    a = np.zeros(4 * h)
    for mult, gain in ((2, 1.0), (3, 0.8), (4, 0.6)):
        k = np.arange(1, h + 1)
        a[mult * k - 1] += gain / k
    return a


def _brass(h: int) -> Audio:
    k = np.arange(1, h + 1)
    return np.exp(-(((k - 4.0) / 3.5) ** 2)) + 0.35 / k


def _strings(h: int) -> Audio:
    k = np.arange(1, h + 1)
    return (1.0 / k**1.05) * (1.0 + 0.6 * np.exp(-(((k - 6.0) / 2.0) ** 2)))


def _chord_times(ctx: _Ctx, prog: Sequence[int], chord_s: float, t0: float = 0.0) -> list[tuple[float, int]]:
    """(start s, scale degree) of a progression repeated over the file."""
    out = []
    t = t0
    i = 0
    while t < ctx.seconds:
        out.append((t, prog[i % len(prog)]))
        t += chord_s
        i += 1
    return out


def _walk(ctx: _Ctx, start: int, lo: int, hi: int, steps: Sequence[int], p: Sequence[float]) -> Callable[[], int]:
    """Random walk over scale degrees within [lo, hi]; returns a 'next degree' function."""
    state = [start]

    def step() -> int:
        d = state[0] + int(ctx.rng.choice(steps, p=p))
        if d < lo or d > hi:
            d = state[0] - (d - state[0])
        state[0] = int(np.clip(d, lo, hi))
        return state[0]

    return step


def _db(lo: float, hi: float, rng: np.random.Generator) -> float:
    """Random gain, uniform in dB between ``lo`` and ``hi``, as a linear factor."""
    return float(10.0 ** (rng.uniform(lo, hi) / 20.0))


def _rms(x: Audio) -> float:
    """Root mean square of all samples (einsum: no temporary, and no BLAS thread wake-ups)."""
    flat = x.ravel()
    return float(np.sqrt(np.einsum("i,i->", flat, flat) / max(flat.size, 1) + 1e-20))


def _norm(x: Audio, gain: float = 1.0) -> Audio:
    """Scale ``x`` in place to RMS ``gain`` (silence stays silent); returns ``x``."""
    r = _rms(x)
    if r > 1e-9:
        x *= gain / r
    return x


# --------------------------------------------------------------------------------------------
# Styles.  Each returns stems, reverb T60 (s), wet level and the added-noise SNR range (dB).
# --------------------------------------------------------------------------------------------


@dataclass
class _Arrangement:
    stems: list[_Stem]
    rt60: float
    wet: float
    snr_db: tuple[float, float]


def _ambient(ctx: _Ctx) -> _Arrangement:
    rng, sr = ctx.rng, ctx.sr
    scale = _SCALES[str(rng.choice(["major", "lydian", "dorian", "minor"]))]
    root = 48 + int(rng.integers(0, 12))
    stems: list[_Stem] = []

    # Detuned saw pad, slow chords (4-10 s), low-passed.
    pad_amps = _saw(24)
    attack, release = rng.uniform(1.0, 3.0), rng.uniform(2.0, 4.0)
    detune = rng.uniform(4.0, 14.0) / 100.0
    size = int(rng.choice([3, 4]))
    notes: list[Note] = []
    t = -rng.uniform(0.0, 3.0)
    deg = 0
    step = _walk(ctx, 0, -3, 6, [-3, -2, 2, 3, 4], [0.2, 0.2, 0.2, 0.2, 0.2])
    while t < ctx.seconds:
        dur = rng.uniform(4.0, 10.0)
        for m in _into_range(_chord_midi(root, scale, deg, size), 50, 76):
            notes.append((t, dur, m - detune, 0.5))
            notes.append((t, dur, m + detune, 0.5))
        deg = step()
        t += dur

    def pad(f: float, n: int, hold: int) -> Audio:
        return _voice(ctx, pad_amps, f, n) * _env_asr(n, sr, attack, hold / sr, release)

    pad_sig = _filt(_render(ctx, notes, pad, release), "lowpass", rng.uniform(700.0, 2500.0), sr)
    stems.append(_Stem(_norm(pad_sig, _db(-3, 0, rng)), rng.uniform(-0.2, 0.2), 1.0))

    # Drone on the root with a slow swell.
    lfo = 0.6 + 0.4 * _voice(ctx, [1.0], 1.0 / rng.uniform(8.0, 20.0), ctx.n)
    drone = _voice(ctx, [1.0, 0.3], ctx.hz(root - 12), ctx.n) * lfo
    stems.append(_Stem(_norm(drone, _db(-14, -5, rng)), 0.0, 0.6))

    # Sparse FM bells from the pentatonic subset of the scale.
    if rng.random() < 0.8:
        rate = rng.uniform(0.1, 0.5)
        count = rng.poisson(rate * ctx.seconds) + 1
        times = np.sort(rng.uniform(0.0, ctx.seconds, count))
        penta = [scale[i] for i in (0, 1, 2, 4, 5)]
        ratio, index, decay = rng.uniform(2.5, 4.1), rng.uniform(1.0, 3.0), rng.uniform(1.5, 4.0)
        bells = [(float(tt), 0.1, root + 24 + 12 * int(rng.integers(0, 2)) + int(rng.choice(penta)), rng.uniform(0.4, 1.0)) for tt in times]
        bell_sig = _render(ctx, bells, lambda f, n, h: _fm_bell(ctx, f, n, decay=decay, ratio=ratio, index=index), 2.5 * decay)
        stems.append(_Stem(_norm(bell_sig, _db(-12, -4, rng)), rng.uniform(-0.6, 0.6), 1.0))

    # Wind: band-passed pink noise with a slow swell.
    if rng.random() < 0.4:
        lo = rng.uniform(300.0, 900.0)
        wind = _filt(_pink(rng, ctx.n), "bandpass", (lo, lo * rng.uniform(2.0, 5.0)), sr)
        wind *= 0.5 + 0.5 * _voice(ctx, [1.0], 1.0 / rng.uniform(6.0, 15.0), ctx.n) ** 2
        stems.append(_Stem(_norm(wind, _db(-22, -12, rng)), rng.uniform(-0.3, 0.3), 0.5))
    return _Arrangement(stems, rng.uniform(3.0, 6.0), rng.uniform(0.45, 0.75), (30.0, 55.0))


def _classical(ctx: _Ctx) -> _Arrangement:
    rng, sr = ctx.rng, ctx.sr
    meter = int(rng.choice([3, 4]))
    beat = 60.0 / rng.uniform(60.0, 126.0)
    bar = meter * beat
    minor = rng.random() < 0.45
    scale = _SCALES["harmonic_minor" if minor else "major"]
    root = 48 + int(rng.integers(0, 12))
    progs = [[0, 3, 4, 0], [0, 5, 3, 4], [0, 4, 5, 3, 0, 1, 4, 0], [0, 3, 0, 4]]
    prog = progs[int(rng.integers(0, len(progs)))]
    chords = _chord_times(ctx, prog, bar)
    vib = (rng.uniform(5.0, 6.5), rng.uniform(0.002, 0.005))
    stems: list[_Stem] = []

    # Dynamics: phrase-long swells shared by all instruments.
    t_all = np.arange(ctx.n) / sr
    swell = 0.65 + 0.35 * np.sin(2 * np.pi * t_all / (bar * rng.choice([4, 8])) + rng.random() * 6.28)

    def bowed(amps: Audio, attack: float) -> Instrument:
        def inst(f: float, n: int, hold: int) -> Audio:
            v = _voice(ctx, amps, f, n, vib=vib) + _voice(ctx, amps, f * 1.003, n, vib=vib)
            return v * _env_asr(n, sr, attack, hold / sr, 0.25)

        return inst

    # String section: sustained chords (most files).
    if rng.random() < 0.8:
        sec = [(t, bar, m, 0.5) for t, d in chords for m in _into_range(_chord_midi(root, scale, d), 55, 74)]
        sig = _filt(_render(ctx, sec, bowed(_strings(20), rng.uniform(0.15, 0.4)), 0.25), "lowpass", 5000.0, sr)
        stems.append(_Stem(_norm(sig * swell, _db(-6, -1, rng)), rng.uniform(-0.3, 0.3), 1.0))

    # Bass line (cello / double bass): roots in half or whole bars.
    bass_notes: list[Note] = []
    div = int(rng.choice([1, 2])) if meter == 4 else 1
    for t, d in chords:
        m = _into_range([_scale_midi(root, scale, d)], 36, 50)[0]
        for k in range(div):
            bass_notes.append((t + k * bar / div, bar / div * 0.95, m if k == 0 else m + 7 * (rng.random() < 0.5), 0.8))
    sig = _render(ctx, bass_notes, bowed(_strings(16), 0.08), 0.25)
    stems.append(_Stem(_norm(sig * swell, _db(-6, -2, rng)), rng.uniform(-0.2, 0.2), 0.8))

    # Melody: violin, flute or horn; stepwise, chord tones on downbeats.
    kind = int(rng.integers(0, 3))
    mel_amps = [_strings(24), _FLUTE, _brass(16)][kind]
    mel_lo = [67, 72, 55][kind]
    rhythms = [[1.0], [0.5, 0.5], [0.75, 0.25], [2.0], [0.5, 0.25, 0.25], [1.5, 0.5]]
    mel: list[Note] = []
    step = _walk(ctx, 7, 0, 13, [-2, -1, 1, 2, 0], [0.15, 0.3, 0.3, 0.15, 0.1])
    for t, d in chords:
        pos = 0.0
        while pos < meter - 1e-6:
            r = rhythms[int(rng.integers(0, len(rhythms)))]
            if pos + sum(r) > meter:
                r = [meter - pos]
            for dur in r:
                deg = step()
                mel.append((t + pos * beat, dur * beat * 0.98, _into_range([_scale_midi(root, scale, deg)], mel_lo, mel_lo + 20)[0], rng.uniform(0.6, 1.0)))
                pos += dur

    def melody(f: float, n: int, hold: int) -> Audio:
        v = _voice(ctx, mel_amps, f, n, vib=vib, dark=_DARK if kind == 2 else None, bright_tau=0.3)
        return v * _env_asr(n, sr, 0.06, hold / sr, 0.15)

    sig = _filt(_render(ctx, mel, melody, 0.15), "lowpass", 6000.0, sr)
    stems.append(_Stem(_norm(sig * swell, _db(-4, 0, rng)), rng.uniform(-0.3, 0.3), 0.9))

    # Harp / pizzicato arpeggio in eighths or sixteenths.
    if rng.random() < 0.55:
        sub = int(rng.choice([2, 4])) if beat > 0.6 else 2
        arp: list[Note] = []
        up_down = rng.random() < 0.5
        for t, d in chords:
            tones = _into_range(_chord_midi(root, scale, d), 55, 67)
            seq = tones + [m + 12 for m in tones]
            if up_down:
                seq = seq + seq[-2:0:-1]
            for k in range(meter * sub):
                arp.append((t + k * beat / sub, beat / sub, seq[k % len(seq)], rng.uniform(0.6, 1.0)))
        decay, bright = rng.uniform(1.0, 2.5), rng.uniform(0.3, 0.7)
        sig = _render(ctx, arp, lambda f, n, h: _pluck(ctx, f, n, n, decay=decay, bright=bright), 0.6)
        stems.append(_Stem(_norm(sig * swell, _db(-8, -2, rng)), rng.uniform(-0.5, 0.5), 1.0))
    return _Arrangement(stems, rng.uniform(1.6, 3.0), rng.uniform(0.25, 0.45), (35.0, 60.0))


def _jazz(ctx: _Ctx) -> _Arrangement:
    rng, sr = ctx.rng, ctx.sr
    beat = 60.0 / rng.uniform(100.0, 240.0)
    bar = 4 * beat
    scale = _SCALES["major"]
    root = 48 + int(rng.integers(0, 12))
    progs = [[1, 4, 0, 5], [1, 4, 0, 0], [0, 5, 1, 4], [2, 5, 1, 4]]
    prog = progs[int(rng.integers(0, len(progs)))]
    per_chord = bar if beat < 0.4 else bar / 2
    chords = _chord_times(ctx, prog, per_chord)
    stems: list[_Stem] = []

    # Patterns on a 12-step (triplet) grid, which is what swing is.
    # Ride: "ding, ding-da, ding, ding-da"; hat foot on 2 and 4.
    ride_t, ride_v = _events(ctx, "X..x.oX..x.o", bar, jitter=0.006)
    ride = _drum_track(ctx, _ride(ctx, decay=rng.uniform(0.6, 1.4)), ride_t, ride_v)
    stems.append(_Stem(_norm(ride, _db(-10, -4, rng)), rng.uniform(0.2, 0.6), 0.6))
    hat_t, hat_v = _events(ctx, "...x.....x..", bar, jitter=0.004)
    stems.append(_Stem(_norm(_drum_track(ctx, _hat(ctx, decay=0.03), hat_t, hat_v), _db(-18, -10, rng)), -0.3, 0.3))
    # Snare comping: random ghost notes on triplet positions; feathered kick.
    comp = "".join(rng.choice(["g", "o", "."], p=[0.12, 0.05, 0.83]) for _ in range(12 * 8))
    sn_t, sn_v = _events(ctx, comp, 8 * bar, jitter=0.006)
    snare = _snare(ctx, tone=rng.uniform(170, 230), decay=rng.uniform(0.08, 0.15))
    stems.append(_Stem(_norm(_drum_track(ctx, snare, sn_t, sn_v), _db(-18, -10, rng)), -0.1, 0.5))
    if rng.random() < 0.6:
        k_t, k_v = _events(ctx, "g..g..g..g..", bar, vel_jitter=0.2)
        kick = _kick(ctx, f_hi=120, f_lo=55, decay=0.12, click=0.1)
        stems.append(_Stem(_norm(_drum_track(ctx, kick, k_t, k_v), _db(-20, -14, rng)), 0.0, 0.3))

    # Walking bass: quarter notes, chord tones with stepwise/chromatic approaches.
    bass: list[Note] = []
    for i, (t, d) in enumerate(chords):
        tones = _chord_midi(root, scale, d, 4)
        n_beats = int(round(per_chord / beat))
        nxt = _scale_midi(root, scale, prog[(i + 1) % len(prog)])
        for k in range(n_beats):
            if k == 0:
                m = tones[0]
            elif k == n_beats - 1:
                m = nxt + int(rng.choice([-1, 1, 2, -2]))
            else:
                m = int(rng.choice(tones + [tones[0] + 2, tones[0] + 5]))
            m = _into_range([m], 36, 52)[0]
            bass.append((t + k * beat + rng.normal(0, 0.005), beat * 0.95, m, rng.uniform(0.7, 1.0)))
    b_decay, b_bright = rng.uniform(0.8, 1.6), rng.uniform(0.15, 0.35)
    sig = _render(ctx, bass, lambda f, n, h: _pluck(ctx, f, n, h, decay=b_decay, bright=b_bright), 0.05)
    stems.append(_Stem(_norm(_filt(sig, "lowpass", 1500.0, sr), _db(-4, 0, rng)), rng.uniform(-0.2, 0.2), 0.3))

    # Piano comping: rootless 7th voicings on syncopated triplet positions.
    piano_amps, tau = 1.0 / np.arange(1, 17) ** 1.3, rng.uniform(0.5, 1.2)

    def piano(f: float, n: int, hold: int) -> Audio:
        return _voice(ctx, piano_amps, f, n, dark=_DARK, bright_tau=0.12) * _env_decay(n, sr, tau, hold / sr, 0.08)

    comps: list[Note] = []
    positions = [0.0, 1.0 + 2 / 3, 2.0, 3.0 + 2 / 3, 2.0 + 2 / 3, 1.0]
    for t, d in chords:
        voicing = _into_range(_chord_midi(root, scale, d, 4)[1:] + [_scale_midi(root, scale, d + 8)], 55, 74)
        n_beats = per_chord / beat
        for pos in positions:
            if pos < n_beats and rng.random() < 0.45:
                for m in voicing:
                    comps.append((t + pos * beat + rng.normal(0, 0.006), rng.uniform(0.2, 0.6) * beat, m, rng.uniform(0.3, 0.6)))
    sig = _render(ctx, comps, piano, 0.1)
    stems.append(_Stem(_norm(sig, _db(-6, -1, rng)), rng.uniform(-0.4, 0.0), 0.6))

    # Horn (sax / trumpet) lines in swung eighths, half the files.
    if rng.random() < 0.55:
        h_amps = _brass(20) if rng.random() < 0.5 else _square(15) * 0.7 + _brass(15) * 0.3
        vib = (rng.uniform(4.5, 6.0), 0.004)
        line: list[Note] = []
        step = _walk(ctx, 4, 0, 12, [-2, -1, 1, 2], [0.2, 0.3, 0.3, 0.2])
        t = 0.0
        playing = True
        while t < ctx.seconds:
            if playing:
                count = int(rng.integers(4, 12))
                for k in range(count):
                    off = (2 / 3 if k % 2 else 0.0) * beat
                    dur = (2 / 3 if k % 2 == 0 else 1 / 3) * beat
                    m = _into_range([_scale_midi(root, scale, step()) + int(rng.random() < 0.1)], 60, 80)[0]
                    line.append((t + (k // 2) * beat + off, dur, m, rng.uniform(0.6, 1.0)))
                t += (count // 2 + 1) * beat
            else:
                t += int(rng.integers(2, 6)) * beat
            playing = not playing

        def horn(f: float, n: int, hold: int) -> Audio:
            return _voice(ctx, h_amps, f, n, vib=vib, dark=_DARK, bright_tau=0.25) * _env_asr(n, sr, 0.03, hold / sr, 0.06)

        sig = _render(ctx, line, horn, 0.06)
        stems.append(_Stem(_norm(sig, _db(-6, -1, rng)), rng.uniform(0.0, 0.4), 0.7))
    return _Arrangement(stems, rng.uniform(0.8, 1.8), rng.uniform(0.15, 0.3), (30.0, 50.0))


def _rock(ctx: _Ctx) -> _Arrangement:
    rng, sr = ctx.rng, ctx.sr
    beat = 60.0 / rng.uniform(95.0, 165.0)
    bar = 4 * beat
    mode = str(rng.choice(["major", "mixolydian", "minor"]))
    scale = _SCALES[mode]
    root = 40 + int(rng.integers(0, 12))
    progs = [[0, 4, 5, 3], [0, 3, 4, 3], [0, 5, 6, 0], [0, 6, 3, 0], [0, 3, 0, 4]]
    prog = progs[int(rng.integers(0, len(progs)))]
    per_chord = bar * int(rng.choice([1, 2]))
    chords = _chord_times(ctx, prog, per_chord)
    stems: list[_Stem] = []

    # Drums: backbeat.  Kick 1 & 3 (+ variations), snare 2 & 4, eighth hats, crash every 8 bars.
    kick_pat = str(rng.choice(["X.......X.......", "X.......X.X.....", "X......xX.......", "X.x.....X.x....."]))
    hat_pat = str(rng.choice(["x.o.x.o.x.o.x.o.", "x.x.x.x.x.x.x.x.", "xoxoxoxoxoxoxoxo"]))
    k_t, k_v = _events(ctx, kick_pat, bar)
    s_t, s_v = _events(ctx, "....X.......X...", bar)
    f_t, f_v = _events(ctx, "............xxxx", 8 * bar, t0=7 * bar)
    h_t, h_v = _events(ctx, hat_pat, bar)
    c_t, c_v = _events(ctx, "X", 8 * bar, jitter=0.002)
    kick = _kick(ctx, f_hi=rng.uniform(110, 160), f_lo=rng.uniform(48, 62), decay=rng.uniform(0.12, 0.22), click=0.5)
    snare = _snare(ctx, tone=rng.uniform(170, 240), decay=rng.uniform(0.12, 0.22))
    drums = (
        _drum_track(ctx, kick, k_t, k_v) * _db(-2, 0, rng)
        + _drum_track(ctx, snare, np.concatenate([s_t, f_t]), np.concatenate([s_v, 0.7 * f_v])) * _db(-3, 0, rng)
        + _drum_track(ctx, _hat(ctx, decay=rng.uniform(0.03, 0.07)), h_t, h_v) * _db(-12, -6, rng)
        + _drum_track(ctx, _ride(ctx, decay=1.2), c_t, c_v) * _db(-10, -4, rng)
    )
    stems.append(_Stem(_norm(drums, _db(-3, 0, rng)), 0.0, 0.4))

    # Distorted power chords (root, fifth, octave), eighths, double-tracked left/right.  A
    # power chord is periodic at half the root frequency (harmonics 2, 3, 4), so it is one
    # wavetable voice an octave down; the second track is the first delayed by 12-25 ms.
    gtr_amps = _power_chord(40)
    drive = rng.uniform(4.0, 20.0)
    mute = rng.uniform(0.04, 0.12)
    sustained = rng.random() < 0.3
    notes: list[Note] = []
    for t, d in chords:
        r = _into_range([_scale_midi(root, scale, d)], 40, 52)[0] - 12
        if sustained:
            notes.append((t, per_chord * 0.97, r, 0.8))
        else:
            for k in range(int(round(per_chord / (beat / 2)))):
                notes.append((t + k * beat / 2 + rng.normal(0, 0.003), beat / 2 * 0.9, r, 1.0 if k % 2 == 0 else 0.75))

    def gtr(f: float, n: int, hold: int) -> Audio:
        tau = 5.0 if sustained else mute + 0.15
        return (_voice(ctx, gtr_amps, f * 0.998, n) + _voice(ctx, gtr_amps, f * 1.002, n)) * _env_decay(n, sr, tau, hold / sr, 0.02)

    raw = _render(ctx, notes, gtr, 0.02)
    dist = np.tanh(drive * raw / (np.max(np.abs(raw)) + 1e-9))
    dist = _norm(_filt(_filt(dist, "lowpass", rng.uniform(3000.0, 5500.0), sr, order=4), "highpass", 90.0, sr))
    lag = int(rng.uniform(0.012, 0.025) * sr)
    double = np.concatenate([np.zeros(lag), dist[: ctx.n - lag]])[: ctx.n]
    spread = rng.uniform(0.5, 0.9)
    stems.append(_Stem(dist * _db(-3, 0, rng), -spread, 0.3))
    stems.append(_Stem(double * _db(-3, 0, rng), spread, 0.3))

    # Bass: roots in eighths, slightly driven.
    bass = [(t + k * beat / 2, beat / 2 * 0.9, _into_range([_scale_midi(root, scale, d)], 28, 40)[0], 0.9) for t, d in chords for k in range(int(round(per_chord / (beat / 2))))]
    b_amps = np.array([1.0, 0.6, 0.35, 0.2, 0.1])
    sig = _render(ctx, bass, lambda f, n, h: np.tanh(2.0 * _voice(ctx, b_amps, f, n)) * _env_decay(n, sr, 0.4, h / sr), 0.03)
    stems.append(_Stem(_norm(sig, _db(-6, -2, rng)), 0.0, 0.1))

    # Lead guitar: pentatonic phrases with vibrato, some files.
    if rng.random() < 0.4:
        penta = (0, 3, 5, 7, 10) if mode == "minor" else (0, 2, 4, 7, 9)
        lead: list[Note] = []
        t = 2 * bar
        while t < ctx.seconds:
            for _ in range(int(rng.integers(3, 8))):
                dur = beat * float(rng.choice([0.5, 1.0, 1.5]))
                m = root + 24 + penta[int(rng.integers(0, 5))] + 12 * int(rng.random() < 0.3)
                lead.append((t, dur, m, 0.9))
                t += dur
            t += bar * rng.uniform(0.5, 2.0)
        vib = (rng.uniform(5.0, 7.0), 0.006)
        sig = _render(ctx, lead, lambda f, n, h: _voice(ctx, _saw(30), f, n, vib=vib) * _env_asr(n, sr, 0.01, h / sr, 0.1), 0.1)
        sig = _filt(np.tanh(8.0 * sig / (np.max(np.abs(sig)) + 1e-9)), "lowpass", 5000.0, sr)
        stems.append(_Stem(_norm(sig, _db(-6, -2, rng)), rng.uniform(-0.3, 0.3), 0.6))
    return _Arrangement(stems, rng.uniform(0.6, 1.3), rng.uniform(0.1, 0.25), (35.0, 55.0))


def _techno(ctx: _Ctx) -> _Arrangement:
    rng, sr = ctx.rng, ctx.sr
    beat = 60.0 / rng.uniform(122.0, 140.0)
    bar = 4 * beat
    scale = _SCALES[str(rng.choice(["minor", "phrygian", "dorian"]))]
    root = 36 + int(rng.integers(0, 12))
    stems: list[_Stem] = []

    # Four-on-the-floor kick, off-beat open hat, sixteenth closed hats, clap on 2 and 4.
    k_t, k_v = _events(ctx, "X...X...X...X...", bar, jitter=0.001, vel_jitter=0.02)
    kick = _kick(ctx, f_hi=rng.uniform(130, 200), f_lo=rng.uniform(42, 55), decay=rng.uniform(0.15, 0.3), click=0.4)
    stems.append(_Stem(_norm(_drum_track(ctx, kick, k_t, k_v), _db(-1, 0, rng)), 0.0, 0.1))
    oh_t, oh_v = _events(ctx, "..x...x...x...x.", bar, jitter=0.001)
    stems.append(_Stem(_norm(_drum_track(ctx, _hat(ctx, decay=rng.uniform(0.08, 0.2)), oh_t, oh_v), _db(-10, -5, rng)), 0.2, 0.3))
    if rng.random() < 0.8:
        ch_t, ch_v = _events(ctx, str(rng.choice(["xgogxgogxgogxgog", "x.g.x.g.x.g.x.g.", "gxggoxggoxggoxgg"])), bar, jitter=0.001)
        stems.append(_Stem(_norm(_drum_track(ctx, _hat(ctx, decay=0.025, cutoff=7000.0), ch_t, ch_v), _db(-14, -8, rng)), -0.3, 0.2))
    if rng.random() < 0.7:
        cl_t, cl_v = _events(ctx, "....x.......x...", bar, jitter=0.001)
        stems.append(_Stem(_norm(_drum_track(ctx, _clap(ctx), cl_t, cl_v), _db(-10, -4, rng)), 0.0, 0.6))

    # Bass: acid sixteenths (bright-to-dark saw) or rolling off-beat sub.
    if rng.random() < 0.55:
        steps = rng.random(16) < rng.uniform(0.5, 0.85)
        offs = rng.choice([0, 0, 0, 12, 7, 3, -2], 16)
        accent = rng.random(16) < 0.3
        pat_notes: list[Note] = []
        n_bars = int(ctx.seconds / bar) + 1
        for b in range(n_bars):
            for s in range(16):
                if steps[s]:
                    pat_notes.append((b * bar + s * beat / 4, beat / 4 * 0.8, root + int(offs[s]), 1.0 if accent[s] else 0.6))
        tau = rng.uniform(0.03, 0.12)
        amps = _saw(40) if rng.random() < 0.5 else _square(40)
        sig = _render(ctx, pat_notes, lambda f, n, h: _voice(ctx, amps, f, n, dark=_DARK, bright_tau=tau) * _env_decay(n, sr, 0.3, h / sr, 0.01), 0.01)
        sig = np.tanh(2.5 * sig / (np.max(np.abs(sig)) + 1e-9))
    else:
        sub = [(b * bar + k * beat + beat / 2, beat * 0.4, root, 1.0) for b in range(int(ctx.seconds / bar) + 1) for k in range(4)]
        sig = _render(ctx, sub, lambda f, n, h: _voice(ctx, [1.0, 0.3, 0.1], f, n) * _env_decay(n, sr, 0.2, h / sr, 0.01), 0.01)
    stems.append(_Stem(_norm(sig, _db(-5, -1, rng)), 0.0, 0.15))

    # Minor chord stabs (short, reverb-drenched) or a slow filtered pad.
    chord = _into_range(_chord_midi(root + 12, scale, 0, int(rng.choice([3, 4]))), 55, 72)
    if rng.random() < 0.65:
        pos = sorted(rng.choice(16, size=int(rng.integers(1, 4)), replace=False))
        pat = "".join("x" if s in pos else "." for s in range(16))
        st_t, _ = _events(ctx, pat, 2 * bar, jitter=0.0, vel_jitter=0.0)
        stab_notes = [(float(t), beat / 4, m, 0.8) for t in st_t for m in chord]
        sig = _render(ctx, stab_notes, lambda f, n, h: _voice(ctx, _saw(30), f, n) * _env_decay(n, sr, 0.12, h / sr, 0.05), 0.05)
        sig = _filt(sig, "lowpass", rng.uniform(1500.0, 4000.0), sr)
        stems.append(_Stem(_norm(sig, _db(-9, -3, rng)), rng.uniform(-0.4, 0.4), 1.0))
    else:
        pad_notes = [(t, 4 * bar, m, 0.5) for t in np.arange(0.0, ctx.seconds, 4 * bar) for m in chord]
        sig = _render(ctx, pad_notes, lambda f, n, h: _voice(ctx, _saw(20), f, n) * _env_asr(n, sr, 1.5, h / sr, 1.0), 1.0)
        sig = _filt(sig, "lowpass", rng.uniform(600.0, 1800.0), sr)
        stems.append(_Stem(_norm(sig, _db(-12, -6, rng)), 0.0, 1.0))
    return _Arrangement(stems, rng.uniform(0.8, 2.0), rng.uniform(0.12, 0.3), (35.0, 60.0))


def _hiphop(ctx: _Ctx) -> _Arrangement:
    rng, sr = ctx.rng, ctx.sr
    beat = 60.0 / rng.uniform(78.0, 98.0)
    bar = 4 * beat
    swing = rng.uniform(0.0, 0.25)
    scale = _SCALES[str(rng.choice(["minor", "dorian"]))]
    root = 36 + int(rng.integers(0, 12))
    prog = [[0, 5], [0, 3], [0, 5, 2, 6], [0, 0, 3, 4]][int(rng.integers(0, 4))]
    stems: list[_Stem] = []

    # Boom-bap: syncopated kick, hard snare on 2 and 4, swung hats.
    kick_pat = str(rng.choice(["X......x..X.....", "X.........X..x..", "X..x......X.....", "X......X.xX....."]))
    k_t, k_v = _events(ctx, kick_pat, bar, swing=swing, jitter=0.004)
    s_t, s_v = _events(ctx, "....X.......X...", bar, jitter=0.004)
    h_t, h_v = _events(ctx, str(rng.choice(["x.o.x.o.x.o.x.o.", "xgoxxgoxxgoxxgox", "xgxgxgxgxgxgxgxg"])), bar, swing=swing, jitter=0.006, vel_jitter=0.25)
    kick = _kick(ctx, f_hi=rng.uniform(90, 130), f_lo=rng.uniform(45, 60), decay=rng.uniform(0.15, 0.3), click=0.3)
    snare = _snare(ctx, tone=rng.uniform(160, 220), decay=rng.uniform(0.12, 0.25), band=(800.0, 5000.0))
    drums = (
        _drum_track(ctx, kick, k_t, k_v)
        + _drum_track(ctx, snare, s_t, s_v) * _db(-2, 1, rng)
        + _drum_track(ctx, _hat(ctx, decay=rng.uniform(0.02, 0.05), cutoff=5000.0), h_t, h_v) * _db(-14, -7, rng)
    )
    stems.append(_Stem(_norm(_filt(drums, "lowpass", rng.uniform(6000.0, 9000.0), sr), _db(-1, 0, rng)), 0.0, 0.2))

    # 808 sub: long sine notes on the chord roots with a pitch drop at the start.
    chords = _chord_times(ctx, prog, 2 * bar if len(prog) == 2 else bar)
    subs: list[Note] = []
    for t, d in chords:
        m = _into_range([_scale_midi(root, scale, d)], 30, 42)[0]
        subs.append((t, bar * 0.9 if len(prog) > 2 else bar * 1.8, m, 1.0))
        if rng.random() < 0.5:
            subs.append((t + 2.5 * beat, beat, m, 0.8))

    def sub808(f: float, n: int, hold: int) -> Audio:
        t = np.arange(n) / sr
        ph = 2 * np.pi * np.cumsum(f * (1.0 + 0.5 * np.exp(-t / 0.03))) / sr
        return np.tanh(1.8 * np.sin(ph)) * _env_decay(n, sr, 1.5, hold / sr, 0.05)

    sig = _render(ctx, subs, sub808, 0.05)
    stems.append(_Stem(_norm(sig, _db(-5, -1, rng)), 0.0, 0.0))

    # Lo-fi keys loop: 7th chords on EP (FM) or piano, rendered once and repeated.
    loop_bars = len(prog) if len(prog) > 2 else 4
    loop_len = int(round(loop_bars * bar * sr))
    loop_ctx = _Ctx(rng, sr, loop_len + int(2.0 * beat * sr), ctx.tuning)
    chord_s = loop_bars * bar / len(prog)
    keys: list[Note] = []
    rhythms = [[0.0], [0.0, 1.5], [0.0, 2.5, 3.0], [0.5, 2.0]]
    rhythm = rhythms[int(rng.integers(0, len(rhythms)))]
    for i, d in enumerate(prog):
        for r in rhythm:
            for m in _into_range(_chord_midi(root + 12, scale, d, 4), 55, 74):
                keys.append((i * chord_s + r * beat, beat * rng.uniform(0.8, 1.8), m, rng.uniform(0.4, 0.7)))
    use_ep = rng.random() < 0.5
    tau = rng.uniform(0.6, 1.5)

    def keys_inst(f: float, n: int, hold: int) -> Audio:
        if use_ep:
            return _fm_bell(loop_ctx, f, n, decay=tau, ratio=1.0, index=1.2) * _env_decay(n, sr, 10.0, hold / sr, 0.1)
        return _voice(loop_ctx, 1.0 / np.arange(1, 13) ** 1.4, f, n, dark=_DARK, bright_tau=0.1) * _env_decay(n, sr, tau, hold / sr, 0.1)

    loop = _render(loop_ctx, keys, keys_inst, 0.1)
    loop[: loop_ctx.n - loop_len] += loop[loop_len:]  # ringing past the loop end wraps to its start
    loop = _filt(_filt(loop[:loop_len], "lowpass", rng.uniform(1800.0, 3500.0), sr), "highpass", 150.0, sr)
    reps = -(-ctx.n // len(loop))
    stems.append(_Stem(_norm(np.tile(loop, reps)[: ctx.n], _db(-8, -3, rng)), rng.uniform(-0.3, 0.3), 0.5))

    # Vinyl: hiss plus sparse crackle.
    crackle = np.zeros(ctx.n)
    pops = rng.integers(0, ctx.n, int(ctx.seconds * rng.uniform(5.0, 30.0)))
    crackle[pops] = rng.uniform(-1.0, 1.0, len(pops))
    vinyl = _filt(crackle, "bandpass", (1000.0, 6000.0), sr) * 8.0 + 0.3 * _filt(ctx.rng.standard_normal(ctx.n), "bandpass", (2000.0, 8000.0), sr)
    stems.append(_Stem(_norm(vinyl, _db(-28, -18, rng)), 0.0, 0.0))
    return _Arrangement(stems, rng.uniform(0.4, 1.0), rng.uniform(0.08, 0.2), (30.0, 50.0))


def _reggae(ctx: _Ctx) -> _Arrangement:
    rng, sr = ctx.rng, ctx.sr
    beat = 60.0 / rng.uniform(66.0, 90.0)
    bar = 4 * beat
    mode = str(rng.choice(["major", "minor", "dorian"]))
    scale = _SCALES[mode]
    root = 40 + int(rng.integers(0, 12))
    prog = [[0, 3], [0, 4], [0, 3, 4, 3], [0, 6], [0, 5, 3, 4]][int(rng.integers(0, 5))]
    chords = _chord_times(ctx, prog, bar)
    stems: list[_Stem] = []

    # One drop (kick and rim on 3) or steppers (kick every beat); shuffled hats.
    steppers = rng.random() < 0.25
    k_t, k_v = _events(ctx, "X...X...X...X..." if steppers else "........X.......", bar)
    r_t, r_v = _events(ctx, "........X.......", bar)
    h_t, h_v = _events(ctx, str(rng.choice(["x.g.x.g.x.g.x.g.", "x.x.x.x.x.x.x.x.", "xggxggxggxggxggx"])), bar, swing=rng.uniform(0.0, 0.3))
    kick = _kick(ctx, f_hi=rng.uniform(90, 130), f_lo=rng.uniform(45, 60), decay=rng.uniform(0.15, 0.25), click=0.2)
    drums = (
        _drum_track(ctx, kick, k_t, k_v)
        + _drum_track(ctx, _rim(ctx) if rng.random() < 0.6 else _snare(ctx, tone=250.0, decay=0.1), r_t, r_v) * _db(-3, 0, rng)
        + _drum_track(ctx, _hat(ctx, decay=rng.uniform(0.03, 0.06)), h_t, h_v) * _db(-14, -8, rng)
    )
    stems.append(_Stem(_norm(drums, _db(-3, 0, rng)), 0.0, 0.3))

    # Skank: short bright chord chops on every off-beat, high-passed; optional dub echo.
    skank_amps = _saw(30) * (1.0 + 0.5 * (np.arange(30) % 2))
    sk: list[Note] = []
    for t, d in chords:
        for k in range(4):
            for m in _into_range(_chord_midi(root + 12, scale, d), 60, 76):
                sk.append((t + (k + 0.5) * beat + rng.normal(0, 0.004), rng.uniform(0.06, 0.12), m, 0.8))
    sig = _render(ctx, sk, lambda f, n, h: _voice(ctx, skank_amps, f, n) * _env_decay(n, sr, 0.08, h / sr, 0.02), 0.02)
    sig = _filt(_filt(sig, "highpass", rng.uniform(350.0, 700.0), sr), "lowpass", 5000.0, sr)
    if rng.random() < 0.4:
        d = int(0.75 * beat * sr)
        echo = np.zeros_like(sig)
        echo[d:] = 0.45 * sig[:-d]
        echo[2 * d :] += 0.2 * sig[: -2 * d]
        sig = sig + echo
    stems.append(_Stem(_norm(sig, _db(-6, -2, rng)), rng.uniform(0.2, 0.6), 0.5))

    # Organ bubble: sixteenth-note organ figure, some files.
    if rng.random() < 0.5:
        bub: list[Note] = []
        for t, d in chords:
            ch = _into_range(_chord_midi(root + 12, scale, d), 55, 70)
            for k in range(4):
                bub.append((t + k * beat + beat / 4, beat / 4, ch[0], 0.5))
                for m in ch[1:]:
                    bub.append((t + k * beat + beat / 2, beat / 4, m, 0.6))
        sig = _render(ctx, bub, lambda f, n, h: _voice(ctx, _ORGAN, f, n) * _env_asr(n, sr, 0.005, h / sr, 0.02), 0.02)
        stems.append(_Stem(_norm(sig, _db(-12, -6, rng)), rng.uniform(-0.6, -0.2), 0.3))

    # Deep, round, syncopated bass: the loudest part.
    bass_rhythms = [[0.0, 1.5, 2.0, 3.0], [0.0, 0.75, 1.5, 2.5, 3.25], [0.5, 1.0, 2.0, 2.75]]
    br = bass_rhythms[int(rng.integers(0, len(bass_rhythms)))]
    bass: list[Note] = []
    for t, d in chords:
        tones = _chord_midi(root, scale, d) + [_scale_midi(root, scale, d + 1)]
        for j, p in enumerate(br):
            m = _into_range([tones[0] if j == 0 else int(rng.choice(tones))], 31, 45)[0]
            bass.append((t + p * beat, beat * 0.6, m, rng.uniform(0.8, 1.0)))
    sig = _render(ctx, bass, lambda f, n, h: _voice(ctx, [1.0, 0.35, 0.12], f, n) * _env_decay(n, sr, 0.6, h / sr, 0.04, attack=0.01), 0.04)
    stems.append(_Stem(_norm(_filt(sig, "lowpass", 700.0, sr), _db(-2, 1, rng)), 0.0, 0.05))
    return _Arrangement(stems, rng.uniform(0.6, 1.5), rng.uniform(0.12, 0.25), (30.0, 50.0))


_RENDERERS: dict[str, Callable[[_Ctx], _Arrangement]] = {
    "ambient": _ambient,
    "classical": _classical,
    "hiphop": _hiphop,
    "jazz": _jazz,
    "reggae": _reggae,
    "rock": _rock,
    "techno": _techno,
}


# --------------------------------------------------------------------------------------------
# Mixing, mastering, encoding
# --------------------------------------------------------------------------------------------


def _reverb_ir(rng: np.random.Generator, sr: int, rt60: float) -> Audio:
    """Exponentially decaying, slightly damped noise tail with 10-30 ms pre-delay, unit energy."""
    m = int(min(rt60, 4.0) * sr)
    pre = int(rng.uniform(0.01, 0.03) * sr)
    t = np.arange(m) / sr
    tail = _filt(rng.standard_normal(m), "lowpass", 6000.0, sr) * np.exp(-6.9 * t / rt60)
    ir = np.concatenate([np.zeros(pre), tail])
    return ir / np.sqrt(np.sum(ir**2))


def _mix(ctx: _Ctx, arr: _Arrangement, channels: int) -> npt.NDArray[np.float64]:
    """Pan stems and add a shared reverb; returns (n, channels).

    One convolution serves both channels: the right channel's reverb is the left's delayed
    by 7-17 ms, enough to decorrelate the tails.
    """
    out = np.zeros((ctx.n, channels))
    send = ctx.zeros()
    for st in arr.stems:
        if channels == 1:
            out[:, 0] += st.audio
        else:
            ang = (st.pan + 1.0) * np.pi / 4.0
            out[:, 0] += math.cos(ang) * math.sqrt(2.0) * st.audio
            out[:, 1] += math.sin(ang) * math.sqrt(2.0) * st.audio
        send += st.send * st.audio
    wet = arr.wet * _fftconv(send, _reverb_ir(ctx.rng, ctx.sr, arr.rt60), ctx.n)
    out[:, 0] += wet
    if channels == 2:
        d = min(int(ctx.rng.uniform(0.007, 0.017) * ctx.sr), ctx.n)
        out[d:, 1] += wet[: ctx.n - d]
    return out


def _master(rng: np.random.Generator, sr: int, x: npt.NDArray[np.float64], snr_db: tuple[float, float]) -> npt.NDArray[np.float32]:
    """Add full-band noise at a random SNR (dB), fade the ends, set a random RMS level
    (``LOUDNESS_DBFS``) and soft-clip below full scale.  ``x`` is (n, channels) at ``sr`` Hz."""
    n = len(x)
    level = _rms(x)
    noise_db = rng.uniform(*snr_db)
    pink = rng.random() < 0.5
    for c in range(x.shape[1]):
        x[:, c] += level * 10.0 ** (-noise_db / 20.0) * (_pink(rng, n) if pink else rng.standard_normal(n))
    fade_in = min(int(rng.uniform(0.005, 0.3) * sr), n // 4)
    fade_out = min(int(rng.uniform(0.05, 2.0) * sr), n // 4)
    if fade_in > 0:
        x[:fade_in] *= np.linspace(0.0, 1.0, fade_in)[:, None]
    if fade_out > 0:
        x[-fade_out:] *= np.linspace(1.0, 0.0, fade_out)[:, None]
    x *= 10.0 ** (rng.uniform(*LOUDNESS_DBFS) / 20.0) / _rms(x)
    ceiling = 0.977
    return (ceiling * np.tanh(x / ceiling)).astype(np.float32)


def render_clip(plan: ClipPlan) -> npt.NDArray[np.float32]:
    """Synthesise one file's audio: float32 array (plan.n_frames, plan.channels), |x| < 1.

    Pure function of the plan.  Instruments are synthesised at ``_SYNTH_SR`` (22 050 Hz,
    the rate the features use); 44.1 kHz files are upsampled (polyphase) before the
    full-band noise floor is added, which keeps them as cheap as 22.05 kHz ones.
    """
    rng = _rng(plan.seed, plan.style, 0, plan.index)
    n_out = max(plan.n_frames, 1)
    n_syn = -(-n_out * _SYNTH_SR // plan.sample_rate)
    ctx = _Ctx(rng, _SYNTH_SR, n_syn, 2.0 ** (rng.uniform(-25.0, 25.0) / 1200.0))
    arr = _RENDERERS[plan.style](ctx)
    x = _mix(ctx, arr, plan.channels)
    if plan.sample_rate != _SYNTH_SR:
        g = math.gcd(plan.sample_rate, _SYNTH_SR)
        x = np.asarray(signal.resample_poly(x, plan.sample_rate // g, _SYNTH_SR // g, axis=0))
        x = x[:n_out] if len(x) >= n_out else np.pad(x, ((0, n_out - len(x)), (0, 0)))
    return _master(rng, plan.sample_rate, x, arr.snr_db)


_BITREV8 = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def _ogg_crc(page: bytes) -> int:
    """Ogg page CRC (poly 0x04C11DB7, MSB-first, init 0, no final xor) via zlib's reflected CRC-32.

    The MSB-first CRC of data equals the bit-reversed LSB-first CRC of the bit-reversed
    bytes; zlib's init/xor-out of 0xFFFFFFFF cancel out against the CRC of as many zeros.
    """
    rev = page.translate(_BITREV8)
    raw = zlib.crc32(rev) ^ zlib.crc32(bytes(len(rev)))
    return int(f"{raw:032b}"[::-1], 2)


def _set_ogg_serial(data: bytes, serial: int) -> bytes:
    """Rewrite the stream serial number of every Ogg page (and its CRC).

    libsndfile seeds the serial from the clock; a fixed serial makes Ogg files
    byte-identical across runs.  Raises ValueError on data that is not a plain Ogg stream.
    """
    buf = bytearray(data)
    pos = 0
    while pos < len(buf):
        if buf[pos : pos + 4] != b"OggS" or pos + 27 > len(buf):
            raise ValueError(f"not an Ogg page at byte {pos}")
        n_seg = buf[pos + 26]
        end = pos + 27 + n_seg + sum(buf[pos + 27 : pos + 27 + n_seg])
        if end > len(buf):
            raise ValueError(f"truncated Ogg page at byte {pos}")
        struct.pack_into("<I", buf, pos + 14, serial & 0xFFFFFFFF)
        struct.pack_into("<I", buf, pos + 22, 0)
        struct.pack_into("<I", buf, pos + 22, _ogg_crc(bytes(buf[pos:end])))
        pos = end
    return bytes(buf)


def encode_clip(audio: npt.NDArray[np.float32], sample_rate: int, ext: str, *, serial: int = 0) -> bytes:
    """Encode (n_frames, channels) float audio as file bytes in format ``ext`` (see FORMATS).

    wav/flac are 16-bit PCM; ogg is Vorbis with its stream serial set to ``serial``;
    mp3 is MPEG-1/2 layer III.  Writes in blocks (libsndfile's Vorbis encoder crashes on
    very large single writes).
    """
    if ext not in FORMATS:
        raise DemoCorpusError(f"unknown format {ext!r}; choose from {list(FORMATS)}")
    fmt, subtype = FORMATS[ext]
    a = audio if audio.ndim == 2 else audio[:, None]
    bio = io.BytesIO()
    with sf.SoundFile(bio, "w", samplerate=sample_rate, channels=a.shape[1], format=fmt, subtype=subtype) as f:
        for i in range(0, len(a), _WRITE_BLOCK):
            f.write(a[i : i + _WRITE_BLOCK])
    data = bio.getvalue()
    if ext == "ogg":
        data = _set_ogg_serial(data, serial)
    return data


def _write_clip(plan: ClipPlan, out_dir: str) -> float:
    """Render, encode and atomically write one file; returns its length in seconds."""
    audio = render_clip(plan)
    data = encode_clip(audio, plan.sample_rate, plan.ext, serial=zlib.crc32(plan.relpath.encode("utf-8")))
    path = Path(out_dir) / plan.relpath
    tmp = path.with_name(f".{path.name}.part")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return len(audio) / plan.sample_rate


def _foreign_files(out: Path, plans: Sequence[ClipPlan]) -> list[Path]:
    """Files under the style folders of ``out`` that this corpus would not write.

    Half-written ``.<name>.part`` files of an interrupted run are ours: they are removed.
    """
    wanted = {out / p.relpath for p in plans}
    found: list[Path] = []
    for style in STYLES:
        d = out / style
        if not d.is_dir():
            continue
        for p in sorted(d.rglob("*")):
            if p.is_file() and p.name.startswith(".") and p.name.endswith(".part"):
                logger.info("removing %s left by an interrupted run", p)
                p.unlink()
            elif p.is_file() and p not in wanted:
                found.append(p)
    return found


def _readme(plans: Sequence[ClipPlan], n_per_style: int, seed: int) -> str:
    styles = sorted({p.style for p in plans})
    total = sum(p.n_frames / p.sample_rate for p in plans)
    return (
        "Synthetic demo corpus written by `python -m pipeline.demo_corpus`.\n"
        f"seed={seed} per_style={n_per_style} files={len(plans)} total_seconds={total:.1f}\n"
        f"styles (one folder per label): {', '.join(styles)}\n"
        "Regenerate with the same arguments to get byte-identical files.\n"
    )


def generate_corpus(
    out_dir: str | os.PathLike[str],
    *,
    n_per_style: int = 40,
    seed: int = 0,
    min_seconds: float | None = None,
    max_seconds: float = MAX_SECONDS,
    formats: Sequence[str] = tuple(FORMATS),
    styles: Sequence[str] = STYLES,
    jobs: int | None = None,
    prune: bool = False,
    progress: bool = True,
) -> CorpusSummary:
    """Write the demo corpus to ``out_dir/<style>/<style>_<nnn>.<ext>`` plus a README.txt.

    ``n_per_style`` files per style; durations in seconds within ``[min_seconds,
    max_seconds]`` (``min_seconds`` defaults to ``min(5, max_seconds)``); ``jobs``
    worker processes (default: all CPUs, 1 = in this process).  Files already there
    are rewritten (same seed -> same bytes).  Other files in the style folders raise
    :class:`DemoCorpusError`, since a folder-per-label scanner would pick them up,
    unless ``prune`` is set, which deletes those matching this generator's naming
    pattern (``<style>_<digits>.<ext>``), e.g. left over from a larger corpus.
    """
    t_start = time.perf_counter()
    plans = plan_corpus(n_per_style, seed=seed, min_seconds=min_seconds, max_seconds=max_seconds, formats=formats, styles=styles)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise DemoCorpusError(f"output path exists and is not a directory: {out}")
    foreign = _foreign_files(out, plans)
    if foreign and prune:
        ours = [p for p in foreign if (m := _FILE_RE.match(p.name)) and m["style"] == p.parent.name and m["ext"] in FORMATS]
        for p in ours:
            p.unlink()
        logger.info("pruned %d stale corpus files", len(ours))
        foreign = [p for p in foreign if p not in ours]
    if foreign:
        raise DemoCorpusError(
            f"{out} holds {len(foreign)} file(s) this corpus would not write (e.g. {foreign[0]}); "
            "use an empty directory" + ("" if prune else " or --prune to delete stale corpus files")
        )
    for style in dict.fromkeys(p.style for p in plans):
        (out / style).mkdir(parents=True, exist_ok=True)
    (out / "README.txt").write_text(_readme(plans, n_per_style, seed), encoding="utf-8")
    others = sorted(p.name for p in out.iterdir() if p.name != "README.txt" and p.name not in STYLES)
    if others:
        logger.warning("%s also holds %s; a folder-per-label scan of it will include them", out, ", ".join(others[:5]))

    n_jobs = max(1, min(jobs if jobs is not None else (os.cpu_count() or 1), len(plans)))
    # Most expensive first (longest-processing-time scheduling), so that no worker is left
    # alone with a 4-minute file at the end.  Rough cost model: synthesis is per second,
    # MP3 encoding costs ~4x synthesis per second and channel.
    order = sorted(plans, key=lambda p: -p.duration_s * (1.0 + (4.0 * p.channels if p.ext == "mp3" else 0.0)))
    total_s = sum(p.n_frames / p.sample_rate for p in plans)
    logger.info("writing %d files (%.2f h of audio) to %s with %d job(s)", len(plans), total_s / 3600, out, n_jobs)
    if n_jobs == 1:
        with tqdm(total=round(total_s, 1), unit="s audio", desc="demo corpus", disable=not progress) as bar:
            for p in order:
                bar.update(round(_write_clip(p, str(out)), 1))
    else:
        with ProcessPoolExecutor(max_workers=n_jobs) as pool:
            # Submit (which starts the workers) before tqdm starts its monitor thread.
            futures = [pool.submit(_write_clip, p, str(out)) for p in order]
            try:
                with tqdm(total=round(total_s, 1), unit="s audio", desc="demo corpus", disable=not progress) as bar:
                    for fut in as_completed(futures):
                        bar.update(round(fut.result(), 1))
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # do not render the rest first
                raise
    summary = CorpusSummary(out, tuple(plans), time.perf_counter() - t_start)
    logger.info(
        "wrote %d files, %.2f h of audio, in %.1f s (%.0fx realtime)",
        summary.n_files,
        summary.total_hours,
        summary.elapsed_s,
        summary.total_seconds / max(summary.elapsed_s, 1e-9),
    )
    return summary


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------


def _csv_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pipeline.demo_corpus",
        description=(
            "Write a deterministic synthetic music corpus, one folder per style (label): "
            "OUT_DIR/<style>/<style>_<nnn>.<ext>. Styles: " + ", ".join(STYLES) + ". "
            "Formats cycle through wav/flac/ogg/mp3, 22.05/44.1 kHz, mono/stereo; durations are "
            f"log-normal (median {MEDIAN_SECONDS:g} s) between --min-seconds and --max-seconds."
        ),
        epilog="Example: python -m pipeline.demo_corpus data/demo --per-style 10 --max-seconds 30",
    )
    p.add_argument("out_dir", metavar="OUT_DIR", help="output directory (created if missing)")
    p.add_argument("--per-style", type=int, default=40, metavar="N", help="files per style (default: 40)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="corpus seed; same seed -> same bytes (default: 0)")
    p.add_argument("--min-seconds", type=float, default=None, metavar="X", help=f"shortest file, s (default: min({MIN_SECONDS:g}, --max-seconds))")
    p.add_argument("--max-seconds", type=float, default=MAX_SECONDS, metavar="X", help=f"longest file, s (default: {MAX_SECONDS:g})")
    p.add_argument("--formats", type=_csv_list, default=list(FORMATS), metavar="LIST", help=f"comma-separated formats to cycle (default: {','.join(FORMATS)})")
    p.add_argument("--styles", type=_csv_list, default=list(STYLES), metavar="LIST", help="comma-separated subset of styles (default: all)")
    p.add_argument("--jobs", "-j", type=int, default=None, metavar="N", help="worker processes (default: all CPUs)")
    p.add_argument("--prune", action="store_true", help="delete stale <style>_<nnn>.<ext> files left by a larger corpus")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar, warnings only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; returns the exit status (2 on bad input, with one line on stderr)."""
    parser = _build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.jobs is not None and args.jobs < 1:
        parser.exit(2, f"error: --jobs must be >= 1, got {args.jobs}\n")
    try:
        summary = generate_corpus(
            args.out_dir,
            n_per_style=args.per_style,
            seed=args.seed,
            min_seconds=args.min_seconds,
            max_seconds=args.max_seconds,
            formats=args.formats,
            styles=args.styles,
            jobs=args.jobs,
            prune=args.prune,
            progress=not args.quiet,
        )
    except (DemoCorpusError, OSError) as exc:
        parser.exit(2, f"error: {exc}\n")
    logger.info("per style: %s; per format: %s", summary.files_per_style, summary.files_per_format)
    return 0


if __name__ == "__main__":
    sys.exit(main())
