"""Executors on this machine: :class:`InlineExecutor` (this process), :class:`ThreadExecutor` (its threads) and
:class:`LokyExecutor` (worker processes).

:class:`LokyExecutor` runs on loky's reusable process pool, the very pool
joblib's ``loky`` backend keeps (asked for with the arguments joblib's
``parallel_config(backend="loky", inner_max_num_threads=1)`` gives it): its
workers stay warm between runs, and a ``joblib.Parallel`` of the same size in
the same process reuses them instead of starting others.  Each worker limits
BLAS/OpenMP to one thread (a task is single-threaded numpy; more threads per
worker would only compete for the cores).  The C heap's thresholds for freed
blocks are set by the decoding code itself in whatever process decodes
(:func:`specstore.common.heap.keep_freed_blocks`), so no worker initialiser
is needed.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import multiprocessing
import os
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .base import KeyedExecutor, TaskFuture, TaskLost, run_with_retries

__all__ = ["InlineExecutor", "LokyExecutor", "ThreadExecutor"]

log = logging.getLogger(__name__)

#: Seconds an idle loky worker waits for work before it exits (joblib's own default).
IDLE_WORKER_SECONDS = 300


class _InlineFuture(TaskFuture):
    """A task run in the calling thread when its result is first asked for (or by ``as_completed``)."""

    def __init__(self, key: str, call: Callable[[], Any]) -> None:
        super().__init__(key)
        self._call: Callable[[], Any] | None = call

    def run(self) -> None:
        """Run the task now unless it has run or was cancelled; an interrupt propagates (and is its outcome)."""
        call, self._call = self._call, None
        if call is None or not self.set_running_or_notify_cancel():
            return
        try:
            value = call()
        except Exception as e:
            self.set_exception(e)
        except BaseException as e:
            self.set_exception(e)
            raise
        else:
            self.set_result(value)

    def result(self, timeout: float | None = None) -> Any:
        self.run()
        return super().result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        self.run()
        return super().exception(timeout)


class InlineExecutor(KeyedExecutor):
    """Tasks run one at a time in the calling thread, in submission order, as their results are asked for.

    What one worker means on this machine: no process to start, nothing to pickle, a profiler sees the
    work, and a store in this process's memory can be written.  Submitting runs nothing; iterating
    :meth:`as_completed` runs each task in turn, so a driver commits between tasks as it would with workers.
    """

    in_process = True

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               retries: int, failed: TaskFuture | None) -> TaskFuture:
        return _InlineFuture(key, lambda: run_with_retries(fn, retries, args, kwargs))

    def as_completed(self, futures: Iterable[TaskFuture], timeout: float | None = None) -> Iterator[TaskFuture]:
        for f in dict.fromkeys(futures):
            if isinstance(f, _InlineFuture):
                f.run()
            yield f

    def live_workers(self) -> int:
        return 1

    def describe(self) -> str:
        return "this process (inline)"


class ThreadExecutor(KeyedExecutor):
    """``workers`` threads of this process (tasks share its memory; numpy and the decoders release the GIL).

    The threads are daemons, as joblib's threading backend's were: an interrupted run's process exits
    without waiting for the task a thread is running.
    """

    in_process = True

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers
        self._queue: queue.SimpleQueue[tuple[TaskFuture, Callable[[], Any]] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"specstore-task-{i}", daemon=True)
                         for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():  # cancelled while queued
                continue
            try:
                value = call()
            except BaseException as e:  # the task's outcome, whatever it is; the thread goes on
                future.finish(error=e)
            else:
                future.finish(value)

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               retries: int, failed: TaskFuture | None) -> TaskFuture:
        future = TaskFuture(key)
        self._queue.put((future, lambda: run_with_retries(fn, retries, args, kwargs)))
        return future

    def live_workers(self) -> int:
        return self.workers

    def describe(self) -> str:
        return f"{self.workers} threads of this process"

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once the queue is done (``cancel_futures``: queued tasks are cancelled, and what
        runs is not waited for)."""
        if cancel_futures:
            for f in self._unfinished():
                f.cancel()
        for _ in self._threads:
            self._queue.put(None)
        if wait and not cancel_futures:
            for thread in self._threads:
                thread.join()


def _loky_pool(workers: int) -> Any:
    """loky's reusable pool of ``workers`` processes, asked for exactly as joblib's loky backend under
    ``parallel_config(backend="loky", inner_max_num_threads=1)`` asks for it, so that both share it."""
    from joblib.executor import get_memmapping_executor
    from joblib.parallel import DEFAULT_MP_CONTEXT, ParallelBackendBase

    env = {name: "1" for name in ParallelBackendBase.MAX_NUM_THREADS_VARS}
    if ParallelBackendBase.TBB_ENABLE_IPC_VAR not in os.environ:
        env[ParallelBackendBase.TBB_ENABLE_IPC_VAR] = "1"
    context = DEFAULT_MP_CONTEXT if DEFAULT_MP_CONTEXT is not None else multiprocessing.get_context()
    # joblib.Parallel's own defaults (max_nbytes "1M", mmap_mode "r", verbose 0): equal arguments reuse the pool
    return get_memmapping_executor(workers, timeout=IDLE_WORKER_SECONDS, env=env, max_nbytes=1 << 20,
                                   mmap_mode="r", verbose=0, context=context)


class LokyExecutor(KeyedExecutor):
    """``workers`` local worker processes (loky; see the module docstring).

    A worker that dies (killed, out of memory) breaks the pool: the unfinished tasks' futures hold
    :class:`TaskLost` (loky's ``TerminatedWorkerError`` its cause) and the next submission starts a fresh
    pool.  Leaving on an error kills the workers of tasks still running, as joblib does when a run is aborted.
    """

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers
        self._pool = _loky_pool(workers)
        self._abandoned: list[cf.Future[Any]] = []  # tasks cancelled while running: they run on

    def _cancel_task(self, inner: cf.Future[Any]) -> None:
        if not inner.cancel() and not inner.done():
            self._abandoned.append(inner)

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               retries: int, failed: TaskFuture | None) -> TaskFuture:
        try:
            inner = self._pool.submit(run_with_retries, fn, retries, args, kwargs)
        except RuntimeError:  # the pool broke (a worker died) or was replaced: a fresh one takes the task
            log.debug("loky pool unusable; starting a fresh one", exc_info=True)
            self._pool = _loky_pool(self.workers)
            inner = self._pool.submit(run_with_retries, fn, retries, args, kwargs)
        future = TaskFuture(key, inner, lambda: self._cancel_task(inner))
        future.settle_from(inner, lambda e: TaskLost(key, self.describe(), e) if isinstance(e, cf.BrokenExecutor)
                           else e)
        return future

    def live_workers(self) -> int:
        return self.workers

    def describe(self) -> str:
        return f"{self.workers} local worker processes (loky)"

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """The pool stays warm for the next run; with ``cancel_futures``, queued tasks are cancelled and the
        workers of running ones killed."""
        if not cancel_futures:
            return
        for f in self._unfinished():
            f.cancel()
        if any(not inner.done() for inner in self._abandoned):
            self._pool.terminate(kill_workers=True)
        self._abandoned.clear()
