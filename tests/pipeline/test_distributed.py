"""Extraction on a dask cluster (and on ray when installed) gives exactly the store a loky run gives, and both
keep the executor seam's contract (:mod:`executor_contract`).

Workers write whole shards straight into the store; the driver commits.  The
clusters here are local, but the workers are separate processes that reach
the store only by its path, as remote workers on a shared filesystem would.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from executor_contract import check_contract
from factories import SMALL_SPECS as SMALL
from factories import assert_same_content, make_corpus, store_content

from specstore.common.executors import DaskExecutor, RayExecutor
from specstore.pipeline.extract import ExtractError, extract
from specstore.store import open_store, validate

pytestmark = pytest.mark.slow

N_FILES = 8


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    c = tmp_path_factory.mktemp("distributed") / "c"
    make_corpus(c, n=N_FILES, seconds=1.5, step=0.31)
    return c


@pytest.fixture(scope="module")
def loky_content(corpus: Path) -> dict[str, tuple]:
    """The store a plain loky run on two workers produces."""
    ref = corpus.parent / "loky.zarr"
    summary = extract(corpus, str(ref), specs=SMALL, jobs=2, progress=False)
    assert not summary.errors, summary.errors
    assert summary.decoded == N_FILES
    return store_content(ref)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """Two single-threaded worker processes, like two machines with one core each."""
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed "
                                                                 "(pip install 'specstore[dask]')")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                  dashboard_address=None) as c:
        yield c


def test_dask_cluster_extraction_equals_loky(corpus: Path, loky_content: dict, cluster: Any, tmp_path: Path) -> None:
    target = tmp_path / "dask.zarr"
    summary = extract(corpus, str(target), specs=SMALL, backend="dask", scheduler=cluster.scheduler_address,
                      progress=False, commit_seconds=0.0)
    assert not summary.errors, summary.errors
    assert summary.decoded == N_FILES and summary.indexed == N_FILES
    # paths, hashes, labels, lengths, durations and every feature byte
    assert_same_content(store_content(target), loky_content)
    assert validate(str(target), deep=True) == []
    # the tasks ran on the cluster's workers, and results were committed as they came back, not all at the end
    assert any("run_task" in prefix for prefix in cluster.scheduler.task_prefixes)
    assert open_store(target).generation > 1
    rerun = extract(corpus, str(target), specs=SMALL, backend="dask", scheduler=cluster.scheduler_address,
                    progress=False)
    assert rerun.decoded == 0 and rerun.unchanged == N_FILES


def test_dask_executor_keeps_the_contract(cluster: Any, tmp_path: Path) -> None:
    with DaskExecutor.connect(cluster.scheduler_address, 2) as executor:
        check_contract(executor, tmp_path / "marks", workers=2, address=cluster.scheduler_address)
        assert executor.describe().startswith(f"the dask scheduler at {cluster.scheduler_address}")
    assert cluster.scheduler.workers  # a client of our own left the cluster running


def test_dask_extraction_on_an_executor_of_the_callers(corpus: Path, loky_content: dict, cluster: Any,
                                                       tmp_path: Path) -> None:
    """``extract(..., executor=...)`` runs on the caller's executor and leaves it open."""
    distributed = pytest.importorskip("dask.distributed")
    with distributed.Client(cluster.scheduler_address) as client:
        executor = DaskExecutor(client)
        extract(corpus, str(tmp_path / "own.zarr"), specs=SMALL, executor=executor, progress=False)
        assert executor.live_workers() == 2 and client.status == "running"
    assert_same_content(store_content(tmp_path / "own.zarr"), loky_content)


def test_dask_cluster_into_a_zstd_file_url(corpus: Path, loky_content: dict, cluster: Any, tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'dask-zstd.zarr'}"
    extract(corpus, url, specs=SMALL, layout="zstd", backend="dask", scheduler=cluster.scheduler_address,
            progress=False)
    assert open_store(url).layout == "zstd"
    assert_same_content(store_content(url), loky_content)


def test_dask_without_a_scheduler_runs_a_local_cluster_for_the_run(corpus: Path, loky_content: dict,
                                                                   tmp_path: Path) -> None:
    pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    target = tmp_path / "local-dask.zarr"
    extract(corpus, str(target), specs=SMALL, backend="dask", jobs=2, progress=False)
    assert_same_content(store_content(target), loky_content)


def test_dask_workers_cannot_write_a_memory_url(corpus: Path, cluster: Any) -> None:
    with pytest.raises(ExtractError, match="worker processes cannot write"):
        extract(corpus, "memory://specstore-dask-refused/s.zarr", specs=SMALL, layout="zstd", backend="dask",
                scheduler=cluster.scheduler_address, progress=False)


def test_unreachable_dask_scheduler_is_a_one_line_error(corpus: Path, tmp_path: Path) -> None:
    dask = pytest.importorskip("dask", reason="dask is not installed")
    pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(ExtractError, match="cannot reach the dask scheduler at tcp://127.0.0.1:9") as err:
            extract(corpus, str(tmp_path / "s.zarr"), specs=SMALL, backend="dask", scheduler="tcp://127.0.0.1:9",
                    progress=False)
    assert "\n" not in str(err.value)


def test_ray_keeps_the_contract_and_extracts_as_loky(corpus: Path, loky_content: dict, tmp_path: Path) -> None:
    """One local ray (started by the executor, stopped when it closes): the seam's contract, then extraction
    through ``backend="ray"``, which finds ray running (and leaves it so), and its store is loky's."""
    ray = pytest.importorskip("ray", reason="ray is not installed (optional: pip install ray)")
    assert not ray.is_initialized()
    with RayExecutor.connect(None, 2) as executor:
        address = ray.get_runtime_context().gcs_address
        assert executor.describe() == f"a local ray of 2 CPUs ({address})"
        check_contract(executor, tmp_path / "marks", workers=2, address=address)
        target = tmp_path / "ray.zarr"
        summary = extract(corpus, str(target), specs=SMALL, backend="ray", jobs=2, progress=False,
                          commit_seconds=0.0)
        assert ray.is_initialized()
    assert not ray.is_initialized()
    assert not summary.errors, summary.errors
    assert summary.decoded == N_FILES
    assert_same_content(store_content(target), loky_content)
    assert validate(str(target)) == []
