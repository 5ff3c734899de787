"""Connection limits below the ASGI layer: deadlines and connection caps for uvicorn's h11 protocol.

uvicorn (0.55) has no header or body read timeout: its keep-alive timer is
cancelled by every byte that arrives, and an ASGI application never sees a
request whose headers are still arriving.  Nor has it a write timeout: an
answer the client never reads waits in the transport for ever, and with it
the connection.  So a client that sends one byte every few seconds, or one
that pipelines requests and never reads the answers, holds its connection,
and a few hundred such clients fill the connection cap, ``/health``
included.  :class:`GuardedH11Protocol` is uvicorn's h11 protocol with these
additions:

* **Read deadlines.**  A request, headers and body, must arrive within
  ``read_timeout`` seconds of the moment it was awaited (the connection
  opening, or the previous answer), or, for a larger upload, at no less
  than ``min_upload_kib_s`` on average since then, and in any case within
  ``max_upload_s``: a slow but real upload goes through, a trickle is
  dropped, and no upload holds its connection (and its bytes of the upload
  budget) for longer than that.  Time during which the server itself is
  not reading (the application has not taken the bytes that arrived, e.g.
  while the request waits for admission) is not counted against the
  client.  A late client gets ``408`` (when no answer has started) and its
  connection is closed; the application sees a disconnect.
* **Write deadlines, one answer at a time.**  The transport pauses writing
  as soon as any byte of an answer is left waiting for the client (a write
  buffer limit of 0), so "paused" means "an answer is unsent".  A
  connection paused for longer than ``read_timeout``, or for a large
  answer taken more slowly than ``min_upload_kib_s`` on average after
  that (counting what left the kernel's buffers too), is reset: its unsent
  bytes are discarded, since a graceful close would wait for them for
  ever.  And no further pipelined request is read while an answer is
  unsent: the next one is parsed only once the last byte of the previous
  answer has gone to the kernel, so a client that never reads costs one
  answer's bytes and then its deadline.
* **Connection caps.**  At most ``max_connections`` open at once, and
  ``max_client_connections`` from one client address; a connection over
  either cap gets ``503`` with ``Retry-After`` and is closed before
  anything is read.
* **Uploads given way.**  The upload budget (:class:`specstore.serving.uploads.ByteBudget`)
  asks the guard to drop uploads that stalled (:meth:`ConnectionGuard.drop_stalled`)
  or to cut a client's upload for another client's share
  (:meth:`ConnectionGuard.cut`: ``503`` + ``Retry-After``, then closed).

Every drop is counted in ``specstore_dropped_connections_total`` by what
was late: ``idle``, ``headers``, ``body`` (below the average rate),
``upload_time`` (over ``max_upload_s``), ``stalled``, ``cut`` (for another
client's share of the upload budget) and ``unread`` (an answer not taken).

:func:`uvicorn_config` builds the uvicorn configuration that uses it;
``specstore serve`` runs exactly that, and so can a user's own script.
Behind a reverse proxy the proxy is one client address: raise
``max_client_connections`` to the proxy's upstream connection count (the
proxy limits its own clients).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import resource
import socket
import struct
import termios
from collections import Counter
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from specstore.common import ConfigError

from .config import ServeConfig
from .metrics import Metrics
from .tally import ClientTally

__all__ = ["STALLED_S", "ConnectionGuard", "GuardedH11Protocol", "ensure_descriptors", "uvicorn_config"]

log = logging.getLogger(__name__)

_OWN_DESCRIPTORS = 256  # file descriptors the server needs beside its connections (libraries, pipes, files)
_PAUSED_CHECK_S = 0.5  # how often a connection whose reading the server paused looks again, seconds
STALLED_S = 2.0
"""Seconds without a byte after which an upload counts as stalled (dropped when the upload budget is full)."""


def _raw_response(status: int, reason: str, message: str, extra: str = "") -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 answer with a JSON ``error``, written straight to the socket."""
    body = ('{"error": "' + message.replace("\\", "\\\\").replace('"', '\\"') + '"}').encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            f"connection: close\r\n{extra}\r\n")
    return head.encode("latin-1") + body


