"""Log-mel and CQT features of one audio file, computed as a stream in bounded memory.

:func:`compute_features` decodes a file once (:func:`pipeline.audio.stream_mono`)
and feeds every requested feature from the same samples, one block of audio
at a time.  Each feature keeps only the samples its next frames still need
(an STFT window's worth of context), so a worker's memory does not grow with
the file's length; only the output arrays do.

What the values are (the contract the store's readers rely on), for a spec
``s`` and ``y = librosa.load(path, sr=s.sample_rate, mono=True)[0]``:

* mel: ``power_to_db(melspectrogram(y=y, sr, n_fft, hop_length, n_mels=n_bins,
  fmin, fmax, power), ref=db_ref, amin=amin, top_db=None).T``
  (librosa 0.11 defaults: periodic hann window, ``center=True``, zero padding,
  Slaney mel filters).
* cqt: ``amplitude_to_db(|cqt(y, sr, hop_length, fmin, n_bins, bins_per_octave)|,
  ref=db_ref, amin=amin, top_db=None).T`` (librosa 0.11 defaults otherwise).

Both are ``(n_frames, n_bins)`` float32 dB with ``n_frames = 1 + len(y) // hop``.

How a stream reproduces the whole-file values:

* Mel (STFT): frame ``t`` covers samples ``[t*hop - n_fft/2, t*hop + n_fft/2)``
  of ``y``, zeros outside ``[0, len(y))``; a frame is computed as soon as its
  samples have arrived, and ``n_fft - hop`` samples are carried to the next
  block.  The FFT runs in float32 (the fast path); a frame where some mel
  bin lies so far below the frame's power that float32 rounding could move it
  by more than ~0.002 dB (band-limited or near-silent audio) is recomputed
  with librosa's own numerics (float64 FFT).
* CQT: librosa's CQT is a cascade: per octave, a short STFT of the signal
  decimated 2:1 once per octave (soxr, "soxr_hq"), multiplied by a sparse
  filter basis.  Here that cascade streams: each decimation stage is a
  streaming soxr resampler, which is sample-identical to the one-shot
  resampling librosa does, and each octave's frames are computed from its
  decimated signal with the same filter basis and the same FFT.  The result
  is the whole-file ``librosa.cqt`` to the last bit in practice, with
  constant memory and no recomputed overlap.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import librosa
import numpy as np
import numpy.typing as npt
import scipy.fft
import scipy.signal
import scipy.sparse
from numpy.lib.stride_tricks import sliding_window_view

from pipeline.audio import AudioError, StreamResampler, probe, stream_mono
from store import ConfigError
from store.spec import FeatureSpec

__all__ = ["FeatureResult", "common_grid", "compute_features", "min_samples", "stored_features"]

#: Frames per FFT batch in the mel path: a (128, 2048) float32 batch is 1 MiB,
#: which keeps window multiply, FFT, squaring and filterbank product in cache.
_MEL_BATCH = 128

#: Frames per batch in a CQT octave (its FFTs are short: 256 points by default).
_CQT_BATCH = 1024

#: Guard for the float32 mel path.  float32 FFT rounding adds noise of about
#: 2e-17 (measured; 3e-17 with margin) of the frame's half-spectrum power to
#: every FFT bin.  A mel bin below ``_F32_GUARD * (sum of its filter weights)
#: * (frame power)`` could be moved by more than ~5e-4 relative (0.002 dB), so
#: its frame is recomputed in float64.  Full-band audio rarely trips it;
#: lossy files with empty high bands (low-bitrate Vorbis/MP3) often do.
_F32_GUARD = 1e-8


@dataclass
class FeatureResult:
    """Features of one file.

    ``arrays[name]`` is ``(n_frames, n_bins)`` float32 dB for each requested
    spec (or the dtype ``compute_features(out_dtypes=...)`` asked for); ``n_frames`` is
    shared by all features; ``duration`` is the seconds of decoded audio at
    ``sample_rate`` Hz.
    """

    arrays: dict[str, np.ndarray]
    n_frames: int
    duration: float
    sample_rate: int


def common_grid(specs: Mapping[str, FeatureSpec]) -> tuple[int, int]:
    """The ``(sample_rate, hop_length)`` all specs share; ValueError if they differ."""
    if not specs:
        raise ConfigError("no feature specs given")
    rates = {s.sample_rate for s in specs.values()}
    hops = {s.hop_length for s in specs.values()}
    if len(rates) > 1 or len(hops) > 1:
        detail = ", ".join(f"{n}: {s.sample_rate} Hz hop {s.hop_length}" for n, s in specs.items())
        raise ConfigError(f"all features must share sample_rate and hop_length ({detail})")
    return next(iter(rates)), next(iter(hops))


# ------------------------------------------------------------------ buffers


class _Signal:
    """Samples ``[start, end)`` of one signal, grown by appends and trimmed from the left.

    ``get(a, b, n)`` returns samples ``[a, b)`` with zeros outside ``[0, n)``
    (``n`` = final length, ``None`` while the stream is running): a view when
    the range is held, a small zero-padded copy at the signal's two ends.
    """

    def __init__(self) -> None:
        self.data = np.zeros(0, dtype=np.float32)
        self.start = 0
        self._pending: list[np.ndarray] = []
        self._pending_len = 0

    @property
    def end(self) -> int:
        return self.start + self.data.shape[0] + self._pending_len

    def append(self, x: np.ndarray) -> None:
        if x.shape[0]:
            self._pending.append(x)
            self._pending_len += x.shape[0]

    def drop_before(self, index: int) -> None:
        """Forget samples before ``index`` (no frame still to come needs them)."""
        self._settle()
        cut = min(max(0, index - self.start), self.data.shape[0])
        if cut:
            # A view; the old buffer is freed at the next concatenation.
            self.data = self.data[cut:]
            self.start += cut

    def _settle(self) -> None:
        if self._pending:
            self.data = np.concatenate([self.data, *self._pending])
            self._pending.clear()
            self._pending_len = 0

    def get(self, a: int, b: int, n: int | None) -> np.ndarray:
        self._settle()
        lo = max(a, 0)
        hi = b if n is None else min(b, n)
        if lo < self.start or hi > self.start + self.data.shape[0]:
            raise AssertionError(f"samples [{lo}, {hi}) not held (have [{self.start}, {self.end}))")
        if lo == a and hi == b:
            return self.data[a - self.start : b - self.start]
        out = np.zeros(b - a, dtype=np.float32)
        if hi > lo:
            out[lo - a : hi - a] = self.data[lo - self.start : hi - self.start]
        return out


def _frames(sig: _Signal, f0: int, f1: int, hop: int, n_fft: int, n: int | None) -> np.ndarray:
    """Centered STFT frames ``[f0, f1)``: a strided ``(f1 - f0, n_fft)`` view of ``sig``."""
    half = n_fft // 2
    seg = sig.get(f0 * hop - half, (f1 - 1) * hop - half + n_fft, n)
    return sliding_window_view(seg, n_fft)[::hop]


def _ready_frames(sig: _Signal, hop: int, n_fft: int) -> int:
    """How many centered frames (from 0) have all their samples in ``sig`` so far."""
    reach = sig.end - n_fft // 2  # frame t needs samples up to t*hop + n_fft//2
    return reach // hop + 1 if reach >= 0 else 0


class _Output:
    """The ``(frames, bins)`` output of one feature (float32, or the storage dtype).

    Without a sink: a growable array, preallocated from the header's length.
    With a sink (a callable taking finished rows in order): a small rolling
    buffer; :meth:`release` hands rows over once every part of them is
    computed and forgets them, so memory does not grow with the file.
    """

    def __init__(self, n_bins: int, frames_hint: int, dtype: npt.DTypeLike = np.float32,
                 sink: Callable[[np.ndarray], None] | None = None) -> None:
        self.sink = sink
        self.base = 0  # first frame held
        self.a = np.empty((max(frames_hint if sink is None else 64, 1), n_bins), dtype=dtype)

    def rows(self, f0: int, f1: int) -> np.ndarray:
        if f1 - self.base > self.a.shape[0]:
            cap = max(f1 - self.base, self.a.shape[0] + self.a.shape[0] // 4 + 64)
            b = np.empty((cap, self.a.shape[1]), dtype=self.a.dtype)
            b[: self.a.shape[0]] = self.a
            self.a = b
        return self.a[f0 - self.base : f1 - self.base]

    def release(self, upto: int) -> None:
        """Hand frames ``[base, upto)`` to the sink and drop them (no-op without a sink)."""
        if self.sink is None or upto <= self.base:
            return
        n = upto - self.base
        self.sink(self.a[:n])
        keep = self.a.shape[0] - n
        self.a[:keep] = self.a[n:].copy()
        self.base = upto

    def finish(self, n_frames: int) -> np.ndarray:
        if self.sink is not None:
            self.release(n_frames)
            return self.a[:0]
        # A view when the estimate was close; a trimmed copy when far off (bad MP3 headers).
        a = self.a[:n_frames]
        return a if n_frames >= 0.9 * self.a.shape[0] else a.copy()


def _to_db(x: np.ndarray, amin: float, offset: float) -> None:
    """In place: ``10 * log10(max(x, amin)) - offset``, float32, as ``librosa.power_to_db``."""
    np.maximum(x, amin, out=x)
    np.log10(x, out=x)
    x *= 10.0
    if offset:
        x -= offset


# ------------------------------------------------------------------ mel


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

    @property
    def min_samples(self) -> int:
        return self.n_fft

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
        _to_db(out, self.amin, self.db_offset)

    def _apply_filters(self, power: np.ndarray, out: np.ndarray) -> None:
        """``out = power @ filterbank.T`` for ``power`` over FFT bins ``[lo, hi)``, skipping the zeros.

        The product runs in float64 and is rounded once to float32, so the
        stored features do not depend on how many threads BLAS uses: a
        multi-threaded float32 GEMM splits rows differently from a
        single-threaded one and can change the last bit, which made a store
        written with ``jobs=1`` (BLAS on every core) differ from one written by
        worker processes (one BLAS thread each).  Costs about 3% of the mel time.
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
        total = sq.sum(axis=1)
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

    A mel filter touches only a few neighbouring FFT bins, so a dense
    ``(743, 128)`` product is ~95% multiplications by zero; the blocks do
    about an eighth of the work with the same sums.
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
def _mel_plan(spec: FeatureSpec) -> _MelPlan:
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
        self.sig = _Signal()
        self.out = _Output(plan.n_bins, frames_hint, dtype, sink)
        self.done = 0  # frames computed

    def feed(self, x: np.ndarray) -> None:
        self.sig.append(x)
        self._emit(_ready_frames(self.sig, self.plan.hop, self.plan.n_fft), None)

    def finish(self, n: int, n_frames: int) -> np.ndarray:
        self._emit(n_frames, n)
        return self.out.finish(n_frames)

    def _emit(self, f1: int, n: int | None) -> None:
        p = self.plan
        if f1 > self.done:
            frames = _frames(self.sig, self.done, f1, p.hop, p.n_fft, n)
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


