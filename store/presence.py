"""Whether a store is there at all, answered without zarr: the first check of every command that reads one.

:func:`~specstore.store.open_store` says ``no store at PATH`` too, but only after zarr
(and, in the model commands, torch) has been imported: seconds on a quiet
machine, minutes on a loaded one.  A command calls
:func:`check_store_present` on its store argument first, so a mistyped path
is one line at once.  Only a local path (or ``file://`` URL) whose root
``zarr.json`` is missing is refused here; a remote URL, or anything that is
there but damaged, is left to :func:`~specstore.store.open_store`, which says what is
wrong with it.  Pure standard library.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import StoreNotFound

__all__ = ["check_store_present", "local_root"]


def local_root(text: str) -> Path | None:
    """The folder a local store address names (a plain path or a ``file://`` URL), None for a remote URL
    (:func:`specstore.store.location.as_location` reads addresses through it)."""
    if text.startswith("file://"):
        return Path(text[len("file://"):]).expanduser().absolute()
    if "://" in text:
        return None
    return Path(text).expanduser().absolute()


def check_store_present(where: str | os.PathLike[str]) -> None:
    """Raise :class:`~specstore.store.StoreNotFound` (``no store at WHERE``, :func:`~specstore.store.open_store`'s own
    words) when ``where`` is a local store address with no root ``zarr.json``; return quietly otherwise."""
    text = os.fspath(where)
    root = local_root(text)
    if root is None:
        return
    try:
        with open(root / "zarr.json", "rb"):
            return
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise StoreNotFound(f"no store at {text}") from None
    except OSError:
        return  # unreadable, but there: open_store reports it
