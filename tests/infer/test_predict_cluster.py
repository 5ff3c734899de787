"""``predict`` on a cluster: units on an executor's workers, one driver that journals, the same CSV.

The store holds duplicate contents and a clip too long for any batch (it runs in windows, in a unit of its
own).  Every run's CSV must be byte-identical to the one-process run's: on threads, loky, a local dask
cluster of two single-thread workers and a local ray of two CPUs; with a worker killed mid-run (dask and
ray run its unit again; the unit is committed once); after the driver is stopped following its second
journal commit (the rerun computes exactly the missing units); with a duplicate result delivered (dropped
and counted).  A journal of another run is refused in one line, and accepted with ``restart``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from executor_doubles import Counting, Duplicating, StopsAfter
from factories import LABELS, SPEC16, budget_mb_holding, make_checkpoint, make_store
from task_gate import GatedDask, GatedRay, Killer, local_ray, started

from specstore.common.errors import ConfigError
from specstore.common.executors import InlineExecutor, RayExecutor, TaskFuture, ThreadExecutor
from specstore.infer.cli import build_parser
from specstore.infer.engine.distributed import UnitJob, file_digest, journal_folder, run_unit
from specstore.infer.engine.predict import ClusterStats, predict
from specstore.infer.engine.runtime import RunOptions
from specstore.infer.engine.units import cut_units, unit_key
from specstore.infer.errors import CheckpointError, PredictionsError
from specstore.infer.options.cluster_options import ClusterOptions
from specstore.store import IndexRow, create_store, open_store

LENGTHS = [30, 45, 60, 75, 90, 110, 130, 150, 40, 6000]
"""Frames per clip; the last is too long for any batch under the run's budget (1000 frames of one clip)."""
UNIT_FRAMES = 240
"""Small units, so a run of ten clips has several."""


