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
from typing import TYPE_CHECKING

from store import ConfigError

if TYPE_CHECKING:  # the policy imports the planner (and torch): not needed to parse options or check limits
    from .policy import BatchPolicy

__all__ = ["DEFAULT_MAX_CHANNELS", "DEFAULT_MAX_SAMPLE_RATE", "LOOPBACK_HOSTS", "MULTIPART_FRAMING_BYTES",
           "ServeConfig", "default_workers", "is_loopback"]

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


def _default_policy() -> BatchPolicy:
    from .policy import BatchPolicy

    return BatchPolicy()


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

    host: str = "127.0.0.1"
    port: int = 8000
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    workers: int = field(default_factory=default_workers)
    max_file_mb: float = 50.0
    max_files: int = 16
    max_seconds: float = 600.0
    max_sample_rate: int = DEFAULT_MAX_SAMPLE_RATE
    max_channels: int = DEFAULT_MAX_CHANNELS
    max_queue: int = 64
    max_client_clips: int | None = None
    max_inflight_mb: float | None = None
    retry_after: int = 1
    timeout: float = 120.0
    read_timeout: float = 10.0
    min_upload_kib_s: float = 16.0
    max_connections: int = 512
    max_client_connections: int = 64
    topk: int = 5
    policy: BatchPolicy = field(default_factory=_default_policy)

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