# ------------------------------------------------------------------ CQT


@dataclass(frozen=True, eq=False)
class _Octave:
    """One octave of librosa's CQT cascade."""

    level: int  # which decimated signal it reads (0 = after early downsampling)
    n_fft: int  # its STFT size, samples at its level's rate
    hop: int  # its hop, samples at its level's rate
    basis: scipy.sparse.csr_matrix  # (n_rows, n_fft//2 + 1) complex64 filter basis, as librosa builds it
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
    db_offset: float  # 10 * log10(max(amin^2, db_ref^2)), as amplitude_to_db
    frame_samples: int  # the highest octave's (shortest) analysis window, in samples at sr

    @property
    def min_samples(self) -> int:
        return self.frame_samples


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
def _cqt_plan(spec: FeatureSpec) -> _CqtPlan:
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
        octaves.append(_Octave(level, n_fft, my_hop, fft_basis, norm, slice(start, stop)))
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
        self.out = _Output(plan.n_bins, frames_hint, dtype, sink)  # float32 octave results cast on assignment
        self.early = StreamResampler(plan.early_factor, 1, scale=True) if plan.early_factor > 1 else None
        self.levels = [_Signal() for _ in range(plan.n_levels)]
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
            f1 = n_frames if n_frames is not None else _ready_frames(sig, octv.hop, octv.n_fft)
            if final_len is not None and n_frames is not None and 1 + final_len // octv.hop < n_frames:
                raise AssertionError(f"octave {j} has {1 + final_len // octv.hop} frames, expected {n_frames}")
            for f0 in range(self.done[j], f1, _CQT_BATCH):
                fb = min(f1, f0 + _CQT_BATCH)
                frames = _frames(sig, f0, fb, octv.hop, octv.n_fft, final_len)
                # librosa.stft(window="ones"): float64 frames, FFT, stored as complex64
                d = scipy.fft.rfft(frames.astype(np.float64), axis=1).astype(np.complex64)
                resp = octv.basis.dot(d.T)  # (rows, frames) complex64
                resp /= octv.norm
                mag = np.abs(resp.T)
                np.square(mag, out=mag)  # amplitude_to_db squares |C| then power_to_db
                _to_db(mag, p.amin_sq, p.db_offset)
                self.out.rows(f0, fb)[:, octv.cols] = mag
            self.done[j] = max(self.done[j], f1)
            need = self.done[j] * octv.hop - octv.n_fft // 2
            keep[octv.level] = min(keep[octv.level], need)
        for sig, k in zip(self.levels, keep, strict=False):
            sig.drop_before(k)
        if n_frames is None:  # rows every octave has filled in are final
            self.out.release(min(self.done))


