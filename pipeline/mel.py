"""Log-mel features streamed block by block: an STFT whose frames are computed as soon as their samples arrive.

Frame ``t`` covers samples ``[t*hop - n_fft/2, t*hop + n_fft/2)`` of the
signal, zeros outside it (librosa's ``center=True`` zero padding); ``n_fft -
hop`` samples are carried to the next block.  The FFT runs in float32 (the
fast path); a frame where some mel bin lies so far below the frame's power
that float32 rounding could move it by more than ~0.002 dB (band-limited or
near-silent audio) is recomputed with librosa's own numerics (float64 FFT).
The values are :mod:`specstore.pipeline.features`' mel contract; how the guard was
measured is in ``docs/features.md``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

import librosa
import numpy as np
import numpy.typing as npt
import scipy.fft
import scipy.signal

from specstore.common import ConfigError
from specstore.store.kinds import SpectralSpec

from .streaming import Output, Signal, centered_frames, ready_frames, to_db

__all__ = ["mel_plan", "musicnn_plan", "musicnn_scale"]

#: Frames per FFT batch: a (128, 2048) float32 batch is 1 MiB, which keeps
#: window multiply, FFT, squaring and filterbank product in cache.
_MEL_BATCH = 128

#: Guard for the float32 path, relative to the frame's half-spectrum power:
#: a mel bin below ``_F32_GUARD * (sum of its filter weights) * (frame power)``
#: could be moved by more than ~5e-4 relative (0.002 dB) by float32 FFT
#: rounding, so its frame is recomputed in float64 (docs/features.md).
_F32_GUARD = 1e-8


@dataclass(frozen=True, eq=False)
class _MelPlan:
    """Constants for one mel spec, built once per spec (see :func:`_mel_plan`)."""

    n_fft: int
    hop: int
    n_bins: int
    window32: np.ndarray  # (n_fft,) float32 periodic hann
    window64: np.ndarray  # (n_fft,) float64, what librosa multiplies by
    lo: int  # first FFT bin any mel filter uses
    hi: int  # one past the last
    groups: tuple[tuple[int, int, int, int, np.ndarray], ...]  # see _mel_groups
    guard: np.ndarray  # (n_bins,) float32: _F32_GUARD * sum of each filter's weights
    power: float
    amin: float
    db_offset: float  # 10 * log10(max(amin, db_ref))
    scale: Callable[[np.ndarray], None] | None = None  # in place, power -> stored values; None: to_db


    @property
    def min_samples(self) -> int:
        return self.n_fft

    def stream(self, frames_hint: int, dtype: npt.DTypeLike = np.float32,
               sink: Callable[[np.ndarray], None] | None = None) -> _MelStream:
        """A stream computing this feature's rows (see :class:`specstore.pipeline.kinds.FeaturePlan`)."""
        return _MelStream(self, frames_hint, dtype, sink)

    def compute(self, frames: np.ndarray, out: np.ndarray) -> None:
        """dB mel of ``frames`` ``(T, n_fft)`` into ``out`` ``(T, n_bins)`` float32.

        Batches go through the float32 path until one needs more than a
        quarter of its frames redone (band-limited audio, e.g. low-bitrate
        MP3/Vorbis or an 8 kHz source); the rest of this call then goes
        straight to the float64 path instead of computing those frames twice.
        """
        exact = self.power != 2.0
        for i in range(0, frames.shape[0], _MEL_BATCH):
            fr = frames[i : i + _MEL_BATCH]
            o = out[i : i + _MEL_BATCH]
            if exact:
                self._exact(fr, o)
            else:
                exact = 4 * self._fast(fr, o) > fr.shape[0]
        if self.scale is not None:
            self.scale(out)
        else:
            to_db(out, self.amin, self.db_offset)

    def _apply_filters(self, power: np.ndarray, out: np.ndarray) -> None:
        """``out = power @ filterbank.T`` for ``power`` over FFT bins ``[lo, hi)``, skipping the zeros.

        The product runs in float64 and is rounded once to float32, so the
        stored features do not depend on how many threads BLAS uses (a
        multi-threaded float32 GEMM splits rows differently from a
        single-threaded one and can change the last bit; docs/features.md).
        """
        power64 = power.astype(np.float64)
        for g0, g1, a, b, w in self.groups:
            out[:, g0:g1] = power64[:, a:b] @ w

    def _fast(self, fr: np.ndarray, out: np.ndarray) -> int:
        """float32 FFT path; returns how many frames had to be redone in float64."""
        spec = scipy.fft.rfft(fr * self.window32, axis=1, overwrite_x=True)
        sq = spec.view(np.float32)  # (T, 2 * (n_fft//2 + 1)): re, im interleaved
        np.square(sq, out=sq)
        band = sq[:, 2 * self.lo : 2 * self.hi]
        self._apply_filters(band[:, 0::2] + band[:, 1::2], out)
        # Frames with a bin near float32 rounding noise: redo them like librosa.
        total = np.einsum("ij->i", sq)  # a plain row sum, a third of sum()'s pairwise cost here
        risky = np.flatnonzero((out < self.guard[None, :] * total[:, None]).any(axis=1))
        if risky.size:
            redo = np.empty((risky.size, self.n_bins), dtype=np.float32)
            self._exact(fr[risky], redo)
            out[risky] = redo
        return int(risky.size)

    def _exact(self, fr: np.ndarray, out: np.ndarray) -> None:
        """librosa's numerics: float64 window and FFT, complex64 result, float32 power (product: see _apply_filters)."""
        spec = scipy.fft.rfft(fr * self.window64, axis=1, overwrite_x=True)[:, self.lo : self.hi]
        mag = np.abs(spec.astype(np.complex64))
        if self.power == 2.0:
            np.square(mag, out=mag)
        elif self.power != 1.0:
            mag **= self.power
        self._apply_filters(mag, out)


