"""Chunk checksums: CRC-32C of every chunk a shard writes.

A checksum covers a chunk's *values*: the chunk's in-bounds frames as
little-endian C-order bytes of the stored dtype.  The raw layout's chunk
file is exactly those bytes; a zstd chunk decompresses to them.  So one
definition serves both layouts, and a plain reader can check a chunk with
any CRC-32C implementation (``google_crc32c.value(bytes)``).

Each shard records, per feature, ``{"algorithm": "crc32c", "chunk_frames": C,
"crc32c": [...], "nbytes": [...]}``: chunk ``k`` holds frames
``[k*C, min((k+1)*C, n_frames))``; ``nbytes[k]`` is the size of its stored
object (what quick validation compares).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import google_crc32c
import numpy as np

from .errors import StoreCorrupt
from .layout import CHECKSUM_ALGORITHM

__all__ = ["ChunkSums", "crc32c", "values_bytes"]


def values_bytes(rows: np.ndarray, dtype: str) -> bytes:
    """``rows`` as the stored bytes: ``dtype``, little-endian, C order (one copy)."""
    return np.ascontiguousarray(rows, dtype=np.dtype(dtype).newbyteorder("<")).tobytes()


def crc32c(data: bytes, crc: int = 0) -> int:
    """CRC-32C of ``data``, continuing from ``crc`` (0 = a fresh checksum)."""
    return int(google_crc32c.extend(crc, data)) if crc else int(google_crc32c.value(data))


@dataclass(frozen=True)
class ChunkSums:
    """Checksums of one shard array: chunk ``k`` covers frames ``[k*chunk_frames, (k+1)*chunk_frames)``."""

    chunk_frames: int
    crc: tuple[int, ...]
    nbytes: tuple[int, ...]

    def n_chunks(self, n_frames: int) -> int:
        """How many chunks an array of ``n_frames`` frames has."""
        return -(-n_frames // self.chunk_frames) if n_frames else 0

    def to_dict(self) -> dict[str, Any]:
        return {"algorithm": CHECKSUM_ALGORITHM, "chunk_frames": self.chunk_frames, "crc32c": list(self.crc),
                "nbytes": list(self.nbytes)}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> ChunkSums:
        """Parse a shard's checksum record; :class:`StoreCorrupt` naming ``where`` if it is unusable."""
        try:
            if d["algorithm"] != CHECKSUM_ALGORITHM:
                raise ValueError(f"unknown algorithm {d['algorithm']!r}")
            sums = cls(int(d["chunk_frames"]), tuple(int(x) for x in d["crc32c"]), tuple(int(x) for x in d["nbytes"]))
        except (KeyError, TypeError, ValueError) as e:
            raise StoreCorrupt(f"{where} has an unreadable checksum record ({e})") from None
        if sums.chunk_frames < 1 or len(sums.crc) != len(sums.nbytes):
            raise StoreCorrupt(f"{where} has an inconsistent checksum record")
        return sums