# ------------------------------------------------------------------ driver


_Stream = _MelStream | _CqtStream


def _plan(spec: FeatureSpec) -> _MelPlan | _CqtPlan:
    return _mel_plan(spec) if spec.kind == "mel" else _cqt_plan(spec)


def min_samples(specs: Mapping[str, FeatureSpec]) -> int:
    """Fewest decoded samples (at the specs' rate) a file needs: one whole frame of every feature.

    A mel frame is ``n_fft`` samples.  A CQT frame is the analysis window of
    its highest (shortest) octave; lower octaves' longer windows are
    zero-padded, as librosa pads them, so a 0.5 s clip has the same CQT as
    ``librosa.cqt`` gives it (the default 84-bin CQT at 22 050 Hz needs 256
    samples).  Shorter audio raises :class:`AudioError`.
    """
    common_grid(specs)
    return max(_plan(s).min_samples for s in specs.values())


def compute_features(
    path: str | os.PathLike[str],
    specs: Mapping[str, FeatureSpec],
    *,
    block_seconds: float = 60.0,
    out_dtypes: Mapping[str, str] | None = None,
    sinks: Mapping[str, Callable[[np.ndarray], None]] | None = None,
) -> FeatureResult:
    """Decode ``path`` once and compute every feature in ``specs`` as a stream.

    Decoded audio is handed to the features ``block_seconds`` at a time; peak
    memory is about one block of samples plus each feature's context and
    working arrays, independent of the file's length (the outputs excepted).
    The values are the whole-file librosa computation described in the
    module docstring.

    ``out_dtypes`` (feature name -> numpy dtype name, e.g. the specs' storage
    dtypes) makes those arrays come back in that dtype: values are computed
    in float32 and cast block by block as they are written, the same values
    as ``astype`` on the float32 result, without ever holding the whole
    float32 array (for a 60-minute file, 79 MB of log-mel).

    ``sinks`` (feature name -> callable) streams the output instead: each
    feature's finished rows are handed to its callable in order, a block at
    a time, and never kept (``arrays`` is then empty), so memory does not
    grow with the file's length at all.  A file that fails part-way has
    already handed over some rows: the caller drops them.

    Raises ValueError for inconsistent or unsupported specs (different
    sample_rate or hop_length, odd n_fft, CQT above Nyquist) and
    :class:`AudioError` for files that do not decode or hold fewer than
    :func:`min_samples` samples.
    """
    if not block_seconds > 0:
        raise ConfigError(f"block_seconds must be positive, not {block_seconds!r}")
    sr, hop = common_grid(specs)
    plans = {name: _plan(s) for name, s in specs.items()}
    need = max(p.min_samples for p in plans.values())

    if sinks is not None and set(sinks) != set(plans):
        raise ConfigError(f"sinks {sorted(sinks)} differ from the features {sorted(plans)}")
    if sinks is None:
        info = probe(path)
        est = math.ceil(info.n_samples * sr / info.sample_rate) if info.sample_rate else 0
        hint = 1 + est // hop + 1
    else:
        hint = 0
    dtypes = {name: np.dtype((out_dtypes or {}).get(name, "float32")) for name in plans}
    out = dict(sinks or {})
    streams: dict[str, _Stream] = {
        name: (_MelStream if isinstance(p, _MelPlan) else _CqtStream)(p, hint, dtypes[name], out.get(name))  # type: ignore[arg-type]
        for name, p in plans.items()
    }

    def feed(parts: list[np.ndarray]) -> int:
        block = np.concatenate(parts) if len(parts) > 1 else parts[0]
        for s in streams.values():
            s.feed(block)
        return block.shape[0]

    target = max(1, int(block_seconds * sr))  # samples per block
    pending: list[np.ndarray] = []
    pending_n = 0
    n = 0  # samples fed so far
    for chunk in stream_mono(path, sr):
        pending.append(chunk)
        pending_n += chunk.shape[0]
        if pending_n >= target:
            n += feed(pending)
            pending, pending_n = [], 0
    if pending:
        n += feed(pending)
    if n < need:
        raise AudioError(f"shorter than one frame ({n} samples < {need})", os.fspath(path))
    n_frames = 1 + n // hop
    arrays = {name: s.finish(n, n_frames) for name, s in streams.items()}
    if sinks is not None:
        arrays = {}
    return FeatureResult(arrays=arrays, n_frames=n_frames, duration=n / sr, sample_rate=sr)


def stored_features(
    path: str | os.PathLike[str],
    specs: Mapping[str, FeatureSpec],
    *,
    block_seconds: float = 60.0,
) -> FeatureResult:
    """The values a store would hold for ``path``: :func:`compute_features` in each spec's storage dtype.

    What extraction writes into a shard (float16 for the default specs),
    here as in-memory ``(n_frames, n_bins)`` arrays, so a file classified
    without a store (``specstore classify``, the server) gets exactly the
    inputs ``make infer`` reads from a store made of it.  Raises as
    :func:`compute_features` does.
    """
    return compute_features(path, specs, block_seconds=block_seconds,
                            out_dtypes={name: s.dtype for name, s in specs.items()})
