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
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .decoder_warnings import (
    LOGGER,
    MAX_LINE_BYTES,
    MAX_LINES,  # noqa: F401 - importable from here, as before the split
    DecoderWarnings,
    library_of,
    log_lines,
    log_summary,
)
from .fd2_pipe import FLUSH_SECONDS, Fd2Pipe

__all__ = [
    "LOGGER", "DecoderLogListener", "DecoderWarnings", "captured_stderr", "divert_stderr", "library_of",
    "log_lines", "log_summary",
]

log = logging.getLogger(LOGGER)


class _State:
    """The process's one :class:`Fd2Pipe` and how many in-process decodes share it."""

    lock = threading.Lock()
    pipe: Fd2Pipe | None = None
    users = 0

    @classmethod
    def current(cls) -> Fd2Pipe | None:
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
            pipe = Fd2Pipe(True, sink)
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
                pipe = _State.pipe = Fd2Pipe(False, None)
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


def _exit_quietly(signum: int, frame: object) -> None:
    os._exit(128 + signum)  # the shell's status for a signal; no traceback, no clean-up: the parent stops too


def _pool_worker(conn: multiprocessing.connection.Connection, stop_on_interrupt: bool = False) -> None:
    """A decode pool's initializer: divert this worker's decoder warnings to the parent's listener, and answer
    Ctrl-C without a traceback.

    A terminal's Ctrl-C reaches every process of its group, and each worker
    would print a KeyboardInterrupt traceback of its own.  With
    ``stop_on_interrupt`` the worker exits at once, silently (``classify``:
    the run stops now); without, it ignores Ctrl-C and its parent stops the
    pool (``specstore serve``'s shutdown, which lets a decode under way end).
    """
    with contextlib.suppress(ValueError, OSError):  # ValueError: not the main thread (never in a pool worker)
        signal.signal(signal.SIGINT, _exit_quietly if stop_on_interrupt else signal.SIG_IGN)

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

    def pool_options(self, *, stop_on_interrupt: bool = False) -> dict[str, Any]:
        """``initializer`` and ``initargs`` for a ``ProcessPoolExecutor``; starts listening on first use.

        ``stop_on_interrupt``: the workers exit at once on Ctrl-C, else they ignore it and leave the stop to
        this process (:func:`_pool_worker`); silently either way."""
        if self._conns is None:
            self._conns = multiprocessing.get_context(self._context).Pipe(duplex=False)
            self._thread = threading.Thread(target=self._listen, args=(self._conns[0],), daemon=True,
                                            name="specstore-decoder-listener")
            self._thread.start()
        return {"initializer": _pool_worker, "initargs": (self._conns[1], stop_on_interrupt)}

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

