"""Where a store lives: a local directory or an fsspec URL that zarr accepts.

Besides handing zarr a store object, a :class:`Location` reads, sizes and
deletes single objects by key (``"zarr.json"``, ``"shards/ab12/mel/c/0/0"``):
what the checksum checks, the writer lock and the raw shard writer need.

The zarr store of a URL (:meth:`Location.zarr_store`) is safe to use after
``fork``: an async fsspec filesystem (s3fs, gcsfs, HTTP through aiohttp)
holds a session bound to the event loop of the process that made it, and a
forked child (a DataLoader worker) that used it would hang or fail with
"attached to a different loop".  The store object opens its filesystem
again in every process that uses it, so a :class:`~specstore.store.Store`
opened before the fork (or any zarr group made from it) reads in the child
too; pickled, it carries only the URL and the options.

A failure of the storage itself (an endpoint that does not answer, refused
credentials, a network error) is :class:`StoreUnavailable`, one line naming
the store, the object and the cause, never mistaken for damage
(:class:`~specstore.store.StoreCorrupt`).  A missing object is no failure:
it reads as ``None``, as in zarr.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import zarr
from zarr.abc.store import ByteRequest
from zarr.abc.store import Store as ZarrStore
from zarr.core.buffer import Buffer, BufferPrototype, default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore, WrapperStore

from specstore.common.errors import ConfigError, OutputPathError, SpecstoreError

from .errors import StoreUnavailable
from .presence import local_root

__all__ = ["Location", "StoreUnavailable", "as_location"]

T = TypeVar("T")

#: What reading a URL may raise that is an answer, not a failure: no such object (zarr reads it as None), a
#: wrong argument, or one of the project's own one-line errors.
_ANSWERS: tuple[type[BaseException], ...] = (FileNotFoundError, IsADirectoryError, NotADirectoryError, KeyError,
                                             ValueError, TypeError, NotImplementedError, SpecstoreError)


def unavailable(url: str, doing: str, key: str, error: BaseException) -> StoreUnavailable:
    """``"s3://b/x.zarr: cannot read zarr.json: EndpointConnectionError: Could not connect ..."`` as one line."""
    cause = " ".join(str(error).split()) or "no message"
    what = f"{doing} {key}" if key else doing
    return StoreUnavailable(f"{url}: {what}: {type(error).__name__}: {cause}")


class _ForkSafeStore(WrapperStore[FsspecStore]):
    """An :class:`~zarr.storage.FsspecStore` for a URL that opens its filesystem again in each process.

    ``_store`` is made on first use in each process (``os.getpid()`` differs
    from the one that made it: a forked child); fsspec's own instance cache
    is emptied on fork too, so the child gets a filesystem with its own
    session and event loop.  Storage failures become :class:`StoreUnavailable`.
    """

    def __init__(self, url: str, storage_options: dict[str, Any], read_only: bool) -> None:
        # (WrapperStore's __init__ is not called: it would set the store that _store makes per process)
        self._url, self._options, self._read_only_flag = url, dict(storage_options), read_only
        self._pid = -1
        self._inner: FsspecStore | None = None

    @property
    def _store(self) -> FsspecStore:
        if self._inner is None or self._pid != os.getpid():
            self._inner = FsspecStore.from_url(self._url, storage_options=self._options or None,
                                               read_only=self._read_only_flag)
            self._pid = os.getpid()
        return self._inner

    @_store.setter
    def _store(self, store: FsspecStore) -> None:
        self._inner, self._pid = store, os.getpid()

    def __getstate__(self) -> dict[str, Any]:
        return {"_url": self._url, "_options": self._options, "_read_only_flag": self._read_only_flag,
                "_pid": -1, "_inner": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def _with_store(self, store: FsspecStore) -> _ForkSafeStore:
        return _ForkSafeStore(self._url, self._options, store.read_only)

    def with_read_only(self, read_only: bool = False) -> _ForkSafeStore:
        return _ForkSafeStore(self._url, self._options, read_only)

    def __eq__(self, value: object) -> bool:
        return (isinstance(value, _ForkSafeStore) and (self._url, self._options, self._read_only_flag)
                == (value._url, value._options, value._read_only_flag))

    def __hash__(self) -> int:
        return hash((self._url, self._read_only_flag))

    def __str__(self) -> str:
        return self._url

    def __repr__(self) -> str:
        return f"_ForkSafeStore({self._url!r}, read_only={self._read_only_flag})"

    async def _guard(self, doing: str, key: str, call: Callable[[], Awaitable[T]], *, writing: bool = False) -> T:
        """``call()``, its storage failures raised as :class:`StoreUnavailable` (``writing``: a missing
        bucket or folder too, which a read reports as a missing object)."""
        try:
            return await call()
        except (FileNotFoundError, NotADirectoryError) as e:
            if writing:
                raise unavailable(self._url, doing, key, e) from e
            raise
        except _ANSWERS:
            raise
        except Exception as e:  # noqa: BLE001 - any other failure of the storage: one line, with its cause
            raise unavailable(self._url, doing, key, e) from e

    async def get(self, key: str, prototype: BufferPrototype, byte_range: ByteRequest | None = None) -> Buffer | None:
        return await self._guard("cannot read", key, lambda: self._store.get(key, prototype, byte_range))

    async def get_partial_values(self, prototype: BufferPrototype,
                                 key_ranges: Iterable[tuple[str, ByteRequest | None]]) -> list[Buffer | None]:
        ranges = list(key_ranges)
        first = ranges[0][0] if ranges else ""
        return await self._guard("cannot read", first, lambda: self._store.get_partial_values(prototype, ranges))

    async def exists(self, key: str) -> bool:
        return await self._guard("cannot read", key, lambda: self._store.exists(key))

    async def getsize(self, key: str) -> int:
        return await self._guard("cannot read", key, lambda: self._store.getsize(key))

    async def set(self, key: str, value: Buffer) -> None:
        await self._guard("cannot write", key, lambda: self._store.set(key, value), writing=True)

    async def delete(self, key: str) -> None:
        await self._guard("cannot delete", key, lambda: self._store.delete(key))

    async def delete_dir(self, prefix: str) -> None:
        await self._guard("cannot delete", prefix, lambda: self._store.delete_dir(prefix))

    def list(self) -> AsyncIterator[str]:
        return self._listing("", self._store.list())

    def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        return self._listing(prefix, self._store.list_prefix(prefix))

    def list_dir(self, prefix: str) -> AsyncIterator[str]:
        return self._listing(prefix, self._store.list_dir(prefix))

    async def _listing(self, prefix: str, keys: AsyncIterator[str]) -> AsyncIterator[str]:
        try:
            async for key in keys:
                yield key
        except _ANSWERS:
            raise
        except Exception as e:  # noqa: BLE001 - as in _guard
            raise unavailable(self._url, "cannot list", prefix, e) from e


@dataclass(frozen=True)
class Location:
    """A store address.

    ``local`` is the directory for local stores (plain paths and ``file://``
    URLs), ``None`` for remote ones; only local raw stores are read through
    mmap.  ``url`` is what was given; ``storage_options`` go to fsspec.
    """

    url: str
    local: Path | None
    storage_options: dict[str, Any] = field(default_factory=dict)

    def zarr_store(self, *, read_only: bool) -> ZarrStore:
        """A zarr store object for this location."""
        if self.local is not None:
            return LocalStore(self.local, read_only=read_only)
        return _ForkSafeStore(self.url, self.storage_options, read_only)

    def get(self, key: str) -> bytes | None:
        """The bytes of the object at ``key`` (relative to the store root), or None when there is none."""
        if self.local is not None:
            try:
                return (self.local / key).read_bytes()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                return None
        buf = sync(self.zarr_store(read_only=True).get(key, prototype=default_buffer_prototype()))
        return None if buf is None else buf.to_bytes()

    def size(self, key: str) -> int | None:
        """Bytes of the object at ``key``, or None when it does not exist."""
        if self.local is not None:
            try:
                return (self.local / key).stat().st_size
            except (FileNotFoundError, NotADirectoryError):
                return None
        try:
            return int(sync(self.zarr_store(read_only=True).getsize(key)))
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        """Write one small object (a whole-object replace; atomic on local disks)."""
        if self.local is not None:
            from specstore.common.atomic import write_atomic

            write_atomic(self.local / key, data, stream=False)
            return
        from zarr.core.buffer import cpu

        sync(self.zarr_store(read_only=False).set(key, cpu.Buffer.from_bytes(data)))

    def delete(self, key: str) -> None:
        """Remove the object at ``key`` if it exists."""
        if self.local is not None:
            (self.local / key).unlink(missing_ok=True)
            return
        sync(self.zarr_store(read_only=False).delete(key))

    def upload(self, local_file: Path, key: str) -> None:
        """Copy a local file to ``key`` (remote stores), streaming: memory does not grow with its size."""
        from fsspec.core import url_to_fs

        fs, root = url_to_fs(self.url, **self.storage_options)
        try:
            fs.put_file(str(local_file), f"{root.rstrip('/')}/{key}")
        except (FileNotFoundError, NotADirectoryError) as e:  # no bucket: a write cannot miss an object
            raise unavailable(self.url, "cannot write", key, e) from e
        except _ANSWERS:
            raise
        except Exception as e:  # noqa: BLE001 - a failure of the storage: one line, with its cause
            raise unavailable(self.url, "cannot write", key, e) from e

    def check_writable_path(self) -> None:
        """Refuse, before any work, a local store path that is a file or lies under one."""
        if self.local is None:
            return
        if self.local.exists() and not self.local.is_dir():
            raise OutputPathError(f"store path {self.local} is a file, not a store folder")
        for parent in self.local.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise OutputPathError(f"store path {self.local} lies under {parent}, which is a file")
                break

    def open_group(self, mode: Literal["r", "r+", "a", "w", "w-"]) -> zarr.Group:
        """Open the root group (``mode`` as for :func:`zarr.open_group`)."""
        return zarr.open_group(self.zarr_store(read_only=(mode == "r")), mode=mode, zarr_format=3)

    def exists(self) -> bool:
        """Whether a root ``zarr.json`` (a zarr node, readable or not) exists here."""
        if self.local is not None:
            return (self.local / "zarr.json").is_file()
        return self.get("zarr.json") is not None

    def is_vacant(self) -> bool:
        """Whether nothing is stored here yet, so a new store may be created without destroying anything.

        True for a missing path or an empty directory (local), and for a URL
        under which fsspec lists nothing (remote).  Creating a store
        overwrites its prefix, so anything else there must be refused.
        """
        from .layout import LOCK_NAME

        if self.local is not None:
            return not self.local.exists() or (
                self.local.is_dir() and all(p.name == LOCK_NAME for p in self.local.iterdir()))
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(self.url, **self.storage_options)
        try:
            return not fs.exists(path) or all(p.rstrip("/").rsplit("/", 1)[-1] == LOCK_NAME
                                              for p in fs.ls(path, detail=False))
        except FileNotFoundError:
            return True
        except _ANSWERS:
            raise
        except Exception as e:  # noqa: BLE001 - a failure of the storage: one line, with its cause
            raise unavailable(self.url, "cannot list", "", e) from e

    def __str__(self) -> str:
        return self.url


def as_location(where: str | os.PathLike[str] | Location, storage_options: dict[str, Any] | None = None) -> Location:
    """Turn a path, ``file://`` URL or other fsspec URL into a :class:`Location`."""
    if isinstance(where, Location):
        return where
    text = os.fspath(where)
    local = local_root(text)
    if local is None:
        _check_protocol(text)
    return Location(text, local, dict(storage_options or {}))


def _check_protocol(url: str) -> None:
    """A one-line :class:`ConfigError` for a URL whose fsspec filesystem is unknown or not installed."""
    from fsspec.registry import get_filesystem_class, known_implementations

    protocol = url.split("://", 1)[0]
    for proto in protocol.split("::"):
        try:
            get_filesystem_class(proto)
        except ImportError:
            hint = known_implementations.get(proto, {}).get("err", "")
            package = known_implementations.get(proto, {}).get("class", proto).split(".")[0]
            raise ConfigError(f"store {url}: {proto}:// needs the package {package} ({hint or 'not installed'}): "
                              f"pip install {package}") from None
        except ValueError:
            raise ConfigError(f"store {url}: unknown protocol {proto}://") from None
