"""One audio file -> the model's input, as ``make features`` would store it: the decode side of serving.

Runs inside the decode worker processes (and in ``specstore classify``'s),
so it imports the pipeline and numpy only, never torch.  The checkpoint's
:class:`~specstore.store.FeatureSpec` s drive :func:`specstore.pipeline.stored_features` (the
same streaming decode and features extraction uses, block by block, in
the store's dtype); the parts are stacked by :func:`specstore.store.stack_parts`, as
:meth:`specstore.infer.data.StoreDataset.window` stacks them from a store.  So a clip
classified here gets the exact input values ``make infer`` reads from a
store of the same file.

The server streams each upload to a file of its own naming
(:mod:`specstore.serving.uploads`) and decodes it with :func:`decode_file`;
:func:`decode_bytes` does the same for bytes already in memory, through a
private temporary file.  Whatever goes wrong is a :class:`ClipError` with a
one-line reason that names no server path.

Decode work is bounded before it starts: the header's sample rate,
channels and duration (:func:`specstore.pipeline.audio.probe`) are each checked
against ``max_sample_rate``, ``max_channels`` and ``max_seconds``, so a
file is refused before any sample is decoded (a decode running in a
worker pool cannot be cancelled).  The bound holds because libsndfile
never decodes past the frame count its header declares, and the PyAV path
(:mod:`specstore.pipeline.decode_av`, m4a/AAC and WMA) stops a little past it; a
header that declares less than the file holds is refused after that short
decode ("longer than declared", :func:`specstore.pipeline.audio.stream_mono`).
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from specstore.pipeline.audio import AudioInfo, probe
from specstore.pipeline.errors import AudioError
from specstore.pipeline.features import stored_features
from specstore.pipeline.hashing import content_hash, digest_bytes
from specstore.store import FeatureSpec, stack_parts

from .config import DEFAULT_MAX_CHANNELS, DEFAULT_MAX_SAMPLE_RATE  # the server's defaults, re-exported
from .errors import ClipError

__all__ = [
    "DEFAULT_MAX_CHANNELS", "DEFAULT_MAX_SAMPLE_RATE", "ClipError", "DecodedClip", "check_header", "decode_bytes",
    "decode_file", "decode_or_reason", "mel_picture", "warm_up",
]

#: Longest side of a log-mel picture, pixels (frames are averaged down to it).
PICTURE_WIDTH = 640


@dataclass
class DecodedClip:
    """One decoded file: ``features`` ``(n_bins, n_frames)`` float32 (store values), ``duration`` in seconds,
    ``hash`` the SHA-256 of its bytes (the content hash of new stores), ``picture`` a PNG of its log-mel or None."""

    features: np.ndarray
    duration: float
    hash: str
    picture: bytes | None = None

    @property
    def n_frames(self) -> int:
        return int(self.features.shape[1])


def mel_picture(features: np.ndarray, limits: tuple[float, float], *, width: int = PICTURE_WIDTH) -> bytes:
    """A PNG of ``(n_bins, n_frames)`` dB values, low bins at the bottom, colours fixed by ``limits`` (dB).

    Frames are averaged in groups so the picture is at most ``width`` pixels
    wide; one pixel per bin in height (magma colour map, as the notebook's
    figures use fixed dB limits per feature kind).
    """
    from matplotlib import image  # only where a picture is asked for

    n = features.shape[1]
    group = max(1, -(-n // width))
    cols = -(-n // group)
    padded = np.full((features.shape[0], cols * group), np.nan, dtype=np.float32)
    padded[:, :n] = features
    small = np.nanmean(padded.reshape(features.shape[0], cols, group), axis=2)
    buf = io.BytesIO()
    image.imsave(buf, small, vmin=limits[0], vmax=limits[1], cmap="magma", origin="lower", format="png")
    return buf.getvalue()


def _too_long(seconds: float, max_seconds: float) -> bool:
    """Longer than ``max_seconds``, allowing 1 % + 1 s for headers that round their length."""
    return seconds > max_seconds * 1.01 + 1.0


def check_header(info: AudioInfo, *, max_seconds: float | None = None, max_sample_rate: int | None = None,
                 max_channels: int | None = None) -> None:
    """Raise :class:`ClipError` naming the limit when the header ``info`` asks for more decode work than allowed.

    ``max_sample_rate`` in Hz, ``max_channels`` a count, ``max_seconds`` in
    seconds (with 1 % + 1 s of slack); None = no limit.
    """
    if max_sample_rate is not None and info.sample_rate > max_sample_rate:
        raise ClipError(f"sample rate of {info.sample_rate} Hz is above the limit of {max_sample_rate} Hz")
    if max_channels is not None and info.channels > max_channels:
        raise ClipError(f"audio of {info.channels} channels is above the limit of {max_channels} channels")
    if max_seconds is not None and _too_long(info.duration, max_seconds):
        raise ClipError(f"audio of {info.duration:.0f} s is longer than the limit of {max_seconds:.0f} s")


def decode_file(path: str | os.PathLike[str], specs: Mapping[str, FeatureSpec], *,
                max_seconds: float | None = None, max_sample_rate: int | None = None,
                max_channels: int | None = None, picture: tuple[str, tuple[float, float]] | None = None,
                block_seconds: float = 60.0, digest: str | None = None) -> DecodedClip:
    """Decode ``path`` with ``specs`` (the checkpoint's, in its feature order) into a :class:`DecodedClip`.

    ``max_seconds`` (s), ``max_sample_rate`` (Hz), ``max_channels``: refuse
    files whose header asks for more (:func:`check_header`, before any
    decoding; the duration again on the decoded samples); None = no limit.
    ``picture``: ``(feature name, dB limits)`` of the part to draw as a PNG;
    ``digest``: the content hash if the caller has it.  Raises
    :class:`ClipError` with the reason.
    """
    try:
        if max_seconds is not None or max_sample_rate is not None or max_channels is not None:
            check_header(probe(path), max_seconds=max_seconds, max_sample_rate=max_sample_rate,
                         max_channels=max_channels)
        result = stored_features(path, specs, block_seconds=block_seconds)
    except AudioError as e:
        raise ClipError(e.reason) from None
    except MemoryError:
        raise ClipError("out of memory while decoding") from None
    except ClipError:
        raise
    except Exception as e:  # a decoder bug on one odd file must not cost the others
        raise ClipError(f"decode failed: {type(e).__name__}: {e}".splitlines()[0]) from None
    if max_seconds is not None and _too_long(result.duration, max_seconds):
        raise ClipError(f"audio of {result.duration:.0f} s is longer than the limit of {max_seconds:.0f} s")
    features = stack_parts([result.arrays[name] for name in specs])
    image = None
    if picture is not None:
        name, limits = picture
        lo = sum(specs[k].n_bins for k in list(specs)[:list(specs).index(name)])
        image = mel_picture(features[lo:lo + specs[name].n_bins], limits)
    return DecodedClip(features, float(result.duration), digest or content_hash(path), image)


def decode_bytes(data: bytes, specs: Mapping[str, FeatureSpec], *, max_seconds: float | None = None,
                 max_sample_rate: int | None = None, max_channels: int | None = None,
                 picture: tuple[str, tuple[float, float]] | None = None,
                 block_seconds: float = 60.0) -> DecodedClip:
    """:func:`decode_file` of an upload's bytes (same limits), through a private temporary file deleted afterwards."""
    if not data:
        raise ClipError("empty file")
    fd, tmp = tempfile.mkstemp(prefix="specstore-upload-", suffix=".audio")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return decode_file(tmp, specs, max_seconds=max_seconds, max_sample_rate=max_sample_rate,
                           max_channels=max_channels, picture=picture, block_seconds=block_seconds,
                           digest=digest_bytes(data))
    finally:
        os.unlink(tmp)


def decode_or_reason(path: str, specs: Mapping[str, FeatureSpec], digest: str, *, max_seconds: float | None = None,
                     max_sample_rate: int | None = None, max_channels: int | None = None) -> DecodedClip | str:
    """:func:`decode_file` (same limits), or the one-line reason it failed (for worker pools: no exception to ship)."""
    try:
        return decode_file(path, specs, digest=digest, max_seconds=max_seconds, max_sample_rate=max_sample_rate,
                           max_channels=max_channels)
    except ClipError as e:
        return str(e)


def warm_up() -> int:
    """Run once in each new decode worker: the decode stack is imported before the first file arrives."""
    import librosa.filters  # noqa: F401  (what the feature plans build on)

    return 0
