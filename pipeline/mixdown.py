"""Mono float32 from decoded sample frames: the channel mean librosa's ``to_mono`` takes, and 16-bit PCM read
as stored.

:func:`downmix` is the mix-down every decoder's blocks go through
(:mod:`specstore.pipeline.audio`).  :func:`read_pcm16` reads 16-bit PCM from an
uncompressed container (WAV, AIFF, AU, ...) as int16 and scales and mixes it
here: libsndfile's own int16 -> float32 conversion costs more than reading
the file, and every step here is exact in float32, so the samples are the
bits of a float32 read (``tests/pipeline/test_audio.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import soundfile as sf

__all__ = ["block_reader", "downmix", "read_pcm16", "reads_pcm16"]


def downmix(block: np.ndarray) -> np.ndarray:
    """Mono float32 from a ``(frames, channels)`` float32 block, as ``np.mean(axis=1)``.

    For one and two channels this is a view or one add: bit-identical to
    librosa's ``to_mono`` (a float32 mean), without its full-buffer checks.
    """
    ch = block.shape[1]
    if ch == 1:
        return block[:, 0]
    if ch == 2:
        mono = np.add(block[:, 0], block[:, 1])
        mono *= np.float32(0.5)  # == / 2 exactly
        return mono
    return block.mean(axis=1, dtype=np.float32)


#: libsndfile's float32 scale for 16-bit PCM (its normalised read divides by 0x8000).
_INT16_SCALE = np.float32(2.0**-15)

#: Uncompressed containers whose 16-bit PCM is read as int16 and scaled here (:func:`read_pcm16`):
#: libsndfile's own int16 -> float32 conversion costs more than the read itself.  FLAC's decoder
#: costs far more than either, so compressed formats keep the float32 read.
_PCM16_CONTAINERS = frozenset({"WAV", "WAVEX", "AIFF", "AU", "W64", "RF64", "CAF"})

#: Frames per int16 read of :func:`read_pcm16` (128 KiB a channel): a block is read in these
#: pieces, so the int16 copy of a whole block is never held beside its float32 mix-down.
_PCM16_PIECE = 65536


def reads_pcm16(f: sf.SoundFile) -> bool:
    """Whether ``f`` is 16-bit PCM in an uncompressed container (read with :func:`read_pcm16`)."""
    return f.subtype == "PCM_16" and f.format in _PCM16_CONTAINERS


def read_pcm16(f: sf.SoundFile, frames: int, piece: np.ndarray) -> np.ndarray:
    """Up to ``frames`` frames of 16-bit PCM ``f`` mixed down to a ``(n, 1)`` float32 block (``n = 0``: the end).

    The samples are read as stored (int16, through ``piece``, a ``(k,
    channels)`` int16 buffer) and scaled by 2**-15 as libsndfile's float32
    read scales them; the mix-down is :func:`downmix`'s.  Every step is
    exact in float32, so the block holds the bits a float32 read and
    :func:`downmix` give, faster on 16-bit PCM (docs/measurements.md).
    """
    if f.seekable():  # as soundfile's own read: no larger than what is left
        frames = max(0, min(frames, f.frames - f.tell()))
    out = np.empty((frames, 1), dtype=np.float32)
    n = 0
    while n < frames:
        got = f.read(min(piece.shape[0], frames - n), dtype="int16", always_2d=True, out=piece)
        k = got.shape[0]
        if not k:
            break
        dst = out[n : n + k, 0]
        if got.shape[1] == 1:
            np.multiply(got[:, 0], _INT16_SCALE, out=dst, dtype=np.float32)
        elif got.shape[1] == 2:
            np.add(got[:, 0], got[:, 1], out=dst, dtype=np.float32)
            dst *= _INT16_SCALE * np.float32(0.5)  # == (a + b) / 2 of the scaled samples, exactly
        else:
            dst[...] = downmix(np.multiply(got, _INT16_SCALE, dtype=np.float32))
        n += k
    return out[:n]


def block_reader(f: sf.SoundFile, block_frames: int) -> Callable[[], np.ndarray]:
    """A function reading ``f``'s next block of up to ``block_frames`` frames (no frames: the end).

    16-bit PCM in an uncompressed container comes mixed down already, ``(n, 1)``, through
    :func:`read_pcm16` and an int16 buffer of its own; any other file is soundfile's float32 read,
    ``(n, channels)``, for :func:`downmix`.
    """
    if not reads_pcm16(f):
        return functools.partial(f.read, block_frames, dtype="float32", always_2d=True)
    piece = np.empty((min(block_frames, _PCM16_PIECE), f.channels), dtype=np.int16)
    return functools.partial(read_pcm16, f, block_frames, piece)
