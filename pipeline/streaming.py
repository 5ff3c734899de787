"""Bounded-memory buffers for streamed features: the samples a feature still needs, and its output rows.

Every streamed feature (:mod:`specstore.pipeline.mel`, :mod:`specstore.pipeline.cqt`, a kind
registered from user code) keeps a :class:`Signal` of the samples its next
frames still need and writes its rows into an :class:`Output`, which either
grows (an in-memory result) or hands finished rows to a sink in order, so
a worker's memory does not grow with the file's length.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["Output", "Signal", "centered_frames", "ready_frames", "to_db"]


class Signal:
    """Samples ``[start, end)`` of one signal, grown by appends and trimmed from the left.

    ``get(a, b, n)`` returns samples ``[a, b)`` with zeros outside ``[0, n)``
    (``n`` = final length, ``None`` while the stream is running): a view when
    the range is held, a zero-padded copy at the signal's two ends.  A
    signal made with ``lead`` zeros holds them before sample 0 like samples
    (``start == -lead``), so centred frames that reach before the start are
    views too instead of a padded copy of the whole first block.
    """

    def __init__(self, lead: int = 0) -> None:
        self.data = np.zeros(lead, dtype=np.float32)
        self.start = -lead
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


def centered_frames(sig: Signal, f0: int, f1: int, hop: int, n_fft: int, n: int | None) -> np.ndarray:
    """Centered STFT frames ``[f0, f1)``: a strided ``(f1 - f0, n_fft)`` view of ``sig``."""
    half = n_fft // 2
    seg = sig.get(f0 * hop - half, (f1 - 1) * hop - half + n_fft, n)
    return sliding_window_view(seg, n_fft)[::hop]


def ready_frames(sig: Signal, hop: int, n_fft: int) -> int:
    """How many centered frames (from 0) have all their samples in ``sig`` so far."""
    reach = sig.end - n_fft // 2  # frame t needs samples up to t*hop + n_fft//2
    return reach // hop + 1 if reach >= 0 else 0


class Output:
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


def to_db(x: np.ndarray, amin: float, offset: float) -> None:
    """In place: ``10 * log10(max(x, amin)) - offset``, float32, as ``librosa.powerto_db``."""
    np.maximum(x, amin, out=x)
    np.log10(x, out=x)
    x *= 10.0
    if offset:
        x -= offset
