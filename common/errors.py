"""The root of every error a user can cause, and the two that every package raises.

Every error a user can cause derives from :class:`SpecstoreError`, whose
``str()`` is a one-line explanation naming the path or value at fault.  Each
package gathers its own subclasses in its ``errors`` module
(``specstore.store.errors``, ...); :func:`specstore.common.cli.run_cli`
prints any of them as one line, ``specstore: error: <message>``, and exits 2.
"""

from __future__ import annotations

__all__ = ["ConfigError", "ExecutorError", "OutputPathError", "SpecstoreError"]


class SpecstoreError(Exception):
    """Root of every user-facing error in the project; ``str(err)`` is one line."""


class ConfigError(SpecstoreError, ValueError):
    """A bad option, setting or spec value (caught before any work starts where possible)."""


class OutputPathError(SpecstoreError, ValueError):
    """An output path cannot be written: a directory, under a file, a socket or block device, a closed descriptor."""


class ExecutorError(SpecstoreError, RuntimeError):
    """Where tasks should run cannot be had: a cluster's library is missing, its scheduler cannot be reached, or
    a local one cannot start (:mod:`specstore.common.executors`)."""
