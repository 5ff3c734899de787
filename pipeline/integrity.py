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
decoding, in :func:`specstore.pipeline.audio.stream_mono`.

The opposite lie, a header that declares *less* audio than the file holds,
is found after decoding: libsndfile stops at the declared frame count
whatever follows, so :func:`specstore.pipeline.audio.stream_mono` notes the byte where
the decoder stopped reading and :func:`audio_after` looks for audio beyond
the declared length:

- Ogg (Vorbis, Opus): a page whose granule position (samples completed) is
  past the last page's, or a page other than the last that the decoder
  never reached.  Exact to the last page: a stream may end its audio
  anywhere in its last page (that is how Vorbis and Opus trim the end), so
  hiding less than the last page holds (typically under a second) is not
  seen; nor is rewriting every page's granule position when the hidden
  pages fit in libsndfile's read-ahead (a few KiB).
- FLAC: a frame (header CRC-8 checked) whose first sample, from its frame
  or sample number, is at or past the declared count: exact to the frame.
- MP3: two consecutive MPEG audio frames after the byte where the decoder
  stopped (mpg123 reads ahead little: a lie of a few frames is found).

WAV, AIFF and the other PCM containers decode exactly the audio chunk their
header sizes: bytes after it are other chunks or junk, never audio, and are
not searched.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable
from typing import BinaryIO

__all__ = ["audio_after", "mp3_declares_frames", "truncation_reason"]

#: Bytes read from the end of an Ogg file to find its last page (a page is < 65 307 bytes).
_OGG_TAIL = 65536 + 1024
#: Bytes scanned at a time by :func:`audio_after`, and the overlap between scans (an MPEG frame
#: header is confirmed by the next one, <= 2 881 bytes further; a FLAC frame header is <= 16 bytes).
_SCAN_BLOCK = 1 << 20
_SCAN_OVERLAP = 4096
#: The first two bytes of a FLAC frame header (fixed or variable block size) and of an MPEG audio frame.
_FLAC_SYNC = re.compile(rb"\xff[\xf8\xf9]")
_MPEG_SYNC = re.compile(rb"\xff[\xe0-\xff]")
#: How far before the byte where the decoder stopped :func:`audio_after` starts looking: more than
#: libsndfile and its decoders read ahead (a few KiB), so frames read but never decoded are seen.
_LOOKBACK = 1 << 18


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


def _xing(f: BinaryIO) -> tuple[int, int | None, int | None] | None:
    """``(audio start, frame count, byte count)`` of an MP3's Xing/Info header (None: a field it lacks), or None."""
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
    body = frame[4 + side + 4:]
    if tag not in (b"Xing", b"Info") or len(body) < 8:
        return None
    flags = struct.unpack(">I", body[:4])[0]
    fields: list[int | None] = []
    offset = 4
    for bit in (0x1, 0x2):  # frame count, then byte count
        if flags & bit and len(body) >= offset + 4:
            fields.append(struct.unpack(">I", body[offset: offset + 4])[0])
            offset += 4
        else:
            fields.append(None)
    return start, fields[0], fields[1]


def mp3_declares_frames(f: BinaryIO) -> bool:
    """Whether the MP3 open as ``f`` has a Xing/Info header with a frame count (its length is exact, not estimated)."""
    xing = _xing(f)
    return xing is not None and bool(xing[1])


def _mp3(f: BinaryIO, size: int) -> str | None:
    xing = _xing(f)
    if xing is None or xing[2] is None:
        return None
    start, declared = xing[0], xing[2]
    f.seek(max(0, size - 128))
    trailer = 128 if f.read(3) == b"TAG" else 0
    held = size - start - trailer
    if declared > 0 and held < 0.99 * declared:
        return f"truncated: the MP3 header declares {declared} bytes, the file holds {held}"
    return None


# -- audio after the declared end ------------------------------------------------------------------------------------

