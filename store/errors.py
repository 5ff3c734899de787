"""The project's exceptions and its one command-line error handler.

Every error a user can cause derives from :class:`SpecstoreError`, whose
``str()`` is a one-line explanation naming the path or value at fault.  The
three packages raise their own subclasses (``specstore.store`` below; ``specstore.pipeline`` and
``specstore.infer`` in their modules), and every command line ends in
:func:`run_cli`, which prints ``specstore: error: <message>`` and exits 2 for
any of them: one prefix and one list of "user errors" for all commands.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

__all__ = [
    "PROG",
    "ConfigError",
    "IndexCorrupt",
    "OutputPathError",
    "SpecMismatch",
    "SpecstoreError",
    "StoreCorrupt",
    "StoreError",
    "StoreLocked",
    "StoreNotFound",
    "one_line",
    "run_cli",
]

#: The prefix of every command's one-line error messages.
PROG = "specstore"


class SpecstoreError(Exception):
    """Root of every user-facing error in the project; ``str(err)`` is one line."""


class ConfigError(SpecstoreError, ValueError):
    """A bad option, setting or spec value (caught before any work starts where possible)."""


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


class OutputPathError(SpecstoreError, ValueError):
    """An output path cannot be written: a directory, under a file, a socket or block device, a closed descriptor."""


def one_line(err: BaseException) -> str:
    """The first non-empty line of ``str(err)``, or the exception's type name."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def run_cli(main: Callable[[], int], *, interrupted: str = "interrupted", verbose: bool = False) -> int:
    """Run a command's body: one line and exit status 2 for user errors, 130 on Ctrl-C.

    ``interrupted`` is what to tell the user after Ctrl-C (for example how to
    resume).  ``verbose`` also logs the traceback of a user error at debug
    level.
    """
    try:
        return int(main())
    except SpecstoreError as e:
        if verbose:
            logging.getLogger(__name__).debug("user error", exc_info=True)
        print(f"{PROG}: error: {one_line(e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{PROG}: {interrupted}", file=sys.stderr)
        return 130