def _kernel_unsent(sock: Any) -> int:
    """Bytes of ``sock``'s answers the kernel still holds (unsent or unacknowledged); 0 where it cannot say."""
    try:
        return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0])
    except (OSError, ValueError, AttributeError):
        return 0


class ConnectionGuard:
    """Open connections in all and per client address, shared by every connection of one server.

    ``admit``/``release`` are called from the event loop's thread only (the
    protocol's callbacks), so plain counters suffice.  Refusals and drops
    are counted in ``metrics``.
    """

    def __init__(self, config: ServeConfig, metrics: Metrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.connections = ClientTally()
        self.open: set[GuardedH11Protocol] = set()
        self.by_peer: dict[tuple[str, int], GuardedH11Protocol] = {}  # open connections by (address, port)

    @property
    def total(self) -> int:
        return self.connections.total

    @property
    def by_client(self) -> Counter[str]:
        return self.connections.by_client

    def admit(self, client: str) -> str | None:
        """Count a new connection from ``client``; the reason it is refused, or None when admitted."""
        reason = self.connections.refusal(client, 1, self.config.max_connections, self.config.max_client_connections)
        if reason is not None:
            self.metrics.refused_connections.inc(1, reason)
            return reason
        self.connections.add(client)
        self.metrics.connections.set(self.total)
        return None

    def release(self, client: str) -> None:
        """Forget an admitted connection from ``client``."""
        self.connections.remove(client)
        self.metrics.connections.set(self.total)

    def dropped(self, phase: str) -> None:
        self.metrics.dropped_connections.inc(1, phase)

    def drop_stalled(self, seconds: float = STALLED_S) -> list[tuple[str, int]]:
        """Drop every connection whose upload has sent nothing for ``seconds``; their peers (address, port).

        Called when the server is out of upload budget: an upload that has
        stalled holds bytes that a client ready to send could use, so under
        that pressure it loses the rest of its read deadline.
        """
        now = asyncio.get_running_loop().time()
        stalled = [p for p in self.open if p.stalled_for(now) >= seconds]
        for p in stalled:
            p.drop("stalled")
        return [p.client for p in stalled if p.client is not None]

    def cut(self, peer: tuple[str, int], message: str) -> bool:
        """Answer the upload on connection ``peer`` (address, port) 503 + ``Retry-After`` with ``message`` and
        close it (its bytes of the budget went to another client); whether that connection was still open."""
        p = self.by_peer.get(peer)
        if p is None or p.transport.is_closing():
            return False
        p.cut(message)
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and connection caps (see the module docstring)."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._admitted = False
        self._client_key = ""
        self._phase_start = self.loop.time()  # when the current request's headers (or body) began to count
        self._body_bytes = 0
        self._header_bytes = 0
        self._paused_s = 0.0
        self._last_check = self._last_data = self._phase_start
        self._timer: asyncio.TimerHandle | None = None
        self._write_timer: asyncio.TimerHandle | None = None
        self._write_paused_at = 0.0  # when the transport last paused writing (the event loop's clock, s)
        self._write_waiting = 0  # bytes of the answer waiting then
        self._next_held = False  # an answer is complete but unsent: the next pipelined request waits for it
        self._dropped = False  # closed by a deadline or a cut (counted once)

    # -- connection life --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=0)  # paused for writing while any byte of an answer waits
        self._client_key = self.client[0] if self.client else ""
        refused = self.guard.admit(self._client_key)
        if refused is not None:
            what = (f"{self.guard.config.max_connections} connections are open" if refused == "total" else
                    f"{self.guard.config.max_client_connections} connections from your address are open")
            transport.write(_raw_response(503, "Service Unavailable", f"the server is busy: {what}",
                                          f"retry-after: {self.guard.config.retry_after}\r\n"))
            transport.close()
            return
        self._admitted = True
        self.guard.open.add(self)
        if self.client is not None:
            self.guard.by_peer[self.client] = self
        self._start_phase()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        self._cancel_write_timer()
        if self._admitted:
            self._admitted = False
            self.guard.open.discard(self)
            if self.client is not None and self.guard.by_peer.get(self.client) is self:
                del self.guard.by_peer[self.client]
            self.guard.release(self._client_key)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self._last_data = self.loop.time()
        before = self.conn.their_state
        if before is h11.IDLE:
            self._header_bytes += len(data)
        super().data_received(data)
        after = self.conn.their_state
        if before is h11.SEND_BODY:
            self._body_bytes += len(data)
        if after is not before:
            self._arm()

    def on_response_complete(self) -> None:
        if self.flow.write_paused and not self.transport.is_closing():
            self._next_held = True  # read nothing more until this answer is out (resume_writing goes on)
            self.flow.pause_reading()
            return
        self._next_request()

    def _next_request(self) -> None:
        super().on_response_complete()  # resumes reading and starts a pipelined request, if one is waiting
        if not self.transport.is_closing():
            self._start_phase()  # the next request (headers, or a pipelined one's body) gets its own deadline

    # -- answers -----------------------------------------------------------------------------------
    def pause_writing(self) -> None:
        """An answer's bytes wait for the client: it must take them within ``read_timeout``, or at
        ``min_upload_kib_s`` on average after that (:meth:`_unread`)."""
        super().pause_writing()
        if self._write_timer is None:
            self._write_paused_at = self.loop.time()
            self._write_waiting = self._unsent()
            self._write_timer = self.loop.call_later(self.guard.config.read_timeout, self._unread)

    def resume_writing(self) -> None:
        """Every byte of the answer went out: the deadline ends, and a pipelined request may be read."""
        super().resume_writing()
        self._cancel_write_timer()
        if self._next_held and not self.transport.is_closing():
            self._next_held = False
            self._next_request()

    def _unsent(self) -> int:
        """Bytes of answers the client has not taken: in the transport's buffer and in the kernel's (which holds
        megabytes on a fast link, so the transport's alone would lag far behind what the client reads)."""
        return self.transport.get_write_buffer_size() + _kernel_unsent(self.transport.get_extra_info("socket"))

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _unread(self) -> None:
        """The answer's deadline: abort a client that did not take it in time (a close would wait for the unsent
        bytes for ever); a client taking it at the minimum rate gets more time.  No answer is written while
        one waits (uvicorn drains first), so what left the buffers is what the client took."""
        self._write_timer = None
        if not self.flow.write_paused:
            return
        config = self.guard.config
        taken = self._write_waiting - self._unsent()
        allowed = max(config.read_timeout, taken / config.min_upload_bytes_s)
        if self.loop.time() < self._write_paused_at + allowed:
            self._write_timer = self.loop.call_at(self._write_paused_at + allowed, self._unread)
            return
        if not self._dropped:
            self._dropped = True
            self.guard.dropped("unread")
            log.info("dropped %s: it did not take its answer in time", self._client_key)
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # reset at once: a plain close would leave the kernel the unsent bytes to deliver
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()

    # -- deadlines ---------------------------------------------------------------------------------
    def _start_phase(self) -> None:
        self._phase_start = self._last_check = self._last_data = self.loop.time()
        self._body_bytes = self._header_bytes = 0
        self._paused_s = 0.0
        self._arm()

    def _deadline(self) -> float | None:
        """When the current request is late (the event loop's clock, seconds), or None while no read is awaited.

        Headers and body share one clock, started when the request was awaited: ``read_timeout`` seconds
        for the whole request, or more for a body that keeps ``min_upload_kib_s`` on average since then, but
        never more than ``max_upload_s``.
        """
        config = self.guard.config
        state = self.conn.their_state
        if state is h11.IDLE:
            return self._phase_start + config.read_timeout + self._paused_s
        if state is h11.SEND_BODY:
            return self._phase_start + self._paused_s + min(self._rate_allows(), config.max_upload_s)
        return None  # the request is whole: the application's own timeout governs

    def _rate_allows(self) -> float:
        """Seconds the body's bytes so far buy at the minimum rate (at least ``read_timeout``)."""
        config = self.guard.config
        return max(config.read_timeout, self._body_bytes / config.min_upload_bytes_s)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        self._cancel_timer()
        deadline = self._deadline()
        if deadline is not None and self._admitted:
            self._timer = self.loop.call_at(deadline, self._check)

    def _check(self) -> None:
        self._timer = None
        if not self._admitted or self.transport.is_closing():
            return
        now = self.loop.time()
        if self._behind():  # the server is not reading, not the client: that time is not the client's
            self._paused_s += now - self._last_check
            self._last_check = now
            self._timer = self.loop.call_later(_PAUSED_CHECK_S, self._check)
            return
        self._last_check = now
        deadline = self._deadline()
        if deadline is None:
            return
        if now < deadline:
            self._timer = self.loop.call_at(deadline, self._check)
            return
        self.drop()

    def _behind(self) -> bool:
        """Whether the server, not the client, is holding things up: reading paused, or bytes not yet taken."""
        return self.flow.read_paused or (self.cycle is not None and len(self.cycle.body) > 0)

    def stalled_for(self, now: float) -> float:
        """Seconds this connection's upload has sent nothing while the server was ready to read (0: not stalled)."""
        if self.conn.their_state is not h11.SEND_BODY or self._behind() or self.transport.is_closing():
            return 0.0
        return now - self._last_data

    def drop(self, why: str = "") -> None:
        """Close a connection whose client is late (or stalled, ``why``), answering 408 where no answer started."""
        config = self.guard.config
        state = self.conn.their_state
        phase = "body" if state is h11.SEND_BODY else "headers"
        idle = phase == "headers" and self._header_bytes == 0
        overtime = phase == "body" and not why and self._rate_allows() >= config.max_upload_s
        self._dropped = True
        self.guard.dropped(why or ("idle" if idle else "upload_time" if overtime else phase))
        log.info("dropped %s: its request %s %s", self._client_key, phase,
                 "stalled while others waited for upload bytes" if why else "did not arrive in time")
        started = self.cycle is not None and self.cycle.response_started and phase == "body"
        if not idle and not started:
            limit = (f"headers within {config.read_timeout:g} s" if phase == "headers" else
                     f"a whole upload within {config.max_upload_s:g} s" if overtime else
                     f"a body at {config.min_upload_kib_s:g} KiB/s or faster after {config.read_timeout:g} s")
            self.transport.write(_raw_response(408, "Request Timeout", f"the request was too slow: send {limit}"))
        self.transport.close()

    def cut(self, message: str) -> None:
        """Close this connection's upload for another client's share of the budget: 503 + ``Retry-After``."""
        self._dropped = True
        self.guard.dropped("cut")
        log.info("cut %s's upload: %s", self._client_key, message)
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(_raw_response(503, "Service Unavailable", message,
                                               f"retry-after: {self.guard.config.retry_after}\r\n"))
        self.transport.close()


def uvicorn_config(app: Any, config: ServeConfig, guard: ConnectionGuard, **kwargs: Any) -> uvicorn.Config:
    """The uvicorn configuration that serves ``app`` on ``config.host:config.port`` through the guarded protocol.

    ``kwargs`` go to :class:`uvicorn.Config` (``log_level``, ...).  One
    process, the h11 protocol (the guard is a subclass of it), no
    WebSocket, and a connection's idle keep-alive ended after 5 s.
    """
    protocol = functools.partial(GuardedH11Protocol, guard=guard)
    return uvicorn.Config(app, host=config.host, port=config.port, http=protocol,  # type: ignore[arg-type]
                          ws="none", timeout_keep_alive=5, **kwargs)


def ensure_descriptors(config: ServeConfig) -> int:
    """Raise this process's soft open-file limit so ``max_connections`` fit beside the server's own files.

    Returns the descriptors needed; a hard limit too low for them is one :class:`~specstore.common.ConfigError` line
    (running out of descriptors would stop the server answering anyone, ``/health`` included).
    """
    need = config.max_connections + _OWN_DESCRIPTORS + 8 * config.workers
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise ConfigError(f"--max-connections {config.max_connections} needs about {need} open files and this "
                              f"process may open {hard} (ulimit -n): lower --max-connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return need
