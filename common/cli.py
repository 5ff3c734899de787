"""The one command-line error handler: every command's body runs in :func:`run_cli`.

A user error (any :class:`~specstore.common.errors.SpecstoreError`) is one
line, ``specstore: error: <message>``, and exit status 2; Ctrl-C is one line
and 130.  Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from .errors import SpecstoreError

__all__ = ["LOG_FORMAT", "PROG", "one_line", "run_cli", "setup_logging"]

#: The prefix of every command's one-line error messages.
PROG = "specstore"
#: How a command's log records look on stderr: ``WARNING specstore.infer.train: ...``.
LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def setup_logging(level: int) -> None:
    """Log records of ``level`` and above to stderr, one line each (:data:`LOG_FORMAT`), as every command does.

    The level holds for the handler too, not only for the root logger: a library that sets its own logger
    to INFO (dask's ``distributed`` does, at import) would otherwise print its INFO records through this
    handler.  A handler already on the root logger (a caller's, pytest's) is left as it is.
    """
    root = logging.getLogger()
    before = list(root.handlers)
    logging.basicConfig(level=level, format=LOG_FORMAT)
    for handler in root.handlers:
        if handler not in before:
            handler.setLevel(level)


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
