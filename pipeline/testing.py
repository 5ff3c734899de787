"""Test audio for tests and benchmarks, generated on the fly: tones, music-like signals, bad files.

A reusable testing module (as ``zarr.testing`` is for zarr): the project's
tests and benchmarks use it, and so can anyone testing code built on
specstore: ``from pipeline.testing import write_music_like``.
Every writer takes the destination path first and returns it as a
:class:`pathlib.Path`; the format follows the suffix (``.wav``, ``.flac``,
``.ogg`` = Vorbis, ``.mp3``) unless ``fmt`` says otherwise.  Signals are
deterministic for a given seed.  :func:`write_with_av` writes the formats soundfile
cannot (AAC in ``.m4a``, WMA, ...) with PyAV's encoders (the optional
``formats`` extra).  Long files are synthesised and written in
blocks, so making a ten-minute file does not need ten minutes of samples in
memory.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import soundfile as sf

__all__ = [
    "music_like",
    "write_tone",
    "write_music_like",
    "write_empty",
    "write_text_as_wav",
    "write_zero_length_wav",
    "write_short_wav",
    "write_truncated_wav",
    "write_truncated_mp3",
    "write_corrupt_flac",
    "AV_FORMATS",
    "write_with_av",
    "write_truncated_m4a",
]

# suffix -> (soundfile format, subtype)
_FORMATS: dict[str, tuple[str, str]] = {
    "wav": ("WAV", "PCM_16"),
    "flac": ("FLAC", "PCM_16"),
    "ogg": ("OGG", "VORBIS"),
    "mp3": ("MP3", "MPEG_LAYER_III"),
}

PathLike = str | os.PathLike[str]


def _format_for(path: Path, fmt: str | None, subtype: str | None) -> tuple[str, str | None]:
    key = (fmt or path.suffix.lstrip(".")).lower()
    if key not in _FORMATS:
        raise ValueError(f"unknown audio format {key!r}; use one of {sorted(_FORMATS)}")
    f, st = _FORMATS[key]
    return f, subtype or st


def _write_blocks(path: Path, sr: int, channels: int, fmt: str | None, subtype: str | None, blocks) -> Path:
    f, st = _format_for(path, fmt, subtype)
    path.parent.mkdir(parents=True, exist_ok=True)
    with sf.SoundFile(path, "w", samplerate=sr, channels=channels, format=f, subtype=st) as out:
        for b in blocks:
            out.write(np.clip(b, -0.99, 0.99))
    return path


def write_tone(
    path: PathLike,
    seconds: float,
    sr: int = 22050,
    channels: int = 1,
    fmt: str | None = None,
    *,
    freq: float = 440.0,
    amplitude: float = 0.5,
    subtype: str | None = None,
) -> Path:
    """A steady sine of ``freq`` Hz, ``seconds`` long (channels identical)."""
    n = int(round(seconds * sr))
    t = np.arange(n, dtype=np.float64) / sr
    y = (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.float32)
    return _write_blocks(Path(path), sr, channels, fmt, subtype, [np.repeat(y[:, None], channels, axis=1)])


class _MusicSynth:
    """Block-wise synthesiser of a music-like signal: harmonic notes with
    attack/decay envelopes, per-note stereo pan, percussive noise bursts and a
    low noise floor.  Broadband (energy from ~30 Hz up to Nyquist), so every
    mel and CQT bin sees signal."""

    max_note = 2.5  # seconds

    def __init__(self, sr: int, channels: int, seed: int) -> None:
        self.sr = sr
        self.channels = channels
        self.rng = np.random.default_rng(seed)
        self.carry = np.zeros((0, channels), dtype=np.float64)

    def block(self, start: int, n: int) -> np.ndarray:
        """Samples ``[start, start + n)`` as float32 ``(n, channels)``."""
        sr, rng, ch = self.sr, self.rng, self.channels
        span = n + int(self.max_note * sr) + 1
        buf = np.zeros((span, ch), dtype=np.float64)
        buf[: self.carry.shape[0]] += self.carry
        n_notes = rng.poisson(2.5 * n / sr) + 1
        for _ in range(n_notes):
            on = int(rng.integers(0, n))
            dur = rng.uniform(0.15, self.max_note)
            m = int(dur * sr)
            t = np.arange(m) / sr
            env = np.minimum(t / 0.01, 1.0) * np.exp(-t / (0.3 * dur))
            f0 = 32.7 * 2.0 ** (rng.integers(0, 72) / 12.0)
            amp = rng.uniform(0.04, 0.15)
            note = np.zeros(m)
            for h in range(1, 7):
                if f0 * h < 0.45 * sr:
                    note += np.sin(2 * np.pi * f0 * h * t + rng.uniform(0, 2 * np.pi)) / h
            note *= amp * env
            pan = rng.uniform(0.2, 0.8, size=ch) if ch > 1 else np.ones(1)
            buf[on : on + m] += note[:, None] * pan[None, :]
        n_hits = rng.poisson(1.5 * n / sr)
        for _ in range(n_hits):
            on = int(rng.integers(0, n))
            m = int(0.12 * sr)
            hit = rng.standard_normal((m, ch)) * rng.uniform(0.02, 0.1)
            hit *= np.exp(-np.arange(m) / (0.02 * sr))[:, None]
            buf[on : on + m] += hit
        buf[:n] += 0.002 * rng.standard_normal((n, ch))
        self.carry = buf[n:].copy()
        return buf[:n].astype(np.float32)


def music_like(seconds: float, seed: int = 0, sr: int = 22050, channels: int = 1) -> np.ndarray:
    """A music-like float32 signal ``(n_samples, channels)``, peak below 1."""
    n = int(round(seconds * sr))
    synth = _MusicSynth(sr, channels, seed)
    step = 10 * sr
    parts = [synth.block(s, min(step, n - s)) for s in range(0, n, step)]
    y = np.concatenate(parts) if parts else np.zeros((0, channels), np.float32)
    return np.clip(y, -0.99, 0.99)


def write_music_like(
    path: PathLike,
    seconds: float,
    seed: int = 0,
    sr: int = 22050,
    channels: int = 1,
    format: str | None = None,  # noqa: A002 - name fixed by the shared helper API
    *,
    subtype: str | None = None,
    loop_seconds: float | None = None,
) -> Path:
    """Write :func:`music_like` audio (generated and written in 10 s blocks).

    ``loop_seconds`` makes long files cheap: that much is synthesised once
    and repeated (each repeat with its own gain and polarity) until
    ``seconds`` are written.
    """
    n = int(round(seconds * sr))
    synth = _MusicSynth(sr, channels, seed)
    step = 10 * sr
    if loop_seconds is None:
        blocks = (synth.block(s, min(step, n - s)) for s in range(0, n, step))
    else:
        loop = music_like(loop_seconds, seed=seed, sr=sr, channels=channels)
        gains = np.random.default_rng(seed + 1).uniform(0.5, 1.0, size=n // max(len(loop), 1) + 1)
        signs = np.where(np.arange(gains.size) % 2, -1.0, 1.0)
        blocks = (
            (loop[: min(len(loop), n - s)] * np.float32(g * sgn))
            for s, g, sgn in zip(range(0, n, len(loop)), gains, signs, strict=False)
        )
    return _write_blocks(Path(path), sr, channels, format, subtype, blocks)


# ---------------------------------------------------------------- bad files


def write_empty(path: PathLike) -> Path:
    """A zero-byte file."""
    p = Path(path)
    p.write_bytes(b"")
    return p


def write_text_as_wav(path: PathLike) -> Path:
    """A text file wearing a ``.wav`` name."""
    p = Path(path)
    p.write_text("this is not audio, just text that someone renamed\n" * 20)
    return p


def write_zero_length_wav(path: PathLike, sr: int = 22050, channels: int = 1) -> Path:
    """A valid WAV header with zero sample frames."""
    p = Path(path)
    sf.write(p, np.zeros((0, channels), dtype=np.float32), sr, format="WAV", subtype="PCM_16")
    return p


def write_short_wav(path: PathLike, n_samples: int = 1000, sr: int = 22050, channels: int = 1) -> Path:
    """A valid WAV of ``n_samples`` frames of a 440 Hz tone (shorter than one 2048 frame by default)."""
    p = Path(path)
    t = np.arange(n_samples) / sr
    y = (0.5 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    sf.write(p, np.repeat(y[:, None], channels, axis=1), sr, format="WAV", subtype="PCM_16")
    return p


def _truncate(p: Path, keep_fraction: float) -> Path:
    data = p.read_bytes()
    p.write_bytes(data[: max(1, int(len(data) * keep_fraction))])
    return p


def write_truncated_wav(path: PathLike, seconds: float = 3.0, sr: int = 22050, keep_fraction: float = 0.5) -> Path:
    """A music-like WAV whose bytes are cut at ``keep_fraction`` (header claims more frames)."""
    p = write_music_like(Path(path), seconds, seed=7, sr=sr, format="wav")
    return _truncate(p, keep_fraction)


def write_truncated_mp3(path: PathLike, seconds: float = 3.0, sr: int = 22050, keep_fraction: float = 0.5) -> Path:
    """A music-like MP3 whose bytes are cut at ``keep_fraction``."""
    p = write_music_like(Path(path), seconds, seed=8, sr=sr, format="mp3")
    return _truncate(p, keep_fraction)


def write_corrupt_flac(path: PathLike, seconds: float = 3.0, sr: int = 22050) -> Path:
    """A FLAC with a valid header and garbage bytes in the middle of its frames (decode fails)."""
    p = write_music_like(Path(path), seconds, seed=9, sr=sr, format="flac")
    data = bytearray(p.read_bytes())
    mid = len(data) // 2
    junk = np.random.default_rng(1).integers(0, 256, size=min(2000, len(data) // 4), dtype=np.uint8)
    data[mid : mid + junk.size] = junk.tobytes()
    p.write_bytes(bytes(data))
    return p


#: suffix -> (FFmpeg encoder, FFmpeg muxer) of :func:`write_with_av`.
AV_FORMATS: dict[str, tuple[str, str]] = {
    "m4a": ("aac", "ipod"),
    "aac": ("aac", "adts"),
    "wma": ("wmav2", "asf"),
    "aiff": ("pcm_s16be", "aiff"),
}


def write_with_av(path: PathLike, samples: np.ndarray, sr: int, *, codec: str | None = None,
                  container: str | None = None, bit_rate: int = 128_000,
                  options: dict[str, str] | None = None) -> Path:
    """``samples`` (float32 ``(n, channels)`` or 1-D) encoded with PyAV: encoder and muxer from the suffix.

    ``codec``/``container`` override :data:`AV_FORMATS`; ``bit_rate`` in
    bits/s for lossy codecs; ``options`` go to the muxer (e.g.
    ``{"movflags": "faststart"}`` puts an MP4's index first).  Raises
    ``ValueError`` for an unknown suffix, PyAV's errors when the bundled
    FFmpeg cannot encode it.
    """
    import fractions

    import av

    p = Path(path)
    enc, mux = AV_FORMATS.get(p.suffix.lstrip(".").lower(), (None, None))
    enc, mux = codec or enc, container or mux
    if enc is None:
        raise ValueError(f"unknown format for {p.name}; use one of {sorted(AV_FORMATS)} or pass codec/container")
    x = np.asarray(samples, dtype=np.float32)
    x = x[:, None] if x.ndim == 1 else x
    layout = {1: "mono", 2: "stereo"}[x.shape[1]]
    p.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(p), "w", format=mux, options=options or {}) as out:
        stream = out.add_stream(enc, rate=sr, layout=layout)
        assert isinstance(stream, av.AudioStream)
        stream.bit_rate = bit_rate
        fmt = (stream.codec_context.codec.audio_formats or [av.AudioFormat("fltp")])[0].name
        stream.format = fmt
        stream.codec_context.open()  # frame_size is known once the encoder is open
        resampler = av.AudioResampler(format=fmt, layout=layout, rate=sr,
                                      frame_size=stream.codec_context.frame_size or None)
        frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(x.T), format="fltp", layout=layout)
        frame.sample_rate, frame.pts, frame.time_base = sr, 0, fractions.Fraction(1, sr)
        for f in [*resampler.resample(frame), *resampler.resample(None)]:
            out.mux(stream.encode(f))
        out.mux(stream.encode(None))
    return p


def write_truncated_m4a(path: PathLike, seconds: float = 2.0, sr: int = 22050, keep_fraction: float = 0.5, *,
                        index_first: bool = True) -> Path:
    """A music-like AAC ``.m4a`` whose bytes are cut at ``keep_fraction``.

    ``index_first``: the MP4 index (``moov``) precedes the audio, so the cut
    file opens and declares more audio than it holds; otherwise the index,
    written last, is lost and the file does not open at all.
    """
    opts = {"movflags": "faststart"} if index_first else None
    p = write_with_av(path, music_like(seconds, seed=10, sr=sr), sr, options=opts)
    return _truncate(p, keep_fraction)
