"""``specstore serve``: the HTTP service (Starlette on uvicorn) over the decode pool and the online batcher.

Routes:

* ``GET /``: the upload page (``page.html``): drop or pick files, progress,
  top-5 genres with probabilities and each clip's log-mel picture.
* ``POST /classify``: multipart, one or many files (any field name);
  query ``topk`` (default the server's, at most the number of labels) and ``picture=1`` (a PNG data URL
  per file).  200 ``{"model", "labels", "files": [{"file", "duration_s",
  "frames", "top": [{"label", "prob"}], "picture"?} or {"file", "error"}]}``;
  every file failed: 422 with ``error`` (500 when the server failed); limits: 413 (too large, too many
  files), 400 (no files, malformed), 503 + ``Retry-After`` (busy), 504 (timeout).
* ``GET /health``: model, labels, device, budget, queue depth, limits.
* ``GET /metrics``: Prometheus text (:mod:`serving.metrics`).

A request is admitted by its declared bytes before its body is read, and
its files are streamed to the server's own folder
(:func:`serving.uploads.receive_uploads`); each is decoded by path in a
worker process (:func:`serving.clips.decode_file`: content checked by
decoding, never by name; the client's file name is only echoed back),
queued on the :class:`~serving.batcher.Batcher`, and deleted when its
request ends.  A bad upload is a JSON error for that file alone.  Host and
Origin are checked (:func:`create_app`); connection-level limits live in
:mod:`serving.connections`.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures as cf
import contextlib
import functools
import itertools
import logging
import multiprocessing
import shutil
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures.process import BrokenProcessPool
from importlib import resources
from pathlib import Path
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

from pipeline.decoder_log import DecoderLogListener, log_summary

from .batcher import Batcher, BatchError
from .clips import ClipError, DecodedClip, decode_file, warm_up
from .config import ServeConfig
from .connections import ConnectionGuard
from .metrics import Metrics
from .model import Classifier, top_k
from .tally import ClientTally
from .uploads import ByteBudget, Refused, Upload, Uploads, make_folder, receive_uploads

__all__ = ["Service", "create_app"]

log = logging.getLogger(__name__)

_SERVER_FAULT = "_server_fault"  # marks an answer that failed on the server's side, not the upload's


def _error(status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


class Service:
    """The server's state: classifier, decode pool, batcher, metrics and limits.  One per process.

    ``guard``: the connection guard the server's protocol uses (:func:`serving.connections.uvicorn_config`),
    when it was made before the service (:func:`serving.server.serve` binds the port first); its metrics
    become the service's.
    """

    def __init__(self, classifier: Classifier, config: ServeConfig | None = None, *,
                 guard: ConnectionGuard | None = None) -> None:
        config = config or ServeConfig()
        self.classifier = classifier
        self.guard = guard or ConnectionGuard(config)  # the server's connections (its protocol shares it)
        self.metrics: Metrics = self.guard.metrics
        self.batcher = Batcher(classifier, config.policy, self.metrics)
        self._config = config
        self.guard.config = config
        self.upload_bytes = ByteBudget(config.max_inflight_bytes, on_full=self.guard.drop_stalled)
        self.clips = ClientTally()  # clips decoding, waiting or running, by client address
        self._pool: cf.ProcessPoolExecutor | None = None
        self._folder: Path | None = None
        self._names = itertools.count()
        self._picture = classifier.picture_part()
        self.decoder_log = DecoderLogListener(lambda library: self.metrics.decoder_warnings.inc())

    @property
    def config(self) -> ServeConfig:
        return self._config

    @config.setter
    def config(self, config: ServeConfig) -> None:
        """Replace the limits; the byte budget and the connection guard follow (bytes held stay counted)."""
        self._config = config
        self.upload_bytes.capacity = config.max_inflight_bytes
        self.guard.config = config

    @property
    def in_flight(self) -> int:
        """Clips admitted and not yet answered."""
        return self.clips.total

    @in_flight.setter
    def in_flight(self, n: int) -> None:
        self.clips.total = n

    @property
    def by_client(self) -> Counter[str]:
        return self.clips.by_client

    @property
    def model_name(self) -> str:
        """The checkpoint's file name (never the server's path to it)."""
        return self.classifier.name.replace("\\", "/").rsplit("/", 1)[-1]

    # -- life cycle ---------------------------------------------------------------------------------
    def _new_pool(self) -> cf.ProcessPoolExecutor:
        # spawn: the server has torch's threads running, which a fork would copy half-started; the workers'
        # decoder messages on stderr (libmpg123's) come to self.decoder_log: logged under specstore.decoder, counted
        return cf.ProcessPoolExecutor(max_workers=self.config.workers, mp_context=multiprocessing.get_context("spawn"),
                                      **self.decoder_log.pool_options())

    async def start(self) -> None:
        """Make the uploads folder, start the decode workers (warmed up) and the batcher."""
        self._folder = make_folder()
        self._pool = self._new_pool()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, warm_up) for _ in range(self.config.workers)))
        await self.batcher.start()

    async def stop(self) -> None:
        """Stop the batcher and the workers (off the event loop) and remove the uploads folder."""
        await self.batcher.stop()
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.get_running_loop().run_in_executor(
                None, functools.partial(pool.shutdown, wait=True, cancel_futures=True))
        log_summary(self.decoder_log.close(), "since the server started")
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    # -- one file -----------------------------------------------------------------------------------
    async def decode(self, path: Path, picture: bool) -> DecodedClip:
        """Decode an upload in the worker pool; a crashed worker's pool is replaced and the file tried once more.

        The limits on the decode's work (duration, sample rate, channels) are checked from the file's header
        in the worker before decoding starts: a decode cannot be cancelled once it runs.  A decode whose
        request has gone is cancelled if it has not started, and its result dropped if it has.
        """
        loop = asyncio.get_running_loop()
        config = self.config
        job = functools.partial(decode_file, str(path), self.classifier.specs, max_seconds=config.max_seconds,
                                max_sample_rate=config.max_sample_rate, max_channels=config.max_channels,
                                picture=self._picture if picture else None)
        for attempt in range(2):
            pool = self._pool
            if pool is None:
                raise BatchError("the server is not running")
            try:
                return await loop.run_in_executor(pool, job)
            except BrokenProcessPool:
                log.warning("a decode worker died; starting a new pool")
                if self._pool is pool:
                    self._pool = self._new_pool()
                    pool.shutdown(wait=False, cancel_futures=True)
                if attempt:
                    raise ClipError("the decoder crashed on this file") from None
        raise AssertionError("unreachable")

    async def classify_one(self, upload: Upload, topk: int, picture: bool) -> dict[str, Any]:
        """The answer for one uploaded file (a result or an ``error``); counted in the metrics."""
        name = upload.name
        if upload.path is None or upload.error is not None:
            self.metrics.files.inc(1, "bad")
            return {"file": name, "error": upload.error or "no data"}
        if upload.size == 0:
            self.metrics.files.inc(1, "bad")
            return {"file": name, "error": "empty file"}
        t0 = time.perf_counter()
        try:
            clip = await self.decode(upload.path, picture)
        except ClipError as e:
            self.metrics.files.inc(1, "bad")
            return {"file": name, "error": str(e)}
        except BatchError as e:
            self.metrics.files.inc(1, "failed")
            return {"file": name, "error": str(e), _SERVER_FAULT: True}
        finally:
            self.metrics.decode_seconds.observe(time.perf_counter() - t0)
        try:
            probs = await self.batcher.classify(clip.features)
        except BatchError as e:
            self.metrics.files.inc(1, "failed")
            return {"file": name, "error": str(e), _SERVER_FAULT: True}
        self.metrics.files.inc(1, "ok")
        self.metrics.audio_seconds.inc(clip.duration)
        out: dict[str, Any] = {
            "file": name, "duration_s": round(clip.duration, 3), "frames": clip.n_frames,
            "top": [{"label": lab, "prob": round(p, 6)} for lab, p in top_k(probs, self.classifier.label_names, topk)],
        }
        if picture and clip.picture is not None:
            out["picture"] = "data:image/png;base64," + base64.b64encode(clip.picture).decode("ascii")
        return out

    # -- routes -------------------------------------------------------------------------------------
    async def page(self, request: Request) -> Response:
        text = resources.files("serving").joinpath("page.html").read_text(encoding="utf-8")
        return HTMLResponse(text)

    async def health(self, request: Request) -> Response:
        c, k = self.classifier, self.config
        return JSONResponse({
            "status": "ok", "model": self.model_name, "labels": c.label_names,
            "feature": c.feature, "device": str(c.engine.device), "budget_mib": round(c.budget.budget_bytes / 2**20),
            "max_batch": c.budget.max_batch, "batching": k.policy.batching,
            "queue_depth": self.in_flight, "inflight_upload_bytes": self.upload_bytes.used,
            "open_connections": self.guard.total, "limits": {
                "max_file_mb": k.max_file_mb, "max_files": k.max_files, "max_seconds": k.max_seconds,
                "max_sample_rate": k.max_sample_rate, "max_channels": k.max_channels,
                "max_queue": k.max_queue, "max_client_clips": k.client_clips,
                "max_inflight_mb": k.max_inflight_bytes / 2**20, "timeout_s": k.timeout,
                "read_timeout_s": k.read_timeout, "min_upload_kib_s": k.min_upload_kib_s,
                "max_connections": k.max_connections, "max_client_connections": k.max_client_connections},
        })

    async def metrics_page(self, request: Request) -> Response:
        self.metrics.queue_depth.set(self.in_flight)
        self.metrics.inflight_bytes.set(self.upload_bytes.used)
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def classify(self, request: Request) -> Response:
        t0 = time.perf_counter()
        try:
            response = await self._classify(request)
        except Exception:  # a bug must answer JSON and leave the server running
            log.exception("POST /classify failed")
            response = _error(500, "internal error (logged by the server)")
        self.metrics.requests.inc(1, str(response.status_code))
        self.metrics.latency.observe(time.perf_counter() - t0)
        return response

    def _options(self, request: Request) -> tuple[int, bool]:
        q = request.query_params
        try:
            topk = int(q.get("topk", self.config.topk))
        except ValueError:
            raise Refused(400, "topk must be a whole number") from None
        if topk < 1:
            raise Refused(400, "topk must be at least 1")
        return min(topk, len(self.classifier.label_names)), q.get("picture", "0").lower() in ("1", "true", "yes")

    def _admit_clips(self, client: str, n: int) -> None:
        """Count ``n`` clips of ``client`` as in progress, or refuse them (503) if the queue or its share is full."""
        config = self.config
        refusal = self.clips.refusal(client, n, config.max_queue, config.client_clips)
        if refusal == "total":
            raise Refused(503, f"the queue is full ({self.in_flight} clips in progress); retry shortly",
                          {"Retry-After": str(config.retry_after)})
        if refusal == "client":
            raise Refused(503, f"your address has {self.by_client[client]} clips in progress, the most one client "
                               f"may have is {config.client_clips}; retry shortly",
                          {"Retry-After": str(config.retry_after)})
        self.clips.add(client, n)
        self.metrics.queue_depth.set(self.in_flight)

    def _release_clips(self, client: str, n: int) -> None:
        self.clips.remove(client, n)
        self.metrics.queue_depth.set(self.in_flight)

    async def _classify(self, request: Request) -> Response:
        if self._folder is None:
            return _error(503, "the server is not running", headers={"Retry-After": str(self.config.retry_after)})
        uploads = Uploads()
        try:
            topk, picture = self._options(request)
            uploads = await receive_uploads(request, self._folder, self.config, self.upload_bytes, self._names)
            return await self._answer(request, uploads.files, topk, picture)
        except Refused as e:
            # the body may be unread: the connection closes after the answer, so nothing more is taken from it
            return _error(e.status, e.message, headers={**e.headers, "Connection": "close"})
        finally:
            uploads.remove(self.upload_bytes)

    async def _answer(self, request: Request, files: list[Upload], topk: int, picture: bool) -> Response:
        request.state.files = len(files)  # for the access log
        if len(files) == 1 and files[0].error is not None:
            self.metrics.files.inc(1, "bad")
            return _error(413, files[0].error, file=files[0].name)
        n = sum(1 for f in files if f.error is None)
        client = request.client.host if request.client else ""
        self._admit_clips(client, n)
        try:
            async with asyncio.timeout(self.config.timeout):
                answers = await asyncio.gather(*(self.classify_one(f, topk, picture) for f in files))
        except TimeoutError:
            return _error(504, f"the request took longer than {self.config.timeout:g} s")
        finally:
            self._release_clips(client, n)
        server_fault = any(a.pop(_SERVER_FAULT, False) for a in answers)
        if all("error" in a for a in answers):
            return _error(500 if server_fault else 422,
                          answers[0]["error"] if len(answers) == 1 else "no file could be classified", files=answers)
        return JSONResponse({"model": self.model_name, "labels": self.classifier.label_names, "files": answers})


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
                response = _error(403, f"cross-origin request from {origin[:100]} refused (a --cors-origin "
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


def create_app(service: Service) -> Starlette:
    """The Starlette application serving ``service`` (its lifespan starts and stops the workers and batcher).

    ``Host`` must be one of the config's :attr:`~serving.config.ServeConfig.hosts` (400 otherwise: DNS
    rebinding cannot read answers), and a cross-origin POST is refused unless ``cors_origins`` names it.
    """
    config = service.config
    routes = [
        Route("/", service.page, methods=["GET"]),
        Route("/classify", service.classify, methods=["POST"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/metrics", service.metrics_page, methods=["GET"]),
    ]
    middleware = [Middleware(TrustedHostMiddleware, allowed_hosts=list(config.hosts), www_redirect=False)]
    if config.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(config.cors_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["*"]))
    middleware.append(Middleware(OriginCheck, allowed=config.cors_origins))
    app = Starlette(routes=routes, middleware=middleware, lifespan=service.lifespan)
    app.state.service = service
    return app
