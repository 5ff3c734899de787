"""The server's settings and limits, in one dataclass: every bound a client can run into, with its unit.

Each limit is checked where it is cheapest to refuse (issue 30):

* at the connection (:mod:`serving.connections`): open connections in all
  and per client address, and read deadlines: a request (headers and
  body) within ``read_timeout`` seconds, or a larger upload at no less
  than ``min_upload_kib_s`` on average, so a client that trickles bytes
  is dropped;
* at the request's headers (:mod:`serving.uploads`): the declared body
  against ``max_request_bytes`` (413) and against the bytes of uploads
  already held (``max_inflight_bytes``: 503 + ``Retry-After``), before a
  byte of the body is read;
* while the body arrives: each file against ``max_file_bytes``, the number
  of files against ``max_files`` and ``max_queue`` (413);
* before decoding (:func:`serving.clips.decode_file`, in the worker): the
  header's sample rate, channels and duration;
* when clips are queued: ``max_queue`` clips in all, ``max_client_clips``
  per client (503 + ``Retry-After``).
"""

from __future__ import annotations

import ipaddress
import math
import os
from dataclasses import dataclass, field

from infer.budget import CPU_BATCH_OVERHEAD_FRAMES, DEFAULT_BATCH_OVERHEAD_FRAMES
from infer.cli_options import LABELS_HELP, UNKNOWN_BELOW_HELP
from infer.predictions import parse_unknown_below
from store import ConfigError
from store.options import borrowed, option

from .policy import BATCHING, BatchPolicy
from .segments import parse_segments