def audio_after(f: BinaryIO, container: str, stopped: int, declared: int) -> int | None:
    """The byte offset of audio past the ``declared`` sample frames of the file open as ``f``, else None.

    ``container`` is libsndfile's major format name ("OGG", "FLAC", "MP3";
    any other is not searched), ``stopped`` the byte where the decoder
    stopped reading once it had the declared frames.  Reads at most the
    file from ``stopped`` - 256 KiB to its end, in 1 MiB blocks, and stops at
    the first hit.  Tags and pictures appended after the audio (ID3v1,
    APEv2) are not mistaken for audio: an Ogg page needs its capture
    pattern, version and flags, a FLAC frame a matching CRC-8, an MPEG frame
    a second header where its length says.
    """
    f.seek(0, os.SEEK_END)
    size = f.tell()
    if container == "OGG":
        return _ogg_after(f, size, stopped)
    if container == "FLAC":
        return _scan(f, max(0, stopped - _LOOKBACK), _FlacBeyond(f, declared))
    if container == "MP3":
        return _scan(f, stopped, _find_mpeg)
    return None


def _scan(f: BinaryIO, start: int, find: Callable[[bytes, int], int | None]) -> int | None:
    """The first offset >= ``start`` where ``find(block, limit)`` hits, reading 1 MiB blocks that overlap."""
    pos = start
    while True:
        f.seek(pos)
        block = f.read(_SCAN_BLOCK + _SCAN_OVERLAP)
        if not block:
            return None
        last = len(block) < _SCAN_BLOCK + _SCAN_OVERLAP
        at = find(block, len(block) if last else _SCAN_BLOCK)
        if at is not None:
            return pos + at
        if last:
            return None
        pos += _SCAN_BLOCK


def _ogg_page(f: BinaryIO, at: int) -> tuple[int, int] | None:
    """``(granule position, page length)`` of a whole Ogg page at byte ``at``, else None."""
    f.seek(at)
    head = f.read(27)
    if len(head) < 27 or head[:5] != b"OggS\x00" or head[5] & 0xF8:
        return None
    table = f.read(head[26])
    if len(table) < head[26]:
        return None
    return struct.unpack("<q", head[6:14])[0], 27 + head[26] + sum(table)


def _ogg_after(f: BinaryIO, size: int, stopped: int) -> int | None:
    """An Ogg page past the declared end: granule past the last page's, or never reached and not the last."""
    f.seek(max(0, size - _OGG_TAIL))
    tail = f.read()
    found = tail.rfind(b"OggS")
    last_at = max(0, size - len(tail)) + found
    last = None if found < 0 else _ogg_page(f, last_at)
    if last is None:
        return None
    at = max(0, stopped - _LOOKBACK)
    while at < last_at:
        page = _ogg_page(f, at)
        if page is None:  # not on a page boundary: on to the next capture pattern
            f.seek(at + 1)
            chunk = f.read(_SCAN_BLOCK)
            if not chunk:
                return None
            found = chunk.find(b"OggS\x00")
            at += 1 + (found if found >= 0 else max(len(chunk) - 4, 1))
            continue
        if page[0] > last[0] or at >= stopped:
            return at
        at += page[1]
    return None


