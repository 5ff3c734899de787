"""Constant-Q features streamed through librosa's octave cascade, bit for bit, in constant memory.

librosa's CQT is a cascade: per octave, a short STFT of the signal
decimated 2:1 once per octave (soxr, "soxr_hq"), multiplied by a sparse
filter basis.  Here that cascade streams: each decimation stage is a
streaming soxr resampler (:class:`specstore.pipeline.audio.StreamResampler`), which
is sample-identical to the one-shot resampling librosa does, and each
octave's frames are computed from its decimated signal with the same
filter basis and the same FFT.  The values are :mod:`specstore.pipeline.features`'
CQT contract, with no recomputed overlap.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import librosa
import numpy as np
import numpy.typing as npt
import scipy.fft
import scipy.sparse

from specstore.common import ConfigError
from specstore.store.kinds import SpectralSpec

from .audio import StreamResampler
from .streaming import Output, Signal, centered_frames, ready_frames, to_db

__all__ = ["cqt_plan"]

#: Frames per batch in an octave (its FFTs are short: 256 points by default).
_CQT_BATCH = 1024


@dataclass(frozen=True, eq=False)
class _Octave:
    """One octave of librosa's CQT cascade."""

    level: int  # which decimated signal it reads (0 = after early downsampling)
    n_fft: int  # its STFT size, samples at its level's rate
    hop: int  # its hop, samples at its level's rate
    basis: scipy.sparse.csr_matrix  # (n_rows, hi - lo) complex64: librosa's filter basis, FFT bins [lo, hi)
    lo: int  # first FFT bin the basis uses
    hi: int  # one past the last
    norm: np.ndarray  # (n_rows, 1) float64: sqrt(filter lengths), librosa's ``scale=True`` division
    cols: slice  # its rows in the (frames, n_bins) output


@dataclass(frozen=True, eq=False)
class _CqtPlan:
    """Constants for one CQT spec (see :func:`_cqt_plan`)."""

    n_bins: int
    early_factor: int  # librosa's early downsampling factor (1 = none)
    n_levels: int  # decimated signals used by the octaves
    octaves: tuple[_Octave, ...]
    amin_sq: float
    db_offset: float  # 10 * log10(max(amin^2, db_ref^2)), as amplitudeto_db
    frame_samples: int  # the highest octave's (shortest) analysis window, in samples at sr

    @property
    def min_samples(self) -> int:
        return self.frame_samples

    def stream(self, frames_hint: int, dtype: npt.DTypeLike = np.float32,
               sink: Callable[[np.ndarray], None] | None = None) -> _CqtStream:
        """A stream computing this feature's rows (see :class:`specstore.pipeline.kinds.FeaturePlan`)."""
        return _CqtStream(self, frames_hint, dtype, sink)


def _relative_bandwidth(freqs: np.ndarray) -> np.ndarray:
    """Relative bandwidth of each CQT filter, as librosa.filters computes it for the basis."""
    bpo = np.empty_like(freqs)
    logf = np.log2(freqs)
    bpo[0] = 1 / (logf[1] - logf[0])
    bpo[-1] = 1 / (logf[-1] - logf[-2])
    bpo[1:-1] = 2 / (logf[2:] - logf[:-2])
    return (2.0 ** (2 / bpo) - 1) / (2.0 ** (2 / bpo) + 1)


def _num_twos(x: int) -> int:
    k = 0
    while x > 0 and x % 2 == 0:
        x //= 2
        k += 1
    return k


