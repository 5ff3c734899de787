"""Running ``specstore serve``: the port first, then the model behind a ``503 starting``, then one line saying so.

:func:`serve` is what the command runs, and a script can run it the same
way.  It binds the port before anything slow happens, so a busy port is
one line at once (not a traceback after the model has loaded), and the
server answers from the first second: ``GET /health`` says
``{"status": "starting"}`` with 503 and every other request gets 503 with
``Retry-After`` while the checkpoint loads in a thread.  When the service
is ready, one line names its URL, model, labels and limits.  Each request
is one access-log line (logger ``specstore.serving.access``: client, method, path,
status, files, seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from specstore.common import ConfigError

from .config import ServeConfig
from .connections import ConnectionGuard, ensure_descriptors, uvicorn_config
from .responses import StatusSent

__all__ = ["AccessLog", "Starting", "bind", "serve"]

log = logging.getLogger(__name__)
access = logging.getLogger("specstore.serving.access")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port``; a port in use (or any bind failure) is one ConfigError line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        hint = ("another server is listening there; stop it or choose another --port" if e.errno == errno.EADDRINUSE
                else e.strerror or str(e))
        raise ConfigError(f"cannot listen on {host}:{port}: {hint}") from None
    sock.set_inheritable(True)
    return sock


class Starting:
    """An ASGI application that answers 503 while ``load`` builds the real one in a thread, then hands over.

    ``load`` returns ``(app, start, stop)``: the application, and coroutines
    starting and stopping what it needs (workers, batcher).  A failed load
    is kept in :attr:`error` and ``on_failure`` is called (the server stops).
    """

    def __init__(self, load: Callable[[], tuple[ASGIApp, Any, Any]], *, retry_after: int = 1,
                 on_ready: Callable[[], None] | None = None, on_failure: Callable[[], None] | None = None) -> None:
        self.load = load
        self.retry_after = retry_after
        self.on_ready = on_ready
        self.on_failure = on_failure
        self.app: ASGIApp | None = None
        self.error: BaseException | None = None
        self._stop: Any = None
        self._task: asyncio.Task[None] | None = None

    async def _load(self) -> None:
        try:
            app, start, stop = await asyncio.to_thread(self.load)
            await start()
            self._stop = stop
            self.app = app
        except Exception as e:  # reported by serve(); the server stops
            self.error = e
            if self.on_failure is not None:
                self.on_failure()
            return
        if self.on_ready is not None:
            self.on_ready()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.app is not None:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            if scope["path"] == "/health":
                response = JSONResponse({"status": "starting"}, status_code=503)
            else:
                response = JSONResponse({"error": "the server is starting (loading the model); retry shortly"},
                                        status_code=503,
                                        headers={"Retry-After": str(self.retry_after), "Connection": "close"})
            await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._task = asyncio.create_task(self._load(), name="specstore-load")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self._task is not None and not self._task.done():
                    self._task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await self._task
                if self._stop is not None:
                    await self._stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


class AccessLog:
    """One ``specstore.serving.access`` INFO line per HTTP request: client, method, path, status, files, seconds.

    ``files`` is what the request's handler put in ``scope["state"]["files"]`` (``-`` for other routes).
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not access.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        sending = StatusSent(send)
        try:
            await self.app(scope, receive, sending)
        finally:
            status = sending.status
            client = scope.get("client") or ("-", 0)
            files = scope.get("state", {}).get("files")
            access.info('%s "%s %s" %s%s %.2f s', client[0], scope["method"], scope["path"], status or "-",
                        "" if files is None else f" {files} file{'s' if files != 1 else ''}", time.perf_counter() - t0)


def describe(service: Any, url: str) -> str:
    """The one line ``specstore serve`` prints when it is ready."""
    c, k = service.classifier, service.config
    labels = ", ".join(c.label_names[:8]) + (f", ... ({len(c.label_names)} in all)" if len(c.label_names) > 8 else "")
    return (f"serving {service.model_name} ({labels}) on {url} ({c.engine.device}); limits: {k.max_files} files "
            f"of {k.max_file_mb:g} MiB and {k.max_seconds:g} s per request, queue {k.max_queue}, timeout "
            f"{k.timeout:g} s; Ctrl-C stops it")


def serve(load_classifier: Callable[[], Any], config: ServeConfig, *, log_level: str = "warning",
          announce: Callable[[str], None] | None = None) -> None:
    """Serve the classifier ``load_classifier()`` builds under ``config`` until interrupted (see the module doc).

    ``announce`` receives the progress lines (default: the ``specstore.serving.server`` logger at INFO).  A failed
    load stops the server and is raised here (its one-line error).
    """
    say = announce or log.info
    ensure_descriptors(config)
    sock = bind(config.host, config.port)
    host = f"[{config.host}]" if ":" in config.host else config.host
    url = f"http://{host}:{sock.getsockname()[1]}/"
    guard = ConnectionGuard(config)
    server: uvicorn.Server | None = None
    service_box: list[Any] = []

    def load() -> tuple[ASGIApp, Any, Any]:
        from .app import Service, create_app  # torch and the model: after the port is open

        service = Service(load_classifier(), config, guard=guard)
        service_box.append(service)
        return create_app(service), service.start, service.stop

    def stop_server() -> None:
        if server is not None:
            server.should_exit = True

    starting = Starting(load, retry_after=config.retry_after,
                        on_ready=lambda: say(describe(service_box[0], url)), on_failure=stop_server)
    server = uvicorn.Server(uvicorn_config(AccessLog(starting), config, guard, log_level=log_level,
                                           timeout_graceful_shutdown=10))
    say(f"listening on {url}; loading the model (GET /health answers 503 until it is ready)")
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    if starting.error is not None:
        raise starting.error
