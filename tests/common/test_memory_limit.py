"""A worker's own memory limit: dask's ``memory_limit``, a cgroup's, the tightest of them, or None."""

from __future__ import annotations

from pathlib import Path

import pytest

from specstore.common.executors import memory
from specstore.common.executors.memory import NO_LIMIT_BYTES, memory_limit


@pytest.mark.parametrize(("v2", "v1", "expected"), [
    ("1073741824\n", None, 1 << 30),  # cgroup v2 with a limit
    ("max\n", "4096", None),  # v2 without one: v1's file is not looked at
    (None, "2147483648", 2 << 30),  # v1 with a limit
    (None, str(NO_LIMIT_BYTES * 8), None),  # v1's figure for none
    (None, None, None),  # no cgroup files
])
def test_the_cgroup_limit_is_read_from_whichever_version_is_mounted(tmp_path: Path, v2: str | None, v1: str | None,
                                                                    expected: int | None) -> None:
    files = (tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes")
    for path, text in zip(files, (v2, v1), strict=True):
        if text is not None:
            path.write_text(text)
    assert memory._cgroup_limit(files) == expected


def test_the_tightest_limit_wins_and_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "_dask_limit", lambda: 3 << 30)
    monkeypatch.setattr(memory, "_ray_limit", lambda: None)
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: 2 << 30)
    assert memory_limit() == (2 << 30, "the cgroup memory limit")
    monkeypatch.setattr(memory, "_cgroup_limit", lambda: None)
    assert memory_limit() == (3 << 30, "the dask worker's memory limit")
    monkeypatch.setattr(memory, "_dask_limit", lambda: None)
    assert memory_limit() is None


@pytest.mark.slow
def test_a_dask_worker_sees_its_memory_limit() -> None:
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    with distributed.LocalCluster(n_workers=1, processes=True, threads_per_worker=1, memory_limit="700MiB",
                                  dashboard_address=":0") as cluster, distributed.Client(cluster) as client:
        limit = client.submit(memory_limit, pure=False).result(timeout=60)
    assert limit is not None
    cgroup = memory._cgroup_limit()
    assert limit == ((700 << 20, "the dask worker's memory limit") if cgroup is None or cgroup > 700 << 20
                     else (cgroup, "the cgroup memory limit"))
    assert memory._dask_limit() is None  # this process is no dask worker
