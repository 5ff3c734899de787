"""Tasks on ray: :class:`RayExecutor`, one ray task per submission (not joblib's pool of ray actors).

A ray task whose worker process or node is lost is run again by ray, up to
``lost_worker_retries`` times (ray's ``max_retries``); an actor pool's task
runs at most once, so one lost actor ended the whole run.  A task that
raised is run again in its worker (:func:`~specstore.common.executors.base.run_with_retries`).
Its error reaches the driver as the task raised it, not wrapped in ray's
``RayTaskError``; a task lost more often than that (ray's ``WorkerCrashedError``,
``NodeDiedError``, ...) fails with :class:`~specstore.common.executors.base.TaskLost`.
ray is imported when an executor is made.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial
from typing import Any

from ..errors import ExecutorError
from .base import KeyedExecutor, TaskFuture, TaskLost, run_with_retries

__all__ = ["LOST_WORKER_RETRIES", "RayExecutor"]

log = logging.getLogger(__name__)

#: How often ray runs a task again whose worker was lost (ray's own default for tasks).
LOST_WORKER_RETRIES = 3


def _task_error(key: str, where: Callable[[], str], error: BaseException) -> BaseException:
    """The error the task raised, out of ray's ``RayTaskError`` wrapper; ray's own errors (a worker or node lost
    beyond ``max_retries``, an object lost) as :class:`TaskLost` naming ``key`` and ``where()``; a cancel as is."""
    from ray.exceptions import RayError, RayTaskError, TaskCancelledError

    if isinstance(error, RayTaskError):
        cause = getattr(error, "cause", None)
        return cause if isinstance(cause, Exception) else error
    if isinstance(error, RayError) and not isinstance(error, TaskCancelledError):
        return TaskLost(key, where(), error)
    return error


class RayExecutor(KeyedExecutor):
    """Tasks on the ray this process is connected to (:meth:`connect` connects or starts one)."""

    def __init__(self, *, lost_worker_retries: int = LOST_WORKER_RETRIES, owned: bool = False) -> None:
        import ray

        if not ray.is_initialized():
            raise ExecutorError("RayExecutor needs a ray connection: ray.init() first, or RayExecutor.connect()")
        super().__init__()
        self.lost_worker_retries = lost_worker_retries
        self._owned = owned
        self._remote = ray.remote(run_with_retries)

    @classmethod
    def connect(cls, address: str | None, workers: int, *,
                lost_worker_retries: int = LOST_WORKER_RETRIES) -> RayExecutor:
        """The ray this process is connected to; else the cluster at ``address`` (``auto``, ``ray://head:10001``;
        default ``RAY_ADDRESS``), or a local ray of ``workers`` CPUs started now (and shut down by
        :meth:`shutdown`)."""
        try:
            import ray
        except ImportError:
            raise ExecutorError("BACKEND=ray needs ray: pip install ray") from None
        address = address or os.environ.get("RAY_ADDRESS")
        owned = False
        if not ray.is_initialized():
            options: dict[str, Any] = {"address": address} if address else {"num_cpus": workers}
            try:
                ray.init(**options)
            except (ConnectionError, OSError, ValueError) as e:
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise ExecutorError(f"cannot start or reach ray ({address or 'local'}): {reason}") from None
            owned = True
        return cls(lost_worker_retries=lost_worker_retries, owned=owned)

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               retries: int, failed: TaskFuture | None) -> TaskFuture:
        import ray

        task = self._remote.options(name=key, num_cpus=1, max_retries=self.lost_worker_retries,
                                    retry_exceptions=False)
        ref = task.remote(fn, retries, args, kwargs)
        future = TaskFuture(key, ref, lambda: ray.cancel(ref))
        future.settle_from(ref.future(), unwrap=partial(_task_error, key, self._lost_where))
        return future

    def _lost_where(self) -> str:
        """Where a lost task ran, and how often ray ran it, for :class:`TaskLost`."""
        runs = self.lost_worker_retries + 1
        return f"the ray cluster at {self.address} ({runs} run{'s' if runs > 1 else ''})"

    def live_workers(self) -> int:
        """The CPUs of ray's live nodes (0 when every node is gone, or ray cannot be asked)."""
        import ray

        try:
            return int(ray.cluster_resources().get("CPU", 0))
        except Exception:
            log.debug("asking ray for its resources failed", exc_info=True)
            return 0

    @property
    def address(self) -> str | None:
        import ray

        try:
            return str(ray.get_runtime_context().gcs_address)
        except Exception:
            return None

    def describe(self) -> str:
        if self._owned:
            return f"a local ray of {self.live_workers()} CPUs ({self.address})"
        return f"the ray cluster at {self.address}"

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        import ray

        if cancel_futures:
            for f in self._unfinished():
                f.cancel()
        if self._owned and ray.is_initialized():
            ray.shutdown()
        self._owned = False
