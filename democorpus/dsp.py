"""Signal primitives: wavetable oscillators, envelopes, filters, noise, convolution and levels.

Signals are mono float64 arrays (:data:`Audio`, full scale 1.0) at the context's
sample rate ``Ctx.sr``; times are in seconds, frequencies in Hz, lengths in
samples.  Random draws come from ``Ctx.rng`` in call order: calling these in
another order changes every file.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from scipy import fft as sfft
from scipy import signal

__all__ = [
    "Audio",
    "Ctx",
    "add_at",
    "env_asr",
    "env_decay",
    "fftconv",
    "filt",
    "norm",
    "overdrive",
    "pink",
    "random_gain",
    "rms",
    "voice",
]


Audio = npt.NDArray[np.float64]
"""Mono signal, float64 samples (full scale 1.0)."""


_TABLE_BITS = 12
_TABLE = 1 << _TABLE_BITS
"""Wavetable length (samples per cycle); a power of two, indexed by the top bits of the phase."""


@dataclass(frozen=True)
class Ctx:
    """Per-file synthesis context: generator, sample rate (Hz), length (samples), tuning ratio.

    ``tuning`` multiplies every pitch (A4 = 440 Hz * tuning); ``tables`` caches the
    file's wavetables (see :func:`voice`).
    """

    rng: np.random.Generator
    sr: int
    n: int
    tuning: float
    tables: dict[tuple[bytes, int], Audio] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Length in seconds."""
        return self.n / self.sr

    def hz(self, midi: float) -> float:
        """Frequency (Hz) of MIDI pitch ``midi`` (fractional pitches detune) at this file's tuning."""
        return 440.0 * self.tuning * 2.0 ** ((midi - 69.0) / 12.0)

    def zeros(self) -> Audio:
        """A silent signal of the file's length."""
        return np.zeros(self.n, dtype=np.float64)


def add_at(buf: Audio, start: int, x: Audio) -> None:
    """Add ``x`` into ``buf`` at sample ``start``, clipping at both ends."""
    if start < 0:
        if -start >= len(x):
            return
        x = x[-start:]
        start = 0
    end = min(len(buf), start + len(x))
    if end > start:
        buf[start:end] += x[: end - start]


def _table(ctx: Ctx, amps: npt.ArrayLike, freq: float) -> Audio:
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


def _phase_index(
    freq: float, n: int, sr: int, phase0: float, vib: tuple[float, float] | None
) -> npt.NDArray[np.uint32]:
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


def voice(
    ctx: Ctx,
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


def env_asr(n: int, sr: int, attack: float, hold: float, release: float) -> Audio:
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


def env_decay(n: int, sr: int, tau: float, hold: float, release: float = 0.03, attack: float = 0.002) -> Audio:
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


def filt(x: Audio, kind: str, cutoff: float | tuple[float, float], sr: int, order: int = 2) -> Audio:
    """Butterworth low/high/band-pass (cutoffs in Hz, clamped below Nyquist) along the first axis
    (time; an ``(n, channels)`` array filters every channel)."""
    return np.asarray(signal.sosfilt(_sos(kind, cutoff, sr, order), x, axis=0))


def pink(rng: np.random.Generator, n: int) -> Audio:
    """Pink (1/f) noise, unit RMS (Kellet's 3-pole approximation)."""
    b = [0.049922035, -0.095993537, 0.050612699, -0.004408786]
    a = [1.0, -2.494956002, 2.017265875, -0.522189400]
    x = np.asarray(signal.lfilter(b, a, rng.standard_normal(n + 2000)))[2000:]
    return norm(x)


def fftconv(x: Audio, h: Audio, n: int) -> Audio:
    """First ``n`` samples of the linear convolution x * h (one zero-padded real FFT, float32)."""
    size = sfft.next_fast_len(len(x) + len(h) - 1, real=True)
    spec = sfft.rfft(x.astype(np.float32), size)
    spec *= sfft.rfft(h.astype(np.float32), size)
    return np.asarray(sfft.irfft(spec, size)[:n], dtype=np.float64)


def random_gain(lo: float, hi: float, rng: np.random.Generator) -> float:
    """Random gain, uniform in dB between ``lo`` and ``hi``, as a linear factor."""
    return float(10.0 ** (rng.uniform(lo, hi) / 20.0))


def rms(x: Audio) -> float:
    """Root mean square of all samples (einsum: no temporary, and no BLAS thread wake-ups)."""
    flat = x.ravel()
    return float(np.sqrt(np.einsum("i,i->", flat, flat) / max(flat.size, 1) + 1e-20))


def norm(x: Audio, gain: float = 1.0) -> Audio:
    """Scale ``x`` in place to RMS ``gain`` (silence stays silent); returns ``x``."""
    r = rms(x)
    if r > 1e-9:
        x *= gain / r
    return x


def overdrive(x: Audio, drive: float) -> Audio:
    """Soft clipping, ``tanh(drive * x / peak)``: ``drive`` is the gain at the peak of ``x``."""
    return np.tanh(drive * x / (np.max(np.abs(x)) + 1e-9))
