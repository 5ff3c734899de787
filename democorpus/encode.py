"""From samples to file bytes: libsndfile encoding in blocks, with a fixed Ogg stream serial.

libsndfile seeds an Ogg stream's serial number from the clock; :func:`encode_clip`
rewrites it (and every page's CRC) to a given value, so Ogg files too are
byte-identical across runs.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import numpy.typing as npt
import soundfile as sf

from .errors import DemoCorpusError
from .plan import FORMATS

__all__ = ["encode_clip"]


_WRITE_BLOCK = 65536
"""Frames per write call.  libsndfile 1.2's Vorbis encoder crashes on single writes of ~2.5 M frames."""

_BITREV8 = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))
"""Byte -> the byte with its bits reversed (a ``bytes.translate`` table)."""


def _ogg_crc(page: bytes) -> int:
    """Ogg page CRC (poly 0x04C11DB7, MSB-first, init 0, no final xor) via zlib's reflected CRC-32.

    The MSB-first CRC of data equals the bit-reversed LSB-first CRC of the bit-reversed
    bytes; zlib's init/xor-out of 0xFFFFFFFF cancel out against the CRC of as many zeros.
    """
    rev = page.translate(_BITREV8)
    raw = zlib.crc32(rev) ^ zlib.crc32(bytes(len(rev)))
    return int(f"{raw:032b}"[::-1], 2)


def _set_ogg_serial(data: bytes, serial: int) -> bytes:
    """Rewrite the stream serial number of every Ogg page (and its CRC).

    libsndfile seeds the serial from the clock; a fixed serial makes Ogg files
    byte-identical across runs.  Raises ValueError on data that is not a plain Ogg stream.
    """
    buf = bytearray(data)
    pos = 0
    while pos < len(buf):
        if buf[pos : pos + 4] != b"OggS" or pos + 27 > len(buf):
            raise ValueError(f"not an Ogg page at byte {pos}")
        n_seg = buf[pos + 26]
        end = pos + 27 + n_seg + sum(buf[pos + 27 : pos + 27 + n_seg])
        if end > len(buf):
            raise ValueError(f"truncated Ogg page at byte {pos}")
        struct.pack_into("<I", buf, pos + 14, serial & 0xFFFFFFFF)
        struct.pack_into("<I", buf, pos + 22, 0)
        struct.pack_into("<I", buf, pos + 22, _ogg_crc(bytes(buf[pos:end])))
        pos = end
    return bytes(buf)


def encode_clip(audio: npt.NDArray[np.float32], sample_rate: int, ext: str, *, serial: int = 0) -> bytes:
    """Encode (n_frames, channels) float audio as file bytes in format ``ext`` (see FORMATS).

    wav/flac are 16-bit PCM; ogg is Vorbis with its stream serial set to ``serial``;
    mp3 is MPEG-1/2 layer III.  Writes in blocks (libsndfile's Vorbis encoder crashes on
    very large single writes).
    """
    if ext not in FORMATS:
        raise DemoCorpusError(f"unknown format {ext!r}; choose from {list(FORMATS)}")
    fmt, subtype = FORMATS[ext]
    a = audio if audio.ndim == 2 else audio[:, None]
    bio = io.BytesIO()
    with sf.SoundFile(bio, "w", samplerate=sample_rate, channels=a.shape[1], format=fmt, subtype=subtype) as f:
        for i in range(0, len(a), _WRITE_BLOCK):
            f.write(a[i : i + _WRITE_BLOCK])
    data = bio.getvalue()
    if ext == "ogg":
        data = _set_ogg_serial(data, serial)
    return data
