"""A gate for cluster tests: each task leaves ``started.<key>.<pid>`` in a folder and waits for ``release``.

A test then knows which process runs which task, can kill one of them deterministically, and lets the
tasks go on (tests/pipeline/test_cluster_kill.py, tests/infer/test_predict_cluster.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

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
