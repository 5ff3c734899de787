"""The server's figures for ``GET /metrics``: prometheus_client metrics in a registry of the server's own.

Each :class:`Metrics` has its own :class:`prometheus_client.CollectorRegistry`
(never the process-global one), so two services in one process (the serve
bench runs two) keep apart.  Label values are fixed sets chosen by the
server (never by a client); prometheus_client escapes them anyway.  The
small wrappers here keep the server's calls short (``inc(1, "ok")``,
``get("ok")``) and give a gauge no ``inc``.  Updates come from the event
loop's thread, and ``decoder_warnings`` from the decode pool's listener
thread (prometheus_client's values are locked).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import prometheus_client
from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

__all__ = ["CONTENT_TYPE", "Counter", "Gauge", "Histogram", "Metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The Prometheus text format ``GET /metrics`` answers in."""

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
"""Request latency histogram bounds, seconds."""

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
"""Clips-per-batch histogram bounds."""

_INTEGRAL_VALUE = re.compile(r"^([^#].* -?\d+)\.0$", re.M)
"""A sample line whose value is a whole number written as a float (prometheus_client writes ``2.0``)."""


def _sample(metric: MetricWrapperBase, name: str, labels: dict[str, str]) -> float:
    """The value of ``metric``'s sample ``name`` with ``labels`` (0 when it has none yet)."""
    for family in metric.collect():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0


class Counter:
    """A monotonically increasing figure per label values (``name`` ends in ``_total``)."""

    def __init__(self, registry: CollectorRegistry, name: str, help: str, labels: tuple[str, ...] = ()) -> None:
        self.name, self.labels = name, labels
        self._metric = prometheus_client.Counter(name, help, labels, registry=registry)

    def inc(self, by: float = 1.0, *label_values: str) -> None:
        (self._metric.labels(*label_values) if self.labels else self._metric).inc(by)

    def get(self, *label_values: str) -> float:
        return _sample(self._metric, self.name, dict(zip(self.labels, label_values, strict=True)))


class Gauge:
    """A figure that goes up and down, set to its current value."""

    def __init__(self, registry: CollectorRegistry, name: str, help: str) -> None:
        self.name = name
        self._metric = prometheus_client.Gauge(name, help, registry=registry)

    def set(self, value: float) -> None:
        self._metric.set(value)

    def get(self) -> float:
        return _sample(self._metric, self.name, {})


class Histogram:
    """Observations counted in cumulative buckets (upper bounds, ``+Inf`` added), with their sum and count."""

    def __init__(self, registry: CollectorRegistry, name: str, help: str,
                 buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name = name
        self._metric = prometheus_client.Histogram(name, help, buckets=buckets, registry=registry)

    def observe(self, value: float) -> None:
        self._metric.observe(value)

    def count(self) -> float:
        return _sample(self._metric, f"{self.name}_count", {})


class _WithoutCreated(Collector):
    """``registry``'s metrics without their ``_created`` samples (start times the server's figures never had).

    prometheus_client turns these off only process-wide (``disable_created_metrics()``, a global that would
    change every other registry in the process); filtering at collection keeps it to this registry.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [s for s in family.samples if s.name != family.name + "_created"]
            yield out


class Metrics:
    """Every figure the server exports; attributes are the metrics, :meth:`render` the page."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "specstore_"
        self.requests = Counter(r, f"{p}requests_total", "HTTP requests to /classify by status code", ("code",))
        self.files = Counter(r, f"{p}files_total", "uploaded files by outcome", ("outcome",))
        self.batches = Counter(r, f"{p}batches_total", "batches run by the model")
        self.batched_clips = Counter(r, f"{p}batched_clips_total", "clips run by the model")
        self.real_frames = Counter(r, f"{p}real_frames_total", "real (unpadded) frames run by the model")
        self.computed_frames = Counter(r, f"{p}computed_frames_total", "frames computed, padding included")
        self.padding_efficiency = Gauge(r, f"{p}padding_efficiency",
                                        "real / computed frames since start (1 = no padding)")
        self.padding_efficiency.set(1.0)
        self.oom_splits = Counter(r, f"{p}oom_splits_total", "batches split and retried after a CUDA out-of-memory")
        self.windowed = Counter(r, f"{p}windowed_clips_total", "clips too long for any batch, run in windows")
        self.queue_depth = Gauge(r, f"{p}queue_depth",
                                 "clips admitted and not yet answered (decoding, waiting, running)")
        self.waiting = Gauge(r, f"{p}batcher_waiting", "decoded clips waiting for a batch")
        self.connections = Gauge(r, f"{p}open_connections", "HTTP connections open now")
        self.refused_connections = Counter(r, f"{p}refused_connections_total",
                                           "connections closed at once: too many in all or from one client",
                                           ("reason",))
        self.dropped_connections = Counter(r, f"{p}dropped_connections_total",
                                           "connections dropped by the server, by why: idle, headers, body "
                                           "(below the minimum rate), upload_time, stalled, cut (an upload "
                                           "that gave way to another client's share), unread (an answer the "
                                           "client did not take)", ("phase",))
        self.inflight_bytes = Gauge(r, f"{p}inflight_upload_bytes", "upload bytes reserved by requests in progress")
        self.audio_seconds = Counter(r, f"{p}audio_seconds_total", "seconds of audio classified")
        self.decoder_warnings = Counter(r, f"{p}decoder_warnings_total", "messages the audio decoders printed "
                                        "about the files they decoded (libmpg123's on damaged frames; logged at INFO)")
        self.latency = Histogram(r, f"{p}request_seconds", "latency of /classify requests, seconds")
        self.decode_seconds = Histogram(r, f"{p}decode_seconds", "decode + features time per file, seconds")
        self.batch_seconds = Histogram(r, f"{p}batch_seconds", "model time per closed batch, seconds")
        self.batch_size = Histogram(r, f"{p}batch_size", "clips per closed batch", BATCH_SIZE_BUCKETS)

    def add_batch(self, clips: int, real: int, computed: int, oom: int, windowed: int, seconds: float) -> None:
        """Count one closed batch (the engine may have run it as several planned batches)."""
        self.batches.inc()
        self.batched_clips.inc(clips)
        self.real_frames.inc(real)
        self.computed_frames.inc(computed)
        self.oom_splits.inc(oom)
        self.windowed.inc(windowed)
        self.batch_seconds.observe(seconds)
        self.batch_size.observe(clips)
        total = self.computed_frames.get()
        self.padding_efficiency.set(self.real_frames.get() / total if total else 1.0)

    def render(self) -> str:
        """The Prometheus text page (format 0.0.4, :data:`CONTENT_TYPE`); whole values are written as integers
        (``specstore_batches_total 3``), as the page always wrote them."""
        text = prometheus_client.generate_latest(_WithoutCreated(self.registry)).decode("utf-8")
        return _INTEGRAL_VALUE.sub(r"\1", text)
