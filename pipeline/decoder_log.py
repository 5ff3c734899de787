"""The C decoders' own messages on stderr, counted and sent through :mod:`logging`.

libsndfile's MP3 decoder, libmpg123, writes to file descriptor 2 itself,
``[src/libmpg123/layer3.c:INT123_do_layer3():1774] error: part2_3_length
(4095) too large for available bit count (1496)``, for frames it conceals
and goes on past: the file decodes, but a user reads a failure.  Python's
``sys.stderr`` cannot catch these lines (they never pass through Python),
so this module works on the file descriptor:

- **Decode worker processes** (``specstore classify --jobs N``, the
  server's decode pool, ``make features``' worker processes) call
  :func:`divert_stderr` once: fd 2 becomes a pipe read by a daemon thread.
  A line that is a C library's message (``[path/file.c:...] ``, the form
  libmpg123 writes; :func:`library_of`) is a *decoder warning*: counted
  and handed to a sink (kept for the task's result, or sent to the parent
  through :class:`DecoderLogListener`), and the parent logs it at INFO
  under the ``specstore.decoder`` logger, which ``-v`` shows.  Any other
  line written to fd 2 is passed through to the original stderr as it
  was, and ``sys.stderr`` (tracebacks, warnings, this process's logging)
  is pointed at a copy of the original descriptor, so nothing of Python's
  own is swallowed or counted.
- **In-process decoding** (``classify --jobs 1``, ``make features JOBS=1``,
  the threading backend) keeps its stderr: :func:`captured_stderr`
  redirects fd 2 only for the duration of a decode and copies every byte
  straight back to the original stderr, counting the decoder warnings it
  sees on the way.

Either way each run ends with one summary line, :meth:`DecoderWarnings.summary`.

The redirection is per process (file descriptor 2 is), so its state is
one module-level object per process, guarded by a lock and checked against
the process id (a forked child does not inherit its parent's reader thread).
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.util
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LOGGER", "DecoderLogListener", "DecoderWarnings", "captured_stderr", "divert_stderr", "library_of",
    "log_lines", "log_summary",
]

#: The logger decoder warnings are logged under (INFO: shown with -v).
LOGGER = "specstore.decoder"
log = logging.getLogger(LOGGER)

#: Lines a result keeps for the parent to log (the count stays exact beyond it).
MAX_LINES = 1000
#: Longest line kept or sent, in bytes: one pipe write of it is atomic (POSIX PIPE_BUF is at least 512, Linux 4096).
MAX_LINE_BYTES = 3800
#: Seconds a flush waits for the reader thread before giving up (it never should).
FLUSH_SECONDS = 5.0

_MARK = b"\x00specstore-decoder-log:"
_FLUSH = _MARK + b"flush\x00"
_STOP = _MARK + b"stop\x00"
# "[src/libmpg123/layer3.c:INT123_do_layer3():1774] error: ..." (the source file of a C library, then a space)
_C_MESSAGE = re.compile(r"\[((?:[\w.+-]+/)*[\w.+-]+\.c)(?::[^\]\n]*)?\] ")


def library_of(line: str) -> str | None:
    """The C library that wrote ``line`` (``libmpg123``), the source file when no folder names one, or None.

    None means the line is not a C library's message (``[path/file.c:...] ``
    somewhere in it): it is passed through, never counted.
    """
    m = _C_MESSAGE.search(line)
    if m is None:
        return None
    parts = m.group(1).split("/")
    return next((p for p in parts[:-1] if p.startswith("lib")), parts[-1])


@dataclass
class DecoderWarnings:
    """Decoder warnings counted in one run or task: ``counts`` by library, ``shown`` of them already on stderr.

    ``lines``: the first :data:`MAX_LINES` of those not shown, for the
    parent to log (:func:`log_lines`); ``counts`` stay exact beyond it.
    """

    counts: dict[str, int] = field(default_factory=dict)
    shown: int = 0
    lines: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, library: str, line: str | None = None, *, shown: bool = False) -> None:
        """Count one warning of ``library``: ``shown`` if it is on stderr already, ``line`` kept to be logged."""
        self.counts[library] = self.counts.get(library, 0) + 1
        if shown:
            self.shown += 1
        elif line is not None and len(self.lines) < MAX_LINES:
            self.lines.append(line)

    def add(self, other: DecoderWarnings) -> None:
        """Add ``other``'s counts, and its lines while fewer than :data:`MAX_LINES` are kept."""
        for lib, n in other.counts.items():
            self.counts[lib] = self.counts.get(lib, 0) + n
        self.shown += other.shown
        self.lines.extend(other.lines[:max(0, MAX_LINES - len(self.lines))])

    def take(self) -> DecoderWarnings:
        """Everything recorded so far, leaving this empty."""
        out = DecoderWarnings(self.counts, self.shown, self.lines)
        self.counts, self.shown, self.lines = {}, 0, []
        return out

    def summary(self, during: str = "during this run") -> str | None:
        """One line for the end of a run (None when there was nothing): how many, from which library, where to see them.

        ``12 decoder warnings (libmpg123) during this run; ...``: the files
        they concern still decoded (those that did not are reported as
        failures on their own), so this is a note, not an error.
        """
        n = self.total
        if not n:
            return None
        libraries = ", ".join(sorted(self.counts))
        if self.shown == n:
            where = "printed above"
        elif log.isEnabledFor(logging.INFO):
            where = f"logged above as {LOGGER}"
        else:
            where = "-v shows them"
        return (f"{n} decoder warning{'s' if n != 1 else ''} ({libraries}) {during}; files that could not be "
                f"decoded are reported on their own; {where}")


