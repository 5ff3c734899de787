"""How an extraction runs: :class:`ExtractOptions`, and the bounds of its own settings (``--jobs``,
``--block-seconds``, ``--commit-seconds``, ``--max-idle``, the empty-cluster warning's intervals).

One home for each run option's name, default, help and bound:
``specstore features`` generates its run options from the fields
(:func:`specstore.common.options.add_options`), and
:func:`specstore.pipeline.extract` takes the dataclass (or its fields as
keywords).  The feature parameters' options and bounds are the feature kinds'
(:mod:`specstore.pipeline.spec_options`).  Pure: no audio libraries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specstore.common.errors import ConfigError
from specstore.common.executors import BACKENDS
from specstore.common.executors.idle import IDLE_WARN_EVERY, IDLE_WARN_SECONDS, MAX_IDLE, idle_warn_field
from specstore.common.limits import Limit, check_fields
from specstore.common.options import option
from specstore.store.kinds import DEFAULT_KINDS

if TYPE_CHECKING:
    from specstore.common.executors import Executor
    from specstore.store import FeatureSpec

__all__ = ["BLOCK_SECONDS", "COMMIT_SECONDS", "IDLE_WARN_EVERY", "IDLE_WARN_SECONDS", "JOBS", "MAX_IDLE",
           "ExtractOptions"]

JOBS = Limit(1, 4096, "tasks decoding at once: worker processes here, or a dask or ray cluster's workers, each "
                      "holding a block of audio; 4096 is beyond any cluster this tool drives", optional=True)
"""``--jobs``: unset means all cores."""

BLOCK_SECONDS = Limit(0.0, 600.0, "seconds of audio a worker decodes at once, at the file's own rate and channels: "
                                  "600 s of 48 kHz stereo float32 is 230 MB per worker", kind=float, low_open=True)
"""``--block-seconds``: how long files are streamed (the values do not depend on it)."""

COMMIT_SECONDS = Limit(0.0, 3600.0, "seconds of finished work an interruption may lose; 0 commits after every task",
                       kind=float)
"""``--commit-seconds``: how often finished shards are committed into the index."""



@dataclass(frozen=True)
class ExtractOptions:
    """How one extraction runs: the features, where its tasks run, how often it commits, which files it takes.

    ``features`` names the feature kinds (their default specs); ``specs`` gives the specs themselves (then
    ``features`` is unused).  ``jobs`` workers (default: all cores; never more than there are tasks) on
    ``backend`` (:data:`specstore.common.executors.BACKENDS`: ``loky`` local processes; ``threading``;
    ``dask`` with ``scheduler`` a ``tcp://`` address, or a local cluster when None; ``ray``, with
    ``scheduler`` a ray address), or on ``executor``, an :class:`~specstore.common.executors.Executor` of
    the caller's (``backend`` and ``scheduler`` are then unused, and it is left open).  While the executor
    has no live workers (:meth:`~specstore.common.executors.Executor.live_workers`) and no task finishes,
    the run warns, naming the scheduler, after ``idle_warn_seconds`` and then every ``idle_warn_every``
    seconds; after ``max_idle`` seconds (None: never) it commits what has finished and stops with an
    :class:`~specstore.pipeline.errors.ExtractError`.  ``storage_options``
    go to fsspec for a store at a URL.  The values are checked when the options are made
    (:class:`~specstore.common.errors.ConfigError`, one line).
    """

    features: tuple[str, ...] = DEFAULT_KINDS
    specs: Mapping[str, FeatureSpec] | None = None
    jobs: int | None = option(None, "worker processes", limit=JOBS, shown="all cores")
    layout: str = option("raw", "raw: uncompressed, memory-mapped reads; zstd: compressed, for archives and object "
                                "stores", choices=("raw", "zstd"))
    backend: str = option("loky", "where the tasks run: loky (local processes), threading (threads of this "
                                  "process), dask or ray")
    scheduler: str | None = option(None, "the cluster to use: a dask scheduler (tcp://host:8786) with --backend "
                                         "dask, or a ray address (auto, ray://host:10001) with --backend ray",
                                   shown="a local one")
    block_seconds: float = option(60.0, "decode long files in blocks of this many seconds: a worker's memory",
                                  limit=BLOCK_SECONDS)
    commit_seconds: float = option(2.0, "commit finished shards at most this often, seconds (0: after every task): "
                                        "an interruption loses at most this much work", limit=COMMIT_SECONDS)
    max_idle: float | None = option(None, "stop the run when its cluster has had no live workers for this many "
                                          "seconds (what has finished is committed first; rerun to resume)",
                                    limit=MAX_IDLE, shown="wait for ever", metavar="SECONDS")
    idle_warn_seconds: float = idle_warn_field(IDLE_WARN_SECONDS)
    idle_warn_every: float = idle_warn_field(IDLE_WARN_EVERY)
    progress: bool = option(True, "show a progress bar")
    add_corpus: bool = option(False, "allow a store that holds another corpus to take this one too (its paths get "
                                     "their own prefix)")
    remove_missing: bool = option(False, "drop indexed paths whose files are no longer in the corpus")
    follow_links: bool = option(False, "follow links to files and folders outside the corpus root (otherwise they "
                                       "are recorded as bad files, so a downloaded corpus cannot pull in other "
                                       "audio of this machine)")
    group_by: str | None = option(None, "group a folder corpus's files so that one work stays on one side of a "
                                        "split: 'parent' (the folder below the label folder) or a regular "
                                        "expression over the path (first capture group, else the match); a "
                                        "manifest uses its group column instead", metavar="parent|REGEX")
    storage_options: dict[str, Any] | None = None
    executor: Executor | None = None

    def __post_init__(self) -> None:
        if isinstance(self.features, str) or not isinstance(self.features, Iterable):
            raise ConfigError(f"features must be a sequence of feature names, got {self.features!r}")
        object.__setattr__(self, "features", tuple(self.features))
        check_fields(self)
        if self.executor is None and self.backend not in BACKENDS:
            gone = " (loky runs the same local processes)" if self.backend == "multiprocessing" else ""
            raise ConfigError(f"unknown backend {self.backend!r}{gone}; choose {', '.join(BACKENDS)}")

    def replace(self, **changes: Any) -> ExtractOptions:
        """These options with ``changes`` (field names), checked again."""
        return dataclasses.replace(self, **changes)
