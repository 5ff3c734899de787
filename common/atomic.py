"""Writing a local file atomically, or straight through a stream, and checking an output path before work starts.

Every local file the project writes (checkpoints, resume files, reports,
predictions, figures, exports, a local store's small documents) goes through
:func:`open_output` (a file object) or :func:`atomic_path` (a path, for
libraries that write to a path themselves).  What happens is decided from ``os.lstat`` of the path as given,
before any link is resolved (:func:`output_target`):

- a new or regular file: the content is written to a temporary file beside it
  and renamed over it, so a reader never sees half a file and a crash leaves
  the old file or none; the temporary file is removed if writing fails;
- a link to a regular file: the same, beside the link's target, which is
  replaced; the link stays.  A dangling link creates its target, as a shell's
  ``>`` does;
- a FIFO, a character device (a terminal, ``/dev/null``), or a path naming one
  of this process's open descriptors (``/dev/stdout``, ``/dev/stderr``,
  ``/dev/fd/N``, ``/proc/self/fd/N``, or a link to one): written straight
  through, never truncated, created or replaced.  ``/dev/stdout`` is written
  through the process's own descriptor 1, whatever it is: a pipe, a terminal,
  or a regular file, written at its offset, so ``--out /dev/stdout > f``
  leaves ``f`` holding the output and ``>> f`` appends to it.  A stream is
  opened before the output is written (a FIFO's open waits for a reader, as a
  shell's ``>`` does) and closed after, also on failure, so its reader always
  sees an end.  :func:`open_output` writes into it as the caller writes;
  :func:`atomic_path` writes a temporary file first and copies it in whole;
- a folder, a block device, a socket or any other special file: refused in
  one line (:class:`~specstore.common.errors.OutputPathError`).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from .errors import OutputPathError

__all__ = ["OutputTarget", "atomic_path", "check_output_path", "open_output", "output_target", "write_atomic"]

_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_DESCRIPTOR = re.compile(r"/(?:dev/fd|proc/(?:self|thread-self|(\d+))/fd)/(\d+)")
_MAX_LINKS = 40
"""Links followed looking for a descriptor's name (the kernel's own limit)."""


@dataclass(frozen=True)
class OutputTarget:
    """How an output path is written (see the module docstring).

    ``given``: the path as named; ``path``: the file written (a link's target
    for a link to a regular file); ``fd``: the open descriptor the path names
    (``/dev/stdout``: 1), else None; ``kind``: ``"file"`` (atomic replace) or
    what is written through (``"FIFO"``, ``"character device"``, ``"standard
    output"``, ``"file descriptor N"``).
    """

    given: Path
    path: Path
    fd: int | None
    kind: str
    missing: tuple[Path, ...] = ()
    """The folders above a new file that do not exist yet, outermost first (they are made when it is written)."""

    @property
    def stream(self) -> bool:
        """Written straight through: no temporary file beside it, no rename."""
        return self.kind != "file"


def _kind(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return name
    return "special file"


def _named_descriptor(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``),
    following links to such a name; None for any other path.  Resolving the descriptor's own link instead would
    give ``pipe:[N]`` for a pipe, and a regular file's name, whose rename would not be the open file."""
    p = os.path.abspath(path)
    for _ in range(_MAX_LINKS):
        if p in _STANDARD:
            return _STANDARD[p]
        m = _DESCRIPTOR.fullmatch(p)
        if m and (m[1] is None or int(m[1]) == os.getpid()):
            return int(m[2])
        try:
            p = os.path.normpath(os.path.join(os.path.dirname(p), os.readlink(p)))
        except OSError:  # not a link (or not readable): a name of no descriptor
            return None
    return None


def _check_parents(p: Path, what: str) -> list[Path]:
    """Refuse a new or replaced file whose nearest existing parent is a file or cannot be written; the folders
    missing above ``p``, outermost first."""
    missing: list[Path] = []
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputPathError(f"{what} path {p} lies under {parent}, which is a file")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputPathError(f"{what} path {p}: {parent} is not writable")
            break
        missing.append(parent)
    return missing[::-1]


def _probe_folders(folders: list[Path], p: Path, what: str) -> None:
    """Make ``folders`` (outermost first) and remove them again: a file system that takes no new folder (read
    only, ``/proc``) is refused now, in one line, not when the output is written after the work.  Leaves
    nothing behind; a folder another process made meanwhile is left to it."""
    made: list[Path] = []
    try:
        for folder in folders:
            try:
                folder.mkdir()
            except FileExistsError:
                continue
            made.append(folder)
    except OSError as e:
        raise OutputPathError(f"{what} path {p}: cannot create the folder {folder}: {e.strerror or e}") from None
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):  # not empty: another writer's now
                folder.rmdir()


def _refuse(given: Path, kind: str, what: str) -> OutputPathError:
    if kind == "directory":
        return OutputPathError(f"{what} path {given} is a directory; give a file name")
    return OutputPathError(f"{what} path {given} is a {kind}, not a regular file, FIFO or character device; "
                           "give a file name")


