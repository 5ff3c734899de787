"""The feature store's errors: every problem with a store is a :class:`StoreError`.

They derive from :class:`specstore.common.errors.SpecstoreError`, so every
command prints them as one line (:func:`specstore.common.cli.run_cli`).
"""

from __future__ import annotations

from specstore.common.errors import SpecstoreError

__all__ = ["IndexCorrupt", "SpecMismatch", "Stale", "StoreCorrupt", "StoreError", "StoreLocked", "StoreNotFound",
           "StoreUnavailable"]


class StoreError(SpecstoreError):
    """Any problem with a feature store; ``str(err)`` is a one-line explanation."""


class StoreNotFound(StoreError):
    """The path does not hold a specstore store."""


class StoreCorrupt(StoreError):
    """The store exists but its metadata, index or chunks are damaged."""


class IndexCorrupt(StoreCorrupt):
    """The committed index lies about where clips are (overlaps, extents outside a shard, values out of range).

    ``str(err)`` is the first problem on one line; ``problems`` lists one line
    per kind of problem (what ``python -m specstore store validate`` prints).
    """

    def __init__(self, message: str, problems: list[str]) -> None:
        super().__init__(message)
        self.problems = problems


class StoreLocked(StoreError):
    """Another writer holds the store's lock."""


class SpecMismatch(StoreError):
    """A store was opened for writing with feature specs that differ from the stored ones."""


class Stale(StoreError):  # noqa: N818 - a signal inside the writer, never raised to a user
    """A row's content is not in the index a writer read at open; it may be in a shard committed since, and
    the writer reads the index again (:class:`specstore.store.writer.StoreWriter`)."""


class StoreUnavailable(StoreError):
    """The storage a store lives on failed (unreachable endpoint, refused credentials, network error).

    Not damage: the store may be whole; the message names the store, the object and the cause on one line
    (raised in a DataLoader worker too: :func:`specstore.common.errors.worker_message`).
    """
