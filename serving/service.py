"""The classify service behind ``specstore serve``: uploaded files in, typed answers out, no HTTP.

A request's files arrive in the service's own folder (:attr:`Service.folder`;
:func:`specstore.serving.uploads.receive_uploads` writes them).  Each is decoded by
path in the :class:`~specstore.serving.decode_pool.DecodePool` (content checked by
decoding, never by name; the client's file name is only echoed back),
queued on the :class:`~specstore.serving.batcher.Batcher`, and answered as a
:class:`~specstore.serving.answers.Classified` or :class:`~specstore.serving.answers.Failed`.
A bad upload fails that file alone.  Whatever fails the whole request is a
:class:`~specstore.serving.errors.RequestError` the HTTP layer (:mod:`specstore.serving.responses`)
turns into a response.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import shutil
import time
from collections import Counter
from pathlib import Path

import numpy as np

from .answers import Answer, Classified, Failed, FileAnswer, model_name
from .batcher import Batcher
from .clips import DecodedClip, decode_file
from .config import ServeConfig
from .connections import ConnectionGuard
from .decode_pool import DecodePool
from .errors import ClipError, FileRefused, NoFileClassified, NotRunning, Refused, ServerFault, TimedOut
from .metrics import Metrics
from .model import Classifier, top_k
from .segments import AUTO, MAX_SEGMENTS, Segment, auto_seconds, segment_rows, segment_spans
from .tally import ClientTally
from .uploads import ByteBudget, Upload, make_folder

__all__ = ["Service"]


class Service:
    """The server's state: classifier, decode pool, batcher, metrics and limits.  One per process.

    ``guard``: the connection guard the server's protocol uses (:func:`specstore.serving.connections.uvicorn_config`),
    when it was made before the service (:func:`specstore.serving.server.serve` binds the port first); its metrics
    become the service's.
    """

    def __init__(self, classifier: Classifier, config: ServeConfig | None = None, *,
                 guard: ConnectionGuard | None = None) -> None:
        config = config or ServeConfig()
        self.classifier = classifier
        self.guard = guard or ConnectionGuard(config)  # the server's connections (its protocol shares it)
        self.metrics: Metrics = self.guard.metrics
        self.batcher = Batcher(classifier, config.policy, self.metrics)
        self.pool = DecodePool(config.workers, lambda library: self.metrics.decoder_warnings.inc())
        self.upload_bytes = ByteBudget(config.max_inflight_bytes, on_full=self.guard.drop_stalled)
        self.clips = ClientTally()  # clips decoding, waiting or running, by client address
        self.names = itertools.count()  # numbers the uploads' files
        self._folder: Path | None = None
        self._picture = classifier.picture_part()
        self._config = config
        self.config = config  # the pool, byte budget and guard follow it

    @property
    def config(self) -> ServeConfig:
        return self._config

    @config.setter
    def config(self, config: ServeConfig) -> None:
        """Replace the limits; the byte budget, the connection guard and the pool follow (bytes held stay counted)."""
        self._config = config
        self.upload_bytes.capacity = config.max_inflight_bytes
        self.guard.config = config
        self.pool.workers = config.workers

    @property
    def folder(self) -> Path:
        """The uploads' folder; :class:`~specstore.serving.errors.NotRunning` before :meth:`start` and after
        :meth:`stop`."""
        if self._folder is None:
            raise NotRunning(self.config.retry_after)
        return self._folder

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
        return model_name(self.classifier.name)

    @property
    def failure(self) -> str | None:
        """Why the service cannot classify any more (its batcher stopped), or None while it is healthy."""
        return self.batcher.failure

    # -- life cycle ---------------------------------------------------------------------------------
    async def start(self) -> None:
        """Make the uploads folder, start the decode workers (warmed up) and the batcher."""
        self._folder = make_folder()
        await self.pool.start()
        await self.batcher.start()

    async def stop(self) -> None:
        """Stop the batcher and the workers and remove the uploads folder, all off the event loop."""
        await self.batcher.stop()
        await self.pool.stop()
        folder, self._folder = self._folder, None
        if folder is not None:
            await asyncio.to_thread(shutil.rmtree, folder, ignore_errors=True)

    # -- one file -----------------------------------------------------------------------------------
    async def decode(self, path: Path, picture: bool) -> DecodedClip:
        """Decode an upload in the worker pool (:meth:`specstore.serving.decode_pool.DecodePool.run`).

        The limits on the decode's work (duration, sample rate, channels) are checked from the file's header
        in the worker before decoding starts: a decode cannot be cancelled once it runs.
        """
        config = self.config
        return await self.pool.run(functools.partial(
            decode_file, str(path), self.classifier.specs, max_seconds=config.max_seconds,
            max_sample_rate=config.max_sample_rate, max_channels=config.max_channels,
            picture=self._picture if picture else None))

    async def segments_of(self, clip: DecodedClip, seconds: float, topk: int) -> list[Segment]:
        """``clip``'s windows of ``seconds`` with their top-k, each queued on the batcher as a clip of its own
        (masked in its batch, so exact whatever else runs; :mod:`specstore.serving.segments`).  Raises
        :class:`~specstore.serving.errors.ClipError` for more than
        :data:`~specstore.serving.segments.MAX_SEGMENTS` windows."""
        c = self.classifier
        spans = segment_spans(clip.n_frames, clip.duration, seconds, c.frame_seconds, c.window_align)
        if len(spans) > MAX_SEGMENTS:
            raise ClipError(f"{len(spans)} segments of {seconds:g} s; at most {MAX_SEGMENTS} per file: ask for "
                            f"longer segments")
        probs = await asyncio.gather(*(self.batcher.classify(np.ascontiguousarray(clip.features[:, a:b]))
                                       for _, _, a, b in spans))
        return segment_rows(np.stack(probs), spans, c.label_names, topk)

    def _failed(self, name: str, error: ClipError | ServerFault) -> Failed:
        """The answer for file ``name`` that ``error`` stopped, counted in the metrics: a
        :class:`~specstore.serving.errors.ClipError` is the upload's fault (``bad``), a
        :class:`~specstore.serving.errors.ServerFault` the server's (``failed``)."""
        if isinstance(error, ServerFault):
            self.metrics.files.inc(1, "failed")
            return Failed(name, str(error), server_fault=True)
        self.metrics.files.inc(1, "bad")
        return Failed(name, str(error))

    async def classify_one(self, upload: Upload, topk: int, picture: bool,
                           segments: float | str | None = None) -> FileAnswer:
        """The answer for one uploaded file; counted in the metrics.  ``segments``: seconds per window of its
        genre over time, ``"auto"`` (:func:`~specstore.serving.segments.auto_seconds`), or None (none)."""
        name = upload.name
        if upload.path is None or upload.error is not None:
            self.metrics.files.inc(1, "bad")
            return Failed(name, upload.error or "no data")
        if upload.size == 0:
            self.metrics.files.inc(1, "bad")
            return Failed(name, "empty file")
        t0 = time.perf_counter()
        try:
            clip = await self.decode(upload.path, picture)
        except (ClipError, ServerFault) as e:
            return self._failed(name, e)
        finally:
            self.metrics.decode_seconds.observe(time.perf_counter() - t0)
        c = self.classifier
        seconds = auto_seconds(clip.duration, c.window_align * c.frame_seconds) if segments == AUTO else segments
        try:
            probs = await self.batcher.classify(clip.features)
            rows = await self.segments_of(clip, float(seconds), topk) if seconds is not None else None
        except (ClipError, ServerFault) as e:
            return self._failed(name, e)
        self.metrics.files.inc(1, "ok")
        self.metrics.audio_seconds.inc(clip.duration)
        return Classified(name, clip.duration, clip.n_frames, top_k(probs, c.label_names, topk),
                          clip.picture if picture else None, rows, float(seconds) if seconds is not None else None)

    # -- one request --------------------------------------------------------------------------------
    def admit_clips(self, client: str, n: int) -> None:
        """Count ``n`` clips of ``client`` as in progress, or refuse them (503) if the queue or its share is full."""
        config = self.config
        refusal = self.clips.refusal(client, n, config.max_queue, config.client_clips)
        retry = {"Retry-After": str(config.retry_after)}
        if refusal == "total":
            raise Refused(503, f"the queue is full ({self.in_flight} clips in progress); retry shortly", retry)
        if refusal == "client":
            raise Refused(503, f"your address has {self.by_client[client]} clips in progress, the most one client "
                               f"may have is {config.client_clips}; retry shortly", retry)
        self.clips.add(client, n)
        self.metrics.queue_depth.set(self.in_flight)

    def release_clips(self, client: str, n: int) -> None:
        self.clips.remove(client, n)
        self.metrics.queue_depth.set(self.in_flight)

    async def classify(self, client: str, files: list[Upload], topk: int, picture: bool,
                       segments: float | str | None = None) -> Answer:
        """Classify one request's ``files`` for ``client`` (its address), within the queue's limits and timeout;
        ``segments``: see :meth:`classify_one` (a file's windows are not counted against the queue's limits).

        Raises :class:`~specstore.serving.errors.FileRefused` (the only file refused by a limit as it arrived),
        :class:`~specstore.serving.errors.Refused` (the queue is full), :class:`~specstore.serving.errors.TimedOut` and
        :class:`~specstore.serving.errors.NoFileClassified` (every file failed).
        """
        if len(files) == 1 and files[0].error is not None:
            self.metrics.files.inc(1, "bad")
            raise FileRefused(files[0].error, files[0].name)
        n = sum(1 for f in files if f.error is None)
        self.admit_clips(client, n)
        try:
            async with asyncio.timeout(self.config.timeout):
                answers = await asyncio.gather(*(self.classify_one(f, topk, picture, segments) for f in files))
        except TimeoutError:
            raise TimedOut(self.config.timeout) from None
        finally:
            self.release_clips(client, n)
        failures = [a for a in answers if isinstance(a, Failed)]
        if len(failures) == len(answers):
            raise NoFileClassified(failures)
        return Answer(self.model_name, self.classifier.label_names, list(answers),
                      getattr(self.classifier, "outputs", "classes"), self.classifier.calibration.temperature)