__all__ = ["DEFAULT_MAX_CHANNELS", "DEFAULT_MAX_SAMPLE_RATE", "LOOPBACK_HOSTS", "MULTIPART_FRAMING_BYTES",
           "BatchingOptions", "ClassifierOptions", "ClassifyOptions", "ServeConfig", "default_workers",
           "is_loopback"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The names a server bound to this machine only answers to unless ``allowed_hosts`` says more."""

MULTIPART_FRAMING_BYTES = 64 << 10
"""Bytes of multipart framing (boundaries, part headers) allowed per file on top of its data."""

DEFAULT_MAX_SAMPLE_RATE = 192_000
"""Highest sample rate an upload may declare, Hz (decode work grows with it; studio masters reach 192 kHz)."""

DEFAULT_MAX_CHANNELS = 8
"""Most channels an upload may declare (7.1 surround; decode work grows with them)."""

_MAX_WORKERS = 256
_MAX_CONNECTIONS = 65536


def default_workers() -> int:
    """Decode worker processes by default: one per core the process may use, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` reaches this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServeConfig:
    """How ``specstore serve`` runs and what it accepts (see the module docstring for where each is checked).

    Where it listens: ``host``/``port`` (this machine only unless told
    otherwise); ``allowed_hosts``: the ``Host`` header values answered (a
    guard against DNS rebinding; empty means the loopback names, and is
    refused for any other ``host``); ``cors_origins``: other web origins
    allowed to post (empty: none; the page itself is always allowed).

    Work: ``workers`` decode processes; ``max_file_mb`` (MiB) per uploaded
    file, ``max_files`` per request; ``max_seconds`` of audio per file,
    ``max_sample_rate`` (Hz) and ``max_channels``, each read from the
    file's header before decoding (a decode cannot be stopped once it runs);
    ``max_queue`` clips decoding, waiting or running at once, at most
    ``max_client_clips`` of them from one client address (default: half of
    ``max_queue``, at least ``max_files``); ``max_inflight_mb`` (MiB) of
    upload bytes held at once (default ``max_queue x max_file_mb``, plus
    multipart framing): the
    bound on the server's temporary disk for uploads.  Refusals for load
    carry ``Retry-After: retry_after`` seconds.  ``timeout``: seconds a
    request may take from its last byte to its answer, then 504.

    Connections: ``read_timeout`` seconds for a whole request (headers and
    body), or more for an upload that keeps ``min_upload_kib_s`` KiB/s on
    average; ``max_connections`` open at once, ``max_client_connections``
    from one client address.

    ``topk``: labels per file unless the request asks for another number;
    ``policy``: how batches close (:class:`~serving.policy.BatchPolicy`).
    """

    host: str = option("127.0.0.1", "address to listen on (127.0.0.1: this machine only)")
    port: int = option(8000, "port")
    allowed_hosts: tuple[str, ...] = option((), "a Host header value to answer (repeatable; '*' for any); required "
                                                "with a --host other than loopback (a guard against DNS rebinding)",
                                            flag="--allowed-host", metavar="NAME", shown="the loopback names")
    cors_origins: tuple[str, ...] = option((), "a web origin (https://site.example) whose pages may post to the API "
                                               "(repeatable; cross-origin posts get 403, the server's own page always "
                                               "works)", flag="--cors-origin", metavar="URL", shown="none")
    workers: int = option(help="decode worker processes", default_factory=default_workers,
                          shown="cores, at most 4")
    max_file_mb: float = option(50.0, "largest upload per file, MiB")
    max_files: int = option(16, "files per request")
    max_seconds: float = option(600.0, "longest audio per file, s, checked from the header before decoding")
    max_sample_rate: int = option(DEFAULT_MAX_SAMPLE_RATE, "highest sample rate an upload may declare, Hz, checked "
                                                           "from the header before decoding")
    max_channels: int = option(DEFAULT_MAX_CHANNELS, "most channels an upload may declare, checked from the header "
                                                     "before decoding")
    max_queue: int = option(64, "clips in progress at once; more get 503 + Retry-After; a request with more files "
                                "gets 413")
    max_client_clips: int | None = option(None, "clips in progress from one client address",
                                          shown="half of --max-queue, at least --max-files")
    max_inflight_mb: float | None = option(None, "upload bytes held at once, MiB, reserved from each request's "
                                                 "Content-Length before its body is read; the bound on the server's "
                                                 "temporary disk", shown="--max-queue x --max-file-mb")
    retry_after: int = 1
    timeout: float = option(120.0, "seconds from a request's last byte to its answer before 504")
    read_timeout: float = option(10.0, "seconds a client has to send a whole request (headers and body), or more "
                                       "for an upload that keeps --min-upload-kib-s; slower clients are dropped with "
                                       "408")
    min_upload_kib_s: float = option(16.0, "slowest average upload accepted beyond --read-timeout, KiB/s")
    max_connections: int = option(512, "connections open at once; more are answered 503 and closed")
    max_client_connections: int = option(64, "connections open at once from one client address (behind a reverse "
                                             "proxy, the proxy's upstream connections)")
    topk: int = option(5, "genres per file unless ?topk= says")
    policy: BatchPolicy = field(default_factory=BatchPolicy)

    def __post_init__(self) -> None:
        finite = {k: getattr(self, k) for k in ("max_file_mb", "max_seconds", "timeout", "read_timeout",
                                                 "min_upload_kib_s", "max_inflight_mb")}
        checks = {
            **{k: v is None or (math.isfinite(v) and v > 0) for k, v in finite.items()},
            "workers": 1 <= self.workers <= _MAX_WORKERS, "max_files": self.max_files >= 1,
            "max_sample_rate": self.max_sample_rate >= 1, "max_channels": self.max_channels >= 1,
            "max_queue": self.max_queue >= 1, "retry_after": self.retry_after >= 1, "topk": self.topk >= 1,
            "port": 0 <= self.port < 65536,
            "max_client_clips": self.max_client_clips is None or self.max_client_clips >= 1,
            "max_connections": 1 <= self.max_connections <= _MAX_CONNECTIONS,
            "max_client_connections": 1 <= self.max_client_connections <= self.max_connections,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"invalid server setting(s): {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)} "
                              f"(counts must be at least 1, sizes and times finite and above 0, workers at most "
                              f"{_MAX_WORKERS}, max_client_connections at most max_connections)")
        if self.max_inflight_mb is not None and self.max_inflight_bytes < self.max_file_bytes + MULTIPART_FRAMING_BYTES:
            raise ConfigError(f"max_inflight_mb={self.max_inflight_mb:g} cannot hold one file of max_file_mb="
                              f"{self.max_file_mb:g} (and its multipart framing)")
        if not is_loopback(self.host) and not self.allowed_hosts:
            raise ConfigError(f"listening on {self.host} needs the host names clients use, e.g. "
                              f"--allowed-host genres.example.org (a guard against DNS rebinding); "
                              f"'*' accepts any")

    @property
    def hosts(self) -> tuple[str, ...]:
        """The ``Host`` header names answered (``allowed_hosts`` or the loopback names; IPv6 in brackets, as
        a ``Host`` header writes it)."""
        return tuple(f"[{h}]" if ":" in h and not h.startswith("[") else h
                     for h in (self.allowed_hosts or LOOPBACK_HOSTS))

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * (1 << 20))

    @property
    def max_inflight_bytes(self) -> int:
        """Upload bytes held at once (reserved from each request's headers until it ends)."""
        if self.max_inflight_mb is not None:
            return int(self.max_inflight_mb * (1 << 20))
        return self.max_queue * (self.max_file_bytes + MULTIPART_FRAMING_BYTES)

    @property
    def max_request_bytes(self) -> int:
        """Largest request body: every file at its limit plus multipart framing, within the in-flight bytes."""
        return min(self.max_files * (self.max_file_bytes + MULTIPART_FRAMING_BYTES), self.max_inflight_bytes)

    @property
    def client_clips(self) -> int:
        """Clips one client address may have in progress at once."""
        if self.max_client_clips is not None:
            return min(self.max_client_clips, self.max_queue)
        return min(self.max_queue, max(self.max_files, self.max_queue // 2))

    @property
    def min_upload_bytes_s(self) -> float:
        return self.min_upload_kib_s * 1024.0


@dataclass(frozen=True)
class BatchingOptions:
    """``serve``'s batching options as its command line spells them (milliseconds, ``--fixed-batch``); the
    defaults are :class:`~serving.policy.BatchPolicy`'s, which :meth:`policy` makes."""

    batching: str = borrowed(BatchPolicy, "batching", choices=BATCHING,
                             help="budget: length-binned batches under the memory budget; fixed: --fixed-batch "
                                  "clips in arrival order (the baseline)")
    max_delay_ms: float = option(BatchPolicy.max_delay * 1000.0, "longest a clip waits for its batch to fill, ms")
    fixed_batch: int = borrowed(BatchPolicy, "fixed_size", help="clips per batch with --batching fixed")

    def policy(self) -> BatchPolicy:
        return BatchPolicy(batching=self.batching, max_delay=self.max_delay_ms / 1000.0, fixed_size=self.fixed_batch)


@dataclass(frozen=True)
class ClassifierOptions:
    """How ``classify`` and ``serve`` plan a model's batches beyond the run options
    (:class:`~infer.run_options.RunOptions`)."""

    batch_overhead_frames: float | None = option(
        None, "the planner's price of one more batch, padded frames",
        shown=f"{CPU_BATCH_OVERHEAD_FRAMES:g} on a CPU, where batches cost little and may split to save padding; "
              f"{DEFAULT_BATCH_OVERHEAD_FRAMES:g} on a GPU")


@dataclass(frozen=True)
class ClassifyOptions:
    """``classify``'s own options: labels per file, decode processes, the decoded-clip cache."""

    topk: int = borrowed(ServeConfig, "topk", help="genres (or a tagger's tags) listed per file")
    jobs: int = option(1, "decode worker processes")
    cache: str | None = option(None, "keep decoded clips in DIR, keyed by content hash and feature settings, so "
                                     "files classified again are not decoded again", metavar="DIR",
                               shown="no cache")
    unknown_below: float | None = option(None, UNKNOWN_BELOW_HELP + " (JSON: each file's answer field; CSV: the "
                                               "pred column; table: an answer column)",
                                         parse=parse_unknown_below, metavar="P", shown="off")
    labels: str | None = option(None, LABELS_HELP, metavar="A,B,...", shown="all")
    segments: float | None = option(None, "genre over time: also classify each window of SECONDS (the last one "
                                          "shorter; each alone, its real frames only) and list its top-k (JSON: "
                                          "each file's segments; CSV: one row per window with start_s, end_s; "
                                          "table: one indented line per window; a tagger's windows list tags); "
                                          "at least the model's time step",
                                    parse=parse_segments, metavar="SECONDS", shown="off")
