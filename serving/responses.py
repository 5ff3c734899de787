"""The service's typed answers and errors as HTTP responses: the JSON bodies, the status codes, the headers.

:func:`handle_request_error` is the Starlette exception handler for every
:class:`~specstore.serving.errors.RequestError`; :class:`CountRequests` counts each
``/classify`` answer by status code and times it, whichever way it was made.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .answers import answer_json, file_json  # the answer's JSON, shared with `classify --json`
from .errors import FileRefused, NoFileClassified, NotRunning, Refused, RequestError, TimedOut
from .metrics import Metrics

__all__ = ["CountRequests", "StatusSent", "answer_json", "error_json", "file_json", "handle_request_error"]


def error_json(status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """``{"error": message, **extra}`` with ``status`` and ``headers``."""
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def error_response(exc: RequestError) -> JSONResponse:
    """The response for ``exc``: a refusal closes the connection (its body may be unread); a request whose
    every file failed is 500 when the server failed one of them, 422 when the uploads did."""
    if isinstance(exc, Refused):
        return error_json(exc.status, exc.message, headers={**exc.headers, "Connection": "close"})
    if isinstance(exc, NotRunning):
        return error_json(503, exc.message, headers={"Retry-After": str(exc.retry_after)})
    if isinstance(exc, FileRefused):
        return error_json(413, exc.message, file=exc.file)
    if isinstance(exc, TimedOut):
        return error_json(504, exc.message)
    if isinstance(exc, NoFileClassified):
        return error_json(500 if exc.server_fault else 422, exc.message,
                          files=[file_json(a) for a in exc.failures])
    return error_json(500, exc.message)


async def handle_request_error(request: Request, exc: Exception) -> Response:
    """Starlette's exception handler for :class:`~specstore.serving.errors.RequestError` (registered by
    :func:`specstore.serving.app.create_app`)."""
    assert isinstance(exc, RequestError)
    return error_response(exc)


class StatusSent:
    """An ASGI ``send`` that passes every message on to ``send`` and keeps the response's :attr:`status`."""

    def __init__(self, send: Send, status: int = 0) -> None:
        self.send = send
        self.status = status

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


class CountRequests:
    """Route middleware: each answer's status code counted in ``specstore_requests_total``, its time in
    ``specstore_request_seconds`` (the route's exception handler runs inside, so errors are counted too)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        sending = StatusSent(send, 500)  # 500: what Starlette answers if the route raised past its handlers
        try:
            await self.app(scope, receive, sending)
        except Exception:
            self._count(sending.status, t0)
            raise
        self._count(sending.status, t0)  # not when cancelled: the client went away, nothing was answered

    def _count(self, status: int, t0: float) -> None:
        self.metrics.requests.inc(1, str(status))
        self.metrics.latency.observe(time.perf_counter() - t0)
