"""Streaming audio decode: one file, block by block, to mono float32 at a target rate.

The pipeline never holds a whole decoded file: :func:`stream_mono` reads a
bounded block of sample frames with soundfile, averages the channels
(:mod:`specstore.pipeline.mixdown`), and
pushes the block through a streaming soxr resampler, so memory stays constant
however long the file is.  The concatenated output equals
``librosa.load(path, sr=target_sr, mono=True)`` (librosa 0.11, default
``res_type="soxr_hq"``): soundfile decodes to float32 the same way, the channel
mean is the same float32 arithmetic, streaming soxr is sample-identical to
``soxr.resample`` and the final length is fixed to ``ceil(n * target/native)``
samples exactly as ``librosa.resample`` does.

Files soundfile cannot open (m4a/AAC, WMA: libsndfile has no decoder for
them) are decoded through PyAV when it is installed (:mod:`specstore.pipeline.decode_av`,
the ``formats`` extra) into the same mix-down and resampler; files soundfile
reads never go there.

Every way a file can fail to yield audio raises :class:`AudioError` whose
``reason`` is one short human line (what a CLI prints next to the path).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator

import numpy as np
import soundfile as sf
import soxr

from . import decode_av, mixdown
from .audio_types import AV_EXTENSIONS, SOUNDFILE_EXTENSIONS, AudioInfo
from .errors import AudioError
from .integrity import audio_after, mp3_declares_frames, truncation_reason

__all__ = ["AudioError", "AudioInfo", "SOUNDFILE_EXTENSIONS", "StreamResampler", "probe", "readable_extensions",
           "stream_mono", "DEFAULT_BLOCK_SAMPLES"]


#: Source sample frames decoded per soundfile read (1.5 s at 44.1 kHz; 512 KiB
#: of float32 stereo).  Large enough that per-call overhead is negligible,
#: small enough to stay in cache-friendly territory.
DEFAULT_BLOCK_SAMPLES = 65536

#: soxr quality that librosa 0.11's default ``res_type="soxr_hq"`` selects.
_SOXR_QUALITY = "HQ"

#: Sample frames an Ogg stream may decode short of its last page's granule position without being
#: called truncated: one long Vorbis block (8192; an Opus packet is at most 5760), for encoders that
#: round the end.  FLAC's STREAMINFO count is exact; an MP3 without a Xing frame count declares an
#: estimate (not compared).
OGG_END_SLACK = 8192
#: The same for an MP3 whose Xing header counts its frames: two frames of 1152 samples.
MP3_END_SLACK = 2304


def _sf_message(exc: BaseException) -> str:
    """The useful part of a soundfile/libsndfile error, on one line."""
    msg = getattr(exc, "error_string", None) or str(exc)
    return " ".join(str(msg).split()) or type(exc).__name__


def _check_path(path: str) -> None:
    """Raise :class:`AudioError` for paths that are not readable regular, non-empty files."""
    if os.path.islink(path) and not os.path.exists(path):
        raise AudioError("broken symlink", path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise AudioError("file not found", path) from None
    except PermissionError:
        raise AudioError("unreadable: permission denied", path) from None
    except OSError as exc:
        raise AudioError(f"unreadable: {exc.strerror or exc}", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise AudioError("unreadable: is a directory", path)
    if not stat.S_ISREG(st.st_mode):
        # FIFOs, sockets and devices could block or never end.
        raise AudioError("unreadable: not a regular file", path)
    if st.st_size == 0:
        raise AudioError("empty file", path)
    try:
        # soundfile reports a permission problem as an opaque libsndfile
        # error; opening once ourselves gives the real reason.
        with open(path, "rb"):
            pass
    except PermissionError:
        raise AudioError("unreadable: permission denied", path) from None
    except OSError as exc:
        raise AudioError(f"unreadable: {exc.strerror or exc}", path) from None


def _open(path: str, fd: int) -> sf.SoundFile:
    """soundfile's reader of ``path`` through its descriptor ``fd`` (checked already); failures are
    :class:`AudioError`."""
    try:
        return sf.SoundFile(fd, closefd=False)
    except sf.LibsndfileError as exc:
        raise AudioError(f"not an audio file: {_sf_message(exc)}", path) from None
    except (sf.SoundFileError, RuntimeError, ValueError, TypeError) as exc:
        raise AudioError(f"not an audio file: {_sf_message(exc)}", path) from None
    except PermissionError:
        raise AudioError("unreadable: permission denied", path) from None
    except OSError as exc:
        raise AudioError(f"unreadable: {exc.strerror or exc}", path) from None


def readable_extensions() -> frozenset[str]:
    """The file extensions this install decodes (lower case, with the dot): soundfile's, and PyAV's when the
    ``formats`` extra is installed (:mod:`specstore.pipeline.decode_av`)."""
    return SOUNDFILE_EXTENSIONS | (AV_EXTENSIONS if decode_av.available() else frozenset())


def _open_fd(path: str) -> int:
    """A read-only descriptor of ``path``, checked first (:func:`_check_path`); failures are :class:`AudioError`."""
    _check_path(path)
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise AudioError(f"unreadable: {exc.strerror or exc}", path) from None


def _open_any(path: str, fd: int) -> sf.SoundFile | decode_av.AvReader:
    """soundfile's reader of ``path`` through its descriptor ``fd``, or PyAV's where soundfile cannot open it
    (:mod:`specstore.pipeline.decode_av`).

    soundfile reads through the descriptor, so libsndfile judges the bytes
    alone, never the name (given a path, it takes ``.mp3`` as a hint, runs
    libmpg123 over a text file and calls it "File does not exist or is not
    a regular file").  When both refuse, the reason is soundfile's unless
    FFmpeg opened a container it knows (then its own: "no audio stream"),
    so a file that is not audio has one reason whatever its name, in a
    store, a classify run or an upload.  Without PyAV installed, a file
    soundfile cannot open is refused with a reason naming the extra to
    install (unless its extension is soundfile's).
    """
    try:
        return _open(path, fd)
    except AudioError as exc:
        if not exc.reason.startswith("not an audio file"):
            raise
        refused = exc
    ext = os.path.splitext(path)[1].lower()
    if not decode_av.available():
        if ext in SOUNDFILE_EXTENSIONS:
            raise refused
        if ext in AV_EXTENSIONS:
            raise AudioError(decode_av.missing_reason(ext), path)
        raise AudioError(f"{refused.reason} ({decode_av.missing_reason('')})", path)
    try:
        return decode_av.AvReader(path)
    except decode_av.Unrecognised:
        raise refused from None


def probe(path: str | os.PathLike[str]) -> AudioInfo:
    """Read a file's header (no decoding): rate, channels, length, format.

    Raises :class:`AudioError` for missing, unreadable, empty or non-audio
    files.  A header that claims zero frames is *not* an error here (MP3
    lengths are estimates); :func:`stream_mono` decides from the samples.
    Files soundfile cannot open are read through PyAV when it is installed.
    """
    p = os.fspath(path)
    fd = _open_fd(p)
    try:
        reader = _open_any(p, fd)
        if isinstance(reader, decode_av.AvReader):
            with reader:
                return reader.info
        with reader as f:
            sr = int(f.samplerate)
            n = max(int(f.frames), 0)
            return AudioInfo(sample_rate=sr, channels=int(f.channels), n_samples=n,
                             duration=n / sr if sr > 0 else 0.0, format=f"{f.format}/{f.subtype}")
    finally:
        os.close(fd)


_EMPTY = np.zeros(0, dtype=np.float32)
_EMPTY.setflags(write=False)


class StreamResampler:
    """Streaming soxr resampler whose total output is ``librosa.resample``'s.

    ``librosa.resample(y, orig_sr, target_sr, res_type="soxr_hq", scale=scale)``
    runs ``soxr.resample`` on the whole signal, fixes the length to
    ``ceil(len(y) * target_sr / orig_sr)`` (zero padding) and, when ``scale``,
    divides by ``sqrt(target_sr / orig_sr)``.  Streaming soxr is
    sample-identical to the one-shot call whatever the chunking, so feeding
    :meth:`push` chunk by chunk and ending with :meth:`finish` yields the same
    samples with constant memory.  The last output chunk is held back until
    the next one arrives so the final length can be fixed without recalling
    samples already handed out.
    """

    def __init__(self, orig_sr: float, target_sr: float, *, scale: bool = False) -> None:
        self._rs = soxr.ResampleStream(orig_sr, target_sr, 1, dtype="float32", quality=_SOXR_QUALITY)
        self._ratio = float(target_sr) / orig_sr
        self._scale = np.sqrt(self._ratio) if scale else None  # a float64, as librosa divides by
        self._held: np.ndarray | None = None
        self.n_in = 0  # samples pushed
        self.n_out = 0  # samples returned

    def _release(self, y: np.ndarray) -> np.ndarray:
        if self._scale is not None and y.shape[0]:
            y /= self._scale
        self.n_out += y.shape[0]
        return y

    def push(self, x: np.ndarray) -> np.ndarray:
        """Feed 1-D float32 samples; returns the output now ready (may be empty)."""
        self.n_in += x.shape[0]
        y = self._rs.resample_chunk(np.ascontiguousarray(x, dtype=np.float32))
        if y.shape[0] == 0:
            return _EMPTY
        ready, self._held = self._held, y
        return _EMPTY if ready is None else self._release(ready)

    def finish(self) -> np.ndarray:
        """Flush: the remaining output, padded or cut so the total is ``ceil(n_in * ratio)``."""
        parts = [] if self._held is None else [self._held]
        self._held = None
        parts.append(self._rs.resample_chunk(np.zeros(0, dtype=np.float32), last=True))
        tail = np.concatenate(parts)
        expected = int(np.ceil(self.n_in * self._ratio))  # as librosa.resample computes it
        want = expected - self.n_out
        if want < 0:  # soxr rounds its length, never exceeding the ceiling; guard anyway
            raise RuntimeError(f"resampler produced {self.n_out} samples, more than {expected}")
        if tail.shape[0] >= want:
            tail = tail[:want]
        else:
            tail = np.concatenate([tail, np.zeros(want - tail.shape[0], dtype=np.float32)])
        return self._release(tail)


def stream_mono(
    path: str | os.PathLike[str],
    target_sr: int,
    *,
    block_samples: int = DEFAULT_BLOCK_SAMPLES,
    backend: str = "auto",
) -> Iterator[np.ndarray]:
    """Decode ``path`` to mono float32 at ``target_sr`` Hz, one block at a time.

    Reads ``block_samples`` source frames per step (memory does not grow with
    file length), averages channels, resamples with a streaming soxr
    resampler at librosa's default quality, and yields non-empty 1-D float32
    arrays of varying length.  Their concatenation has exactly
    ``ceil(n_source * target_sr / source_sr)`` samples and equals
    ``librosa.load(path, sr=target_sr, mono=True)[0]``.

    Decoders read a truncated file up to where it breaks off without an
    error; a file whose container declares more audio than it holds (see
    :mod:`specstore.pipeline.integrity`; FLAC, Ogg and an MP3's Xing frame count
    checked against the decoded sample count at the end) raises :class:`AudioError` with a
    "truncated: ..." reason, so a half-copied file never enters the store as
    a shorter clip.  libsndfile never decodes past the frame count its header
    declares, so a header that declares *less* than the file holds would make
    a shorter clip silently: when the decoder stopped before the end of the
    file and an Ogg page, FLAC frame or MPEG audio frame follows where it
    stopped (:func:`specstore.pipeline.integrity.audio_after`), this raises with a
    "longer than declared: ..." reason.  Also raises for files that cannot be
    opened, decode errors (with the frame where they hit), non-finite
    samples, and files with no samples at all.

    ``backend``: ``"auto"`` (soundfile; PyAV only where soundfile cannot
    open the file, see :mod:`specstore.pipeline.decode_av`), or ``"pyav"`` to decode
    through PyAV whatever the file (the benchmarks compare the two on the
    formats both read).  A PyAV decode gets the same mix-down and
    resampling; its length checks are :class:`specstore.pipeline.decode_av.AvReader`'s.
    """
    if backend not in ("auto", "pyav"):
        raise ValueError(f"backend must be 'auto' or 'pyav', not {backend!r}")
    if target_sr <= 0 or int(target_sr) != target_sr:
        raise ValueError(f"target_sr must be a positive integer (Hz), not {target_sr!r}")
    if block_samples <= 0:
        raise ValueError(f"block_samples must be positive, not {block_samples!r}")
    p = os.fspath(path)
    fd = _open_fd(p)
    try:
        if backend == "pyav":
            with decode_av.AvReader(p) as reader:
                yield from _stream_av(reader, int(target_sr), block_samples)
        else:
            yield from _stream_fd(p, fd, int(target_sr), block_samples)
    finally:
        os.close(fd)


class _Mono:
    """Decoded ``(frames, channels)`` blocks -> mono float32 at ``target_sr``: the step both decoders share."""

    def __init__(self, path: str, native_sr: int, target_sr: int) -> None:
        if native_sr <= 0:
            raise AudioError(f"not an audio file: sample rate {native_sr}", path)
        self.path = path
        self.resampler = None if native_sr == target_sr else StreamResampler(native_sr, target_sr)
        self.n_in = 0  # source frames decoded

    def push(self, block: np.ndarray) -> np.ndarray:
        """Mix ``block`` down, check it is finite, resample; the output now ready (may be empty)."""
        mono = mixdown.downmix(block)
        if not np.isfinite(np.add.reduce(mono)):
            raise AudioError(f"non-finite samples (NaN or inf) in frames {self.n_in}..{self.n_in + len(mono)}",
                             self.path)
        self.n_in += block.shape[0]
        return mono if self.resampler is None else self.resampler.push(mono)

    def finish(self) -> np.ndarray:
        """The resampler's tail (empty without one); "zero-length audio" when nothing was decoded."""
        if self.n_in == 0:
            raise AudioError("zero-length audio", self.path)
        return _EMPTY if self.resampler is None else self.resampler.finish()


def _stream_fd(p: str, fd: int, target_sr: int, block_samples: int) -> Iterator[np.ndarray]:
    """:func:`stream_mono` of ``p`` read through the descriptor ``fd`` (whose offset shows how far it was read)."""
    f = _open_any(p, fd)
    if isinstance(f, decode_av.AvReader):
        with f:
            yield from _stream_av(f, target_sr, block_samples)
        return
    with f:
        try:
            truncated = truncation_reason(p)
        except OSError as exc:
            raise AudioError(f"unreadable: {exc.strerror or exc}", p) from None
        if truncated:
            raise AudioError(truncated, p)
        declared = int(f.frames)
        mono = _Mono(p, int(f.samplerate), target_sr)
        read = mixdown.block_reader(f, block_samples)
        while True:
            try:
                block = read()
            except (sf.SoundFileError, RuntimeError) as exc:
                raise AudioError(f"decode failed at frame {mono.n_in}: {_sf_message(exc)}", p) from None
            if block.shape[0] == 0:
                break
            out = mono.push(block)
            if out.shape[0]:
                yield out
        if mono.n_in:
            reason = _length_reason(f, fd, declared, mono.n_in)
            if reason:
                raise AudioError(reason, p)
        tail = mono.finish()
        if tail.shape[0]:
            yield tail


def _stream_av(reader: decode_av.AvReader, target_sr: int, block_samples: int) -> Iterator[np.ndarray]:
    """:func:`stream_mono` through PyAV: its blocks, the same mix-down and resampling (length checks in the reader)."""
    mono = _Mono(reader.path, reader.info.sample_rate, target_sr)
    for block in reader.blocks(block_samples):
        out = mono.push(block)
        if out.shape[0]:
            yield out
    tail = mono.finish()
    if tail.shape[0]:
        yield tail


def _declares(fmt: str, exact: bool) -> str:
    """How a reason names where the declared length comes from (``exact``: an MP3 with a Xing frame count)."""
    if fmt == "MP3":
        return "the MP3 Xing header declares" if exact else "the MP3 has no Xing frame count; libsndfile estimates"
    return f"the {'Ogg' if fmt == 'OGG' else fmt} header declares"


def _length_reason(f: sf.SoundFile, fd: int, declared: int, decoded: int) -> str | None:
    """Why the ``decoded`` sample frames disagree with the ``declared`` ones of the file open as ``f`` on ``fd``.

    Shorter: FLAC's STREAMINFO count must be met exactly, an Ogg stream's
    last granule position within :data:`OGG_END_SLACK` frames, an MP3's
    Xing frame count (when it has one) within :data:`MP3_END_SLACK`.  Longer
    (libsndfile stopped at the declared count): audio follows the byte where
    the decoder stopped reading.  None when they agree.
    """
    fmt = str(f.format)
    try:
        stopped = os.lseek(fd, 0, os.SEEK_CUR)
        size = os.fstat(fd).st_size
        with open(fd, "rb", closefd=False) as raw:
            exact = fmt == "FLAC" or fmt == "MP3" and mp3_declares_frames(raw)
            slack = {"OGG": OGG_END_SLACK, "MP3": MP3_END_SLACK}.get(fmt, 0)
            header = _declares(fmt, exact)
            if (exact or fmt == "OGG") and decoded + slack < declared:
                return f"truncated: {header} {declared} samples, {decoded} decoded"
            more = None if decoded < declared else audio_after(raw, fmt, stopped, declared)
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"
    if more is None:
        return None
    return (f"longer than declared: {header} {declared} samples ({declared / f.samplerate:.2f} s), "
            f"but more audio follows at byte {more} of {size}")
