"""Where ``make infer`` and ``make eval`` run: :class:`ClusterOptions` (``--backend``, ``--scheduler``, ``--jobs``,
``--restart``, ...).

No ``backend`` (the default) keeps the one-process path exactly as it was.
With ``--backend dask`` or ``--backend ray`` the driver
(:mod:`specstore.infer.engine.distributed`) cuts the store's distinct
contents into units of a few seconds of device time, runs them on the
cluster's workers, and commits their logits into a journal beside the
output, so a rerun of the same command resumes.  Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from specstore.common import ConfigError
from specstore.common.executors import BACKENDS
from specstore.common.executors.idle import IDLE_WARN_EVERY, IDLE_WARN_SECONDS, MAX_IDLE, idle_warn_field
from specstore.common.limits import Limit, check_fields
from specstore.common.options import option

__all__ = ["CLI_BACKENDS", "COMMIT_SECONDS", "IDLE_WARN_EVERY", "IDLE_WARN_SECONDS", "JOBS", "MAX_IDLE",
           "UNIT_FRAMES", "ClusterOptions"]

CLI_BACKENDS = ("dask", "ray")
"""The backends ``specstore infer --backend`` offers (Python callers may also name ``loky`` or ``threading``)."""

JOBS = Limit(1, 4096, "workers of a local cluster started for the run (one model and one store reader each); "
                      "4096 is beyond any cluster this tool drives", optional=True)
UNIT_FRAMES = Limit(1, 1 << 30, "padded frames of one unit of work (a unit is the smallest piece a lost worker or "
                                "an interrupted run recomputes); 2**30 frames is 290 days of audio")
COMMIT_SECONDS = Limit(0.0, 3600.0, "seconds of finished units an interrupted run may lose; 0 journals every unit",
                       kind=float)



@dataclass(frozen=True)
class ClusterOptions:
    """How ``predict`` and ``evaluate`` spread their work (see the module docstring).

    ``backend``: None (one process, today's path), ``dask`` or ``ray`` (or, from Python, ``loky`` /
    ``threading``); ``scheduler``: a dask scheduler ``tcp://host:8786`` or a ray address, None for a local
    cluster of ``jobs`` single-threaded workers (default 2).  ``restart``: discard a journal left by another
    run instead of refusing it.  ``unit_frames``: padded frames per unit (a few seconds of CPU time each;
    a clip too long for any batch is a unit of its own).  ``commit_seconds``: how often finished units are
    journalled.  ``max_idle`` / ``idle_warn_*``: what a run does while its cluster has no live workers
    (:class:`~specstore.common.executors.idle.IdleWatch`).  Checked when made (one line).
    """

    backend: str | None = option(None, "run the model on a cluster: dask or ray (journalled beside the output, "
                                       "so rerunning the same command resumes)", choices=CLI_BACKENDS,
                                 shown="this process")
    scheduler: str | None = option(None, "the cluster to use: a dask scheduler (tcp://host:8786) with --backend "
                                         "dask, or a ray address (auto, ray://host:10001) with --backend ray",
                                   shown="a local one")
    jobs: int | None = option(None, "workers of the local cluster started when no --scheduler is given",
                              limit=JOBS, shown="2")
    restart: bool = option(False, "discard a journal left beside the output by another run (other model, store or "
                                  "options) instead of refusing it")
    unit_frames: int = option(32768, "padded frames per unit of work (about a few seconds of CPU time)",
                              limit=UNIT_FRAMES)
    commit_seconds: float = option(2.0, "journal finished units at most this often, seconds (0: after every unit)",
                                   limit=COMMIT_SECONDS)
    max_idle: float | None = option(None, "stop the run when its cluster has had no live workers for this many "
                                          "seconds (finished units are journalled first; rerun to resume)",
                                    limit=MAX_IDLE, shown="wait for ever", metavar="SECONDS")
    idle_warn_seconds: float = idle_warn_field(IDLE_WARN_SECONDS)
    idle_warn_every: float = idle_warn_field(IDLE_WARN_EVERY)

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}; choose {', '.join(CLI_BACKENDS)}")
        if self.scheduler is not None and self.backend is None:
            raise ConfigError("--scheduler needs --backend dask or --backend ray")
        check_fields(self)

    @property
    def workers(self) -> int:
        """Workers of a local cluster (``jobs``, default 2)."""
        return self.jobs if self.jobs is not None else 2
