"""The server's figures in the Prometheus text format (version 0.0.4), with no client library.

Counters, gauges and histograms, each with a fixed set of label values
chosen by the server (never by a client), rendered by :meth:`Metrics.render`
for ``GET /metrics``.  All updates happen on the event loop's thread.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Counter", "Gauge", "Histogram", "Metrics"]

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
"""Request latency histogram bounds, seconds."""

BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    pairs = ",".join(f'{n}="{v}"' for n, v in zip(names, values, strict=True))
    return "{" + pairs + "}"


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v)) if not float(v).is_integer() else str(int(v))


@dataclass
class Counter:
    """A monotonically increasing figure per label values."""

    name: str
    help: str
    labels: tuple[str, ...] = ()
    values: dict[tuple[str, ...], float] = field(default_factory=dict)
    kind: str = "counter"

    def inc(self, by: float = 1.0, *label_values: str) -> None:
        self.values[label_values] = self.values.get(label_values, 0.0) + by

    def get(self, *label_values: str) -> float:
        return self.values.get(label_values, 0.0)

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]
        values = self.values or ({(): 0.0} if not self.labels else {})
        out += [f"{self.name}{_labels(self.labels, k)} {_num(v)}" for k, v in sorted(values.items())]
        return out


@dataclass
class Gauge(Counter):
    """A figure that goes up and down."""

    kind: str = "gauge"

    def set(self, value: float, *label_values: str) -> None:
        self.values[label_values] = float(value)


@dataclass
class Histogram:
    """Observations counted in cumulative buckets (upper bounds), with their sum and count."""

    name: str
    help: str
    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        i = next((k for k, b in enumerate(self.buckets) if value <= b), len(self.buckets))
        self.counts[i] += 1
        self.total += value
        self.n += 1

    def lines(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, c in zip((*self.buckets, math.inf), self.counts, strict=True):
            running += c
            out.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {running}')
        out += [f"{self.name}_sum {_num(self.total)}", f"{self.name}_count {self.n}"]
        return out


class Metrics:
    """Every figure the server exports; attributes are the metrics, :meth:`render` the page."""

    def __init__(self) -> None:
        p = "specstore_"
        self.requests = Counter(f"{p}requests_total", "HTTP requests to /classify by status code", ("code",))
        self.files = Counter(f"{p}files_total", "uploaded files by outcome", ("outcome",))
        self.batches = Counter(f"{p}batches_total", "batches run by the model")
        self.batched_clips = Counter(f"{p}batched_clips_total", "clips run by the model")
        self.real_frames = Counter(f"{p}real_frames_total", "real (unpadded) frames run by the model")
        self.computed_frames = Counter(f"{p}computed_frames_total", "frames computed, padding included")
        self.padding_efficiency = Gauge(f"{p}padding_efficiency", "real / computed frames since start (1 = no padding)")
        self.padding_efficiency.set(1.0)
        self.oom_splits = Counter(f"{p}oom_splits_total", "batches split and retried after a CUDA out-of-memory")
        self.windowed = Counter(f"{p}windowed_clips_total", "clips too long for any batch, run in windows")
        self.queue_depth = Gauge(f"{p}queue_depth", "clips admitted and not yet answered (decoding, waiting, running)")
        self.waiting = Gauge(f"{p}batcher_waiting", "decoded clips waiting for a batch")
        self.connections = Gauge(f"{p}open_connections", "HTTP connections open now")
        self.refused_connections = Counter(f"{p}refused_connections_total",
                                           "connections closed at once: too many in all or from one client",
                                           ("reason",))
        self.dropped_connections = Counter(f"{p}dropped_connections_total",
                                           "connections dropped for sending too slowly, by what was late",
                                           ("phase",))
        self.inflight_bytes = Gauge(f"{p}inflight_upload_bytes", "upload bytes reserved by requests in progress")
        self.audio_seconds = Counter(f"{p}audio_seconds_total", "seconds of audio classified")
        # counted by the decode pool's listener thread (its only writer), not on the event loop's
        self.decoder_warnings = Counter(f"{p}decoder_warnings_total", "messages the audio decoders printed about "
                                        "the files they decoded (libmpg123's on damaged frames; logged at INFO)")
        self.latency = Histogram(f"{p}request_seconds", "latency of /classify requests, seconds")
        self.decode_seconds = Histogram(f"{p}decode_seconds", "decode + features time per file, seconds")
        self.batch_seconds = Histogram(f"{p}batch_seconds", "model time per closed batch, seconds")
        self.batch_size = Histogram(f"{p}batch_size", "clips per closed batch", BATCH_SIZE_BUCKETS)

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
        """The Prometheus text page."""
        parts: list[Counter | Histogram] = [
            self.requests, self.files, self.batches, self.batched_clips, self.real_frames, self.computed_frames,
            self.padding_efficiency, self.oom_splits, self.windowed, self.queue_depth, self.waiting,
            self.connections, self.refused_connections, self.dropped_connections, self.inflight_bytes,
            self.audio_seconds, self.decoder_warnings, self.latency, self.decode_seconds, self.batch_seconds,
            self.batch_size,
        ]
        return "\n".join(line for m in parts for line in m.lines()) + "\n"