def _readonly(*arrays: np.ndarray) -> None:
    for a in arrays:
        a.setflags(write=False)


def _mel_groups(fb_t: np.ndarray, size: int = 16) -> tuple[tuple[int, int, int, int, np.ndarray], ...]:
    """Split the (bins, mels) filterbank into blocks of ``size`` mel filters, each
    cut to the FFT-bin rows it uses: ``(m0, m1, row0, row1, weights)``.

    A mel filter touches only a few neighbouring FFT bins, so most of a
    dense product is multiplications by zero; the blocks give the same sums
    for a fraction of the work (docs/features.md).
    """
    out = []
    for m0 in range(0, fb_t.shape[1], size):
        m1 = min(m0 + size, fb_t.shape[1])
        rows = np.flatnonzero(fb_t[:, m0:m1].any(axis=1))
        r0, r1 = (int(rows[0]), int(rows[-1]) + 1) if rows.size else (0, 1)
        w = np.ascontiguousarray(fb_t[r0:r1, m0:m1], dtype=np.float64)
        w.setflags(write=False)
        out.append((m0, m1, r0, r1, w))
    return tuple(out)


@functools.lru_cache(maxsize=16)
def _mel_plan(spec: SpectralSpec) -> _MelPlan:
    if spec.n_fft is None or spec.n_fft < 2 or spec.n_fft % 2:
        raise ConfigError(f"mel n_fft must be an even number of samples >= 2, not {spec.n_fft!r}")
    if spec.power <= 0:
        raise ConfigError(f"mel power must be positive, not {spec.power!r}")
    if spec.amin <= 0:
        raise ConfigError(f"amin must be positive, not {spec.amin!r}")
    fb = librosa.filters.mel(
        sr=spec.sample_rate, n_fft=spec.n_fft, n_mels=spec.n_bins, fmin=spec.fmin, fmax=spec.fmax
    )
    used = np.flatnonzero(fb.any(axis=0))
    lo, hi = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 1)
    fb_t = np.ascontiguousarray(fb[:, lo:hi].T, dtype=np.float32)
    window64 = np.asarray(scipy.signal.get_window("hann", spec.n_fft, fftbins=True), dtype=np.float64)
    plan = _MelPlan(
        n_fft=spec.n_fft,
        hop=spec.hop_length,
        n_bins=spec.n_bins,
        window32=window64.astype(np.float32),
        window64=window64,
        lo=lo,
        hi=hi,
        groups=_mel_groups(fb_t),
        guard=(_F32_GUARD * fb.sum(axis=1)).astype(np.float32),
        power=float(spec.power),
        amin=float(spec.amin),
        db_offset=float(10.0 * np.log10(max(spec.amin, spec.db_ref))),
    )
    _readonly(plan.window32, plan.window64, plan.guard)
    return plan


class _MelStream:
    """Streams one mel feature: frames are computed as soon as their samples arrive."""

    def __init__(self, plan: _MelPlan, frames_hint: int, dtype: npt.DTypeLike = np.float32,
                 sink: Callable[[np.ndarray], None] | None = None) -> None:
        self.plan = plan
        self.sig = Signal(lead=plan.n_fft // 2)
        self.out = Output(plan.n_bins, frames_hint, dtype, sink)
        self.done = 0  # frames computed

    def feed(self, x: np.ndarray) -> None:
        self.sig.append(x)
        self._emit(ready_frames(self.sig, self.plan.hop, self.plan.n_fft))

    def finish(self, n: int, n_frames: int) -> np.ndarray:
        # The zeros after sample n that the last frames reach (librosa's centred padding) are held like
        # samples, so those frames are a view as well.
        self.sig.append(np.zeros(max(0, n + self.plan.n_fft // 2 - self.sig.end), dtype=np.float32))
        self._emit(n_frames)
        return self.out.finish(n_frames)

    def _emit(self, f1: int) -> None:
        p = self.plan
        if f1 > self.done:
            frames = centered_frames(self.sig, self.done, f1, p.hop, p.n_fft, None)
            rows = self.out.rows(self.done, f1)
            if rows.dtype == np.float32:
                p.compute(frames, rows)
            else:  # computed in float32 (one block's frames), cast as stored
                block = np.empty(rows.shape, dtype=np.float32)
                p.compute(frames, block)
                rows[...] = block
            self.done = f1
            self.out.release(f1)
        self.sig.drop_before(self.done * p.hop - p.n_fft // 2)


def mel_plan(spec: SpectralSpec) -> _MelPlan:
    """The streaming plan of a mel spec (cached per spec); ConfigError for an unusable spec."""
    return _mel_plan(spec)


def musicnn_scale(x: np.ndarray) -> None:
    """In place, float32: ``log10(1 + 10000 * power)``, musicnn's input compression (no float16 cast)."""
    x *= np.float32(10000.0)
    np.log10(x + np.float32(1.0), out=x)


@functools.lru_cache(maxsize=4)
def musicnn_plan(spec: SpectralSpec) -> _MelPlan:
    """The streaming plan of a musicnn spec: its mel power (as a mel spec's), compressed by :func:`musicnn_scale`."""
    if spec.power != 2.0:
        raise ConfigError(f"the musicnn feature is a mel power spectrogram (power 2), not power {spec.power!r}")
    return dataclasses.replace(_mel_plan(spec), scale=musicnn_scale)
