"""``specstore serve``: the HTTP service (Starlette on uvicorn) over the decode pool and the online batcher.

Routes:

* ``GET /``: the upload page (``page.html``): drop or pick files, progress,
  top-5 genres with probabilities and each clip's log-mel picture.
* ``POST /classify``: multipart, one or many files (any field name);
  query ``topk`` (default the server's, at most the number of labels) and ``picture=1`` (a PNG data URL
  per file).  200 ``{"model", "labels", "files": [{"file", "duration_s",
  "frames", "top": [{"label", "prob"}], "picture"?} or {"file", "error"}]}``;
  every file failed: 422 with ``error`` (500 when the server failed); limits: 413 (too large), 400 (no
  files, malformed), 503 + ``Retry-After`` (queue full), 504 (timeout).
* ``GET /health``: model, labels, device, budget, queue depth.
* ``GET /metrics``: Prometheus text (:mod:`serving.metrics`).

Each upload is read into memory (bounded by the limits), decoded in a
worker process (:func:`serving.clips.decode_bytes`: content checked by
decoding, never by name; the client's file name is only echoed back) and
queued on the :class:`~serving.batcher.Batcher`.  A bad upload is a JSON
error for that file alone.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures as cf
import contextlib
import functools
import logging
import multiprocessing
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures.process import BrokenProcessPool
from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .batcher import Batcher, BatchError
from .clips import ClipError, DecodedClip, decode_bytes, warm_up
from .config import ServeConfig
from .metrics import Metrics
from .model import Classifier, top_k

__all__ = ["Service", "create_app"]

log = logging.getLogger(__name__)

_NAME_CHARS = 200
_SERVER_FAULT = "_server_fault"  # marks an answer that failed on the server's side, not the upload's


class _TooLarge(Exception):
    """The request body passed the size limit."""


def _limited(receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
             limit: int) -> Callable[[], Awaitable[MutableMapping[str, Any]]]:
    """``receive`` that raises :class:`_TooLarge` once the body passes ``limit`` bytes."""
    seen = 0

    async def wrapped() -> MutableMapping[str, Any]:
        nonlocal seen
        message = await receive()
        if message.get("type") == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _TooLarge
        return message

    return wrapped


def _error(status: int, message: str, *, headers: dict[str, str] | None = None, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _client_name(upload: UploadFile, index: int) -> str:
    """The name to echo back: the client's file name (only ever text in the answer), or ``file-N``."""
    name = (upload.filename or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if ch.isprintable())[:_NAME_CHARS]
    return name or f"file-{index + 1}"