def log_lines(warnings: DecoderWarnings) -> None:
    """Log the lines of ``warnings`` (decoded elsewhere, not yet shown) at INFO under :data:`LOGGER`."""
    for line in warnings.lines:
        log.info("%s", line)


def log_summary(warnings: DecoderWarnings, during: str = "during this run") -> None:
    """Log :meth:`DecoderWarnings.summary` at WARNING (nothing when there were none): the run's one line."""
    line = warnings.summary(during)
    if line is not None:
        log.warning("%s", line)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _text(data: bytes) -> str:
    return data[:MAX_LINE_BYTES].decode("utf-8", "replace").strip("\r\n")


class _Fd2Pipe:
    """This process's fd 2 redirected into a pipe, read by a daemon thread.

    ``divert``: decoder warnings go to ``sink`` and every other line to the
    original stderr (worker processes).  Otherwise (``tee``) every byte is
    copied to the original stderr as it arrives and decoder warnings are
    only counted (in-process decoding).  Counts gather in ``pending`` until
    :meth:`drain`.
    """

    def __init__(self, divert: bool, sink: Callable[[str, str], None] | None) -> None:
        self.pid = os.getpid()
        self.divert = divert
        self.sink = sink
        self.pending = DecoderWarnings()
        self._lock = threading.Lock()  # pending and the flush count (the reader takes it, never while writing)
        self._seen = threading.Condition(self._lock)
        self._writing = threading.Lock()  # flush markers go into the pipe in ticket order
        self._asked = self._flushed = 0
        self._line = b""
        sys.stderr.flush()
        self.original = os.dup(2)
        r, w = os.pipe()
        try:
            os.dup2(w, 2)
        except OSError:
            for fd in (r, w, self.original):
                os.close(fd)
            raise
        self._r, self._w = r, w
        self._thread = threading.Thread(target=self._read, name="specstore-decoder-log", daemon=True)
        self._thread.start()

    # -- the reader thread ---------------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            self._read_markers()
        except Exception:  # never: but a reader that stopped would block every write to fd 2, so copy on
            with contextlib.suppress(OSError):
                while chunk := os.read(self._r, 65536):
                    self._forward(chunk)

    def _read_markers(self) -> None:
        pending = b""
        while True:
            try:
                chunk = os.read(self._r, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                self._handle(pending)
                self._end_line()
                return
            pending += chunk
            while pending:
                i = pending.find(b"\x00")
                if i < 0:
                    self._handle(pending)
                    pending = b""
                elif i:
                    self._handle(pending[:i])
                    pending = pending[i:]
                elif pending.startswith(_FLUSH):
                    pending = pending[len(_FLUSH):]
                    self._end_line()
                    with self._seen:
                        self._flushed += 1
                        self._seen.notify_all()
                elif pending.startswith(_STOP):
                    self._handle(pending[len(_STOP):])
                    self._end_line()
                    return
                elif len(pending) < len(_FLUSH) and (_FLUSH.startswith(pending) or _STOP.startswith(pending)):
                    break  # the rest of a marker is still on its way
                else:  # a NUL of someone's output
                    self._handle(pending[:1])
                    pending = pending[1:]

    def _handle(self, data: bytes) -> None:
        """Bytes written to fd 2 (markers removed): copied through in tee mode, split into lines either way."""
        if not data:
            return
        if not self.divert:
            self._forward(data)
        self._line += data
        if b"\n" in data:
            *complete, self._line = self._line.split(b"\n")
            for line in complete:
                self._one_line(line, b"\n")
        if len(self._line) > 65536:  # no line is that long: whatever it is, do not hold it back
            self._end_line()

    def _end_line(self) -> None:
        if self._line:
            line, self._line = self._line, b""
            self._one_line(line, b"")

    def _one_line(self, line: bytes, sep: bytes) -> None:
        try:
            text = _text(line)
            library = library_of(text)
            if library is None:
                if self.divert:
                    self._forward(line + sep)
                return
            if self.divert and self.sink is not None:
                self.sink(library, text)
                return
            with self._lock:
                self.pending.record(library, text, shown=not self.divert)
        except Exception:  # the reader must go on: a stuck reader would block every write to fd 2
            if self.divert:
                self._forward(line + sep)

    def _forward(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            _write_all(self.original, data)

    # -- the other threads ---------------------------------------------------------------------------------
    def flush(self) -> None:
        """Return once everything written to fd 2 before this call has been read and handled.

        The marker is written without holding the lock the reader needs: a
        full pipe blocks the write until the reader has made room.
        """
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        with self._writing:
            self._asked += 1
            ticket = self._asked
            try:
                os.write(self._w, _FLUSH)  # one write of a few bytes: atomic, so never split by others' output
            except OSError:
                return
        with self._seen:
            self._seen.wait_for(lambda: self._flushed >= ticket or not self._thread.is_alive(), FLUSH_SECONDS)

    def drain(self) -> DecoderWarnings:
        """:meth:`flush`, then take what was counted since the last drain."""
        self.flush()
        with self._lock:
            return self.pending.take()

    def restore(self) -> None:
        """Put the original stderr back on fd 2 and stop the reader (tee mode)."""
        self.flush()
        os.dup2(self.original, 2)
        with contextlib.suppress(OSError):
            os.write(self._w, _STOP)
        os.close(self._w)
        self._thread.join(FLUSH_SECONDS)
        os.close(self._r)
        os.close(self.original)


class _State:
    """The process's one :class:`_Fd2Pipe` and how many in-process decodes share it."""

    lock = threading.Lock()
    pipe: _Fd2Pipe | None = None
    users = 0

    @classmethod
    def current(cls) -> _Fd2Pipe | None:
        """This process's pipe (None, too, for one a forked parent left behind: its thread did not come along)."""
        if cls.pipe is not None and cls.pipe.pid != os.getpid():
            cls.pipe, cls.users = None, 0
        return cls.pipe


def _point_python_at(fd: int) -> None:
    """``sys.stderr``, and logging handlers and faulthandler writing to it, now write to ``fd``."""
    old = sys.stderr
    new = io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), encoding=getattr(old, "encoding", None) or "utf-8",
                           errors="backslashreplace", line_buffering=True, write_through=True)
    sys.stderr = new
    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    for logger in loggers:  # handlers a forked worker inherited from its parent
        for h in logger.handlers:
            if isinstance(h, logging.StreamHandler) and h.stream is old:
                h.setStream(new)
    if faulthandler.is_enabled():
        faulthandler.enable(file=new)


