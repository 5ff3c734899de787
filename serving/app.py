"""``specstore serve``'s HTTP layer (Starlette): routes over the classify service, errors mapped to responses.

Routes:

* ``GET /``: the upload page (``page.html``): drop or pick files, progress,
  top-5 genres with probabilities, each clip's log-mel picture and its genre over time (a strip of
  windows, each the colour of its top genre).
* ``POST /classify``: multipart, one or many files (any field name);
  query ``topk`` (default the server's, at most the number of labels) and ``picture=1`` (a PNG data URL
  per file).  200 ``{"model", "labels", "files": [{"file", "duration_s",
  "frames", "top": [{"label", "prob"}], "picture"?} or {"file", "error"}]}``;
  every file failed: 422 with ``error`` (500 when the server failed); limits: 413 (too large, too many
  files), 400 (no files, malformed), 503 + ``Retry-After`` (busy), 504 (timeout).
  With ``picture=1`` each file also has ``picture_axes``: ``{"time", "frequency", "db": [{"at", "label"}],
  "colours"}`` (:mod:`specstore.serving.picture`).  With ``segments=SECONDS`` (or ``segments=auto``: 1, 2, 5, 10...
  s, at most 24 windows a file) each file also has ``segment_s`` and ``segments``: genre over time,
  ``[{"start_s", "end_s", "top"}]`` (:mod:`specstore.serving.segments`); the page asks for ``auto``.
* ``GET /favicon.ico``: the page's icon (SVG).
* ``GET /health``: model, labels, device, budget, queue depth, limits; 503
  ``{"status": "unhealthy", "reason"}`` once the service cannot classify (its batcher stopped).
* ``GET /metrics``: Prometheus text (:mod:`specstore.serving.metrics`).

A request is admitted by its declared bytes before its body is read, and
its files are streamed to the service's folder
(:func:`specstore.serving.uploads.receive_uploads`), classified by
:meth:`specstore.serving.service.Service.classify` and deleted when the request
ends.  The routes raise typed errors (:mod:`specstore.serving.errors`); one
exception handler (:func:`specstore.serving.responses.handle_request_error`) makes
the responses.  Host and Origin are checked (:func:`create_app`);
connection-level limits live in :mod:`specstore.serving.connections`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from specstore.common import ConfigError
from specstore.pipeline.audio import readable_extensions

from .errors import InternalError, Refused, RequestError
from .metrics import CONTENT_TYPE
from .picture import PictureScale
from .responses import CountRequests, answer_json, error_json, handle_request_error
from .segments import AUTO, check_segment_length
from .service import Service
from .uploads import Uploads, receive_uploads

__all__ = ["OriginCheck", "Routes", "Service", "create_app"]

log = logging.getLogger(__name__)

#: The page's icon: three spectrogram bars in the picture's colours.
FAVICON = ('<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 16 16"><rect width="16" height="16" rx="3" '
           'fill="#000004"/><rect x="2" y="8" width="3" height="6" fill="#b73779"/><rect x="6.5" y="3" width="3" '
           'height="11" fill="#fc8961"/><rect x="11" y="6" width="3" height="8" fill="#fcfdbf"/></svg>')


def health_json(service: Service, formats: list[str]) -> dict[str, Any]:
    """What ``GET /health`` says: the model, the device, the queue, every limit and ``formats`` (the extensions
    this install decodes, looked up once when the routes are made: ``/health`` is polled)."""
    c, k = service.classifier, service.config
    failure = service.failure
    return {
        "status": "ok" if failure is None else "unhealthy", **({"reason": failure} if failure else {}),
        "model": service.model_name, "labels": c.label_names, "outputs": getattr(c, "outputs", "classes"),
        **_calibration(c),
        "feature": c.feature, "device": str(c.engine.device), "budget_mib": round(c.budget.budget_bytes / 2**20),
        "max_batch": c.budget.max_batch, "batching": k.policy.batching,
        "queue_depth": service.in_flight, "inflight_upload_bytes": service.upload_bytes.used,
        "open_connections": service.guard.total,
        "formats": formats, "limits": {
            "max_file_mb": k.max_file_mb, "max_files": k.max_files, "max_seconds": k.max_seconds,
            "max_sample_rate": k.max_sample_rate, "max_channels": k.max_channels,
            "max_queue": k.max_queue, "max_client_clips": k.client_clips,
            "max_inflight_mb": k.max_inflight_bytes / 2**20,
            "max_client_inflight_mb": k.client_inflight_bytes / 2**20, "timeout_s": k.timeout,
            "read_timeout_s": k.read_timeout, "min_upload_kib_s": k.min_upload_kib_s, "max_upload_s": k.max_upload_s,
            "max_connections": k.max_connections, "max_client_connections": k.max_client_connections},
    }


def _calibration(classifier: Any) -> dict[str, Any]:
    """A single-label model's ``calibration`` and ``temperature`` (as in each answer); nothing for a tagger."""
    from specstore.infer.models.calibration import calibration_fields

    calibration = getattr(classifier, "calibration", None)
    return calibration_fields(None if calibration is None else calibration.temperature,
                              getattr(classifier, "outputs", "classes"))


