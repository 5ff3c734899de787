"""Detecting truncated audio files from their container headers (no decoding).

Decoders read a truncated WAV, Ogg or MP3 up to where it breaks off without
an error, so a half-copied file would silently enter the store as a shorter
clip.  Each container says how long it should be, in a way that costs a few
reads to check:

- WAV (RIFF/RIFX): the ``data`` chunk declares its byte size;
- Ogg (Vorbis, Opus, FLAC-in-Ogg): a complete stream ends with a page that
  carries the end-of-stream flag, and that page is whole;
- MP3 with a Xing/Info header (written by LAME and most encoders): the header
  declares the stream's byte size (checked to 1%, as mpg123 does).

Formats or files that declare nothing (an MP3 without a Xing header, a WAV
written as a stream with size 0 or 0xFFFFFFFF) are not judged: never reject
a file that may be whole.  FLAC's declared sample count is checked while
decoding, in :func:`pipeline.audio.stream_mono`.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

__all__ = ["truncation_reason"]

#: Bytes read from the end of an Ogg file to find its last page (a page is < 65 307 bytes).
_OGG_TAIL = 65536 + 1024


def truncation_reason(path: str | os.PathLike[str]) -> str | None:
    """A one-line reason if the file's header says it is cut short, else None."""
    p = os.fspath(path)
    size = os.path.getsize(p)
    with open(p, "rb") as f:
        head = f.read(12)
        if len(head) < 12:
            return None
        if head[:4] in (b"RIFF", b"RIFX") and head[8:12] == b"WAVE":
            return _wav(f, size, "<" if head[:4] == b"RIFF" else ">")
        if head[:4] == b"OggS":
            return _ogg(f, size)
        return _mp3(f, size)


def _wav(f: BinaryIO, size: int, endian: str) -> str | None:
    pos = 12
    while pos + 8 <= size:
        f.seek(pos)
        chunk = f.read(8)
        if len(chunk) < 8:
            return None
        cid, csize = chunk[:4], struct.unpack(endian + "I", chunk[4:])[0]
        if cid == b"data":
            if csize in (0, 0xFFFFFFFF):  # written as a stream: length unknown
                return None
            held = size - (pos + 8)
            if held < csize:
                return f"truncated: the WAV header declares {csize} bytes of audio, the file holds {held}"
            return None
        pos += 8 + csize + (csize & 1)
    return None


def _ogg(f: BinaryIO, size: int) -> str | None:
    start = max(0, size - _OGG_TAIL)
    f.seek(start)
    tail = f.read()
    at = tail.rfind(b"OggS")
    while at >= 0 and len(tail) - at < 27:  # a capture pattern without room for a header
        at = tail.rfind(b"OggS", 0, at)
    if at < 0:
        return "truncated: no complete Ogg page at the end of the file"
    header_type = tail[at + 5]
    n_segments = tail[at + 26]
    table = tail[at + 27: at + 27 + n_segments]
    if len(table) < n_segments or at + 27 + n_segments + sum(table) > len(tail):
        return "truncated: the last Ogg page is cut off"
    if not header_type & 0x04:
        return "truncated: the Ogg stream has no end-of-stream page"
    return None


def _id3v2_size(head: bytes) -> int:
    if head[:3] != b"ID3" or len(head) < 10:
        return 0
    b = head[6:10]
    footer = 10 if head[5] & 0x10 else 0
    return 10 + ((b[0] & 0x7F) << 21 | (b[1] & 0x7F) << 14 | (b[2] & 0x7F) << 7 | (b[3] & 0x7F)) + footer


def _mp3(f: BinaryIO, size: int) -> str | None:
    f.seek(0)
    start = _id3v2_size(f.read(10))
    f.seek(start)
    frame = f.read(4 + 32 + 4 + 12)  # header, side info, tag, flags + frames + bytes
    if len(frame) < 4 + 9 + 12 or frame[0] != 0xFF or (frame[1] & 0xE0) != 0xE0:
        return None  # not an MPEG frame where expected: do not judge
    version = (frame[1] >> 3) & 0x3  # 3 = MPEG-1
    layer = (frame[1] >> 1) & 0x3  # 1 = layer III
    if layer != 1:
        return None
    mono = ((frame[3] >> 6) & 0x3) == 3
    side = (17 if mono else 32) if version == 3 else (9 if mono else 17)
    tag = frame[4 + side: 4 + side + 4]
    if tag not in (b"Xing", b"Info"):
        return None
    body = frame[4 + side + 4:]
    if len(body) < 8:
        return None
    flags = struct.unpack(">I", body[:4])[0]
    if not flags & 0x2:
        return None
    offset = 4 + (4 if flags & 0x1 else 0)
    if len(body) < offset + 4:
        return None
    declared = struct.unpack(">I", body[offset: offset + 4])[0]
    f.seek(max(0, size - 128))
    trailer = 128 if f.read(3) == b"TAG" else 0
    held = size - start - trailer
    if declared > 0 and held < 0.99 * declared:
        return f"truncated: the MP3 header declares {declared} bytes, the file holds {held}"
    return None
