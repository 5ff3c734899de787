"""One writer at a time: the store's writer lock.

Every :class:`specstore.store.StoreWriter` holds the lock ``<store>/.specstore-lock``
from opening to :meth:`~specstore.store.StoreWriter.close`.  A second writer is
refused at once with :class:`StoreLocked` naming the holder (host, pid,
since when).  Readers never lock.

* Local stores: an exclusive ``flock`` on the lock file.  The kernel drops
  it when the holder's process ends, however it ends (``kill -9``
  included), so a dead writer never blocks the next run.  The file stays
  (removing a lock file races with its next holder); its content names the
  current holder and is emptied on release.
* fsspec stores (object stores have no file locks), and local file systems
  without ``flock``: a lease.  The lock object holds the holder and an
  expiry time; the holder renews it every ``LEASE_SECONDS / 3`` seconds
  from a background thread and deletes it on release.  A lease that has
  expired, or whose holder is a dead process on this host, is taken over.
  Object stores have no atomic create-if-absent, so two writers starting
  within the same moment could both take a free lease; the writer
  therefore re-reads the lease after taking it, re-checks it before every
  commit and refuses to commit when another writer committed meanwhile
  (see :meth:`specstore.store.StoreWriter.commit`), and orphan cleanup on a lease
  only removes shards older than two lease periods.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

from .errors import StoreError, StoreLocked
from .layout import LOCK_NAME
from .location import Location

__all__ = ["LEASE_SECONDS", "WriterLock"]

log = logging.getLogger(__name__)

#: How long a lease lasts without renewal (a dead writer's lease blocks others at most this long).
LEASE_SECONDS = 60.0
#: Pause between writing a lease and reading it back (another writer's simultaneous write shows).
_SETTLE_SECONDS = 0.2


def _holder(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    now = time.time()
    return {"host": socket.gethostname(), "pid": os.getpid(), "since": now, "token": uuid.uuid4().hex,
            **(extra or {})}


def _describe(h: dict[str, Any]) -> str:
    since = h.get("since")
    when = (datetime.datetime.fromtimestamp(float(since)).astimezone().isoformat(timespec="seconds")
            if isinstance(since, (int, float)) else "an unknown time")
    return f"pid {h.get('pid', '?')} on host {h.get('host', '?')} since {when}"


def _process_is_dead(h: dict[str, Any]) -> bool:
    """True only when the holder is on this host and its pid no longer exists."""
    if h.get("host") != socket.gethostname() or not isinstance(h.get("pid"), int):
        return False
    try:
        os.kill(h["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class WriterLock:
    """The lock a writer holds; :meth:`acquire` it, :meth:`release` it (idempotent).

    ``reliable`` is True for a kernel lock (``flock``) and False for a lease.
    """

    def __init__(self, loc: Location, holder: dict[str, Any], fd: int | None) -> None:
        self.location = loc
        self.holder = holder
        self._fd = fd
        self.reliable = fd is not None
        self._stop = threading.Event()
        self._lost = False
        self._thread: threading.Thread | None = None
        if fd is None:
            self._thread = threading.Thread(target=self._renew, name="specstore-lease", daemon=True)
            self._thread.start()

    # -- acquiring ---------------------------------------------------------------------------------
    @classmethod
    def acquire(cls, loc: Location) -> WriterLock:
        """Take the store's lock or raise :class:`StoreLocked` naming its holder."""
        if loc.local is not None:
            fd = cls._flock(loc)
            if fd is not None:
                holder = _holder()
                os.ftruncate(fd, 0)
                os.pwrite(fd, json.dumps(holder).encode(), 0)
                return cls(loc, holder, fd)
        return cls(loc, cls._take_lease(loc), None)

    @staticmethod
    def _flock(loc: Location) -> int | None:
        """An fd holding an exclusive flock on the lock file; None where flock is not supported."""
        assert loc.local is not None
        path = loc.local / LOCK_NAME
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StoreError(f"cannot lock {loc} for writing: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
            except ValueError:
                holder = {}
            os.close(fd)
            raise StoreLocked(f"{loc} is locked by another writer: {_describe(holder)}; "
                              "wait for that run to finish, or stop it") from None
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                log.info("%s: no flock on this file system (%s); using a lease", loc, e.strerror)
                return None
            raise StoreError(f"cannot lock {loc} for writing: {e.strerror or e}") from None
        return fd

    @staticmethod
    def _read_lease(loc: Location) -> dict[str, Any] | None:
        raw = loc.get(LOCK_NAME)
        if not raw:
            return None
        try:
            doc = json.loads(raw)
        except ValueError:
            return None  # a torn or foreign lock object: treat as free
        return doc if isinstance(doc, dict) else None

    @classmethod
    def _take_lease(cls, loc: Location) -> dict[str, Any]:
        current = cls._read_lease(loc)
        if current is not None and float(current.get("expires", 0)) > time.time() and not _process_is_dead(current):
            left = float(current["expires"]) - time.time()
            raise StoreLocked(f"{loc} is locked by another writer: {_describe(current)} (its lease runs "
                              f"{left:.0f} s more unless renewed); wait for that run to finish, or stop it")
        if current is not None:
            log.warning("%s: taking over the expired lock of %s", loc, _describe(current))
        holder = _holder({"expires": time.time() + LEASE_SECONDS})
        loc.put(LOCK_NAME, json.dumps(holder).encode())
        time.sleep(_SETTLE_SECONDS)
        now = cls._read_lease(loc)
        if now is None or now.get("token") != holder["token"]:
            raise StoreLocked(f"{loc} was locked by another writer at the same moment: "
                              f"{_describe(now or {})}; wait for that run to finish")
        return holder

    # -- holding -----------------------------------------------------------------------------------
    def _renew(self) -> None:
        while not self._stop.wait(LEASE_SECONDS / 3):
            try:
                now = self._read_lease(self.location)
                if now is None or now.get("token") != self.holder["token"]:
                    self._lost = True
                    log.error("%s: the writer lock was taken by %s", self.location, _describe(now or {}))
                    return
                self.holder["expires"] = time.time() + LEASE_SECONDS
                self.location.put(LOCK_NAME, json.dumps(self.holder).encode())
            except OSError as e:  # a network hiccup: the next renewal tries again
                log.warning("%s: renewing the writer lock failed: %s", self.location, e)

    def check(self) -> None:
        """Raise :class:`StoreLocked` if this lock is no longer held (a lease taken over)."""
        if self._fd is None and (self._lost or self._stop.is_set()):
            raise StoreLocked(f"{self.location}: this writer lost its lock; another writer took it over")
        if self._fd is not None:
            return
        now = self._read_lease(self.location)
        if now is None or now.get("token") != self.holder["token"]:
            self._lost = True
            raise StoreLocked(f"{self.location}: this writer lost its lock to {_describe(now or {})}")

    def release(self) -> None:
        """Give the lock up (safe to call twice)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)
            return
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        try:
            now = self._read_lease(self.location)
            if now is not None and now.get("token") == self.holder["token"]:
                self.location.delete(LOCK_NAME)
        except OSError as e:
            log.warning("%s: releasing the writer lock failed: %s", self.location, e)
