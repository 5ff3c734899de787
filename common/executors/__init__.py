"""Where tasks run: one ``concurrent.futures``-style seam over local processes, dask and ray.

:class:`Executor` (in :mod:`.base`) is the interface: keyed submission with
retries, results as they complete, the live workers, where it runs.  Its
implementations: :class:`InlineExecutor`, :class:`ThreadExecutor` and
:class:`LokyExecutor` on this machine (:mod:`.local`), :class:`DaskExecutor`
(:mod:`.dask_cluster`) and :class:`RayExecutor` (:mod:`.ray_cluster`).
:func:`open_executor` makes one from a backend's name, as ``--backend`` and
``--scheduler`` give it.  Extraction runs its tasks through it; a caller may
pass an executor of its own (``extract(..., executor=...)``).

Standard library only at import: joblib, dask and ray are imported when an
executor that needs them is made.
"""

from __future__ import annotations

from ..errors import ExecutorError
from .base import Executor, KeyedExecutor, TaskFuture, TaskLost, run_with_retries, task_key
from .dask_cluster import DaskExecutor
from .local import InlineExecutor, LokyExecutor, ThreadExecutor
from .ray_cluster import RayExecutor

__all__ = ["BACKENDS", "DaskExecutor", "Executor", "InlineExecutor", "KeyedExecutor", "LokyExecutor",
           "RayExecutor", "TaskFuture", "TaskLost", "ThreadExecutor", "open_executor", "run_with_retries", "task_key"]

#: The backends :func:`open_executor` knows: local processes (the default), threads of this process, dask, ray.
BACKENDS = ("loky", "threading", "dask", "ray")


def open_executor(backend: str, workers: int, scheduler: str | None = None) -> Executor:
    """An executor for ``backend`` (:data:`BACKENDS`) with ``workers`` workers where it starts them.

    ``loky`` and ``threading`` with one worker run tasks inline, in this process (no pool to start, as
    joblib does with one job); ``scheduler`` is then unused.  ``dask``: the scheduler at ``scheduler``, or
    a local cluster of ``workers`` processes; ``ray``: the cluster at ``scheduler`` (or ``RAY_ADDRESS``),
    or a local ray of ``workers`` CPUs.  :class:`~specstore.common.errors.ExecutorError` (one line) when
    the library is missing or the scheduler cannot be reached.
    """
    if backend == "dask":
        return DaskExecutor.connect(scheduler, workers)
    if backend == "ray":
        return RayExecutor.connect(scheduler, workers)
    if backend not in BACKENDS:
        raise ExecutorError(f"unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
    if workers == 1:
        return InlineExecutor()
    return LokyExecutor(workers) if backend == "loky" else ThreadExecutor(workers)
