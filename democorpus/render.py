"""From a plan to samples: arrange the style, mix the stems (form, balance, pan, reverb), record, resample,
master.

Instruments are synthesised at :data:`SYNTH_SR` (22 050 Hz, the rate the
features use).  The mix applies the song form (stems muted and unmuted by role,
section levels), moves every stem's level by up to +-4 dB and the reverb's by
up to +-6 dB; the recording chain (:mod:`~specstore.democorpus.recording`: EQ,
compression, clipping, hum, hiss, band limits) follows; 44.1 kHz files are then
upsampled (polyphase) before the full-band noise floor is added.  Mastering sets
the RMS level to a random value in :data:`LOUDNESS_DBFS` (dB relative to full
scale) and soft-clips below 0.977.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import signal

from .arrangement import Arrangement
from .dsp import Audio, Ctx, fftconv, filt, pink, random_gain, rms
from .form import stem_gains
from .plan import ClipPlan, rng_for
from .recording import record
from .styles import RECIPES

__all__ = ["LOUDNESS_DBFS", "SYNTH_SR", "render_clip"]


LOUDNESS_DBFS = (-25.0, -8.0)
"""Range of the target RMS level of a file, dB relative to full scale."""

SYNTH_SR = 22050
"""Sample rate (Hz) the instruments are synthesised at; other rates are resampled from it."""


def _reverb_ir(rng: np.random.Generator, sr: int, rt60: float) -> Audio:
    """Exponentially decaying, slightly damped noise tail with 10-30 ms pre-delay, unit energy."""
    m = int(min(rt60, 4.0) * sr)
    pre = int(rng.uniform(0.01, 0.03) * sr)
    t = np.arange(m) / sr
    tail = filt(rng.standard_normal(m), "lowpass", 6000.0, sr) * np.exp(-6.9 * t / rt60)
    ir = np.concatenate([np.zeros(pre), tail])
    return ir / np.sqrt(np.sum(ir**2))


def _mix(ctx: Ctx, arr: Arrangement, channels: int) -> npt.NDArray[np.float64]:
    """Apply the form, balance and pan the stems and add a shared reverb; returns (n, channels).

    One convolution serves both channels: the right channel's reverb is the left's delayed
    by 7-17 ms, enough to decorrelate the tails.
    """
    out = np.zeros((ctx.n, channels))
    send = ctx.zeros()
    for st, gain in zip(arr.stems, stem_gains(arr.form, arr.stems, ctx.n, ctx.sr), strict=True):
        audio = st.audio * random_gain(-4.0, 4.0, ctx.rng)
        if gain is not None:
            audio *= gain
        if channels == 1:
            out[:, 0] += audio
        else:
            ang = (st.pan + 1.0) * np.pi / 4.0
            out[:, 0] += math.cos(ang) * math.sqrt(2.0) * audio
            out[:, 1] += math.sin(ang) * math.sqrt(2.0) * audio
        send += st.send * audio
    wet = arr.wet * random_gain(-6.0, 6.0, ctx.rng) * fftconv(send, _reverb_ir(ctx.rng, ctx.sr, arr.rt60), ctx.n)
    out[:, 0] += wet
    if channels == 2:
        d = min(int(ctx.rng.uniform(0.007, 0.017) * ctx.sr), ctx.n)
        out[d:, 1] += wet[: ctx.n - d]
    return out


def _master(
    rng: np.random.Generator, sr: int, x: npt.NDArray[np.float64], snr_db: tuple[float, float]
) -> npt.NDArray[np.float32]:
    """Add full-band noise at a random SNR (dB), fade the ends, set a random RMS level
    (``LOUDNESS_DBFS``) and soft-clip below full scale.  ``x`` is (n, channels) at ``sr`` Hz."""
    n = len(x)
    level = rms(x)
    noise_db = rng.uniform(*snr_db)
    use_pink = rng.random() < 0.5
    for c in range(x.shape[1]):
        x[:, c] += level * 10.0 ** (-noise_db / 20.0) * (pink(rng, n) if use_pink else rng.standard_normal(n))
    fade_in = min(int(rng.uniform(0.005, 0.3) * sr), n // 4)
    fade_out = min(int(rng.uniform(0.05, 2.0) * sr), n // 4)
    if fade_in > 0:
        x[:fade_in] *= np.linspace(0.0, 1.0, fade_in)[:, None]
    if fade_out > 0:
        x[-fade_out:] *= np.linspace(1.0, 0.0, fade_out)[:, None]
    x *= 10.0 ** (rng.uniform(*LOUDNESS_DBFS) / 20.0) / rms(x)
    ceiling = 0.977
    return (ceiling * np.tanh(x / ceiling)).astype(np.float32)


def render_clip(plan: ClipPlan) -> npt.NDArray[np.float32]:
    """Synthesise one file's audio: float32 array (plan.n_frames, plan.channels), |x| < 1.

    Pure function of the plan.  Instruments are synthesised, mixed and recorded at
    ``SYNTH_SR`` (22 050 Hz, the rate the features use); 44.1 kHz files are upsampled
    (polyphase) before the full-band noise floor is added, which keeps them as cheap as
    22.05 kHz ones.
    """
    rng = rng_for(plan.seed, plan.style, 0, plan.index)
    n_out = max(plan.n_frames, 1)
    n_syn = -(-n_out * SYNTH_SR // plan.sample_rate)
    ctx = Ctx(rng, SYNTH_SR, n_syn, 2.0 ** (rng.uniform(-25.0, 25.0) / 1200.0))
    arr = RECIPES[plan.style](ctx)
    x = record(ctx, _mix(ctx, arr, plan.channels))
    if plan.sample_rate != SYNTH_SR:
        g = math.gcd(plan.sample_rate, SYNTH_SR)
        x = np.asarray(signal.resample_poly(x, plan.sample_rate // g, SYNTH_SR // g, axis=0))
        x = x[:n_out] if len(x) >= n_out else np.pad(x, ((0, n_out - len(x)), (0, 0)))
    return _master(rng, plan.sample_rate, x, arr.snr_db)
