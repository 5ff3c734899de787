"""Writing a local file atomically, and checking an output path before work starts.

Every file the project writes outside a store (checkpoints, resume files,
reports, predictions, figures) goes through :func:`atomic_path`: the content
is written to a temporary file beside the target and renamed over it, so a
reader never sees half a file and a crash leaves the old file or none.  The
temporary file is removed if writing fails.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import OutputPathError

__all__ = ["atomic_path", "check_output_path", "write_atomic"]


def check_output_path(path: str | os.PathLike[str], *, what: str = "output") -> Path:
    """Refuse, before any work, a file path that cannot be written: a directory, or under a file.

    Creates nothing.  Returns the path as a :class:`~pathlib.Path`.
    """
    p = Path(path).expanduser()
    if str(path) == "" or p.name in ("", ".", ".."):
        raise OutputPathError(f"{what} path {str(path)!r} names no file")
    if p.is_dir():
        raise OutputPathError(f"{what} path {p} is a directory; give a file name")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"{what} path {p} lies under {parent}, which is a file")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputPathError(f"{what} path {p}: {parent} is not writable")
            break
    return p


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it over ``path``.

    Parent folders are created.  On an exception the temporary file is
    deleted and the exception propagates; ``path`` is untouched.
    """
    p = check_output_path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` atomically; return the path."""
    with atomic_path(path) as tmp:
        if isinstance(data, str):
            tmp.write_text(data, encoding="utf-8")
        else:
            tmp.write_bytes(data)
    return Path(path)
