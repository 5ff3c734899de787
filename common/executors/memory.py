"""How much memory the process running a task may use: the tightest limit it can see, or None.

A worker that plans its own batches on a CPU (cluster inference, :mod:`specstore.infer.engine.distributed`)
sizes them from ``BUDGET_MB`` when the user gave one, else from this process's own limit, so that a dask worker
started with ``--memory-limit 4GiB`` or a container with a 4 GiB cgroup does not plan batches for the default
budget and get killed.  The limits looked at, smallest wins:

* a dask worker's ``memory_limit`` (the figure at which dask pauses and restarts it);
* the memory a ray task was given (``memory=`` in its resources), when it was given any;
* the process's cgroup limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``): a Kubernetes pod, a SLURM job
  with cgroups, ``docker run --memory``.

(``ulimit -v`` bounds address space, not memory: torch maps far more than it touches, so it is not used.)

Standard library only: dask and ray are looked up in ``sys.modules`` (a worker of theirs has imported them; no
other process needs them imported).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

__all__ = ["NO_LIMIT_BYTES", "memory_limit"]

log = logging.getLogger(__name__)

NO_LIMIT_BYTES = 1 << 60
"""Figures at or above this many bytes mean "no limit" (cgroup v1 writes 2**63 rounded to pages for none)."""

_CGROUP_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))


def _dask_limit() -> int | None:
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        worker = distributed.get_worker()
    except (ValueError, AttributeError):  # not in a dask worker
        return None
    limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    return int(limit) if limit else None


def _ray_limit() -> int | None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    try:
        memory = ray.get_runtime_context().get_assigned_resources().get("memory")
    except Exception:  # noqa: BLE001 - not in a ray task, or a ray without the call: no figure
        log.debug("asking ray for this task's memory failed", exc_info=True)
        return None
    return int(memory) if memory else None


def _cgroup_limit(files: tuple[Path, ...] = _CGROUP_FILES) -> int | None:
    for path in files:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < NO_LIMIT_BYTES:
            return int(text)
        return None  # "max", or a figure meaning none: this cgroup version sets no limit
    return None


def memory_limit() -> tuple[int, str] | None:
    """``(bytes, where the figure comes from)`` for the tightest memory limit this process is under, or None
    when it is under none of those the module docstring lists."""
    found = [(limit, name) for name, get in (("the dask worker's memory limit", _dask_limit),
                                             ("the ray task's memory", _ray_limit),
                                             ("the cgroup memory limit", _cgroup_limit))
             if (limit := get()) is not None]
    return min(found) if found else None