class Case:
    """The shared store (duplicates, one over-long clip), two models, the run options and the reference CSVs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = make_store(root / "s.zarr", lengths=LENGTHS)
        w = create_store(self.store, {"mel": SPEC16})
        w.commit(rows=[IndexRow("copies/a.wav", "h1", None), IndexRow("copies/b.wav", "h4", "rock"),
                       IndexRow("copies/c.wav", "h1", None)])
        self.model = make_checkpoint(root / "m.pt", time_kernel=1)
        self.other = make_checkpoint(root / "other.pt", time_kernel=1, seed=1)
        self.options = RunOptions(device="cpu", budget_mb=budget_mb_holding(self.model, 1000), progress=False)
        self.reference = self.csv(root / "ref.csv")
        self.other_reference = self.csv(root / "other-ref.csv", self.other)

    def csv(self, out: Path, model: Path | None = None, **cluster: Any) -> bytes:
        """The CSV of a run of ``model`` (default: the first) writing ``out``: one process without
        ``cluster`` keywords, else on a cluster (``executor`` and the :class:`ClusterOptions`)."""
        executor = cluster.pop("executor", None)
        options = ClusterOptions(**{"unit_frames": UNIT_FRAMES, "commit_seconds": 0.0, **cluster}) \
            if cluster or executor is not None else None
        self.last = predict(str(self.store), str(model or self.model), out, options=self.options, topk=3,
                            executor=executor, cluster=options)
        return out.read_bytes()

    def units(self) -> int:
        s = open_store(self.store)
        return len(cut_units(s.lengths, s.hashes, unit_frames=UNIT_FRAMES, long_frames=1000))


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    return Case(tmp_path_factory.mktemp("cluster"))


def _cluster_stats(case: Case) -> ClusterStats:
    stats = case.last.stats
    assert isinstance(stats, ClusterStats)
    return stats


def _check_whole(case: Case, out: Path, csv: bytes, resumed: int = 0) -> ClusterStats:
    """The CSV is the reference, the journal is gone, every unit committed once."""
    assert csv == case.reference
    assert not journal_folder(out).exists()  # type: ignore[union-attr]
    stats = _cluster_stats(case)
    assert stats.units == case.units() and stats.computed + stats.resumed == stats.units
    assert stats.resumed == resumed
    if not resumed:  # the over-long clip ran in windows, on a worker (resumed, it may have run before)
        assert stats.windowed == 1
    assert stats.distinct == len(set(open_store(case.store).hashes)) and stats.clips == len(LENGTHS) + 3
    return stats


# -- units ------------------------------------------------------------------------------------------------

def test_units_are_distinct_contents_sorted_by_length_within_the_frame_budget() -> None:
    lengths = np.array([50, 10, 30, 10, 400, 20, 30, 5000])
    hashes = ["a", "b", "c", "b", "d", "e", "c", "f"]
    units = cut_units(lengths, hashes, unit_frames=60, long_frames=1000)
    assert [u.rows for u in units] == [(1, 5), (2,), (0,), (4,), (7,)]
    assert [u.windowed for u in units] == [False, False, False, False, True]
    assert all(len(u.rows) * max(lengths[list(u.rows)]) <= 60 or len(u.rows) == 1 for u in units)
    assert units[0].hashes == ("b", "e") and units[0].key == unit_key(("b", "e")) and units[0].frames == 30
    assert cut_units(lengths, hashes, unit_frames=60, long_frames=1000) == units  # deterministic
    assert [u.rows for u in cut_units(lengths, hashes, unit_frames=10**6, max_clips=2)] == [(1, 5), (2, 0), (4, 7)]
    assert cut_units(np.zeros(0, dtype=np.int64), [], unit_frames=60) == []


# -- the same CSV on every executor ---------------------------------------------------------------------

@pytest.mark.parametrize("make", [InlineExecutor, lambda: ThreadExecutor(2)], ids=["inline", "threads"])
def test_local_executors_give_the_one_process_csv(case: Case, make: Callable[[], Any], tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    with make() as executor:
        stats = _check_whole(case, out, case.csv(out, executor=executor))
    assert stats.dropped == 0 and stats.commits == stats.units and stats.where == executor.describe()
    assert "units on" in stats.line()


@pytest.mark.slow
def test_loky_gives_the_one_process_csv(case: Case, tmp_path: Path) -> None:
    from specstore.common.executors import LokyExecutor

    out = tmp_path / "p.csv"
    _check_whole(case, out, case.csv(out, executor=LokyExecutor(2)))


@pytest.mark.slow
def test_a_local_dask_cluster_gives_the_one_process_csv(case: Case, tmp_path: Path) -> None:
    pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    out = tmp_path / "p.csv"
    stats = _check_whole(case, out, case.csv(out, backend="dask", jobs=2))
    assert stats.where.startswith("a local dask cluster (tcp://")


@pytest.mark.slow
def test_a_local_ray_gives_the_one_process_csv(case: Case, tmp_path: Path) -> None:
    with local_ray():
        out = tmp_path / "p.csv"
        stats = _check_whole(case, out, case.csv(out, executor=RayExecutor()))
    assert stats.where.startswith("the ray cluster at ")


# -- a worker killed mid-run ------------------------------------------------------------------------------



def _survives_a_kill(case: Case, executor: Any, tmp_path: Path) -> None:
    executor.folder = tmp_path / "gate"
    executor.folder.mkdir()
    killer = Killer(executor.folder)
    killer.start()
    out = tmp_path / "p.csv"
    csv = case.csv(out, executor=executor)
    killer.join(30)
    assert killer.error is None, repr(killer.error)
    assert killer.victim is not None
    key, pid = killer.victim
    assert [p for k, p in started(executor.folder) if k == key and p != pid], "the killed unit was not run again"
    stats = _check_whole(case, out, csv)
    assert stats.computed == stats.units and stats.dropped == 0  # every unit committed once


@pytest.mark.slow
def test_dask_survives_a_killed_worker(case: Case, tmp_path: Path) -> None:
    distributed = pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    with distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=":0") as c, \
            distributed.Client(c) as client:
        _survives_a_kill(case, GatedDask(client), tmp_path)


@pytest.mark.slow
def test_ray_survives_a_killed_worker(case: Case, tmp_path: Path) -> None:
    with local_ray():
        _survives_a_kill(case, GatedRay(), tmp_path)


# -- the driver stopped, a duplicate result, a stale journal ----------------------------------------------

def _stop_after_two_commits(case: Case, out: Path, model: Path | None = None) -> None:
    with pytest.raises(KeyboardInterrupt):
        case.csv(out, model, executor=StopsAfter(2))
    folder = journal_folder(out)
    assert folder is not None and len(list(folder.glob("part-*.npz"))) == 2
    assert not out.exists()


def test_a_stopped_driver_resumes_computing_exactly_the_missing_units(case: Case, tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    _stop_after_two_commits(case, out)
    counting = Counting()
    csv = case.csv(out, executor=counting)
    assert counting.submitted == case.units() - 2
    stats = _check_whole(case, out, csv, resumed=2)
    assert stats.computed == case.units() - 2


def test_a_duplicate_result_is_dropped_and_counted(case: Case, tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    stats = _check_whole(case, out, case.csv(out, executor=Duplicating()))
    assert stats.dropped == 1 and stats.computed == stats.units
    assert "1 duplicate results dropped" in stats.line()


def test_a_stale_journal_is_refused_in_one_line_and_restart_discards_it(case: Case, tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    _stop_after_two_commits(case, out, case.other)
    with pytest.raises(PredictionsError) as err:
        case.csv(out, executor=InlineExecutor())
    message = str(err.value)
    assert "\n" not in message and "journal of another run (model sha256 " in message and "--restart" in message
    assert file_digest(case.other)[:12] in message and file_digest(case.model)[:12] in message
    csv = case.csv(out, executor=InlineExecutor(), restart=True)
    _check_whole(case, out, csv)


# -- what a worker refuses --------------------------------------------------------------------------------

def _job(case: Case, **change: Any) -> UnitJob:
    s = open_store(case.store)
    fields = {"location": s.location, "generation": s.generation, "model_path": str(case.model),
              "model_digest": file_digest(case.model), "trusted": (), "feature": "mel", "options": case.options,
              **change}
    return UnitJob(**fields)


def test_a_worker_refuses_another_store_generation_or_model_file(case: Case) -> None:
    s = open_store(case.store)
    rows, hashes = (0, 1), (s.hashes[0], s.hashes[1])
    assert run_unit(_job(case), "k", rows, hashes).logits.shape[0] == 2
    with pytest.raises(PredictionsError, match=r"changed under this run \(it is at commit \d+, the run started on "):
        run_unit(_job(case, generation=s.generation + 7), "k", rows, hashes)
    with pytest.raises(CheckpointError, match=r"is not the run's \(sha256 [0-9a-f]{12}, the run's 000000000000\)"):
        run_unit(_job(case, model_digest="0" * 64), "k", rows, hashes)
    with pytest.raises(PredictionsError, match="does not hold the unit's clips"):
        run_unit(_job(case), "k", rows, (s.hashes[1], s.hashes[0]))


def test_an_empty_cluster_is_named_and_max_idle_stops_the_run(case: Case, tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    class Empty(InlineExecutor):
        def as_completed(self, futures: Iterable[TaskFuture], timeout: float | None = None) -> Iterator[TaskFuture]:
            time.sleep(timeout or 0)  # a cluster with no worker finishes nothing
            raise TimeoutError

        def live_workers(self) -> int:
            return 0

        def describe(self) -> str:
            return "the dask scheduler at tcp://empty.example:8786"

    with pytest.raises(PredictionsError) as err:
        case.csv(tmp_path / "p.csv", executor=Empty(), idle_warn_seconds=0.05, idle_warn_every=0.1, max_idle=0.3)
    message = str(err.value)
    assert message.startswith("no live workers on the dask scheduler at tcp://empty.example:8786 for ")
    assert "(--max-idle 0.3): 0 of " in message and message.endswith("start workers and rerun to resume")
    assert any("no live workers on the dask scheduler at tcp://empty.example:8786" in r.getMessage()
               for r in caplog.records), caplog.text


# -- the command line ---------------------------------------------------------------------------------------

def test_the_command_line_takes_backend_scheduler_jobs_and_restart() -> None:
    args = build_parser().parse_args(["predict", "s.zarr", "m.pt", "--backend", "dask", "--scheduler",
                                      "tcp://head:8786", "--jobs", "4", "--restart"])
    assert (args.backend, args.scheduler, args.jobs, args.restart) == ("dask", "tcp://head:8786", 4, True)
    plain = build_parser().parse_args(["predict", "s.zarr", "m.pt"])
    assert not hasattr(plain, "backend") and not hasattr(plain, "restart")  # absent: today's one-process path
    with pytest.raises(ConfigError, match="--scheduler needs --backend"):
        ClusterOptions(scheduler="tcp://head:8786")
    with pytest.raises(ConfigError, match="jobs"):
        ClusterOptions(backend="dask", jobs=0)


def test_a_worker_trusts_no_more_than_its_driver(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint naming a user model: the driver's decision travels; a worker's own allow-list adds nothing."""
    from user_models import TinyUserNet

    from specstore.infer.errors import UntrustedModelError
    from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint
    from specstore.infer.models.contract import ModelSpec
    from specstore.infer.models.trust import TRUST_ENV

    target = "user_models:TinyUserNet"
    spec = ModelSpec(target, {"n_bins": SPEC16.n_bins, "n_classes": 3})
    user = tmp_path / "user.pt"
    save_checkpoint(Checkpoint.from_model(TinyUserNet(SPEC16.n_bins, 3), LABELS, "mel", SPEC16,
                                          model_spec=spec), user)
    s = open_store(case.store)
    rows, hashes = (0, 1), (s.hashes[0], s.hashes[1])
    job = _job(case, model_path=str(user), model_digest=file_digest(user))
    monkeypatch.setenv(TRUST_ENV, "user_models")  # the worker's own environment trusts it: not enough
    with pytest.raises(UntrustedModelError, match="which the driver did not trust"):
        run_unit(job, "k", rows, hashes)
    assert run_unit(_job(case, model_path=str(user), model_digest=file_digest(user), trusted=(target,)), "k", rows,
                    hashes).logits.shape == (2, 3)
    monkeypatch.delenv(TRUST_ENV)
    one = predict(str(case.store), str(user), tmp_path / "one.csv", options=case.options, trust_model_code=True)
    two = predict(str(case.store), str(user), tmp_path / "two.csv", options=case.options, trust_model_code=True,
                  executor=InlineExecutor(), cluster=ClusterOptions(unit_frames=UNIT_FRAMES))
    assert isinstance(two.stats, ClusterStats) and not isinstance(one.stats, ClusterStats)
    assert (tmp_path / "one.csv").read_bytes() == (tmp_path / "two.csv").read_bytes()


# -- a worker's budget on a CPU ---------------------------------------------------------------------------

def test_a_cpu_worker_without_budget_mb_caps_the_default_at_half_its_memory_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from specstore.infer.engine import distributed
    from specstore.infer.engine.device import DEFAULT_CPU_BUDGET_MB

    monkeypatch.setattr(distributed, "memory_limit", lambda: (600 << 20, "the dask worker's memory limit"))
    assert distributed._worker_engine(RunOptions(device="cpu")).memory() == (300 << 20, "BUDGET_MB")
    assert distributed._worker_engine(RunOptions(device="cpu", budget_mb=900)).options.budget_mb == 900  # given
    big = int(4 * DEFAULT_CPU_BUDGET_MB) << 20
    monkeypatch.setattr(distributed, "memory_limit", lambda: (big, "the cgroup memory limit"))
    assert distributed._worker_engine(RunOptions(device="cpu")).options.budget_mb is None  # the default is lower
    monkeypatch.setattr(distributed, "memory_limit", lambda: None)
    assert distributed._worker_engine(RunOptions(device="cpu")).options.budget_mb is None
