"""Pitched instruments: harmonic spectra for :func:`~specstore.democorpus.dsp.voice`, plucked strings, FM bells.

A spectrum is an array of harmonic amplitudes (entry ``k - 1`` is harmonic
``k``; ``h`` is how many).  Frequencies are in Hz, lengths in samples at
``Ctx.sr``, decay times in seconds.
"""

from __future__ import annotations

import numpy as np
from scipy import signal

from .dsp import Audio, Ctx

__all__ = ["DARK", "FLUTE", "ORGAN", "brass", "fm_bell", "pluck", "power_chord", "saw", "square", "strings"]


def saw(h: int) -> Audio:
    """Sawtooth: harmonic k at 1/k."""
    return 1.0 / np.arange(1, h + 1)


def square(h: int) -> Audio:
    """Square wave: odd harmonics k at 1/k."""
    k = np.arange(1, h + 1)
    return np.where(k % 2 == 1, 1.0 / k, 0.0)


ORGAN = np.array([1.0, 0.8, 0.6, 0.5, 0.0, 0.35, 0.0, 0.3])
"""Drawbar organ (harmonics 1-4, 6 and 8)."""
FLUTE = np.array([1.0, 0.25, 0.08, 0.03])
"""Nearly pure flute tone."""
DARK = np.array([1.0, 0.3, 0.1, 0.04])
"""Muted spectrum that bright attacks decay to (``voice(..., dark=DARK)``)."""


def power_chord(h: int) -> Audio:
    """Saw root + fifth + octave, as harmonics of half the root frequency (2k, 3k, 4k)."""
    a = np.zeros(4 * h)
    for mult, gain in ((2, 1.0), (3, 0.8), (4, 0.6)):
        k = np.arange(1, h + 1)
        a[mult * k - 1] += gain / k
    return a


def brass(h: int) -> Audio:
    """Brass: a formant around harmonic 4 over a weak 1/k floor."""
    k = np.arange(1, h + 1)
    return np.exp(-(((k - 4.0) / 3.5) ** 2)) + 0.35 / k


def strings(h: int) -> Audio:
    """Bowed strings: about 1/k with a bump around harmonic 6."""
    k = np.arange(1, h + 1)
    return (1.0 / k**1.05) * (1.0 + 0.6 * np.exp(-(((k - 6.0) / 2.0) ** 2)))


def pluck(ctx: Ctx, freq: float, n: int, hold: int, *, decay: float, bright: float) -> Audio:
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


def fm_bell(ctx: Ctx, freq: float, n: int, *, decay: float, ratio: float, index: float) -> Audio:
    """Two-operator FM bell (inharmonic ``ratio``), exponential decay ``decay`` s."""
    t = np.arange(n, dtype=np.float64) / ctx.sr
    env = np.exp(-t / decay) * np.minimum(1.0, t / 0.003)
    mod = index * np.exp(-t / (0.5 * decay)) * np.sin(2.0 * np.pi * ratio * freq * t)
    return env * np.sin(2.0 * np.pi * freq * t + mod)