def divert_stderr(sink: Callable[[str, str], None] | None = None) -> None:
    """In a worker process: send decoder warnings on fd 2 to ``sink(library, line)`` for the rest of its life.

    Without a sink the warnings are kept for :func:`captured_stderr` to hand
    over with each task's result.  ``sys.stderr`` is pointed at a copy of
    the original fd 2, so Python's own output still reaches the user
    directly; other lines on fd 2 are passed through.  Idempotent: the
    first call in a process decides.  Does nothing when fd 2 cannot be
    redirected (none is open).
    """
    with _State.lock:
        current = _State.current()
        if current is not None and current.divert:
            return
        if current is not None:  # an in-process capture is open: leave it; this process decodes in-process
            return
        try:
            pipe = _Fd2Pipe(True, sink)
        except OSError:
            return
        _State.pipe = pipe
        _point_python_at(pipe.original)
        # a pool's worker exits through multiprocessing's finalizers: the last lines are sent before it goes
        multiprocessing.util.Finalize(None, pipe.flush, exitpriority=100)


@contextlib.contextmanager
def captured_stderr(into: DecoderWarnings) -> Iterator[None]:
    """Count the decoder warnings written to fd 2 while the block runs into ``into``.

    In a process that :func:`divert_stderr` set up, the warnings gathered so
    far are added (with their lines, for the parent to log).  Otherwise fd 2
    is redirected for the block only, every byte copied straight to the
    original stderr (the user sees what they always saw), and the decoder
    warnings among them counted as shown.  Threads may nest blocks; fd 2 is
    restored when the last one ends.  When fd 2 cannot be redirected the
    block runs as is, uncounted.
    """
    with _State.lock:
        pipe = _State.current()
        if pipe is None:
            try:
                pipe = _State.pipe = _Fd2Pipe(False, None)
            except OSError:
                pipe = None
        if pipe is not None and not pipe.divert:
            _State.users += 1
    try:
        yield
    finally:
        if pipe is not None:
            into.add(pipe.drain())
            if not pipe.divert:
                with _State.lock:
                    _State.users -= 1
                    if _State.users == 0 and _State.pipe is pipe:
                        _State.pipe = None
                        pipe.restore()


