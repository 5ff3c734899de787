"""Tasks on a dask cluster: :class:`DaskExecutor`, over a ``distributed`` client.

Each task is ``Client.submit(fn, ..., key=key, retries=retries)``: the key is
the task's name on the scheduler (its dashboard groups tasks by the key's
first word) and a task that raised is rerun there, on any worker.  A task
whose worker was lost is rerun by the scheduler itself, up to its
``distributed.scheduler.allowed-failures`` (3 by default); beyond that (dask's
``KilledWorker``), or when its result cannot be fetched, the task fails with
:class:`~specstore.common.errors.TaskLost`.  dask is imported when an
executor is made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from typing import Any

from ..errors import ExecutorError
from .base import KeyedExecutor, TaskFuture, TaskLost

__all__ = ["DaskExecutor", "local_cluster"]

log = logging.getLogger(__name__)


def _settle(future: TaskFuture, where: str, native: Any) -> None:
    """Move a finished dask future's outcome onto ``future`` (dask runs this in a callback thread of its own):
    a task whose workers kept dying (``KilledWorker``), or whose result cannot be fetched (a client closing, a
    lost key), as :class:`TaskLost` naming ``where``."""
    from distributed.scheduler import KilledWorker

    try:
        if native.status == "finished":
            future.finish(native.result())
        elif native.status == "cancelled":
            future.finish(cancelled=True)
        else:
            error = native.exception()
            future.finish(error=TaskLost(future.key, where, error) if isinstance(error, KilledWorker) else error)
    except Exception as e:
        future.finish(error=TaskLost(future.key, where, e))


class DaskExecutor(KeyedExecutor):
    """Tasks on the dask cluster of ``client`` (a ``distributed.Client``).

    Made by :meth:`connect` (a scheduler's address, or a local cluster for this executor's life), or
    from a client of your own, which is then left open.
    """

    def __init__(self, client: Any, *, owned: ExitStack | None = None, local: bool = False) -> None:
        super().__init__()
        self.client = client
        self._owned = owned
        self._local = local

    @classmethod
    def connect(cls, scheduler: str | None, workers: int) -> DaskExecutor:
        """A client of the scheduler at ``scheduler`` (``tcp://host:8786``), or, when None, of a local cluster
        of ``workers`` single-threaded worker processes started now (and stopped by :meth:`shutdown`)."""
        try:
            from dask.distributed import Client
        except ImportError:
            raise ExecutorError("BACKEND=dask needs dask.distributed: pip install 'specstore[dask]'") from None
        stack = ExitStack()
        try:
            if scheduler:
                try:
                    client = stack.enter_context(Client(scheduler))
                except (OSError, ValueError) as e:
                    raise ExecutorError(f"cannot reach the dask scheduler at {scheduler}: {e}".splitlines()[0]) \
                        from None
            else:
                cluster = stack.enter_context(local_cluster(workers))
                client = stack.enter_context(Client(cluster))
        except BaseException:
            stack.close()
            raise
        return cls(client, owned=stack, local=not scheduler)

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               retries: int, failed: TaskFuture | None) -> TaskFuture:
        native = failed.native if failed is not None else None
        if native is not None and native.status == "error":  # the scheduler still knows the key: rerun it there
            native.retry()
        else:
            native = self.client.submit(fn, *args, key=key, retries=retries or None, pure=False, **kwargs)
        future = TaskFuture(key, native, native.cancel)
        native.add_done_callback(partial(_settle, future, f"the dask scheduler at {self.address}"))
        return future

    def live_workers(self) -> int:
        """The threads of the workers connected to the scheduler now (0 if it cannot be asked)."""
        try:
            return int(sum(self.client.nthreads().values()))
        except Exception:
            log.debug("asking the dask scheduler for its workers failed", exc_info=True)
            return 0

    @property
    def address(self) -> str | None:
        return str(self.client.scheduler.address)

    def describe(self) -> str:
        where = f"a local dask cluster ({self.address})" if self._local else f"the dask scheduler at {self.address}"
        link = self.client.dashboard_link
        return f"{where}, dashboard {link}" if link else where

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        if cancel_futures:
            for f in self._unfinished():
                f.cancel()
        if self._owned is not None:
            self._owned.close()
            self._owned = None


def local_cluster(workers: int, **kwargs: Any) -> Any:
    """A dask ``LocalCluster`` of ``workers`` single-threaded worker processes, as a run without a scheduler starts.

    dask starts its workers with ``MALLOC_TRIM_THRESHOLD_=65536``, which makes glibc give memory back after
    nearly every free: a model's forward pass ran about 1.6x slower under it (docs/benchmarks.md, cluster).
    These workers start without it; specstore's own heap tuning (:mod:`specstore.common.heap`) applies.
    ``kwargs`` go to ``LocalCluster`` (e.g. ``dashboard_address``).
    """
    import dask
    from dask.distributed import LocalCluster

    with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}):
        return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, **kwargs)
