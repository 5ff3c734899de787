"""The executor seam's interface: :class:`Executor`, the futures it returns, deterministic keys, retries.

An :class:`Executor` runs tasks (picklable functions and their arguments)
somewhere: in this process, in a pool of local processes, on a dask or on a
ray cluster.  It looks like :class:`concurrent.futures.Executor` (``submit``
returns a :class:`concurrent.futures.Future`, ``as_completed`` yields them as
they finish), as lhotse's ``compute_and_store_features(..., executor=...)``
takes one, and adds what a driver of long runs on a cluster needs:

* every task has a **key**: a task submitted again under a key whose future
  is still held (pending, or finished without error) is recognised, and the
  held future is returned instead of running it twice; :func:`task_key`
  makes keys from what a task is, so a driver that submits again (after a
  lost result, say) gets the same key;
* **retries**: a task that raises is run again, up to ``retries`` more
  times, before its future holds the error;
* :meth:`Executor.live_workers`, the task slots that are up now (a driver
  warns, or gives up, when a cluster has lost them all);
* :meth:`Executor.describe` and :attr:`Executor.address`: where the tasks
  run, for logs and messages;
* a task whose workers were lost more often than the cluster reruns it (or
  whose local pool broke) fails with :class:`TaskLost`, one line naming it and
  where it ran, not with the cluster's own error.

Standard library only: each implementation imports its cluster's library
when it is made.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import logging
import threading
import uuid
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import Any

from ..errors import TaskLost

__all__ = ["Executor", "KeyedExecutor", "TaskFuture", "TaskLost", "run_with_retries", "task_key"]

log = logging.getLogger(__name__)


def task_key(prefix: str, *parts: object) -> str:
    """A deterministic task key: ``prefix-`` and a digest of ``parts`` (their ``str``).

    The same parts give the same key in any process, so a task submitted
    again is recognised.  ``prefix`` names the task where clusters show keys
    (dask groups its dashboard's tasks by the key's first word).
    """
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"{prefix}-{digest[:32]}"


def run_with_retries(fn: Callable[..., Any], retries: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``; when it raises, run again, up to ``retries`` more times (the last error is raised).

    This runs where the task runs (a worker), so a retry costs no round trip to the driver.  Only
    :class:`Exception` is retried: an interrupt or an exit is not an error of the task.
    """
    for left in range(retries, -1, -1):
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if left == 0:
                raise
            log.warning("task %s failed (%s); running it again (%d more tries)",
                        getattr(fn, "__name__", "task"), str(e).splitlines()[0] if str(e) else type(e).__name__, left)
    raise AssertionError("unreachable")  # pragma: no cover


class TaskFuture(cf.Future[Any]):
    """The :class:`concurrent.futures.Future` of one submitted task, with its ``key``.

    Cancelling it also cancels the task where it runs, where the executor can (a task already running
    in a local process runs to its end).  ``native`` is the executor's own handle (a dask future, a ray
    object reference), held while the task may still be needed and dropped once its result is here.
    """

    def __init__(self, key: str, native: Any = None, cancel_native: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.key = key
        self.native = native
        self._cancel_native = cancel_native

    def cancel(self) -> bool:
        if not self.done() and self._cancel_native is not None:
            try:
                self._cancel_native()
            except Exception:  # the cluster may be gone already: this future is cancelled all the same
                log.debug("cancelling task %s where it runs failed", self.key, exc_info=True)
        return super().cancel()

    def failed(self) -> bool:
        """Whether it finished with an error or was cancelled (a key whose task failed may be submitted again)."""
        return self.done() and (self.cancelled() or self.exception() is not None)

    def finish(self, value: Any = None, *, error: BaseException | None = None, cancelled: bool = False) -> None:
        """Record the task's outcome (from any thread; an outcome after a cancel is dropped).  A result lets go
        of ``native``, so the cluster may free it; a failed task keeps it (dask retries it by its handle)."""
        try:
            if cancelled:
                super().cancel()
            elif error is not None:
                self.set_exception(error)
            else:
                self.set_result(value)
                self.native = None
        except cf.InvalidStateError:  # cancelled here meanwhile
            pass

    def settle_from(self, inner: cf.Future[Any],
                    unwrap: Callable[[BaseException], BaseException] | None = None) -> None:
        """Take ``inner``'s outcome once it has one (``unwrap`` maps its error to the task's own)."""
        def done(f: cf.Future[Any]) -> None:
            if f.cancelled():
                self.finish(cancelled=True)
                return
            error = f.exception()
            if error is None:
                self.finish(f.result())
            else:
                self.finish(error=unwrap(error) if unwrap else error)

        inner.add_done_callback(done)


class Executor(ABC):
    """Where tasks run: the seam extraction uses now and inference will.

    ``in_process``: tasks run in this process (inline or in its threads), so they share its memory (an
    fsspec ``memory://`` store, say).  An executor is a context manager: leaving it shuts it down, and
    leaving on an error cancels what has not finished.
    """

    in_process: bool = False

    @abstractmethod
    def submit(self, fn: Callable[..., Any], /, *args: Any, key: str | None = None, retries: int = 0,
               **kwargs: Any) -> TaskFuture:
        """Run ``fn(*args, **kwargs)`` under ``key`` (default: a new unique key) and return its future.

        A key whose future is still held and has not failed returns that future: the task is not run again.
        ``retries``: how many more times the task runs after it raised (a lost worker's task is run again by
        the cluster's own rule; see each executor).  ``fn`` and the arguments must pickle, except inline.
        """

    def as_completed(self, futures: Iterable[TaskFuture], timeout: float | None = None) -> Iterator[TaskFuture]:
        """``futures`` as they finish, in any order (``TimeoutError`` if they are not all done in ``timeout``
        seconds), as :func:`concurrent.futures.as_completed`."""
        for f in cf.as_completed(list(futures), timeout):
            assert isinstance(f, TaskFuture)
            yield f

    @abstractmethod
    def live_workers(self) -> int:
        """How many tasks can run at once now: 0 when a cluster has lost every worker."""

    @property
    def address(self) -> str | None:
        """The scheduler's address (dask ``tcp://...``, ray's GCS ``host:port``); None for local pools."""
        return None

    @abstractmethod
    def describe(self) -> str:
        """Where the tasks run, in words, for logs and messages (naming the scheduler's address)."""

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:  # noqa: B027 - a default
        """Release what this executor started (a local cluster, a ray instance), cancelling unfinished tasks
        when ``cancel_futures``.  What it was given (a dask client, a running ray) is left running."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown(cancel_futures=error is not None)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}: {self.describe()}>"


class KeyedExecutor(Executor):
    """The keyed submission every implementation shares: keys recognised while their future is held."""

    def __init__(self) -> None:
        self._held: weakref.WeakValueDictionary[str, TaskFuture] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, key: str | None = None, retries: int = 0,
               **kwargs: Any) -> TaskFuture:
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be a whole number >= 0, got {retries!r}")
        with self._lock:
            if key is None:
                key = f"{getattr(fn, '__name__', 'task')}-{uuid.uuid4().hex}"
            held = self._held.get(key)
            if held is not None and not held.failed():
                log.debug("task %s is known: its future is returned, the task is not run again", key)
                return held
            future = self._start(key, fn, args, kwargs, retries, held)
            self._held[key] = future
            return future

    @abstractmethod
    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               retries: int, failed: TaskFuture | None) -> TaskFuture:
        """Start the task (``failed``: the failed future this key had, if any) and return its future."""

    def _unfinished(self) -> list[TaskFuture]:
        """The held futures that have not finished."""
        with self._lock:
            return [f for f in list(self._held.values()) if not f.done()]