class Routes:
    """The endpoints over one :class:`~specstore.serving.service.Service`; errors are raised, never returned."""

    def __init__(self, service: Service) -> None:
        self.service = service
        name, limits = service.classifier.picture_part()
        self.scale = PictureScale.of(service.classifier.specs[name], limits)
        self.formats = sorted(ext.lstrip(".") for ext in readable_extensions())

    async def page(self, request: Request) -> Response:
        text = resources.files("specstore.serving").joinpath("page.html").read_text(encoding="utf-8")
        return HTMLResponse(text)

    async def favicon(self, request: Request) -> Response:
        return Response(FAVICON, media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"})

    async def health(self, request: Request) -> Response:
        body = health_json(self.service, self.formats)
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    async def metrics(self, request: Request) -> Response:
        service = self.service
        service.metrics.queue_depth.set(service.in_flight)
        service.metrics.inflight_bytes.set(service.upload_bytes.used)
        return PlainTextResponse(service.metrics.render(), media_type=CONTENT_TYPE)

    def _segments(self, request: Request) -> float | str | None:
        """``segments`` from the query: None (absent), ``auto``, or seconds (400 when not a positive number of
        at least the model's time step)."""
        text = request.query_params.get("segments")
        if text is None:
            return None
        if text.strip().lower() == AUTO:
            return AUTO
        c = self.service.classifier
        try:
            return check_segment_length(float(text), c.frame_seconds, c.window_align)
        except ConfigError as e:  # before ValueError, which it is
            raise Refused(400, str(e)) from None
        except ValueError:
            raise Refused(400, f"segments must be a number of seconds or auto, got {text!r}") from None

    def _options(self, request: Request) -> tuple[int, bool]:
        """``topk`` (at most the number of labels) and ``picture`` from the query; 400 when ``topk`` is bad."""
        q = request.query_params
        try:
            topk = int(q.get("topk", self.service.config.topk))
        except ValueError:
            raise Refused(400, "topk must be a whole number") from None
        if topk < 1:
            raise Refused(400, "topk must be at least 1")
        labels = len(self.service.classifier.label_names)
        return min(topk, labels), q.get("picture", "0").lower() in ("1", "true", "yes")

    async def classify(self, request: Request) -> Response:
        """Receive the request's files, classify them, delete them; a bug answers JSON and the server goes on."""
        service = self.service
        uploads = Uploads()
        try:
            folder = service.folder
            topk, picture = self._options(request)
            segments = self._segments(request)
            uploads = await receive_uploads(request, folder, service.config, service.upload_bytes, service.names,
                                            cut=service.guard.cut)
            request.state.files = len(uploads.files)  # for the access log
            client = request.client.host if request.client else ""
            answer = await service.classify(client, uploads.files, topk, picture, segments)
        except RequestError:
            raise
        except Exception as e:
            log.exception("POST /classify failed")
            raise InternalError() from e
        finally:
            uploads.remove(service.upload_bytes)
        return JSONResponse(answer_json(answer, self.scale if picture else None))


class OriginCheck:
    """Refuse (403) a state-changing request sent by a web page of another origin, unless it is allowed.

    A browser sends ``Origin`` with every cross-origin POST, and a
    multipart POST needs no preflight, so without this check any page the
    operator opens could make the browser spend the server.  Requests with
    no ``Origin`` (curl, scripts) and from the server's own page (same
    host and port as the ``Host`` header, which :class:`TrustedHostMiddleware`
    has checked) pass; so do the ``allowed`` origins (``--cors-origin``).
    """

    SAFE = frozenset({"GET", "HEAD", "OPTIONS"})

    def __init__(self, app: ASGIApp, allowed: tuple[str, ...] = ()) -> None:
        self.app = app
        self.allowed = {o.rstrip("/").lower() for o in allowed}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in self.SAFE:
            headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
            origin = headers.get("origin")
            if origin is not None and not self._allowed(origin, headers.get("host", "")):
                response = error_json(403, f"cross-origin request from {origin[:100]} refused (a --cors-origin "
                                       f"allows an origin)", headers={"Connection": "close"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _allowed(self, origin: str, host: str) -> bool:
        o = origin.rstrip("/").lower()
        if o in self.allowed:
            return True
        parts = urlsplit(o)
        return parts.scheme in ("http", "https") and bool(parts.netloc) and parts.netloc == host.lower()


def _lifespan(service: Service) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        try:
            yield
        finally:
            await service.stop()

    return lifespan


def create_app(service: Service) -> Starlette:
    """The Starlette application serving ``service`` (its lifespan starts and stops the workers and batcher).

    ``Host`` must be one of the config's :attr:`~specstore.serving.config.ServeConfig.hosts` (400 otherwise: DNS
    rebinding cannot read answers), and a cross-origin POST is refused unless ``cors_origins`` names it.
    """
    config = service.config
    routes = Routes(service)
    counted = [Middleware(CountRequests, metrics=service.metrics)]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(config.hosts), www_redirect=False)]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["*"]))
    middleware.append(Middleware(OriginCheck, allowed=config.cors_origins))
    app = Starlette(routes=[
        Route("/", routes.page, methods=["GET"]),
        Route("/classify", routes.classify, methods=["POST"], middleware=counted),
        Route("/favicon.ico", routes.favicon, methods=["GET"]),
        Route("/health", routes.health, methods=["GET"]),
        Route("/metrics", routes.metrics, methods=["GET"]),
    ], middleware=middleware, exception_handlers={RequestError: handle_request_error}, lifespan=_lifespan(service))
    app.state.service = service
    return app
