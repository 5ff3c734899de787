"""Content hashes of source files, and proof that the bytes hashed are the bytes decoded.

The store keys deduplication and resuming on a file's content hash (the
hex digest of its bytes; the algorithm is the store's ``content_hash``:
SHA-256 for new stores, BLAKE2b-128 for stores that record none), so the hash recorded for a clip must be the hash
of the bytes that were decoded.  The driver hashes every file first; a
worker decodes it later, and the file may change in between or meanwhile.
A :class:`Fingerprint` is a hash together with the file's :class:`Stamp`
(device, inode, size, modification and change times) taken around the
hashing.  The worker opens the file once, decodes through that open file
(a rename over the path cannot swap the bytes under it) and compares stamps
before and after decoding:

* same stamp as the driver's, and not *recent*: the bytes are the ones the
  driver hashed (any write or ``touch`` changes ``ctime``, a replacement
  changes the inode), so its hash stands;
* a different stamp, or a recent one (modified within
  :data:`RECENT_SECONDS` of hashing, closer than some file systems' clocks
  can tell apart, as git's "racy clean" files): the worker hashes the open
  file itself, after decoding;
* a stamp that changes while decoding: the decode is thrown away and
  retried (the caller decides how often).
"""

from __future__ import annotations

import functools
import hashlib
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specstore.store.layout import CONTENT_HASH, LEGACY_CONTENT_HASH

from .errors import SourceChanged

__all__ = [
    "Fingerprint", "RECENT_SECONDS", "SourceChanged", "Stamp", "content_hash", "digest_bytes", "digest_fd",
    "fingerprint",
]

#: A file modified this close to when it was stamped is hashed again, whatever its stamp says.
RECENT_SECONDS = 2.0


@dataclass(frozen=True)
class Stamp:
    """What ``stat`` says about a file's identity and last change (sizes in bytes, times in ns)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def recent(self, at_ns: int) -> bool:
        """Whether the file changed within :data:`RECENT_SECONDS` before ``at_ns`` (or after it)."""
        return max(self.mtime_ns, self.ctime_ns) >= at_ns - int(RECENT_SECONDS * 1e9)


@dataclass(frozen=True)
class Fingerprint:
    """A content hash, the stamp of the file it was taken from, and when (``time.time_ns()``)."""

    hash: str
    stamp: Stamp
    taken_ns: int

    @property
    def trusted(self) -> bool:
        """Whether an unchanged stamp proves unchanged bytes (the file was not modified just before)."""
        return not self.stamp.recent(self.taken_ns)


#: hashlib constructors by a store's ``content_hash`` name (:data:`specstore.store.layout.CONTENT_HASHES`).
_HASHERS: dict[str, Callable[[], Any]] = {
    "sha256": hashlib.sha256,
    LEGACY_CONTENT_HASH: functools.partial(hashlib.blake2b, digest_size=16),
}


def _hasher(algorithm: str) -> Callable[[], Any]:
    try:
        return _HASHERS[algorithm]
    except KeyError:
        raise ValueError(f"unknown content hash {algorithm!r}; known: {', '.join(_HASHERS)}") from None


def digest_bytes(data: bytes, algorithm: str = CONTENT_HASH) -> str:
    """Hex digest of ``data``: the hash :func:`content_hash` gives a file holding these bytes."""
    h = _hasher(algorithm)()
    h.update(data)
    return str(h.hexdigest())


def digest_fd(fd: int, algorithm: str) -> str:
    """Hex digest with ``algorithm`` (a store's ``content_hash``) of the whole open file ``fd`` (read from its
    start; the offset is not used)."""
    with os.fdopen(os.dup(fd), "rb") as f:
        f.seek(0)
        return hashlib.file_digest(f, _hasher(algorithm)).hexdigest()


def fingerprint(path: str | os.PathLike[str], *, algorithm: str, tries: int = 3) -> Fingerprint:
    """Hash a regular file with ``algorithm`` (the store's ``content_hash``) and stamp it, retrying while it
    changes under the read.

    Raises ``OSError`` for unreadable files and broken links,
    :class:`SourceChanged` when it kept changing for ``tries`` reads, and
    ``IsADirectoryError``-style ``OSError`` for non-regular files (the caller
    records the reason).
    """
    for _ in range(tries):
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            before = os.fstat(fd)
            if not stat.S_ISREG(before.st_mode):
                raise OSError(0, "not a regular file")
            h = digest_fd(fd, algorithm)
            after = os.fstat(fd)
            taken = time.time_ns()
        finally:
            os.close(fd)
        if Stamp.of(before) == Stamp.of(after):
            return Fingerprint(h, Stamp.of(after), taken)
    raise SourceChanged(0, f"changed while being read ({tries} tries)")


def content_hash(path: str | os.PathLike[str], algorithm: str = CONTENT_HASH) -> str:
    """Hex digest of the file's bytes (``hashlib.file_digest``; memory does not grow with size).

    ``algorithm`` is a store's ``content_hash`` (:data:`specstore.store.layout.CONTENT_HASHES`); the default,
    SHA-256, is what new stores, ``specstore classify`` and the server (identical uploads, the cache) use.

    Raises ``OSError`` for unreadable files and broken links (the caller records the reason).
    """
    with open(path, "rb") as f:
        return hashlib.file_digest(f, _hasher(algorithm)).hexdigest()
