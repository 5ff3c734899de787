"""Decoding through PyAV (FFmpeg) for the files soundfile cannot open: m4a/AAC, WMA and the like.

libsndfile reads WAV, AIFF, FLAC, Ogg (Vorbis, Opus) and MP3; it has no
decoder for AAC or WMA.  :func:`specstore.pipeline.audio.stream_mono` and
:func:`specstore.pipeline.audio.probe` try soundfile first and come here only when it
cannot open a file, so every file soundfile reads decodes exactly as before.
FFmpeg opens only local files in the containers of :data:`ALLOWED_DEMUXERS`.
PyAV is optional (the ``formats`` extra; its wheels carry their own FFmpeg):
without it, :func:`missing_reason` is the one line such a file is refused with.

:class:`AvReader` yields ``(frames, channels)`` float32 blocks, the shape
``soundfile.SoundFile.read(always_2d=True)`` gives, so the mono mix-down and
resampling downstream are the same code for both backends (and a store's
features equal ``specstore classify``'s for the same file).

Lengths: containers that state the stream's length in their header
(:data:`EXACT_CONTAINERS`: MP4/M4A, ASF/WMA, AIFF, CAF, Matroska) are held
to it as the soundfile path holds FLAC to STREAMINFO: audio past the
declared length (codec padding, e.g. AAC's last frame) is cut; more than
:data:`AV_END_SLACK` frames past it stops the decode with "longer than
declared" (so the header's length bounds the decode work a server does);
fewer than the declared length less that slack is "truncated".  Elsewhere
(raw ADTS AAC) FFmpeg estimates the length from the bit rate: no file is
called truncated on an estimate, and the decode stops with "longer than
declared" only past twice the estimate plus :data:`ESTIMATE_SLACK_SECONDS`.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import numpy as np

from .audio_types import AV_EXTENSIONS, AudioInfo
from .errors import AudioError, Unrecognised

__all__ = ["ALLOWED_DEMUXERS", "AV_END_SLACK", "AV_EXTENSIONS", "EXACT_CONTAINERS", "INSTALL_HINT", "AvReader",
           "Unrecognised", "available", "missing_reason"]

#: What to run to get the optional backend (the ``formats`` extra).
INSTALL_HINT = "pip install 'specstore[formats]'"
#: FFmpeg demuxers whose header states the stream length (not an estimate), and how a reason names them.
EXACT_CONTAINERS = {"mov,mp4,m4a,3gp,3g2,mj2": "MP4", "asf": "ASF", "aiff": "AIFF", "caf": "CAF",
                    "matroska,webm": "Matroska"}
#: The only FFmpeg demuxers PyAV may open a file with, and the only protocol (a local file).  FFmpeg
#: probes any of its ~300 formats otherwise: an HLS or concat playlist would make it read other files of
#: the machine (or URLs) as the clip's audio.
ALLOWED_DEMUXERS = ("mov", "asf", "aac", "aiff", "caf", "matroska", "wav", "w64", "flac", "ogg", "mp3")
_OPEN_OPTIONS = {"format_whitelist": ",".join(ALLOWED_DEMUXERS), "protocol_whitelist": "file"}
#: Sample frames a stream may decode past or short of its declared length before it is called longer
#: than declared or truncated: two AAC/WMA frames and ASF's millisecond rounding.
AV_END_SLACK = 8192
#: Where the length is an estimate: seconds on top of twice the estimate before "longer than declared".
ESTIMATE_SLACK_SECONDS = 10.0

#: libsndfile's float normalisation of integer samples (soundfile reads ints to float32 the same way).
_INT_SCALE = {"s16": 1 / 32768, "s16p": 1 / 32768, "s32": 1 / 2**31, "s32p": 1 / 2**31, "s64": 1 / 2**63,
              "s64p": 1 / 2**63}


def available() -> bool:
    """Whether PyAV can be imported (without importing it)."""
    return importlib.util.find_spec("av") is not None


def missing_reason(ext: str) -> str:
    """The one line a file soundfile cannot open is refused with when PyAV is not installed."""
    what = f"{ext} files" if ext else "files soundfile cannot read"
    return f"{what} need the optional PyAV decoder, which is not installed: {INSTALL_HINT}"


def _message(exc: BaseException) -> str:
    """FFmpeg's reason, without the path or the C function PyAV appends."""
    msg = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(msg).split())


def _to_float32(frame: Any, channels: int) -> np.ndarray:
    """A decoded frame as ``(frames, channels)`` float32, integers scaled as libsndfile scales them."""
    arr = frame.to_ndarray()
    fmt = frame.format.name
    arr = arr.T if frame.format.is_planar else arr.reshape(-1, channels)
    if arr.dtype == np.float32:
        return arr
    if fmt in ("u8", "u8p"):
        return (arr.astype(np.float32) - np.float32(128)) * np.float32(1 / 128)
    if fmt in _INT_SCALE:
        return arr.astype(np.float32) * np.float32(_INT_SCALE[fmt])
    return arr.astype(np.float32)


