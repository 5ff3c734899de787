"""Whether a driver waits on an empty cluster: :class:`IdleWatch`, shared by extraction and inference.

A driver that hands tasks to an :class:`~specstore.common.executors.Executor`
and waits for their results looks at the executor's live workers whenever no
task has finished for a while: a cluster that has had none for ``warn_after``
seconds is named in a warning, repeated every ``warn_every`` seconds, and
``max_idle`` bounds the wait (the driver commits what has finished, then
stops).  Extraction (:mod:`specstore.pipeline.extract_run`) and cluster
inference (:mod:`specstore.infer.engine.distributed`) both use it, so an empty
cluster reads the same in both.  Standard library only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from ..limits import Limit, bounded
from .base import Executor, TaskFuture

__all__ = ["IDLE_POLL_SECONDS", "IDLE_WARN_EVERY", "IDLE_WARN_SECONDS", "IDLE_WARN_WHY", "MAX_IDLE", "IdleWatch",
           "idle_warn_field"]

#: ``--max-idle`` of every command that drives a cluster (extraction, inference): how long a run waits while
#: its cluster has no live workers (None: for ever).
MAX_IDLE = Limit(0.0, 7 * 86400.0, "seconds a run waits for a cluster that has no live workers before it stops; "
                                   "unset waits forever, and a week is beyond any outage worth waiting out",
                 kind=float, low_open=True, optional=True)
IDLE_WARN_SECONDS = 30.0
"""Seconds without a live worker before the first warning that names the scheduler."""
IDLE_WARN_EVERY = 60.0
"""Seconds between the further warnings while the cluster stays empty."""
IDLE_WARN_WHY = "seconds of an empty cluster before the run warns, and between warnings; a day at most"
"""Why the two warning intervals are bounded as they are (a field's bound, :func:`specstore.common.limits.bounded`)."""


def idle_warn_field(default: float) -> Any:
    """An options dataclass's warning-interval field (``idle_warn_seconds``, ``idle_warn_every``): seconds in
    (0, a day], ``default`` when not given; every command that drives a cluster declares them so."""
    return bounded(default, 0.0, 86400.0, IDLE_WARN_WHY, low_open=True)

#: Seconds between two looks at the live workers while no task finishes (less where the idle intervals are short).
IDLE_POLL_SECONDS = 5.0


class IdleWatch:
    """Whether a run waits on an empty cluster: warns while ``executor`` has no live workers, and says when to stop.

    The cluster is idle from the first look (:meth:`check`) that finds no live worker
    (:meth:`~specstore.common.executors.Executor.live_workers`) until a look finds one or a task finishes
    (:meth:`progress`: a cluster that finishes tasks works, whatever it reports).  After ``warn_after``
    seconds idle a warning names the scheduler (:meth:`~specstore.common.executors.Executor.describe`), then
    again every ``warn_every`` seconds; after ``max_idle`` seconds (None: never) :meth:`check` returns the
    reason to stop.  ``clock``: seconds, monotonic.  Warnings go to :attr:`logger` (a subclass names its
    driver's logger, so a user filtering one command's log sees them).
    """

    logger: ClassVar[logging.Logger] = logging.getLogger(__name__)

    def __init__(self, executor: Executor, warn_after: float, warn_every: float, max_idle: float | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.executor, self.warn_after, self.warn_every, self.max_idle = executor, warn_after, warn_every, max_idle
        self.clock = clock
        intervals = [warn_after, warn_every] + ([max_idle] if max_idle is not None else [])
        #: Seconds a driver waits for a task to finish before it looks at the workers again.
        self.poll_seconds = min(IDLE_POLL_SECONDS, *(x / 4 for x in intervals))
        self.idle_since: float | None = None
        self.next_warning = 0.0
        self.warned = False
        #: Why the run stops (:meth:`finished` ended early), else None.
        self.stopped: str | None = None

    def progress(self) -> None:
        """A task finished: the cluster is not idle."""
        self.idle_since = None

    def check(self, waiting: int) -> str | None:
        """Look at the live workers (``waiting``: the tasks not finished); warn when due; the one-line reason to
        stop when the cluster has been idle for ``max_idle`` seconds, else None."""
        now = self.clock()
        if self.executor.live_workers() > 0:
            if self.warned:
                self.logger.warning("%s has live workers again; the run goes on", self.executor.describe())
            self.idle_since, self.warned = None, False
            return None
        if self.idle_since is None:
            self.idle_since, self.next_warning = now, now + self.warn_after
        idle = now - self.idle_since
        if self.max_idle is not None and idle >= self.max_idle:
            return f"no live workers on {self.executor.describe()} for {idle:.1f} s (--max-idle {self.max_idle:g})"
        if now >= self.next_warning:
            self.logger.warning("no live workers on %s for %.0f s: %d tasks wait for one (start workers, or "
                                "--max-idle SECONDS stops the run)", self.executor.describe(), idle, waiting)
            self.warned, self.next_warning = True, now + self.warn_every
        return None

    def finished(self, futures: Sequence[TaskFuture]) -> Iterator[TaskFuture]:
        """``futures`` as they finish (``executor.as_completed``), looking at the workers whenever none has
        finished for :attr:`poll_seconds`; ends early, with ``stopped`` set to the reason, when :meth:`check`
        says to stop.  A future the executor yields again (or one not asked for) is passed on as it comes: the
        driver decides what a duplicate result means (inference drops it and counts it)."""
        self.stopped = None
        pending = dict.fromkeys(futures)
        while pending:
            try:
                for future in self.executor.as_completed(list(pending), timeout=self.poll_seconds):
                    pending.pop(future, None)
                    self.progress()
                    yield future
            except TimeoutError:
                pass
            if pending:
                self.stopped = self.check(len(pending))
                if self.stopped is not None:
                    return
