"""The executor seam on this machine: inline, threads and loky processes keep the contract
(:mod:`executor_contract`); the loky pool is joblib's own; a run that stops cancels what is queued; a task
whose worker dies for good fails with one line (:class:`TaskLost`), on loky, dask and ray alike.

dask and ray keep the same contract in ``tests/pipeline/test_distributed.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from executor_contract import check_contract

from specstore.common.errors import ExecutorError
from specstore.common.executors import (
    BACKENDS,
    InlineExecutor,
    LokyExecutor,
    TaskFuture,
    TaskLost,
    ThreadExecutor,
    open_executor,
    task_key,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend, workers, kind", [("loky", 1, InlineExecutor), ("threading", 1, InlineExecutor),
                                                     ("threading", 2, ThreadExecutor), ("loky", 2, LokyExecutor)])
def test_local_executors_keep_the_contract(tmp_path: Path, backend: str, workers: int, kind: type) -> None:
    with open_executor(backend, workers) as executor:
        assert type(executor) is kind and executor.in_process == (kind is not LokyExecutor)
        check_contract(executor, tmp_path / "marks", workers=workers)


def test_inline_tasks_run_when_their_results_are_asked_for(tmp_path: Path) -> None:
    """One worker runs the tasks in this thread, one at a time, as ``as_completed`` reaches them: a driver
    commits between tasks, as it does with workers."""
    ran: list[int] = []
    with InlineExecutor() as executor:
        futures = [executor.submit(ran.append, i) for i in range(3)]
        assert ran == []
        for i, f in enumerate(executor.as_completed(futures)):
            assert ran == list(range(i + 1)) and f.done()
        assert executor.describe() == "this process (inline)" and executor.address is None


def test_task_keys_are_deterministic() -> None:
    assert task_key("run_task", "a", 1) == task_key("run_task", "a", 1) != task_key("run_task", "a", 2)
    assert task_key("run_task", "a").startswith("run_task-")
    code = "from specstore.common.executors import task_key; print(task_key('run_task', 'a', 1))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert other.stdout.strip() == task_key("run_task", "a", 1)  # the same in another process


def test_the_loky_pool_is_the_one_joblib_keeps_warm() -> None:
    """Extraction's local processes are joblib's loky pool (one thread of BLAS each): a joblib.Parallel of
    the same size beside it reuses its workers instead of starting others."""
    from joblib import Parallel, delayed, parallel_config

    def pid() -> int:
        time.sleep(0.3)
        return os.getpid()

    with parallel_config(backend="loky", n_jobs=2, inner_max_num_threads=1):
        joblib_pids = set(Parallel()(delayed(pid)() for _ in range(4)))
    with LokyExecutor(2) as executor:
        ours = {f.result() for f in [executor.submit(pid) for _ in range(4)]}
    assert ours == joblib_pids and os.getpid() not in ours


def test_leaving_on_an_error_cancels_what_is_queued() -> None:
    """An interrupted run neither waits for the task a thread runs (the threads are daemons) nor starts more."""
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt), ThreadExecutor(1) as executor:
        first = executor.submit(time.sleep, 2.0)
        queued = [executor.submit(time.sleep, 2.0) for _ in range(3)]
        while not first.running():
            time.sleep(0.01)
        raise KeyboardInterrupt
    assert time.monotonic() - t0 < 1.5 and all(f.cancelled() for f in queued) and not first.done()
    assert all(thread.daemon for thread in threading.enumerate() if thread.name.startswith("specstore-task"))


def test_unknown_backends_and_bad_retries_are_refused() -> None:
    assert BACKENDS == ("loky", "threading", "dask", "ray")
    with pytest.raises(ExecutorError, match="unknown backend 'multiprocessing'; choose loky, threading, dask, ray"):
        open_executor("multiprocessing", 2)
    with InlineExecutor() as executor, pytest.raises(ValueError, match="retries must be a whole number"):
        executor.submit(print, retries=-1)


def test_the_seam_imports_no_cluster_library() -> None:
    """``specstore.common`` stays on the standard library: joblib, dask and ray load when an executor needs them."""
    code = ("import sys, specstore.common.executors as e; e.InlineExecutor(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'joblib', 'dask', 'distributed', 'ray', "
            "'numpy', 'loky'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def _dies() -> Any:
    """A task that kills its own worker process (made here so that it pickles by value)."""

    def die() -> None:
        import os
        import signal

        os.kill(os.getpid(), signal.SIGKILL)

    return die


@pytest.mark.slow
def test_a_task_whose_loky_worker_dies_is_lost_in_one_line_and_the_pool_recovers() -> None:
    with LokyExecutor(2) as executor:
        lost = executor.submit(_dies(), key="dies")
        error = lost.exception(timeout=60)
        assert isinstance(error, TaskLost) and type(error.__cause__).__name__ == "TerminatedWorkerError", repr(error)
        assert str(error).startswith("task dies was lost on 2 local worker processes (loky) (TerminatedWorkerError")
        assert "\n" not in str(error)
        assert executor.submit(os.getpid).result(timeout=60) != os.getpid()  # a fresh pool takes the next task


def test_dask_killed_worker_and_unfetchable_results_are_lost_tasks() -> None:
    """dask's ``KilledWorker`` (the task's workers died ``allowed-failures`` + 1 times) and a result that cannot
    be fetched are :class:`TaskLost`, naming the scheduler; a task's own error stays its own."""
    pytest.importorskip("distributed", reason="dask[distributed] is not installed")
    from distributed.scheduler import KilledWorker

    from specstore.common.executors.dask_cluster import _settle

    where = "the dask scheduler at tcp://10.0.0.1:8786"
    last_worker: Any = SimpleNamespace(address="tcp://10.0.0.2:4000")  # all that KilledWorker reads of it
    killed = KilledWorker("run_task-k", last_worker, 3)
    native = SimpleNamespace(status="error", exception=lambda: killed)
    _settle(future := TaskFuture("run_task-k"), where, native)
    error = future.exception()
    assert isinstance(error, TaskLost) and error.__cause__ is killed and error.key == "run_task-k"
    assert str(error).startswith(f"task run_task-k was lost on {where} (KilledWorker: Attempted to run task")

    def unreachable() -> None:
        raise OSError("connection closed")

    _settle(future := TaskFuture("run_task-u"), where, SimpleNamespace(status="finished", result=unreachable))
    assert str(future.exception()) == f"task run_task-u was lost on {where} (OSError: connection closed)"
    own = ValueError("bad input")
    _settle(future := TaskFuture("run_task-v"), where, SimpleNamespace(status="error", exception=lambda: own))
    assert future.exception() is own


def test_ray_lost_workers_are_lost_tasks() -> None:
    pytest.importorskip("ray", reason="ray is not installed")
    from ray.exceptions import NodeDiedError, RayTaskError, TaskCancelledError, WorkerCrashedError

    from specstore.common.executors.ray_cluster import _task_error

    def where() -> str:
        return "the ray cluster at 10.0.0.1:6379 (4 runs)"

    crashed = WorkerCrashedError()
    error = _task_error("run_task-c", where, crashed)
    assert isinstance(error, TaskLost) and error.__cause__ is crashed
    assert str(error) == ("task run_task-c was lost on the ray cluster at 10.0.0.1:6379 (4 runs) "
                          "(WorkerCrashedError: The worker died unexpectedly while executing this task. "
                          "Check python-core-worker-*.log files for more information.)")
    assert isinstance(_task_error("run_task-n", where, NodeDiedError("node gone")), TaskLost)
    cancelled = TaskCancelledError()
    assert _task_error("run_task-x", where, cancelled) is cancelled
    own = ValueError("bad input")
    wrapped = RayTaskError("run_task", "Traceback ...", own)
    assert _task_error("run_task-v", where, wrapped) is own
