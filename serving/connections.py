"""Connection limits below the ASGI layer: read deadlines and connection caps for uvicorn's h11 protocol.

uvicorn (0.55) has no header or body read timeout: its keep-alive timer is
cancelled by every byte that arrives, and an ASGI application never sees a
request whose headers are still arriving.  So a client that sends one byte
every few seconds holds its connection, and a few hundred such clients
exhaust the server's file descriptors.  :class:`GuardedH11Protocol` is
uvicorn's h11 protocol with two additions:

* **Read deadlines.**  A request, headers and body, must arrive within
  ``read_timeout`` seconds of the moment it was awaited (the connection
  opening, or the previous answer), or, for a larger upload, at no less
  than ``min_upload_kib_s`` on average since then: a slow but real upload
  goes through and a trickle is dropped.  Time during which the server
  itself is not reading (the application has not taken the bytes that
  arrived, e.g. while the request waits for admission) is not counted
  against the client.  A late client gets ``408`` (when no answer has
  started) and its connection is closed; the application sees a
  disconnect.
* **Connection caps.**  At most ``max_connections`` open at once, and
  ``max_client_connections`` from one client address; a connection over
  either cap gets ``503`` with ``Retry-After`` and is closed before
  anything is read.

:func:`uvicorn_config` builds the uvicorn configuration that uses it;
``specstore serve`` runs exactly that, and so can a user's own script.
Behind a reverse proxy the proxy is one client address: raise
``max_client_connections`` to the proxy's upstream connection count (the
proxy limits its own clients).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import resource
from collections import Counter
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from store import ConfigError

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

    def drop_stalled(self, seconds: float = STALLED_S) -> int:
        """Drop every connection whose upload has sent nothing for ``seconds``; how many were dropped.

        Called when the server is out of upload budget: an upload that has
        stalled holds bytes that a client ready to send could use, so under
        that pressure it loses the rest of its read deadline.
        """
        now = asyncio.get_running_loop().time()
        stalled = [p for p in self.open if p.stalled_for(now) >= seconds]
        for p in stalled:
            p.drop("stalled")
        return len(stalled)


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

    # -- connection life --------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
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
        self._start_phase()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if self._admitted:
            self._admitted = False
            self.guard.open.discard(self)
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
        super().on_response_complete()
        if not self.transport.is_closing():
            self._start_phase()  # the next request (headers, or a pipelined one's body) gets its own deadline

    # -- deadlines ---------------------------------------------------------------------------------
    def _start_phase(self) -> None:
        self._phase_start = self._last_check = self._last_data = self.loop.time()
        self._body_bytes = self._header_bytes = 0
        self._paused_s = 0.0
        self._arm()

    def _deadline(self) -> float | None:
        """When the current request is late (the event loop's clock, seconds), or None while no read is awaited.

        Headers and body share one clock, started when the request was awaited: ``read_timeout`` seconds
        for the whole request, or more for a body that keeps ``min_upload_kib_s`` on average since then.
        """
        config = self.guard.config
        state = self.conn.their_state
        if state is h11.IDLE:
            return self._phase_start + config.read_timeout + self._paused_s
        if state is h11.SEND_BODY:
            return (self._phase_start + self._paused_s
                    + max(config.read_timeout, self._body_bytes / config.min_upload_bytes_s))
        return None  # the request is whole: the application's own timeout governs

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
        state = self.conn.their_state
        phase = "body" if state is h11.SEND_BODY else "headers"
        idle = phase == "headers" and self._header_bytes == 0
        self.guard.dropped(why or ("idle" if idle else phase))
        log.info("dropped %s: its request %s %s", self._client_key, "body" if phase == "body" else "headers",
                 "stalled while others waited for upload bytes" if why else "did not arrive in time")
        started = self.cycle is not None and self.cycle.response_started and phase == "body"
        if not idle and not started:
            config = self.guard.config
            limit = (f"headers within {config.read_timeout:g} s" if phase == "headers" else
                     f"a body at {config.min_upload_kib_s:g} KiB/s or faster after {config.read_timeout:g} s")
            self.transport.write(_raw_response(408, "Request Timeout", f"the request was too slow: send {limit}"))
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

    Returns the descriptors needed; a hard limit too low for them is one :class:`~store.ConfigError` line
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
