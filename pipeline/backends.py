"""Where an extraction's tasks run: the executor of its options (:mod:`specstore.common.executors`).

``--backend loky`` (local processes, the default), ``threading`` (threads of
the driver's process), ``dask`` (a scheduler, or a local cluster for the run)
or ``ray`` (a cluster, or a local ray for the run); or an executor the caller
made (``extract(..., executor=...)``), which the run uses and leaves open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from specstore.common.errors import ExecutorError
from specstore.common.executors import BACKENDS, Executor, open_executor

from .extract_options import ExtractOptions
from .extract_report import ExtractError

__all__ = ["BACKENDS", "run_executor"]

log = logging.getLogger("specstore.pipeline.extract")


@contextmanager
def run_executor(options: ExtractOptions, n_jobs: int) -> Iterator[Executor]:
    """The executor the run's tasks go to: ``options.executor`` (left open), else one for ``options.backend``
    with ``n_jobs`` workers where it starts them (closed at the end; an error cancels what is unfinished).
    A backend that cannot be had is an :class:`ExtractError` (one line)."""
    if options.executor is not None:
        log.info("tasks run on %s", options.executor.describe())
        yield options.executor
        return
    try:
        executor = open_executor(options.backend, n_jobs, options.scheduler)
    except ExecutorError as e:
        raise ExtractError(str(e)) from None
    with executor:
        log.info("tasks run on %s", executor.describe())
        yield executor
