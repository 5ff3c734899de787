"""Features of one audio file, computed as a stream in bounded memory.

:func:`compute_features` decodes a file once (:func:`specstore.pipeline.audio.stream_mono`)
and feeds every requested feature from the same samples, one block of audio
at a time.  Each feature keeps only the samples its next frames still need
(an STFT window's worth of context), so a worker's memory does not grow with
the file's length; only the output arrays do.  How each kind is streamed is
registered by kind name in :mod:`specstore.pipeline.kinds` (:mod:`specstore.pipeline.mel`,
:mod:`specstore.pipeline.cqt`).

What the values are (the contract the store's readers rely on), for a spec
``s`` and ``y = librosa.load(path, sr=s.sample_rate, mono=True)[0]``:

* mel: ``power_to_db(melspectrogram(y=y, sr, n_fft, hop_length, n_mels=n_bins,
  fmin, fmax, power), ref=db_ref, amin=amin, top_db=None).T``
  (librosa 0.11 defaults: periodic hann window, ``center=True``, zero padding,
  Slaney mel filters).
* cqt: ``amplitude_to_db(|cqt(y, sr, hop_length, fmin, n_bins, bins_per_octave)|,
  ref=db_ref, amin=amin, top_db=None).T`` (librosa 0.11 defaults otherwise).

Both are ``(n_frames, n_bins)`` float32 dB with ``n_frames = 1 + len(y) // hop``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from specstore.common import ConfigError
from specstore.common.heap import keep_freed_blocks
from specstore.pipeline.audio import probe, stream_mono
from specstore.pipeline.errors import AudioError
from specstore.store.spec import FeatureSpec

from .kinds import FeaturePlan, FeatureStream, plan_for

__all__ = ["FeatureResult", "common_grid", "compute_features", "min_samples", "stored_features"]


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


def min_samples(specs: Mapping[str, FeatureSpec]) -> int:
    """Fewest decoded samples (at the specs' rate) a file needs: one whole frame of every feature.

    A mel frame is ``n_fft`` samples.  A CQT frame is the analysis window of
    its highest (shortest) octave; lower octaves' longer windows are
    zero-padded, as librosa pads them, so a 0.5 s clip has the same CQT as
    ``librosa.cqt`` gives it (the default 84-bin CQT at 22 050 Hz needs 256
    samples).  Shorter audio raises :class:`AudioError`.
    """
    common_grid(specs)
    return max(plan_for(s).min_samples for s in specs.values())


def _frames_hint(path: str | os.PathLike[str], sr: int, hop: int) -> int:
    """Expected frames of ``path`` from its header (to allocate the outputs once)."""
    info = probe(path)
    est = math.ceil(info.n_samples * sr / info.sample_rate) if info.sample_rate else 0
    return 1 + est // hop + 1


def _blocks(path: str | os.PathLike[str], sr: int, block_seconds: float) -> Iterable[np.ndarray]:
    """The decoded samples of ``path`` at ``sr`` Hz, gathered into blocks of about ``block_seconds``."""
    target = max(1, int(block_seconds * sr))  # samples per block
    pending: list[np.ndarray] = []
    pending_n = 0
    for chunk in stream_mono(path, sr):
        pending.append(chunk)
        pending_n += chunk.shape[0]
        if pending_n >= target:
            yield np.concatenate(pending) if len(pending) > 1 else pending[0]
            pending, pending_n = [], 0
    if pending:
        yield np.concatenate(pending) if len(pending) > 1 else pending[0]


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

    Sets glibc's heap thresholds for the rest of the process
    (:func:`specstore.common.heap.keep_freed_blocks`: freed blocks up to 32 MiB are
    kept for reuse), what every extraction worker and decoded upload needs.

    Raises ValueError for inconsistent or unsupported specs (different
    sample_rate or hop_length, odd n_fft, CQT above Nyquist) and
    :class:`AudioError` for files that do not decode or hold fewer than
    :func:`min_samples` samples.
    """
    if not block_seconds > 0:
        raise ConfigError(f"block_seconds must be positive, not {block_seconds!r}")
    sr, hop = common_grid(specs)
    plans: dict[str, FeaturePlan] = {name: plan_for(s) for name, s in specs.items()}
    need = max(p.min_samples for p in plans.values())
    if sinks is not None and set(sinks) != set(plans):
        raise ConfigError(f"sinks {sorted(sinks)} differ from the features {sorted(plans)}")
    hint = _frames_hint(path, sr, hop) if sinks is None else 0
    dtypes = {name: np.dtype((out_dtypes or {}).get(name, "float32")) for name in plans}
    out = dict(sinks or {})
    streams: dict[str, FeatureStream] = {name: p.stream(hint, dtypes[name], out.get(name))
                                         for name, p in plans.items()}
    # Decoded blocks and each batch of frames are freed and allocated again every step: kept in the heap
    # instead of unmapped and page-faulted in again (specstore.common.heap; docs/measurements.md).
    keep_freed_blocks()
    n = 0  # samples fed so far
    for block in _blocks(path, sr, block_seconds):
        for s in streams.values():
            s.feed(block)
        n += block.shape[0]
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