def _crc8(data: bytes) -> int:
    """CRC-8 of a FLAC frame header (polynomial x^8 + x^2 + x + 1, initial value 0)."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _flac_number(h: bytes) -> tuple[int, int, int] | None:
    """``(number, block size, header length without the CRC byte)`` of a FLAC frame header, else None.

    The number is the frame's first sample in a variable-block-size stream
    (``h[1] == 0xF9``), its frame number in a fixed one.
    """
    if len(h) < 5 or h[0] != 0xFF or h[1] not in (0xF8, 0xF9):
        return None
    block_code, rate_code = h[2] >> 4, h[2] & 0x0F
    if block_code == 0 or rate_code == 0x0F or (h[3] >> 4) > 10 or h[3] & 0x01 or (h[3] >> 1) & 0x07 == 3:
        return None
    first = h[4]  # the number, coded like UTF-8 in 1 to 7 bytes
    ones = next((n for n, mask in enumerate((0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02)) if not first & mask), 7)
    if ones == 1 or first == 0xFF:  # a continuation byte, or 0xFF: not a valid first byte
        return None
    n_bytes = max(ones, 1)
    if len(h) < 4 + n_bytes:
        return None
    number = first & (0x7F >> ones)
    for byte in h[5: 4 + n_bytes]:
        if byte & 0xC0 != 0x80:
            return None
        number = number << 6 | byte & 0x3F
    end = 4 + n_bytes
    if len(h) < end + 2:
        return None
    if block_code == 6:
        size, end = h[end] + 1, end + 1
    elif block_code == 7:
        size, end = (h[end] << 8 | h[end + 1]) + 1, end + 2
    else:
        size = 192 if block_code == 1 else 576 << (block_code - 2) if block_code < 6 else 256 << (block_code - 8)
    length = end + {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    return number, size, length


class _FlacBeyond:
    """A :func:`_scan` finder: a FLAC frame (header CRC checked) whose first sample is at or past ``declared``.

    A fixed-block-size frame's start is its frame number times the stream's
    block size: STREAMINFO's minimum (the size of every block but the last),
    read from ``f``; the frame's own size where there is no STREAMINFO.
    """

    def __init__(self, f: BinaryIO, declared: int) -> None:
        f.seek(0)
        start = _id3v2_size(f.read(10))
        f.seek(start)
        head = f.read(10)
        self.block = struct.unpack(">H", head[8:10])[0] if len(head) == 10 and head[:4] == b"fLaC" else 0
        self.declared = declared

    def __call__(self, block: bytes, limit: int) -> int | None:
        for m in _FLAC_SYNC.finditer(block, 0, limit):
            at = m.start()
            head = _flac_number(block[at:at + 16])
            if head is not None:
                first = head[0] * max(self.block, head[1]) if block[at + 1] == 0xF8 else head[0]
                if first >= self.declared and at + head[2] < len(block) \
                        and _crc8(block[at:at + head[2]]) == block[at + head[2]]:
                    return at
        return None


#: MPEG audio bitrates, kbit/s, by (MPEG-1?, layer) and index 1..14.
_MPEG_KBPS = {
    (True, 1): (32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (True, 2): (32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (True, 3): (32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (False, 1): (32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (False, 2): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    (False, 3): (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
#: Sample rates, Hz, by the version bits (3 = MPEG-1, 2 = MPEG-2, 0 = MPEG-2.5) and index 0..2.
_MPEG_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}


def _mpeg_frame(h: bytes) -> tuple[int, int] | None:
    """``(frame length in bytes, stream key)`` of the MPEG audio frame header starting ``h``, or None."""
    if len(h) < 4 or h[0] != 0xFF or (h[1] & 0xE0) != 0xE0:
        return None
    version, layer_bits = (h[1] >> 3) & 0x3, (h[1] >> 1) & 0x3
    rate_index, bitrate_index = (h[2] >> 2) & 0x3, h[2] >> 4
    if version == 1 or layer_bits == 0 or rate_index == 3 or bitrate_index in (0, 15):
        return None  # reserved values, or free format (no length to check)
    layer = 4 - layer_bits
    rate = _MPEG_RATES[version][rate_index]
    bitrate = _MPEG_KBPS[(version == 3, layer)][bitrate_index - 1] * 1000
    pad = (h[2] >> 1) & 0x1
    if layer == 1:
        length = (12 * bitrate // rate + pad) * 4
    else:
        length = (72 if layer == 3 and version != 3 else 144) * bitrate // rate + pad
    return length, (h[1] & 0xFE) << 8 | (h[2] & 0x0C)


def _find_mpeg(block: bytes, limit: int) -> int | None:
    """The first MPEG audio frame in ``block`` before ``limit`` that a second frame follows, else None."""
    for m in _MPEG_SYNC.finditer(block, 0, limit):
        at = m.start()
        frame = _mpeg_frame(block[at:at + 4])
        if frame is not None:
            nxt = _mpeg_frame(block[at + frame[0]:at + frame[0] + 4])
            if nxt is not None and nxt[1] == frame[1]:
                return at
    return None
