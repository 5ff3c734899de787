"""The service's typed answers and errors as HTTP responses: the JSON bodies, the status codes, the headers.

:func:`handle_request_error` is the Starlette exception handler for every
:class:`~serving.errors.RequestError`; :class:`CountRequests` counts each
``/classify`` answer by status code and times it, whichever way it was made.
"""

from __future__ import annotations

import base64
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .answers import Answer, Classified, FileAnswer
from .errors import FileRefused, NoFileClassified, NotRunning, Refused, RequestError, TimedOut
from .metrics import Metrics
from .picture import PictureScale

__all__ = ["CountRequests", "StatusSent", "answer_json", "error_json", "file_json", "handle_request_error"]


def error_json(status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    """``{"error": message, **extra}`` with ``status`` and ``headers``."""
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _scores(top: list[tuple[str, float]], outputs: str) -> dict[str, Any]:
    """``{"top": [{"label", "prob"}]}``, or a tagger's ``{"tags": [{"tag", "score"}]}``."""
    if outputs == "tags":
        return {"tags": [{"tag": label, "score": round(p, 6)} for label, p in top]}
    return {"top": [{"label": label, "prob": round(p, 6)} for label, p in top]}


def file_json(answer: FileAnswer, scale: PictureScale | None = None, outputs: str = "classes") -> dict[str, Any]:
    """One file's answer: ``{"file", "duration_s", "frames", "top": [{"label", "prob"}], "picture"?,
    "picture_axes"?, "segment_s"?, "segments"?}`` (a PNG data URL; its tick labels by ``scale``,
    :meth:`PictureScale.axes`; each segment ``{"start_s", "end_s", "top"}``) or ``{"file", "error"}``.  A
    tagger's (``outputs == "tags"``) carries ``"tags": [{"tag", "score"}]`` (independent scores) instead of
    ``"top"``, in the file and in each segment."""
    if not isinstance(answer, Classified):
        return {"file": answer.file, "error": answer.error}
    out: dict[str, Any] = {
        "file": answer.file, "duration_s": round(answer.duration, 3), "frames": answer.frames,
        **_scores(answer.top, outputs),
    }
    if answer.picture is not None:
        out["picture"] = "data:image/png;base64," + base64.b64encode(answer.picture).decode("ascii")
        if scale is not None:
            out["picture_axes"] = scale.axes(answer.frames)
    if answer.segments is not None:
        out["segment_s"] = answer.segment_s
        out["segments"] = [{"start_s": round(s.start_s, 3), "end_s": round(s.end_s, 3), **_scores(s.top, outputs)}
                           for s in answer.segments]
    return out


def answer_json(answer: Answer, scale: PictureScale | None = None) -> dict[str, Any]:
    """The request's JSON: model, labels, ``outputs`` (``classes`` or ``tags``), for a single-label model its
    ``calibration`` (``temperature`` or ``uncalibrated``) with its ``temperature`` (null when uncalibrated) --
    a tagger's answer has neither key (its independent scores take no temperature) -- and one object per file."""
    from infer.calibration import calibration_fields  # here: the server answers its port before torch loads

    cal = calibration_fields(answer.temperature, answer.outputs)
    return {"model": answer.model, "labels": answer.labels, "outputs": answer.outputs, **cal,
            "files": [file_json(a, scale, answer.outputs) for a in answer.files]}


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
    """Starlette's exception handler for :class:`~serving.errors.RequestError` (registered by
    :func:`serving.app.create_app`)."""
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
