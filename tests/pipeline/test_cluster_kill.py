"""Extraction outlives a lost worker on ray and dask, and never waits silently on a cluster without workers.

A worker process is killed (SIGKILL) while it holds a running task: the cluster
runs that task again elsewhere, the run ends without an error, and the store is
the store of a run nobody disturbed.  To make the kill land on a running task,
every task of those runs passes a gate first (:func:`task_gate.gated`): it leaves a
marker naming its key and its process, and waits for a release file; the test
kills the process of the first marker, then releases the gate.

A run whose cluster has no live workers warns, naming the scheduler, and
``max_idle`` stops it after committing what has finished: shown on a fake
cluster that never runs its tasks (fast, exact), and on a real dask cluster
whose only worker is closed mid-run.
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from factories import SMALL_SPECS as SMALL
from factories import assert_same_content, make_corpus, store_content
from task_gate import GatedDask, GatedRay, Killer, await_value, local_ray, started

from specstore.common.errors import ConfigError
from specstore.common.executors import Executor, RayExecutor, TaskFuture, TaskLost
from specstore.pipeline.cli import build_parser
from specstore.pipeline.extract import ExtractError, ExtractOptions, extract
from specstore.pipeline.extract_run import IdleWatch
from specstore.store import open_store, validate

N_FILES = 4


# -- the gate: tasks that say where they run and wait to be let go -----------------------------------------

def _dies() -> Callable[[], None]:
    """A task that kills its own worker process (made here so that it pickles by value)."""

    def die() -> None:

        os.kill(os.getpid(), signal.SIGKILL)

    return die


# -- killed workers ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    c = tmp_path_factory.mktemp("kill") / "c"
    make_corpus(c, n=N_FILES, seconds=1.0, step=0.2)
    return c


@pytest.fixture(scope="module")
def undisturbed(corpus: Path) -> dict[str, tuple[Any, ...]]:
    """The store of a run nobody disturbed (in this process: its content is every backend's)."""
    ref = corpus.parent / "undisturbed.zarr"
    summary = extract(corpus, str(ref), specs=SMALL, jobs=1, progress=False)
    assert not summary.errors and summary.decoded == N_FILES, summary.errors
    return store_content(ref)


def _kill_one_worker_mid_run(executor: Executor, corpus: Path, target: Path, gate: Path) -> Killer:
    """Extract on ``executor`` (gated under ``gate``) while a :class:`Killer` kills the worker of the first
    task; the run must end without an error.  The killer comes back for the checks."""
    killer = Killer(gate)
    killer.start()
    summary = extract(corpus, str(target), specs=SMALL, executor=executor, jobs=2, progress=False, commit_seconds=0.0)
    killer.join(30)
    assert killer.error is None, repr(killer.error)
    assert not summary.errors and summary.decoded == N_FILES, summary.errors
    assert killer.victim is not None
    key, pid = killer.victim
    reruns = [p for k, p in started(gate) if k == key and p != pid]
    assert reruns, f"task {key} was not run again after its worker {pid} was killed: {started(gate)}"
    return killer


@pytest.mark.slow
def test_ray_survives_a_killed_worker(corpus: Path, undisturbed: dict, tmp_path: Path) -> None:
    """A ray worker killed while it runs a task: ray runs the task again (``max_retries``), the store is whole."""
    with local_ray():
        executor = GatedRay()
        executor.folder = tmp_path / "gate"
        executor.folder.mkdir()
        _kill_one_worker_mid_run(executor, corpus, tmp_path / "ray.zarr", executor.folder)
        assert executor.live_workers() == 2
        # a task whose worker dies (and no rerun is left) is lost for good: one line
        error = RayExecutor(lost_worker_retries=0).submit(_dies(), key="dies").exception(timeout=60)
        assert isinstance(error, TaskLost), repr(error)
        assert str(error).startswith("task dies was lost on the ray cluster at ") and "(1 run)" in str(error)
    assert_same_content(store_content(tmp_path / "ray.zarr"), undisturbed)
    assert validate(str(tmp_path / "ray.zarr")) == []
    # the class numbers too: labels are numbered by name, not by the order the redone task committed in
    assert open_store(tmp_path / "ray.zarr").label_names == open_store(corpus.parent / "undisturbed.zarr").label_names


@pytest.fixture()
def dask_cluster() -> Iterator[Any]:
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0") as c:
        yield c


@pytest.mark.slow
def test_dask_survives_a_killed_worker(corpus: Path, undisturbed: dict, dask_cluster: Any, tmp_path: Path) -> None:
    """A dask worker process killed while it runs a task: its nanny starts another, the scheduler runs the task
    again, the store is whole."""
    distributed = pytest.importorskip("dask.distributed")
    with distributed.Client(dask_cluster) as client:
        executor = GatedDask(client)
        executor.folder = tmp_path / "gate"
        executor.folder.mkdir()
        _kill_one_worker_mid_run(executor, corpus, tmp_path / "dask.zarr", executor.folder)
    assert_same_content(store_content(tmp_path / "dask.zarr"), undisturbed)
    assert validate(str(tmp_path / "dask.zarr")) == []
    # the class numbers too: labels are numbered by name, not by the order the redone task committed in
    assert open_store(tmp_path / "dask.zarr").label_names == open_store(corpus.parent / "undisturbed.zarr").label_names


# -- an empty cluster -------------------------------------------------------------------------------------

SCHEDULER = "tcp://stalled.example:8786"


class StalledCluster(Executor):
    """A cluster with no live workers that runs no task until :meth:`release`, except the first ``finish`` ones
    (run at once, in this process, as if they had finished before the workers left); with ``lose``, the next
    task is lost for good (:class:`TaskLost`)."""

    in_process = True

    def __init__(self, finish: int = 0, lose: bool = False) -> None:
        self.finish, self.lose = finish, lose
        self.futures: list[TaskFuture] = []
        self.held: list[tuple[TaskFuture, Callable[[], Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, key: str | None = None, retries: int = 0,
               **kwargs: Any) -> TaskFuture:
        future = TaskFuture(key or f"task-{len(self.futures)}")
        if len(self.futures) < self.finish:
            future.set_result(fn(*args, **kwargs))
        elif self.lose and len(self.futures) == self.finish:
            future.set_exception(TaskLost(future.key, self.describe(), OSError("worker went away")))
        else:
            self.held.append((future, lambda: fn(*args, **kwargs)))
        self.futures.append(future)
        return future

    def release(self) -> None:
        """Run the held tasks now (in the calling thread), as a cluster whose workers came back would."""
        for future, call in self.held:
            future.finish(call())

    def live_workers(self) -> int:
        return 0

    @property
    def address(self) -> str | None:
        return SCHEDULER

    def describe(self) -> str:
        return f"the dask scheduler at {SCHEDULER}"


def _idle_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
            and r.getMessage().startswith("no live workers on ")]


def test_an_empty_cluster_is_named_in_warnings_and_max_idle_stops_the_run(
        corpus: Path, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """Warnings name the scheduler while no worker is up; ``max_idle`` stops the run with one line naming it and
    the wait, after committing the tasks that had finished."""
    executor = StalledCluster(finish=2)
    target = tmp_path / "s.zarr"
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="specstore.pipeline.extract"), \
            pytest.raises(ExtractError) as err:
        extract(corpus, str(target), specs=SMALL, executor=executor, jobs=2, progress=False,
                idle_warn_seconds=0.05, idle_warn_every=0.1, max_idle=0.4)
    assert time.monotonic() - t0 < 20
    message = str(err.value)
    assert "\n" not in message
    assert re.fullmatch(rf"no live workers on the dask scheduler at {SCHEDULER} for 0\.[4-9] s \(--max-idle 0\.4\): "
                        rf"2 of {len(executor.futures)} tasks finished and are committed \(\d+ clips in the store\); "
                        "start workers and rerun to resume", message), message
    warnings = _idle_warnings(caplog)
    assert 2 <= len(warnings) <= 5, warnings  # after 0.05 s, then every 0.1 s until 0.4 s
    assert all(SCHEDULER in w for w in warnings), warnings
    assert all(f.cancelled() for f in executor.futures[2:])
    finished = [f.result() for f in executor.futures[:2]]
    store = open_store(target)
    assert len(store.paths) == sum(len(r.decoded) for r in finished) > 0


def test_a_task_lost_for_good_stops_the_run_in_one_line_after_committing_what_finished(corpus: Path,
                                                                                       tmp_path: Path) -> None:
    executor = StalledCluster(finish=2, lose=True)
    target = tmp_path / "s.zarr"
    with pytest.raises(ExtractError) as err:
        extract(corpus, str(target), specs=SMALL, executor=executor, jobs=2, progress=False, commit_seconds=60.0)
    lost = executor.futures[2].key
    message = str(err.value)
    assert message.startswith(f"task {lost} was lost on the dask scheduler at {SCHEDULER} (OSError: worker went "
                              f"away): 2 of {len(executor.futures)} tasks finished and are committed ("), message
    assert message.endswith("clips in the store); rerun to resume") and "\n" not in message
    assert all(f.cancelled() for f in executor.futures[3:])
    finished = [f.result() for f in executor.futures[:2]]
    assert len(open_store(target).paths) == sum(len(r.decoded) for r in finished) > 0


def test_without_max_idle_an_empty_cluster_only_warns(corpus: Path, caplog: pytest.LogCaptureFixture,
                                                      tmp_path: Path) -> None:
    """No ``max_idle``: the run warns and waits on, and ends as usual once the tasks run."""
    executor = StalledCluster()
    outcome: cf.Future[Any] = cf.Future()

    def run() -> None:
        try:
            outcome.set_result(extract(corpus, str(tmp_path / "s.zarr"), specs=SMALL, executor=executor, jobs=2,
                                       progress=False, idle_warn_seconds=0.05, idle_warn_every=0.05))
        except BaseException as e:
            outcome.set_exception(e)

    with caplog.at_level(logging.WARNING, logger="specstore.pipeline.extract"):
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        await_value(lambda: len(_idle_warnings(caplog)) >= 3, 20, "three warnings")
        assert not outcome.done()
        executor.release()
        summary = outcome.result(timeout=60)
    assert summary.decoded == N_FILES and not summary.errors


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Workers(StalledCluster):
    def __init__(self) -> None:
        super().__init__()
        self.live = 0

    def live_workers(self) -> int:
        return self.live


def test_the_idle_watch_warns_at_its_intervals_and_forgets_an_outage_that_ends(
        caplog: pytest.LogCaptureFixture) -> None:
    clock, executor = _Clock(), _Workers()
    watch = IdleWatch(executor, 30.0, 60.0, None, clock=clock)
    assert watch.poll_seconds == 5.0
    times = []
    with caplog.at_level(logging.WARNING, logger="specstore.pipeline.extract"):
        for t in range(0, 200):
            clock.now = 1000.0 + t
            before = len(caplog.records)
            assert watch.check(3) is None
            if len(caplog.records) > before:
                times.append(t)
        assert times == [30, 90, 150]
        assert "no live workers on the dask scheduler at tcp://stalled.example:8786 for 30 s: 3 tasks wait" \
            in caplog.records[0].getMessage()
        executor.live = 2
        assert watch.check(3) is None
        assert caplog.records[-1].getMessage().endswith("has live workers again; the run goes on")
    executor.live = 0
    clock.now += 29
    assert watch.check(1) is None  # a new outage: its own 30 s
    watch.progress()  # a task finished: the cluster works
    clock.now += 29
    assert watch.check(1) is None and watch.idle_since == clock.now
    bounded = IdleWatch(executor, 30.0, 60.0, 10.0, clock=clock)
    assert bounded.poll_seconds == 2.5
    assert bounded.check(4) is None
    clock.now += 10
    assert bounded.check(4) == f"no live workers on the dask scheduler at {SCHEDULER} for 10.0 s (--max-idle 10)"


def test_max_idle_is_bounded_and_offered_on_the_command_line() -> None:
    assert ExtractOptions().max_idle is None
    assert ExtractOptions(max_idle=600).max_idle == 600
    for bad in (0, -1, float("nan"), float("inf"), 1e30):
        with pytest.raises(ConfigError, match="max_idle"):
            ExtractOptions(max_idle=bad)
    with pytest.raises(ConfigError, match="idle_warn_seconds"):
        ExtractOptions(idle_warn_seconds=0)
    text = " ".join(build_parser().format_help().split())
    assert "--max-idle SECONDS stop the run when its cluster has had no live workers" in text
    assert "(default: wait for ever)" in text


@pytest.mark.slow
def test_a_dask_cluster_whose_workers_are_all_closed_is_named_and_max_idle_ends_the_wait(
        corpus: Path, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """Every worker of a real local cluster closed mid-run: warnings name its scheduler, ``max_idle`` ends the
    run in one line naming it."""
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    with distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=1, dashboard_address=":0") as c, \
            distributed.Client(c) as client:
        executor = GatedDask(client)
        executor.folder = tmp_path / "gate"
        executor.folder.mkdir()
        address = c.scheduler_address

        def close_workers(pid: int) -> None:
            c.scale(0)
            await_value(lambda: not client.nthreads(), 30, "the workers to close")

        killer = Killer(executor.folder, close_workers, release=False)
        killer.start()
        with caplog.at_level(logging.WARNING, logger="specstore.pipeline.extract"), \
                pytest.raises(ExtractError) as err:
            extract(corpus, str(tmp_path / "s.zarr"), specs=SMALL, executor=executor, jobs=2, progress=False,
                    idle_warn_seconds=0.2, idle_warn_every=0.3, max_idle=1.2)
        killer.join(30)
        assert killer.error is None, repr(killer.error)
    assert str(err.value).startswith(f"no live workers on the dask scheduler at {address}"), str(err.value)
    assert "(--max-idle 1.2)" in str(err.value)
    warnings = _idle_warnings(caplog)
    assert warnings and all(address in w for w in warnings), caplog.text