def output_target(path: str | os.PathLike[str], *, what: str = "output") -> OutputTarget:
    """Decide how ``path`` is written (see the module docstring), or refuse it in one line.  Creates nothing."""
    given = Path(path).expanduser()
    if str(path) == "" or given.name in ("", ".", ".."):
        raise OutputPathError(f"{what} path {str(path)!r} names no file")
    fd = _named_descriptor(given)
    if fd is not None:
        try:
            kind = _kind(os.fstat(fd).st_mode)
        except OSError:
            raise OutputPathError(f"{what} path {given} names file descriptor {fd}, which is not open") from None
        if kind not in ("regular file", "FIFO", "character device", "socket"):
            raise _refuse(given, kind, what)
        return OutputTarget(given, given, fd, "standard output" if fd == 1 else f"file descriptor {fd}")
    try:
        st: os.stat_result | None = os.lstat(given)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as e:
        raise OutputPathError(f"{what} path {given}: {e.strerror}") from None
    target = given
    if st is not None and stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(given)
        except (FileNotFoundError, NotADirectoryError):
            st = None  # a dangling link: its target is created
        except OSError as e:  # a loop of links
            raise OutputPathError(f"{what} path {given}: {e.strerror}") from None
        target = Path(os.path.realpath(given))
    if st is not None:
        kind = _kind(st.st_mode)
        if kind in ("FIFO", "character device"):
            return OutputTarget(given, given, None, kind)
        if kind != "regular file":
            raise _refuse(given, kind, what)
    return OutputTarget(given, target, None, "file", tuple(_check_parents(target, what)))


def check_output_path(path: str | os.PathLike[str], *, what: str = "output", stream: bool = True) -> Path:
    """Refuse, before any work, a path that cannot be written (see :func:`output_target`), including one whose
    missing folders cannot be made (:func:`_probe_folders`).

    ``stream=False`` also refuses what would be written straight through (a
    FIFO, a device, ``/dev/stdout``): for a file that is read back or has
    files written beside it, such as a checkpoint.  Leaves nothing behind.  Returns
    the path as given, as a :class:`~pathlib.Path`.
    """
    t = output_target(path, what=what)
    if t.stream and not stream:
        raise _not_regular(t, what)
    if t.missing:
        _probe_folders(list(t.missing), t.path, what)
    return t.given


def _not_regular(t: OutputTarget, what: str) -> OutputPathError:
    return OutputPathError(f"{what} path {t.given} is not a regular file ({t.kind}); this file is read back "
                           "and has files written beside it: give a regular file's name")


def _make_parents(target: Path, given: Path, what: str) -> None:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise OutputPathError(f"{what} path {given}: cannot create the folder {target.parent}: "
                              f"{e.strerror or e}") from None


def _open_stream(t: OutputTarget) -> int:
    """A new descriptor writing to stream target ``t``: the named descriptor duplicated (standard output flushed
    first, so what was printed comes before), or the FIFO or device opened without truncating or creating it."""
    if t.fd is not None:
        if t.fd in (1, 2):
            (sys.stdout if t.fd == 1 else sys.stderr).flush()
        return os.dup(t.fd)
    try:  # a FIFO's open waits for a reader, as a shell's `>` does
        fd = os.open(t.path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise OutputPathError(f"cannot write {t.given}: {e.strerror}") from None
    kind = _kind(os.fstat(fd).st_mode)
    if kind != t.kind:  # replaced between the check and the open
        os.close(fd)
        raise OutputPathError(f"{t.given} was a {t.kind} and is now a {kind}; not written")
    return fd


@contextmanager
def open_output(path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None,
                newline: str | None = None) -> Iterator[IO[Any]]:
    """Yield a file object (``mode`` ``"wb"`` or ``"w"``) writing ``path``: a temporary file renamed over it on
    success, or, for a stream (see the module docstring), the stream itself.

    On an exception a regular file is untouched (the temporary file is deleted)
    and the exception propagates; a stream keeps what was written before it.
    A reader that closes a stream early is an :class:`OutputPathError`.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"open_output writes with mode 'w' or 'wb', not {mode!r}")
    t = output_target(path)
    if not t.stream:
        with _atomic_file(t) as tmp:
            try:
                f = open(tmp, mode, encoding=encoding, newline=newline)  # noqa: SIM115 - closed below
            except OSError as e:
                raise OutputPathError(f"cannot write {t.given}: {e.strerror or e}") from None
            with f:
                yield f
        return
    try:
        with open(_open_stream(t), mode, encoding=encoding, newline=newline) as f:
            yield f
    except BrokenPipeError:
        raise OutputPathError(f"the reader of {t.given} closed it before the output was whole") from None


@contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary regular file's path to write; on success it becomes ``path``'s content.

    For a new or regular file (or a link to one) the temporary file lies beside
    the file written and is renamed over it; parent folders are created.  For a
    stream (see the module docstring) it lies in the system's temporary folder
    and is copied into the stream, so libraries that need a real file (seeking,
    a file name) write it as they would any other.  On an exception the
    temporary file is deleted, the exception propagates and ``path`` is untouched.
    """
    t = output_target(path)
    if t.stream:
        with open_output(path) as dst:
            handle, name = tempfile.mkstemp(prefix=".specstore-", suffix=".tmp")
            os.close(handle)
            try:
                yield Path(name)
                with open(name, "rb") as src:
                    shutil.copyfileobj(src, dst)
            finally:
                Path(name).unlink(missing_ok=True)
        return
    with _atomic_file(t) as tmp:
        yield tmp


@contextmanager
def _atomic_file(t: OutputTarget) -> Iterator[Path]:
    """:func:`atomic_path` for a regular file's target ``t`` (decided once by the caller)."""
    _make_parents(t.path, t.given, "output")
    tmp = t.path.with_name(f".{t.path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        yield tmp
        try:
            os.replace(tmp, t.path)
        except OSError as e:
            raise OutputPathError(f"cannot write {t.given}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_atomic(path: str | os.PathLike[str], data: bytes | str, *, stream: bool = True) -> Path:
    """Write ``data`` (text is UTF-8) to ``path`` with :func:`open_output`; return the path as given.

    ``stream=False`` refuses a stream (as :func:`check_output_path` does, without its probe of missing folders:
    they are made now): a store's own files are regular files, and a FIFO put among them would make the writer
    wait for a reader.
    """
    if not stream and (t := output_target(path)).stream:
        raise _not_regular(t, "output")
    with open_output(path) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return Path(path)
