"""This process's file descriptor 2 redirected into a pipe that a daemon thread reads (:class:`Fd2Pipe`).

The C decoders write to fd 2 themselves, past Python's ``sys.stderr``; the
pipe lets :mod:`specstore.pipeline.decoder_log` see each line, count the decoder
warnings among them (:func:`specstore.pipeline.decoder_warnings.library_of`) and pass
the rest through.  Flush and stop requests travel in the pipe itself as
NUL-framed markers, so they arrive in order with the output before them.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable

from .decoder_warnings import MAX_LINE_BYTES, DecoderWarnings, library_of

__all__ = ["FLUSH_SECONDS", "Fd2Pipe"]

#: Seconds a flush waits for the reader thread before giving up (it never should).
FLUSH_SECONDS = 5.0

_MARK = b"\x00specstore-decoder-log:"
_FLUSH = _MARK + b"flush\x00"
_STOP = _MARK + b"stop\x00"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _text(data: bytes) -> str:
    return data[:MAX_LINE_BYTES].decode("utf-8", "replace").strip("\r\n")


class Fd2Pipe:
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