def _pool_worker(conn: multiprocessing.connection.Connection) -> None:
    """A decode pool's initializer: divert this worker's decoder warnings to the parent's listener."""

    def send(library: str, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the parent has gone: nobody to tell
            conn.send_bytes(f"{library}\n{line}".encode()[:MAX_LINE_BYTES])

    try:
        divert_stderr(send)
    except Exception:  # an initializer that raises breaks the whole pool: decode with the lines on stderr instead
        log.warning("could not divert this decode worker's stderr", exc_info=True)


class DecoderLogListener:
    """The parent's side of a decode worker pool: its workers' decoder warnings, logged and counted.

    Pass :meth:`pool_options` to ``ProcessPoolExecutor`` (every pool of a
    run may share one listener); each warning is logged at INFO under
    :data:`LOGGER` as it arrives, counted in :attr:`warnings`, and given to
    ``on_warning(library)`` (a metric, say).  :meth:`close` (after the pools
    have shut down, so their workers' last lines are in) returns the totals.
    The workers write to one pipe without a lock: each message is one write
    of at most :data:`MAX_LINE_BYTES`, which the kernel never interleaves,
    so a worker that dies mid-write cannot block the others.
    """

    def __init__(self, on_warning: Callable[[str], None] | None = None, context: str = "spawn") -> None:
        self.on_warning = on_warning
        self.warnings = DecoderWarnings()
        self._context = context
        self._conns: tuple[multiprocessing.connection.Connection, multiprocessing.connection.Connection] | None = None
        self._thread: threading.Thread | None = None

    def pool_options(self) -> dict[str, Any]:
        """``initializer`` and ``initargs`` for a ``ProcessPoolExecutor``; starts listening on first use."""
        if self._conns is None:
            self._conns = multiprocessing.get_context(self._context).Pipe(duplex=False)
            self._thread = threading.Thread(target=self._listen, args=(self._conns[0],), daemon=True,
                                            name="specstore-decoder-listener")
            self._thread.start()
        return {"initializer": _pool_worker, "initargs": (self._conns[1],)}

    def _listen(self, conn: multiprocessing.connection.Connection) -> None:
        while True:
            try:
                message = conn.recv_bytes()
            except (EOFError, OSError):
                return
            if not message:
                return
            library, _, line = message.decode("utf-8", "replace").partition("\n")
            self.warnings.record(library)  # logged here, so not kept
            log.info("%s", line)
            if self.on_warning is not None:
                with contextlib.suppress(Exception):
                    self.on_warning(library)

    def close(self) -> DecoderWarnings:
        """Stop listening (the workers should be gone) and return the warnings counted; reusable afterwards."""
        if self._conns is not None and self._thread is not None:
            reader, writer = self._conns
            with contextlib.suppress(OSError):
                writer.send_bytes(b"")
            self._thread.join(FLUSH_SECONDS)
            reader.close()
            writer.close()
            self._conns = self._thread = None
        out, self.warnings = self.warnings, DecoderWarnings()
        return out
