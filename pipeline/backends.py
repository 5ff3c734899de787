"""The joblib backends extraction runs on: loky, threading, multiprocessing, dask (local or a scheduler), ray."""

from __future__ import annotations

import logging
import os
from contextlib import ExitStack
from typing import Any

from joblib import parallel_config

from .extract_report import ExtractError

__all__ = ["BACKENDS", "joblib_backend"]

log = logging.getLogger("specstore.pipeline.extract")

BACKENDS = ("loky", "threading", "multiprocessing", "dask", "ray")


def joblib_backend(backend: str, scheduler: str | None, n_jobs: int, stack: ExitStack) -> Any:
    """The joblib ``parallel_config`` for ``backend`` (connecting to or starting dask or ray when asked)."""
    if backend == "dask":
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise ExtractError("BACKEND=dask needs dask.distributed: pip install 'specstore[dask]'") from None
        if scheduler:
            try:
                client = stack.enter_context(Client(scheduler))
            except (OSError, ValueError) as e:
                raise ExtractError(f"cannot reach the dask scheduler at {scheduler}: {e}".splitlines()[0]) from None
        else:
            cluster = stack.enter_context(LocalCluster(n_workers=n_jobs, threads_per_worker=1, processes=True))
            client = stack.enter_context(Client(cluster))
        log.info("dask backend on %s", client.dashboard_link or scheduler)
        return parallel_config(backend="dask", n_jobs=-1)
    if backend == "ray":
        try:
            import ray
            from ray.util.joblib import register_ray
        except ImportError:
            raise ExtractError("BACKEND=ray needs ray: pip install ray") from None
        # SCHEDULER (or RAY_ADDRESS) names a running cluster ("auto", "ray://head:10001");
        # without one, a local ray of n_jobs CPUs lives for this run.
        address = scheduler or os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            options: dict[str, Any] = {"address": address} if address else {"num_cpus": n_jobs}
            try:
                ray.init(**options)
            except (ConnectionError, OSError, ValueError) as e:
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise ExtractError(f"cannot start or reach ray ({address or 'local'}): {reason}") from None
            stack.callback(ray.shutdown)
        register_ray()
        return parallel_config(backend="ray", n_jobs=-1 if address else n_jobs)
    if backend not in ("loky", "threading", "multiprocessing"):
        raise ExtractError(f"unknown backend {backend!r}; choose loky, threading, multiprocessing, dask or ray")
    extra = {"inner_max_num_threads": 1} if backend == "loky" else {}
    return parallel_config(backend=backend, n_jobs=n_jobs, **extra)
