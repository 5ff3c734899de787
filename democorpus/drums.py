"""Drums: one-hit samples, one-bar step patterns, and a hit placed on a track at every onset.

Hits are built from filtered noise and pitch-swept sines at ``Ctx.sr``; decay
times are in seconds, tones and cutoffs in Hz.  A pattern is a string of steps
(``X`` 1.0, ``x`` 0.8, ``o`` 0.55, ``g`` 0.3 ghost, ``.`` rest; spaces ignored)
spread evenly over one bar: :func:`events` turns it into onset times (s) and
velocities, :func:`track` renders a hit at them.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from .dsp import Audio, Ctx, fftconv, filt

__all__ = ["clap", "events", "hat", "kick", "ride", "rim", "snare", "track"]


def kick(ctx: Ctx, *, f_hi: float, f_lo: float, decay: float, click: float = 0.3) -> Audio:
    """Bass drum: a sine swept from ``f_hi`` to ``f_lo`` Hz (35 ms), body decay ``decay`` s, noise ``click`` level."""
    sr = ctx.sr
    n = int(sr * min(2.0, 4.0 * decay + 0.05))
    t = np.arange(n) / sr
    f = f_lo + (f_hi - f_lo) * np.exp(-t / 0.035)
    body = np.sin(2.0 * np.pi * np.cumsum(f) / sr) * np.exp(-t / decay)
    clk = filt(ctx.rng.standard_normal(n), "lowpass", 3000.0, sr) * np.exp(-t / 0.004)
    return np.tanh(1.5 * (body + click * clk))


def snare(ctx: Ctx, *, tone: float, decay: float, band: tuple[float, float] = (1500.0, 7000.0)) -> Audio:
    """Snare: band-passed noise (``band`` Hz, decay ``decay`` s) over a ``tone`` Hz drum body."""
    sr = ctx.sr
    n = int(sr * (5.0 * decay + 0.05))
    t = np.arange(n) / sr
    noise = filt(ctx.rng.standard_normal(n), "bandpass", band, sr) * np.exp(-t / decay)
    body = np.sin(2.0 * np.pi * tone * t) * np.exp(-t / 0.05)
    return 1.6 * noise + 0.6 * body


def hat(ctx: Ctx, *, decay: float, cutoff: float = 6000.0) -> Audio:
    """Hi-hat: noise high-passed at ``cutoff`` Hz, decay ``decay`` s (short = closed, long = open)."""
    sr = ctx.sr
    n = int(sr * (5.0 * decay + 0.01))
    t = np.arange(n) / sr
    x = filt(ctx.rng.standard_normal(n), "highpass", min(cutoff, 0.6 * sr / 2), sr, order=4)
    return 1.5 * x * np.exp(-t / decay)


def clap(ctx: Ctx) -> Audio:
    """Hand clap: three 11 ms-spaced bursts of band-passed noise and a 90 ms tail."""
    sr = ctx.sr
    n = int(0.35 * sr)
    t = np.arange(n) / sr
    env = np.exp(-t / 0.09)
    for k in range(3):
        env += 0.8 * np.exp(-np.maximum(t - 0.011 * k, 0.0) / 0.004) * (t >= 0.011 * k)
    return 1.4 * filt(ctx.rng.standard_normal(n), "bandpass", (900.0, 3500.0), sr) * env


def ride(ctx: Ctx, *, decay: float) -> Audio:
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
    noise = filt(ctx.rng.standard_normal(n), "highpass", 4500.0, sr, order=4)
    ping = np.exp(-t / 0.02)
    return (0.25 * tone + 0.8 * noise) * np.exp(-t / decay) * (0.6 + 0.4 * ping)


def rim(ctx: Ctx) -> Audio:
    """Rim shot: a 12 ms click of band-passed noise and an 820 Hz ping (80 ms in all)."""
    sr = ctx.sr
    n = int(0.08 * sr)
    t = np.arange(n) / sr
    x = filt(ctx.rng.standard_normal(n), "bandpass", (1500.0, 4500.0), sr) * np.exp(-t / 0.012)
    return 1.5 * x + 0.8 * np.sin(2.0 * np.pi * 820.0 * t) * np.exp(-t / 0.015)


def _velocities(s: str) -> npt.NDArray[np.float64]:
    """Step pattern string -> velocities: X 1.0, x 0.8, o 0.55, g 0.3 (ghost), . rest."""
    vel = {"X": 1.0, "x": 0.8, "o": 0.55, "g": 0.3, ".": 0.0}
    return np.array([vel[c] for c in s.replace(" ", "")], dtype=np.float64)


def events(
    ctx: Ctx,
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
    v = _velocities(pattern)
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


def track(ctx: Ctx, hit: Audio, times: Audio, vels: Audio) -> Audio:
    """Place a one-hit sample at ``times`` (s) scaled by ``vels``.

    Sparse hits are added slice by slice; dense long hits (a ride every triplet) are an
    impulse train convolved with the hit, whichever touches fewer samples.
    """
    idx = np.clip(np.round(times * ctx.sr).astype(np.int64), 0, ctx.n - 1)
    if len(idx) * len(hit) <= 30 * ctx.n:
        out = ctx.zeros()
        for i, v in zip(idx.tolist(), vels.tolist(), strict=False):
            end = min(ctx.n, i + len(hit))
            out[i:end] += v * hit[: end - i]
        return out
    imp = np.zeros(ctx.n)
    np.add.at(imp, idx, vels)
    return fftconv(imp, hit, ctx.n)
