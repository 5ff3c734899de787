"""The server's settings and limits, in one dataclass: every bound a client can run into, with its unit.

Each limit is checked where it is cheapest to refuse:

* at the connection (:mod:`specstore.serving.connections`): open connections in all
  and per client address, and deadlines: a request (headers and body)
  within ``read_timeout`` seconds, or a larger upload at no less than
  ``min_upload_kib_s`` on average and within ``max_upload_s`` in all, so a
  client that trickles bytes is dropped; an answer the client does not
  take within ``read_timeout`` (or its size at ``min_upload_kib_s``) drops
  the connection, and no pipelined request is read while an answer is
  unsent;
* at the request's headers (:mod:`specstore.serving.uploads`): the declared body
  against ``max_request_bytes`` (413); a window of it is reserved against
  the upload bytes held (``max_inflight_bytes``, at most
  ``client_inflight_bytes`` per client address: 503 + ``Retry-After``),
  before a byte of the body is read, and the reservation grows with what
  arrives;
* while the body arrives: each file against ``max_file_bytes``, the number
  of files against ``max_files`` and ``max_queue`` (413);
* before decoding (:func:`specstore.serving.clips.decode_file`, in the worker): the
  header's sample rate, channels and duration;
* when clips are queued: ``max_queue`` clips in all, ``max_client_clips``
  per client (503 + ``Retry-After``).

Every number has a lower and an upper bound, stated beside its field with
the reason (:func:`specstore.common.limits.bounded`), so ``nan``, ``inf`` or ``1e30``
never turns a limit off: the command line refuses them as it is parsed, and
the dataclasses when they are made.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field

from specstore.common import ConfigError
from specstore.common.limits import Limit, bounded, check_fields
from specstore.common.options import borrowed, described, option
from specstore.infer.options.cli_options import LABELS_HELP, UNKNOWN_BELOW_HELP, parse_unknown_below
from specstore.infer.options.defaults import MAX_BATCH_LIMIT

from .policy import BATCHING, BatchPolicy
from .segments import parse_segments

__all__ = ["DEFAULT_MAX_CHANNELS", "DEFAULT_MAX_SAMPLE_RATE", "LOOPBACK_HOSTS", "MULTIPART_FRAMING_BYTES",
           "BatchingOptions", "ClassifyOptions", "ServeConfig", "default_workers",
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
_MAX_INFLIGHT_MB = float(1 << 20)  # 1 TiB
_DAY_S = 86400.0
_MIN_WINDOW_BYTES = 64 << 10


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
    multipart framing): the bound on the server's temporary disk for
    uploads, at most ``max_client_inflight_mb`` of them from one client
    address (default: half, at least one file).  Refusals for load carry
    ``Retry-After: retry_after`` seconds.  ``timeout``: seconds a request
    may take from its last byte to its answer, then 504.

    Connections: ``read_timeout`` seconds for a whole request (headers and
    body), or more for an upload that keeps ``min_upload_kib_s`` KiB/s on
    average, but never more than ``max_upload_s``; the same seconds for the
    client to take an answer; ``max_connections`` open at once,
    ``max_client_connections`` from one client address.

    ``topk``: labels per file unless the request asks for another number;
    ``policy``: how batches close (:class:`~specstore.serving.policy.BatchPolicy`).
    Every number is bounded, the reason beside it (:func:`specstore.common.limits.bounded`).
    """

    host: str = option("127.0.0.1", "address to listen on (127.0.0.1: this machine only)")
    port: int = described(bounded(8000, 0, 65535, "a TCP port; 0 picks a free one"), "port")
    allowed_hosts: tuple[str, ...] = option((), "a Host header value to answer (repeatable; '*' for any); required "
                                                "with a --host other than loopback (a guard against DNS rebinding)",
                                            flag="--allowed-host", metavar="NAME", shown="the loopback names")
    cors_origins: tuple[str, ...] = option((), "a web origin (https://site.example) whose pages may post to the API "
                                               "(repeatable; cross-origin posts get 403, the server's own page always "
                                               "works)", flag="--cors-origin", metavar="URL", shown="none")
    workers: int = option(help="decode worker processes", default_factory=default_workers,
                          shown="cores, at most 4",
                          limit=Limit(1, _MAX_WORKERS, "processes, each with its own decoder and memory; more than "
                                      "the cores only compete for them"))
    max_file_mb: float = described(
        bounded(50.0, 0.0, 65536.0, "MiB an upload holds on the server's temporary disk until its request ends; "
                "64 GiB is 3 hours of 8-channel 32-bit audio at 192 kHz", low_open=True),
        "largest upload per file, MiB")
    max_files: int = described(bounded(16, 1, 4096, "files in one request, each a clip of the queue (so also at "
                                                    "most --max-queue)"), "files per request")
    max_seconds: float = described(
        bounded(600.0, 0.0, _DAY_S, "a day: a clip's features are held in memory until it is answered (about 80 MB "
                "of float32 log-mel an hour)", low_open=True),
        "longest audio per file, s, checked from the header before decoding")
    max_sample_rate: int = described(
        bounded(DEFAULT_MAX_SAMPLE_RATE, 1, 768_000, "Hz; decode and resampling work grow with it, and 768 kHz is "
                "the fastest rate audio interfaces offer"),
        "highest sample rate an upload may declare, Hz, checked from the header before decoding")
    max_channels: int = described(
        bounded(DEFAULT_MAX_CHANNELS, 1, 64, "decode work grows with the channels; 64 covers 7th-order ambisonics"),
        "most channels an upload may declare, checked from the header before decoding")
    max_queue: int = described(
        bounded(64, 1, 65536, "clips in progress, each holding its upload and its decoded features"),
        "clips in progress at once; more get 503 + Retry-After; a request with more files gets 413")
    max_client_clips: int | None = described(
        bounded(None, 1, 65536, "clips, at most --max-queue", kind=int, optional=True),
        "clips in progress from one client address", shown="half of --max-queue, at least --max-files")
    max_inflight_mb: float | None = described(
        bounded(None, 0.0, _MAX_INFLIGHT_MB, "MiB of the server's temporary disk; 1 TiB", kind=float, low_open=True,
                optional=True),
        "upload bytes held at once, MiB: each request reserves what has arrived plus a window as its body "
        "streams; the bound on the server's temporary disk", shown="--max-queue x --max-file-mb")
    max_client_inflight_mb: float | None = described(
        bounded(None, 0.0, _MAX_INFLIGHT_MB, "MiB, at most --max-inflight-mb", kind=float, low_open=True,
                optional=True),
        "upload bytes held at once from one client address, MiB; a larger request gets 413",
        shown="half of --max-inflight-mb, at least one file")
    retry_after: int = bounded(1, 1, 3600, "seconds a refused client is told to wait; an hour")
    timeout: float = described(bounded(120.0, 0.0, _DAY_S, "seconds; a day", low_open=True),
                               "seconds from a request's last byte to its answer before 504")
    read_timeout: float = described(
        bounded(10.0, 0.0, 3600.0, "seconds; a client silent for an hour holds a connection for nothing",
                low_open=True),
        "seconds a client has to send a whole request (headers and body), or more for an upload that keeps "
        "--min-upload-kib-s, and to take an answer; slower clients are dropped (408 while sending)")
    min_upload_kib_s: float = described(
        bounded(16.0, 0.0, float(1 << 20), "KiB/s; a floor above the clients' links drops every upload, and "
                "1 GiB/s is above a 10 Gbit/s link", low_open=True),
        "slowest average upload accepted beyond --read-timeout, KiB/s (also the slowest answer taken)")
    max_upload_s: float = described(
        bounded(600.0, 0.0, _DAY_S, "seconds, at least --read-timeout; a day", low_open=True),
        "longest one request's upload may take in all, s, however fast it keeps sending (50 MiB in 600 s is "
        "85 KiB/s)")
    max_connections: int = described(
        bounded(512, 1, _MAX_CONNECTIONS, "each open connection holds a file descriptor and up to 64 KiB of "
                "buffers"),
        "connections open at once; more are answered 503 and closed")
    max_client_connections: int = described(
        bounded(64, 1, _MAX_CONNECTIONS, "connections, at most --max-connections"),
        "connections open at once from one client address (behind a reverse proxy, the proxy's upstream "
        "connections)")
    topk: int = described(bounded(5, 1, 100_000, "labels listed; a model has at most 100 000"),
                          "genres per file unless ?topk= says")
    policy: BatchPolicy = field(default_factory=BatchPolicy)

    def __post_init__(self) -> None:
        check_fields(self)
        one_file = self.max_file_bytes + MULTIPART_FRAMING_BYTES
        crossed = [
            (self.max_client_connections > self.max_connections,
             f"max_client_connections={self.max_client_connections} is above max_connections="
             f"{self.max_connections}"),
            (self.max_inflight_mb is not None and self.max_inflight_bytes < one_file,
             f"max_inflight_mb={self.max_inflight_mb!r} cannot hold one file of max_file_mb={self.max_file_mb:g} "
             f"(and its multipart framing)"),
            (self.max_client_inflight_mb is not None
             and int(self.max_client_inflight_mb * (1 << 20)) < one_file,
             f"max_client_inflight_mb={self.max_client_inflight_mb!r} cannot hold one file of max_file_mb="
             f"{self.max_file_mb:g} (and its multipart framing)"),
            (self.max_upload_s < self.read_timeout,
             f"max_upload_s={self.max_upload_s:g} is shorter than read_timeout={self.read_timeout:g}"),
        ]
        for bad, why in crossed:
            if bad:
                raise ConfigError(f"invalid server setting: {why}")
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
    def client_inflight_bytes(self) -> int:
        """Upload bytes one client address may hold at once: ``max_client_inflight_mb``, by default half the
        budget but at least one file with its framing; never more than the budget."""
        if self.max_client_inflight_mb is not None:
            share = int(self.max_client_inflight_mb * (1 << 20))
        else:
            share = max(self.max_inflight_bytes // 2, self.max_file_bytes + MULTIPART_FRAMING_BYTES)
        return min(share, self.max_inflight_bytes)

    @property
    def upload_window_bytes(self) -> int:
        """Bytes an upload reserves beyond what has arrived: the budget over ``max_connections`` (at least
        64 KiB), so connections that send little cannot fill the budget between them."""
        return max(_MIN_WINDOW_BYTES, self.max_inflight_bytes // self.max_connections)

    @property
    def max_request_bytes(self) -> int:
        """Largest request body: every file at its limit plus multipart framing, within the bytes one client may
        hold (and so within the budget)."""
        return min(self.max_files * (self.max_file_bytes + MULTIPART_FRAMING_BYTES), self.client_inflight_bytes)

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
    defaults are :class:`~specstore.serving.policy.BatchPolicy`'s, which :meth:`policy` makes."""

    batching: str = borrowed(BatchPolicy, "batching", choices=BATCHING,
                             help="budget: length-binned batches under the memory budget; fixed: --fixed-batch "
                                  "clips in arrival order (the baseline)")
    max_delay_ms: float = described(
        bounded(BatchPolicy.max_delay * 1000.0, 0.0, 60_000.0, "ms every clip may wait on top of its own work; a "
                "minute"),
        "longest a clip waits for its batch to fill, ms")
    fixed_batch: int = borrowed(BatchPolicy, "fixed_size", help="clips per batch with --batching fixed",
                                limit=Limit(1, MAX_BATCH_LIMIT, "clips in one batch, as --max-batch"))

    def __post_init__(self) -> None:
        check_fields(self)

    def policy(self) -> BatchPolicy:
        return BatchPolicy(batching=self.batching, max_delay=self.max_delay_ms / 1000.0, fixed_size=self.fixed_batch)


@dataclass(frozen=True)
class ClassifyOptions:
    """``classify``'s own options: labels per file, decode processes, the decoded-clip cache."""

    topk: int = borrowed(ServeConfig, "topk", help="genres (or a tagger's tags) listed per file")
    jobs: int = described(bounded(1, 1, _MAX_WORKERS, "processes, as serve's --workers"), "decode worker processes")
    cache: str | None = option(None, "keep decoded clips in DIR, keyed by content hash and feature settings, so "
                                     "files classified again are not decoded again", metavar="DIR",
                               shown="no cache")
    unknown_below: float | None = described(
        bounded(None, 0.0, 1.0, "a probability", kind=float, low_open=True, optional=True),
        UNKNOWN_BELOW_HELP + " (JSON: each file's answer field; CSV: the pred column; table: an answer column)",
        parse=parse_unknown_below, metavar="P", shown="off")
    labels: str | None = option(None, LABELS_HELP, metavar="A,B,...", shown="all")
    segments: float | None = described(
        bounded(None, 0.0, _DAY_S, "seconds; a day, longer than any clip --max-seconds allows", kind=float,
                low_open=True, optional=True),
        "genre over time: also classify each window of SECONDS (the last one shorter; each alone, its real frames "
        "only) and list its top-k (JSON: each file's segments; CSV: one row per window with start_s, end_s; "
        "table: one indented line per window; a tagger's windows list tags); at least the model's time step",
        parse=parse_segments, metavar="SECONDS", shown="off")

    def __post_init__(self) -> None:
        check_fields(self)
