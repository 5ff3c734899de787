"""Where a store lives: a local directory or an fsspec URL that zarr accepts."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zarr
from zarr.storage import FsspecStore, LocalStore, StoreLike

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

    def zarr_store(self, *, read_only: bool) -> StoreLike:
        """A zarr store object for this location."""
        if self.local is not None:
            return LocalStore(self.local, read_only=read_only)
        return FsspecStore.from_url(self.url, storage_options=self.storage_options or None, read_only=read_only)

    def open_group(self, mode: str) -> zarr.Group:
        """Open the root group (``mode`` as for :func:`zarr.open_group`)."""
        return zarr.open_group(self.zarr_store(read_only=(mode == "r")), mode=mode, zarr_format=3)

    def exists(self) -> bool:
        """Whether a zarr group's metadata document exists here."""
        if self.local is not None:
            return (self.local / "zarr.json").is_file()
        try:
            zarr.open_group(self.zarr_store(read_only=True), mode="r", zarr_format=3)
        except (FileNotFoundError, zarr.errors.GroupNotFoundError, KeyError):
            return False
        return True

    def is_vacant(self) -> bool:
        """Whether nothing is stored here yet, so a new store may be created without destroying anything.

        True for a missing path or an empty directory (local), and for a URL
        under which fsspec lists nothing (remote).  Creating a store
        overwrites its prefix, so anything else there must be refused.
        """
        if self.local is not None:
            return not self.local.exists() or (self.local.is_dir() and not any(self.local.iterdir()))
        from fsspec.core import url_to_fs

        fs, path = url_to_fs(self.url, **self.storage_options)
        try:
            return not fs.exists(path) or not fs.ls(path, detail=False)
        except FileNotFoundError:
            return True

    def __str__(self) -> str:
        return self.url


def as_location(where: "str | os.PathLike[str] | Location", storage_options: dict[str, Any] | None = None) -> Location:
    """Turn a path, ``file://`` URL or other fsspec URL into a :class:`Location`."""
    if isinstance(where, Location):
        return where
    text = os.fspath(where)
    if text.startswith("file://"):
        return Location(text, Path(text[len("file://"):]).expanduser().absolute(), dict(storage_options or {}))
    if "://" in text:
        return Location(text, None, dict(storage_options or {}))
    return Location(text, Path(text).expanduser().absolute(), dict(storage_options or {}))
