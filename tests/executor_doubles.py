"""Executors that misbehave on purpose, for the driver tests of cluster inference and evaluation.

``StopsAfter`` interrupts the driver after ``n`` results (as Ctrl-C would), ``Counting`` counts the tasks
submitted, ``Duplicating`` delivers its first result twice (as a cluster that ran a task again and returned
both would).  Used by tests/infer/test_predict_cluster.py and tests/infer/test_evaluate_cluster.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from specstore.common.executors import InlineExecutor, TaskFuture, ThreadExecutor


class StopsAfter(ThreadExecutor):
    """Threads whose results stop coming after ``n``: the driver gets an interrupt (as from Ctrl-C)."""

    def __init__(self, n: int) -> None:
        super().__init__(2)
        self.n = n

    def as_completed(self, futures: Iterable[TaskFuture], timeout: float | None = None) -> Iterator[TaskFuture]:
        for future in super().as_completed(futures, timeout):
            if self.n == 0:
                raise KeyboardInterrupt
            self.n -= 1
            yield future


class Counting(ThreadExecutor):
    """Threads that count the tasks submitted."""

    def __init__(self) -> None:
        super().__init__(2)
        self.submitted = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, key: str | None = None, retries: int = 0,
               **kwargs: Any) -> TaskFuture:
        self.submitted += 1
        return super().submit(fn, *args, key=key, retries=retries, **kwargs)


class Duplicating(InlineExecutor):
    """Delivers the first result twice (as a cluster that ran a unit again and returned both would)."""

    def as_completed(self, futures: Iterable[TaskFuture], timeout: float | None = None) -> Iterator[TaskFuture]:
        first = True
        for future in super().as_completed(futures, timeout):
            yield future
            if first:
                first = False
                yield future
