"""A gate for cluster tests: each task leaves ``started.<key>.<pid>`` in a folder and waits for ``release``.

A test then knows which process runs which task, can kill one of them deterministically (:class:`Killer`), and
lets the tasks go on.  :class:`GatedDask` and :class:`GatedRay` pass every task through the gate;
:func:`local_ray` is a small local ray for one test (tests/pipeline/test_cluster_kill.py,
tests/infer/test_predict_cluster.py).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from specstore.common.executors import DaskExecutor, RayExecutor, TaskFuture

GATE_SECONDS = 60.0
"""How long a gated task waits for its release before it fails (a test's helper thread releases it in seconds)."""


def gated() -> Callable[..., Any]:
    """The gate, made in a function so that it pickles by value (a ray worker does not see the tests folder)."""

    def gate(folder: str, key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Leave ``started.<key>.<pid>`` in ``folder``, wait for ``folder/release``, then run ``fn``."""
        import os
        import time

        with open(os.path.join(folder, f"started.{key}.{os.getpid()}"), "w"):
            pass
        deadline = time.monotonic() + GATE_SECONDS
        while not os.path.exists(os.path.join(folder, "release")):
            if time.monotonic() > deadline:
                raise TimeoutError(f"task {key} was never released")
            time.sleep(0.02)
        return fn(*args, **kwargs)

    return gate


def started(folder: Path) -> list[tuple[str, int]]:
    """The (key, pid) of every task start so far."""
    return [(p.name.split(".")[1], int(p.name.split(".")[2])) for p in folder.glob("started.*")]


class _Gated:
    """An executor whose tasks pass :func:`gated` under ``folder`` first."""

    folder: Path

    def _start(self, key: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
               retries: int, failed: TaskFuture | None) -> TaskFuture:
        return super()._start(key, gated(), (str(self.folder), key, fn, *args), kwargs,  # type: ignore[misc]
                              retries, failed)


class GatedDask(_Gated, DaskExecutor):
    """dask tasks that pass :func:`gated` under ``folder`` first."""


class GatedRay(_Gated, RayExecutor):
    """Ray tasks that pass :func:`gated` under ``folder`` first."""


def await_value(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    """``condition()``'s first true value, looked for every 20 ms (the event is a file another process writes)."""
    deadline = time.monotonic() + seconds
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {seconds:g} s for {what}")
        time.sleep(0.02)
    return value


class Killer(threading.Thread):
    """Kills (SIGKILL) the worker process of the first task that starts, waits until it is gone, then releases
    every task; ``act(pid)`` replaces the kill (closing a cluster's workers, say), ``release=False`` keeps the
    gate shut.  What it killed is ``victim``; an error of its own is ``error`` (the gate opens all the same)."""

    def __init__(self, folder: Path, act: Callable[[int], None] | None = None, release: bool = True) -> None:
        super().__init__(daemon=True)
        self.folder, self.act, self.release = folder, act, release
        self.victim: tuple[str, int] | None = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            key, pid = self.victim = await_value(lambda: started(self.folder)[:1], 60, "a task to start")[0]
            assert pid != os.getpid(), "the task runs in the test's own process"
            if self.act is not None:
                self.act(pid)
            else:
                import psutil

                process = psutil.Process(pid)
                os.kill(pid, signal.SIGKILL)
                process.wait(timeout=30)
        except BaseException as e:
            self.error = e
        finally:
            if self.release or self.error is not None:
                (self.folder / "release").touch()


@contextlib.contextmanager
def local_ray() -> Iterator[Any]:
    """A local ray of 2 CPUs for the test inside (skipped where ray is not installed), shut down after."""
    ray = pytest.importorskip("ray", reason="ray is not installed (optional: pip install ray)")
    assert not ray.is_initialized()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 << 20, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()
