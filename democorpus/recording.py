"""The recording chain: what happens to a mix between the band and the file, independently of the style.

Every file draws, in this order:

* tone: a low shelf (100-400 Hz, -9..+6 dB) and a high shelf (2.5-6 kHz, -12..+5 dB);
* bus compression (45 % of the files): ratio 2-10, threshold -8..+2 dB around the
  RMS level, power smoothed over 5-80 ms;
* hard clipping (10 %), 2-12 dB below the peak;
* mains hum (12 %): 50 or 60 Hz and harmonics, 22-38 dB below the mix;
* hiss (30 %): high-passed pink noise 18-40 dB below the mix;
* the medium it went through, which band-limits everything before it:

========  ======  ===============================================================
medium    share   what it does
========  ======  ===============================================================
clean     52 %    nothing
bitrate   20 %    steep low-pass at 5-10 kHz, like a low-bitrate lossy encode
tape      12 %    gentle low-pass at 5-10 kHz, saturation
lofi       8 %    cheap speaker / laptop: high-pass 120-350 Hz, low-pass 3.5-7 kHz, a resonance
radio      4 %    AM-radio band, 150 Hz-4.5 kHz
phone      4 %    telephone band, 300 Hz-3.4 kHz, some clipping
========  ======  ===============================================================

Signals are ``(n, channels)`` float64 at the synthesis rate; levels in dB.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy import signal

from .dsp import Ctx, filt, pink, rms

__all__ = ["MEDIA", "record", "through_medium"]


MEDIA: dict[str, float] = {"clean": 0.52, "bitrate": 0.20, "tape": 0.12, "lofi": 0.08, "radio": 0.04, "phone": 0.04}
"""Medium -> share of the files recorded through it."""

Multi = npt.NDArray[np.float64]
"""(n, channels) signal."""


def _shelf(x: Multi, kind: str, cutoff: float, gain_db: float, sr: int) -> Multi:
    """Low (``kind="lowpass"``) or high (``"highpass"``) shelf of ``gain_db`` dB around ``cutoff`` Hz."""
    return x + (10.0 ** (gain_db / 20.0) - 1.0) * filt(x, kind, cutoff, sr)


def _compress(x: Multi, sr: int, ratio: float, threshold_db: float, time_s: float) -> Multi:
    """Feed-forward compressor on the power smoothed over ``time_s`` s; threshold in dB relative to the RMS."""
    power = np.mean(x * x, axis=1)
    a = float(np.exp(-1.0 / (time_s * sr)))
    env = np.asarray(signal.lfilter([1.0 - a], [1.0, -a], power))
    over = 10.0 * np.log10(env + 1e-12) - (10.0 * np.log10(np.mean(power) + 1e-12) + threshold_db)
    x *= 10.0 ** (-np.maximum(over, 0.0) * (1.0 - 1.0 / ratio) / 20.0)[:, None]
    return x


def _clip(x: Multi, drive_db: float) -> Multi:
    """Hard clipping ``drive_db`` dB below the peak."""
    ceiling = float(np.max(np.abs(x))) * 10.0 ** (-drive_db / 20.0)
    return np.clip(x, -ceiling, ceiling)


def record(ctx: Ctx, x: Multi) -> Multi:
    """The recording chain of one file (draws from ``ctx.rng``); ``x`` is the mix at ``ctx.sr`` Hz."""
    rng, sr = ctx.rng, ctx.sr
    n, ch = x.shape
    x = _shelf(x, "lowpass", rng.uniform(100.0, 400.0), rng.uniform(-9.0, 6.0), sr)
    x = _shelf(x, "highpass", rng.uniform(2500.0, 6000.0), rng.uniform(-12.0, 5.0), sr)
    if rng.random() < 0.45:
        x = _compress(x, sr, rng.uniform(2.0, 10.0), rng.uniform(-8.0, 2.0), rng.uniform(0.005, 0.08))
    if rng.random() < 0.1:
        x = _clip(x, rng.uniform(2.0, 12.0))
    level = rms(x)
    if rng.random() < 0.12:
        t = np.arange(n) / sr
        f0 = 50.0 if rng.random() < 0.5 else 60.0
        hum = np.zeros(n)
        for k in (1, 2, 3, 5):
            hum += np.sin(2 * np.pi * k * f0 * t + rng.random() * 6.28) / k
        x += (level * 10.0 ** (rng.uniform(-38.0, -22.0) / 20.0) / rms(hum)) * hum[:, None]
    if rng.random() < 0.3:
        hiss_db = rng.uniform(18.0, 40.0)
        for c in range(ch):
            x[:, c] += level * 10.0 ** (-hiss_db / 20.0) * filt(pink(rng, n), "highpass", 1000.0, sr)
    media = list(MEDIA)
    return through_medium(x, media[int(rng.choice(len(media), p=list(MEDIA.values())))], rng, sr)


def through_medium(x: Multi, medium: str, rng: np.random.Generator, sr: int) -> Multi:
    """``x`` (``(n, channels)`` at ``sr`` Hz) as heard through ``medium`` (one of :data:`MEDIA`)."""
    if medium not in MEDIA:
        raise ValueError(f"unknown medium {medium!r}; choose from {list(MEDIA)}")
    if medium == "bitrate":
        x = filt(x, "lowpass", rng.uniform(5000.0, 10000.0), sr, order=8)
    elif medium == "lofi":
        x = filt(x, "bandpass", (rng.uniform(120.0, 350.0), rng.uniform(3500.0, 7000.0)), sr)
        peak = rng.uniform(700.0, 2500.0)
        x += rng.uniform(0.5, 1.5) * filt(x, "bandpass", (peak / 1.3, peak * 1.3), sr)
    elif medium == "tape":
        x = filt(x, "lowpass", rng.uniform(5000.0, 10000.0), sr)
        drive = rng.uniform(0.7, 2.0)
        x = np.tanh(drive * x / (np.max(np.abs(x)) + 1e-9))
    elif medium == "radio":
        x = filt(x, "bandpass", (150.0, 4500.0), sr, order=3)
    elif medium == "phone":
        x = _clip(filt(x, "bandpass", (300.0, 3400.0), sr, order=4), rng.uniform(0.0, 6.0))
    return x
