"""The executor seam's contract (:class:`specstore.common.executors.Executor`), checked on any executor.

``tests/common/test_executors.py`` runs it on this machine's executors, ``tests/pipeline/test_distributed.py`` on a
local dask cluster and a local ray.  The tasks are made inside functions, so cloudpickle sends them by value:
a ray worker, which does not see the tests folder, runs them as well as a loky or dask worker.  Tasks
leave marks in files (workers are other processes), under a folder every worker of a local cluster sees.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specstore.common.executors import Executor, task_key


def _tasks() -> dict[str, Callable[..., Any]]:
    """The contract's tasks, made here so that they pickle by value."""

    def counted(folder: str, name: str, seconds: float = 0.0) -> str:
        """Sleeps ``seconds`` and leaves one mark per run in ``folder``: runs are counted by the marks."""
        import os
        import time
        import uuid

        time.sleep(seconds)
        with open(os.path.join(folder, f"{name}.{uuid.uuid4().hex}"), "w"):
            pass
        return name

    def fails_once(folder: str, name: str) -> str:
        """Raises on its first run (no mark yet), returns ``name`` on the next."""
        import os

        mark = os.path.join(folder, f"{name}.failed")
        if not os.path.exists(mark):
            with open(mark, "w"):
                pass
            raise RuntimeError(f"{name}: the first run fails")
        return name

    def fails_always(name: str) -> str:
        raise ValueError(f"{name}: bad input")

    return {"counted": counted, "fails_once": fails_once, "fails_always": fails_always}


def runs(folder: Path, name: str) -> int:
    """How often task ``name`` ran (its marks in ``folder``)."""
    return sum(1 for p in folder.iterdir() if p.name.split(".")[0] == name and not p.name.endswith(".failed"))


def check_contract(executor: Executor, folder: Path, *, workers: int, address: str | None = None) -> None:
    """Keys recognised on resubmission, retries of a task that fails once, results as they complete (in any
    order: the slowest submitted first), a task's own error, the live workers, where it runs."""
    tasks = _tasks()
    folder.mkdir(parents=True, exist_ok=True)
    where = str(folder)

    # results as they complete, whatever their order: the first submitted is the slowest
    names = [f"t{i}" for i in range(4)]
    futures = [executor.submit(tasks["counted"], where, name, 1.5 if i == 0 else 0.0, key=task_key("counted", name))
               for i, name in enumerate(names)]
    # the same key again while its future is held: that future, and the task does not run twice
    again = executor.submit(tasks["counted"], where, "t0", 1.5, key=task_key("counted", "t0"))
    assert again is futures[0]
    done = [f.result() for f in executor.as_completed(futures, timeout=120)]
    assert sorted(done) == names
    if workers > 1:
        assert done[0] != "t0", done  # the slow one is not first: results come as they finish, not as submitted
    assert {f.key for f in futures} == {task_key("counted", n) for n in names}
    assert executor.submit(tasks["counted"], where, "t1", key=task_key("counted", "t1")) is futures[1]
    assert [runs(folder, n) for n in names] == [1, 1, 1, 1]

    # retries: a task that fails once succeeds on its retry; without one, its error is the task's own
    retried = executor.submit(tasks["fails_once"], where, "r1", key=task_key("fails_once", "r1"), retries=1)
    assert retried.result(timeout=120) == "r1"
    plain = executor.submit(tasks["fails_once"], where, "r2", key=task_key("fails_once", "r2"))
    error = plain.exception(timeout=120)
    assert isinstance(error, RuntimeError) and str(error) == "r2: the first run fails", repr(error)
    # a key whose task failed is run again when submitted again
    assert executor.submit(tasks["fails_once"], where, "r2", key=task_key("fails_once", "r2")).result(120) == "r2"
    bad = executor.submit(tasks["fails_always"], "v", retries=2)
    assert isinstance(bad.exception(timeout=120), ValueError) and bad.key.startswith("fails_always-")

    # the live workers and where it runs
    deadline = time.monotonic() + 30
    while executor.live_workers() < workers and time.monotonic() < deadline:
        time.sleep(0.2)
    assert executor.live_workers() == workers
    assert executor.address == address
    assert (address or "") in executor.describe()
