"""Where a store lives: a local directory or an fsspec URL that zarr accepts.

Besides handing zarr a store object, a :class:`Location` reads, sizes and
deletes single objects by key (``"zarr.json"``, ``"shards/ab12/mel/c/0/0"``):
what the checksum checks, the writer lock and the raw shard writer need.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import zarr
from zarr.abc.store import Store as ZarrStore
from zarr.core.buffer import default_buffer_prototype
from zarr.core.sync import sync
from zarr.storage import FsspecStore, LocalStore

from specstore.common.errors import ConfigError, OutputPathError

from .presence import local_root

__all__ = ["Location", "as_location"]


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
        return FsspecStore.from_url(self.url, storage_options=self.storage_options or None, read_only=read_only)

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
        fs.put_file(str(local_file), f"{root.rstrip('/')}/{key}")

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