class Service:
    """The server's state: classifier, decode pool, batcher, metrics and limits.  One per process."""

    def __init__(self, classifier: Classifier, config: ServeConfig | None = None) -> None:
        self.classifier = classifier
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.batcher = Batcher(classifier, self.config.policy, self.metrics)
        self.in_flight = 0
        self._pool: cf.ProcessPoolExecutor | None = None
        self._picture = classifier.picture_part()

    @property
    def model_name(self) -> str:
        """The checkpoint's file name (never the server's path to it)."""
        return self.classifier.name.replace("\\", "/").rsplit("/", 1)[-1]

    # -- life cycle ---------------------------------------------------------------------------------
    def _new_pool(self) -> cf.ProcessPoolExecutor:
        # spawn: the server has torch's threads running, which a fork would copy half-started
        return cf.ProcessPoolExecutor(max_workers=self.config.workers, mp_context=multiprocessing.get_context("spawn"))

    async def start(self) -> None:
        """Start the decode workers (warmed up) and the batcher."""
        self._pool = self._new_pool()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(self._pool, warm_up) for _ in range(self.config.workers)))
        await self.batcher.start()

    async def stop(self) -> None:
        await self.batcher.stop()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()

    # -- one file -----------------------------------------------------------------------------------
    async def decode(self, data: bytes, picture: bool) -> DecodedClip:
        """Decode an upload in the worker pool; a crashed worker's pool is replaced and the file tried once more."""
        loop = asyncio.get_running_loop()
        job = functools.partial(decode_bytes, data, self.classifier.specs, max_seconds=self.config.max_seconds,
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

    async def classify_one(self, name: str, data: bytes, topk: int, picture: bool) -> dict[str, Any]:
        """The answer for one uploaded file (a result or an ``error``); counted in the metrics."""
        t0 = time.perf_counter()
        try:
            clip = await self.decode(data, picture)
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
        c = self.classifier
        return JSONResponse({
            "status": "ok", "model": self.model_name, "labels": c.label_names,
            "feature": c.feature, "device": str(c.engine.device), "budget_mib": round(c.budget.budget_bytes / 2**20),
            "max_batch": c.budget.max_batch, "batching": self.config.policy.batching,
            "queue_depth": self.in_flight, "limits": {
                "max_file_mb": self.config.max_file_mb, "max_files": self.config.max_files,
                "max_seconds": self.config.max_seconds, "max_queue": self.config.max_queue,
                "timeout_s": self.config.timeout},
        })

    async def metrics_page(self, request: Request) -> Response:
        self.metrics.queue_depth.set(self.in_flight)
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

    def _options(self, request: Request) -> tuple[int, bool] | JSONResponse:
        q = request.query_params
        try:
            topk = int(q.get("topk", self.config.topk))
        except ValueError:
            return _error(400, "topk must be a whole number")
        if topk < 1:
            return _error(400, "topk must be at least 1")
        return min(topk, len(self.classifier.label_names)), q.get("picture", "0").lower() in ("1", "true", "yes")

    async def _read_files(self, request: Request) -> list[tuple[str, bytes | None]] | JSONResponse:
        """``(name, bytes)`` per uploaded file (``None`` bytes: over the size limit), or an error response."""
        limit = self.config.max_request_bytes
        try:
            declared = int(request.headers.get("content-length", "0") or 0)
        except ValueError:
            return _error(400, "bad Content-Length")
        if declared > limit:
            return _error(413, f"request of {declared} bytes is over the limit of {limit} bytes "
                               f"({self.config.max_files} files of {self.config.max_file_mb:g} MiB)")
        limited = Request(request.scope, receive=_limited(request.receive, limit))
        try:
            form = await limited.form(max_files=self.config.max_files, max_fields=16)
        except _TooLarge:
            return _error(413, f"request body is over the limit of {limit} bytes")
        except HTTPException as e:
            return _error(400, f"malformed upload: {e.detail}")
        except ClientDisconnect:
            return _error(400, "the client went away")
        try:
            uploads = [v for _, v in form.multi_items() if isinstance(v, UploadFile)]
            if not uploads:
                return _error(400, "no files: send multipart/form-data with one or more file fields")
            files: list[tuple[str, bytes | None]] = []
            for i, up in enumerate(uploads):
                name = _client_name(up, i)
                too_big = up.size is not None and up.size > self.config.max_file_bytes
                files.append((name, None if too_big else await up.read()))
            return files
        finally:
            await form.close()

    async def _classify(self, request: Request) -> Response:
        options = self._options(request)
        if isinstance(options, JSONResponse):
            return options
        topk, picture = options
        files = await self._read_files(request)
        if isinstance(files, JSONResponse):
            return files
        too_big = f"file is over the limit of {self.config.max_file_mb:g} MiB"
        if len(files) == 1 and files[0][1] is None:
            self.metrics.files.inc(1, "bad")
            return _error(413, too_big, file=files[0][0])
        n = sum(1 for _, data in files if data is not None)
        if self.in_flight + n > self.config.max_queue:
            return _error(503, f"the queue is full ({self.in_flight} clips in progress); retry shortly",
                          headers={"Retry-After": str(self.config.retry_after)})
        self.in_flight += n
        self.metrics.queue_depth.set(self.in_flight)
        try:
            async with asyncio.timeout(self.config.timeout):
                answers = await asyncio.gather(*(
                    self.classify_one(name, data, topk, picture) if data is not None
                    else _immediate({"file": name, "error": too_big}) for name, data in files))
        except TimeoutError:
            return _error(504, f"the request took longer than {self.config.timeout:g} s")
        finally:
            self.in_flight -= n
            self.metrics.queue_depth.set(self.in_flight)
        server_fault = any(a.pop(_SERVER_FAULT, False) for a in answers)
        if all("error" in a for a in answers):
            return _error(500 if server_fault else 422,
                          answers[0]["error"] if len(answers) == 1 else "no file could be classified", files=answers)
        return JSONResponse({"model": self.model_name, "labels": self.classifier.label_names, "files": answers})


async def _immediate(value: dict[str, Any]) -> dict[str, Any]:
    return value


def create_app(service: Service) -> Starlette:
    """The Starlette application serving ``service`` (its lifespan starts and stops the workers and batcher)."""
    routes = [
        Route("/", service.page, methods=["GET"]),
        Route("/classify", service.classify, methods=["POST"]),
        Route("/health", service.health, methods=["GET"]),
        Route("/metrics", service.metrics_page, methods=["GET"]),
    ]
    app = Starlette(routes=routes, lifespan=service.lifespan)
    app.state.service = service
    return app
