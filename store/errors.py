"""Exceptions raised by the store. Each carries a one-line, user-facing message."""

from __future__ import annotations

__all__ = ["StoreError", "StoreNotFound", "StoreCorrupt", "SpecMismatch"]


class StoreError(Exception):
    """Any problem with a feature store; ``str(err)`` is a one-line explanation."""


class StoreNotFound(StoreError):
    """The path does not hold a specstore store."""


class StoreCorrupt(StoreError):
    """The store exists but its metadata or index is inconsistent."""


class SpecMismatch(StoreError):
    """A store was opened for writing with feature specs that differ from the stored ones."""
