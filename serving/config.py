"""The server's settings and limits, in one dataclass with units in the names' docs."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from store import ConfigError

from .policy import BatchPolicy

__all__ = ["ServeConfig", "default_workers"]


def default_workers() -> int:
    """Decode worker processes by default: one per core the process may use, at most 4."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, min(4, cores))


@dataclass(frozen=True)
class ServeConfig:
    """How ``specstore serve`` runs and what it accepts.

    ``host``/``port``: where it listens (localhost unless told otherwise).
    ``workers``: decode processes.  ``max_file_mb``: largest upload per
    file, MiB; ``max_files``: files per request; ``max_seconds``: longest
    audio per file, seconds (checked by decoding).  ``max_queue``: clips
    admitted at once (decoding, waiting or running); more answer 503 with
    ``Retry-After: retry_after`` seconds.  ``timeout``: seconds a request
    may take before it answers 504.  ``topk``: labels per file unless the
    request asks for another number (1..number of labels).  ``policy``:
    how batches close (:class:`~serving.policy.BatchPolicy`).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = field(default_factory=default_workers)
    max_file_mb: float = 50.0
    max_files: int = 16
    max_seconds: float = 600.0
    max_queue: int = 64
    retry_after: int = 2
    timeout: float = 120.0
    topk: int = 5
    policy: BatchPolicy = field(default_factory=BatchPolicy)

    def __post_init__(self) -> None:
        checks = {
            "workers": self.workers >= 1, "max_file_mb": self.max_file_mb > 0, "max_files": self.max_files >= 1,
            "max_seconds": self.max_seconds > 0, "max_queue": self.max_queue >= 1, "retry_after": self.retry_after >= 1,
            "timeout": self.timeout > 0, "topk": self.topk >= 1, "port": 0 <= self.port < 65536,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"invalid server setting(s): {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)}")

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * (1 << 20))

    @property
    def max_request_bytes(self) -> int:
        """Largest request body: every file at its limit plus 64 KiB of multipart framing per file."""
        return self.max_files * (self.max_file_bytes + (64 << 10))