@functools.lru_cache(maxsize=16)
def _cqt_plan(spec: SpectralSpec) -> _CqtPlan:
    """librosa 0.11 ``vqt`` (``gamma=0``, hann, ``filter_scale=1``, ``norm=1``,
    ``sparsity=0.01``, ``tuning=0``, ``scale=True``) laid out as a cascade."""
    sr, hop, n_bins = spec.sample_rate, spec.hop_length, spec.n_bins
    bpo = spec.bins_per_octave or 12  # librosa's default
    fmin = float(spec.fmin)
    if not fmin > 0:
        raise ConfigError(f"cqt fmin must be a positive frequency in Hz, not {spec.fmin!r}")
    if spec.power != 1.0:
        raise ConfigError(f"cqt features store magnitude dB; power must be 1.0, not {spec.power!r}")
    if n_bins < 2:
        raise ConfigError("cqt needs n_bins >= 2")
    if spec.amin <= 0:
        raise ConfigError(f"amin must be positive, not {spec.amin!r}")
    n_oct = math.ceil(n_bins / bpo)
    n_filters = min(bpo, n_bins)
    freqs = librosa.cqt_frequencies(n_bins=n_bins, fmin=fmin, bins_per_octave=bpo)
    alpha = _relative_bandwidth(freqs)
    lengths, cutoff = librosa.filters.wavelet_lengths(freqs=freqs, sr=sr, alpha=alpha)
    nyquist = sr / 2.0
    if cutoff > nyquist:
        raise ConfigError(
            f"cqt from {fmin:.2f} Hz with {n_bins} bins reaches {cutoff:.0f} Hz, above Nyquist ({nyquist:.0f} Hz)"
        )
    # Early downsampling (librosa's __early_downsample_count).
    early = min(
        max(0, int(np.ceil(np.log2(nyquist / cutoff)) - 1) - 1),
        max(0, _num_twos(hop) - n_oct + 1),
    )
    factor = 2**early
    sr_e = sr / float(factor)
    lengths_e, _ = librosa.filters.wavelet_lengths(freqs=freqs, sr=sr_e, alpha=alpha)
    my_sr, my_hop, level = sr_e, hop // factor, 0
    octaves = []
    frame_samples = 0
    for i in range(n_oct):
        stop = n_bins - n_filters * i
        start = max(0, stop - n_filters)
        basis, blen = librosa.filters.wavelet(
            freqs=freqs[start:stop], sr=my_sr, filter_scale=1, norm=1, pad_fft=True,
            window="hann", gamma=0.0, alpha=alpha[start:stop],  # type: ignore[arg-type]
        )
        n_fft = basis.shape[1]
        basis *= blen[:, np.newaxis] / float(n_fft)
        fft_basis = scipy.fft.fft(basis, n=n_fft, axis=1)[:, : (n_fft // 2) + 1]
        fft_basis = librosa.util.sparsify_rows(fft_basis, quantile=0.01, dtype=np.complex64)
        fft_basis[:] *= np.sqrt(sr_e / my_sr)
        norm = np.sqrt(lengths_e[start:stop])[:, np.newaxis]
        norm.setflags(write=False)
        # Only the FFT bins some filter uses (a third of them by default) are cast and multiplied:
        # the same nonzeros in the same order, so the same sums as librosa's full product.
        used = np.unique(fft_basis.indices)
        lo, hi = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 1)
        octaves.append(_Octave(level, n_fft, my_hop, fft_basis[:, lo:hi].tocsr(), lo, hi, norm,
                               slice(start, stop)))
        # librosa zero-pads a signal shorter than an octave's window (its STFT warns and pads),
        # and so do the streamed frames: one frame of the shortest window is the minimum.
        window = int(round(n_fft * sr / my_sr))
        frame_samples = window if not frame_samples else min(frame_samples, window)
        if i < n_oct - 1 and my_hop % 2 == 0:
            my_hop //= 2
            my_sr /= 2.0
            level += 1
    return _CqtPlan(
        n_bins=n_bins,
        early_factor=factor,
        n_levels=level + 1,
        octaves=tuple(octaves),
        amin_sq=float(spec.amin) ** 2,
        db_offset=float(10.0 * np.log10(max(spec.amin**2, spec.db_ref**2))),
        frame_samples=frame_samples,
    )


class _CqtStream:
    """Streams one CQT feature through librosa's octave cascade.

    Level 0 is the signal (after librosa's early downsampling, if any); level
    ``k + 1`` is level ``k`` decimated 2:1 by a streaming soxr resampler with
    librosa's length and scaling.  Each octave computes its frames from its
    level as soon as their samples arrive.
    """

    def __init__(self, plan: _CqtPlan, frames_hint: int, dtype: npt.DTypeLike = np.float32,
                 sink: Callable[[np.ndarray], None] | None = None) -> None:
        self.plan = plan
        self.out = Output(plan.n_bins, frames_hint, dtype, sink)  # float32 octave results cast on assignment
        self.early = StreamResampler(plan.early_factor, 1, scale=True) if plan.early_factor > 1 else None
        # Each level holds the zeros its octaves' first frames reach before sample 0 (views, not copies).
        self.levels = [Signal(lead=max((o.n_fft // 2 for o in plan.octaves if o.level == k), default=0))
                       for k in range(plan.n_levels)]
        self.down = [StreamResampler(2, 1, scale=True) for _ in range(plan.n_levels - 1)]
        self.done = [0] * len(plan.octaves)

    def feed(self, x: np.ndarray) -> None:
        if self.early is not None:
            x = self.early.push(x)
        for k, sig in enumerate(self.levels):
            sig.append(x)
            if k < len(self.down):
                x = self.down[k].push(x) if x.shape[0] else x
        self._emit(None)

    def finish(self, n: int, n_frames: int) -> np.ndarray:
        x = self.early.finish() if self.early is not None else np.zeros(0, dtype=np.float32)
        for k, sig in enumerate(self.levels):
            sig.append(x)
            if k < len(self.down):
                head = self.down[k].push(x) if x.shape[0] else x
                x = np.concatenate([head, self.down[k].finish()])
        self._emit(n_frames)
        return self.out.finish(n_frames)

    def _emit(self, n_frames: int | None) -> None:
        p = self.plan
        keep = [sig.end for sig in self.levels]
        for j, octv in enumerate(p.octaves):
            sig = self.levels[octv.level]
            final_len = None if n_frames is None else sig.end
            f1 = n_frames if n_frames is not None else ready_frames(sig, octv.hop, octv.n_fft)
            if final_len is not None and n_frames is not None and 1 + final_len // octv.hop < n_frames:
                raise AssertionError(f"octave {j} has {1 + final_len // octv.hop} frames, expected {n_frames}")
            for f0 in range(self.done[j], f1, _CQT_BATCH):
                fb = min(f1, f0 + _CQT_BATCH)
                frames = centered_frames(sig, f0, fb, octv.hop, octv.n_fft, final_len)
                # librosa.stft(window="ones"): float64 frames, FFT, stored as complex64 (the bins used)
                spec = scipy.fft.rfft(frames.astype(np.float64), axis=1, overwrite_x=True)
                d = spec[:, octv.lo : octv.hi].astype(np.complex64)
                resp = octv.basis.dot(d.T)  # (rows, frames) complex64
                resp /= octv.norm
                mag = np.abs(resp.T)
                np.square(mag, out=mag)  # amplitudeto_db squares |C| then powerto_db
                to_db(mag, p.amin_sq, p.db_offset)
                self.out.rows(f0, fb)[:, octv.cols] = mag
            self.done[j] = max(self.done[j], f1)
            need = self.done[j] * octv.hop - octv.n_fft // 2
            keep[octv.level] = min(keep[octv.level], need)
        for sig, k in zip(self.levels, keep, strict=False):
            sig.drop_before(k)
        if n_frames is None:  # rows every octave has filled in are final
            self.out.release(min(self.done))


def cqt_plan(spec: SpectralSpec) -> _CqtPlan:
    """The streaming plan of a CQT spec (cached per spec); ConfigError for an unusable spec."""
    return _cqt_plan(spec)