class AvReader:
    """One file open through PyAV: :attr:`info` from its header, :meth:`blocks` to decode it.

    Raises :class:`Unrecognised` when FFmpeg cannot open the file or finds no
    sample rate in it, :class:`AudioError` when it holds no audio stream.  Use
    as a context manager (closes the container).
    """

    def __init__(self, path: str) -> None:
        import av  # optional: only files soundfile cannot open come here

        self.path = path
        self._av = av
        try:
            self._container = av.open(path, metadata_errors="replace", options=_OPEN_OPTIONS)
        except (av.FFmpegError, OSError, ValueError) as exc:
            raise Unrecognised(f"not an audio file: {_message(exc)}", path) from None
        try:
            self._stream = self._container.streams.audio[0]
        except IndexError:
            self._container.close()
            raise AudioError("not an audio file: no audio stream", path) from None
        for other in self._container.streams:
            if other is not self._stream:
                other.discard = av.stream.Discard.all  # a video track is demuxed past, never decoded
        name = self._container.format.name
        self.exact = name in EXACT_CONTAINERS
        ctx = self._stream.codec_context
        rate = int(ctx.sample_rate or self._stream.rate or 0)
        if rate <= 0 or int(ctx.channels) <= 0:
            self._container.close()
            raise Unrecognised(f"not an audio file: {rate} Hz, {int(ctx.channels)} channels", path)
        self.declared = self._declared(rate)
        kind = EXACT_CONTAINERS.get(name, name.split(",")[0].upper())
        self.info = AudioInfo(sample_rate=rate, channels=int(ctx.channels), n_samples=self.declared,
                              duration=self.declared / rate if rate > 0 else 0.0, format=f"{kind}/{ctx.name}")

    def _declared(self, rate: int) -> int:
        """Sample frames the header declares (exact or estimated), 0 when it says nothing."""
        s = self._stream
        if s.duration is not None and s.time_base is not None:
            return max(round(float(s.duration * s.time_base) * rate), 0)
        if self._container.duration is not None:
            return max(round(self._container.duration * rate / 1_000_000), 0)
        return 0

    def __enter__(self) -> AvReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self._container.close()

    def _limit(self) -> int | None:
        """Decoded sample frames past which the file is longer than declared (None: no declared length)."""
        if self.declared <= 0:
            return None
        if self.exact:
            return self.declared + AV_END_SLACK
        return 2 * self.declared + int(ESTIMATE_SLACK_SECONDS * self.info.sample_rate)

    def _frames(self) -> Iterator[np.ndarray]:
        """Each decoded frame as ``(frames, channels)`` float32; decoder failures are :class:`AudioError`."""
        av, info, n = self._av, self.info, 0
        try:
            for frame in self._container.decode(self._stream):
                if frame.sample_rate != info.sample_rate or frame.layout.nb_channels != info.channels:
                    raise AudioError(f"the stream changes to {frame.layout.nb_channels} channels at "
                                     f"{frame.sample_rate} Hz at frame {n}", self.path)
                block = _to_float32(frame, info.channels)
                n += block.shape[0]
                yield block
        except av.FFmpegError as exc:
            raise AudioError(f"decode failed at frame {n}: {_message(exc)}", self.path) from None

    def blocks(self, block_samples: int) -> Iterator[np.ndarray]:
        """Decode to ``(frames, channels)`` float32 blocks of about ``block_samples`` frames (the last shorter).

        Cut at the declared length where it is exact; raises :class:`AudioError`
        "longer than declared" as soon as the decode passes the limit (see the
        module docstring), and "truncated" at the end when an exact length is
        not met.  :attr:`decoded` counts the frames handed out.
        """
        limit, keep = self._limit(), (self.declared if self.exact and self.declared > 0 else None)
        pending: list[np.ndarray] = []
        held = total = 0
        self.decoded = 0
        for block in self._frames():
            total += block.shape[0]
            if limit is not None and total > limit:
                raise AudioError(self._longer_reason(total), self.path)
            if keep is not None:
                block = block[: max(keep - (total - block.shape[0]), 0)]
            if block.shape[0]:
                pending.append(block)
                held += block.shape[0]
            if held >= block_samples:
                yield self._take(pending)
                pending, held = [], 0
        if pending:
            yield self._take(pending)
        if self.exact and 0 < total + AV_END_SLACK < self.declared:
            head = EXACT_CONTAINERS[self._container.format.name]
            raise AudioError(f"truncated: the {head} header declares {self.declared} samples, {total} decoded",
                             self.path)

    def _take(self, pending: list[np.ndarray]) -> np.ndarray:
        out = pending[0] if len(pending) == 1 else np.concatenate(pending)
        self.decoded += out.shape[0]
        return np.ascontiguousarray(out)

    def _longer_reason(self, total: int) -> str:
        how = "declares" if self.exact else "estimates"
        return (f"longer than declared: the {self.info.format.split('/')[0]} header {how} {self.declared} samples "
                f"({self.info.duration:.2f} s), {total} decoded so far")
