"""Content hashes of source files, for deduplication and resuming."""

from __future__ import annotations

import hashlib
import os

__all__ = ["content_hash", "HASH_BLOCK"]

#: Bytes read per step while hashing (memory stays at this, whatever the file size).
HASH_BLOCK = 1 << 20


def content_hash(path: str | os.PathLike[str]) -> str:
    """BLAKE2b-128 hex digest of the file's bytes, read in 1 MiB blocks.

    Raises ``OSError`` for unreadable files and broken links (the caller records
    the reason).
    """
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()
