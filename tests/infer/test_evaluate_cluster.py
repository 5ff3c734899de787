"""``make eval`` on a cluster scores a distributed run's predictions exactly as a single-process run's.

The store holds duplicate contents (one of them labelled, one not), unlabelled rows (so the scored rows
are a proper subset of the store's) and a clip too long for any batch (it runs in windows, in a unit of
its own).  Every distributed report must equal the one-process report figure for figure, and its
``heldout.csv`` byte for byte: on threads, and through ``specstore eval --backend dask`` on a local dask
cluster of two single-thread workers.  An evaluation stopped after its second journal commit resumes
with exactly the missing units; a journal of another run is refused in one line, and ``--restart``
discards it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from executor_doubles import Counting, StopsAfter
from factories import LABELS, SPEC16, budget_mb_holding, make_checkpoint, make_store

from specstore.common.executors import ThreadExecutor
from specstore.infer.cli import main
from specstore.infer.engine.distributed import journal_folder
from specstore.infer.engine.runtime import RunOptions
from specstore.infer.engine.units import cut_units
from specstore.infer.errors import PredictionsError
from specstore.infer.evaluation.evaluate import Report, evaluate
from specstore.infer.options.cluster_options import ClusterOptions
from specstore.store import IndexRow, create_store, open_store

LENGTHS = [30, 45, 60, 75, 90, 110, 130, 150, 40, 6000]
"""Frames per clip; the last is too long for any batch under the run's budget (1000 frames of one clip)."""
LABELLED = [LABELS[k % 3] for k in range(7)] + [None, None, "rock"]
"""Each clip's label: two unlabelled clips are not scored."""
UNIT_FRAMES = 240
"""Small units, so an evaluation of ten clips has several."""


class Case:
    """The shared store, two models, the run options and the one-process reference report."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.store = make_store(root / "s.zarr", lengths=LENGTHS, labels=LABELLED)
        w = create_store(self.store, {"mel": SPEC16})
        w.commit(rows=[IndexRow("copies/a.wav", "h1", "jazz"), IndexRow("copies/b.wav", "h8", None),
                       IndexRow("copies/c.wav", "h1", "rock")])
        self.model = make_checkpoint(root / "m.pt", time_kernel=1)
        self.other = make_checkpoint(root / "other.pt", time_kernel=1, seed=1)
        self.budget_mb = budget_mb_holding(self.model, 1000)
        self.options = RunOptions(device="cpu", budget_mb=self.budget_mb, progress=False)
        self.reference = self.report(root / "ref")

    def report(self, out_dir: Path, model: Path | None = None, **cluster: Any) -> dict[str, Any]:
        """What an evaluation of ``model`` (default: the first) writes into ``out_dir``: in one process without
        ``cluster`` keywords, else on a cluster (``executor`` and the :class:`ClusterOptions`)."""
        executor = cluster.pop("executor", None)
        options = ClusterOptions(**{"unit_frames": UNIT_FRAMES, "commit_seconds": 0.0, **cluster}) \
            if cluster or executor is not None else None
        self.last = evaluate(str(self.store), str(model or self.model), out_dir, split="all",
                             options=self.options, executor=executor, cluster=options)
        return written(out_dir)

    def units(self) -> int:
        """Units of the scored (labelled) rows."""
        s = open_store(self.store)
        rows = [r for r in range(len(s)) if s.labels[r] >= 0]
        return len(cut_units(s.lengths, s.hashes, unit_frames=UNIT_FRAMES, long_frames=1000, rows=rows))


def written(out_dir: Path) -> dict[str, Any]:
    """``report.json`` without the two fields that name the run's own time and folder, ``report.txt`` with its
    folder replaced, and ``heldout.csv``'s bytes."""
    report = json.loads((out_dir / "report.json").read_text())
    assert report.pop("files") and report.pop("seconds") > 0
    text = (out_dir / "report.txt").read_text().replace(str(out_dir), "OUT")
    return {"json": report, "text": text, "csv": (out_dir / "heldout.csv").read_bytes()}


@pytest.fixture(scope="module")
def case(tmp_path_factory: pytest.TempPathFactory) -> Case:
    return Case(tmp_path_factory.mktemp("eval-cluster"))


def test_the_reference_scores_the_labelled_rows_and_its_units_are_theirs(case: Case) -> None:
    """The fixture means what the other tests rely on: a proper subset of rows, duplicates, a windowed clip."""
    ref = case.reference["json"]
    s = open_store(case.store)
    assert ref["n_clips"] == len(s) - 3 and ref["n_unlabelled"] == 3 and ref["split"] == "all"
    assert case.reference["csv"].count(b"\n") == ref["n_clips"] + 1
    every = len(cut_units(s.lengths, s.hashes, unit_frames=UNIT_FRAMES, long_frames=1000))
    assert 2 < case.units() < every  # the unlabelled contents are not computed


def _check_same(case: Case, out_dir: Path, got: dict[str, Any]) -> None:
    assert got == case.reference
    assert not journal_folder(out_dir / "heldout.csv").exists()  # type: ignore[union-attr]


def test_threads_give_the_one_process_report(case: Case, tmp_path: Path) -> None:
    with ThreadExecutor(2) as executor:
        _check_same(case, tmp_path, case.report(tmp_path, executor=executor))
    assert isinstance(case.last, Report)


@pytest.mark.slow
def test_specstore_eval_on_a_local_dask_cluster_gives_the_one_process_report(case: Case, tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("dask.distributed", reason="dask[distributed] is not installed")
    code = main(["eval", str(case.store), str(case.model), "--out-dir", str(tmp_path), "--split", "all",
                 "--device", "cpu", "--budget-mb", str(case.budget_mb), "--backend", "dask", "--jobs", "2",
                 "--unit-frames", str(UNIT_FRAMES)])
    assert code == 0, capsys.readouterr().err
    _check_same(case, tmp_path, written(tmp_path))
    assert f"on {case.reference['json']['n_clips']} clips" in capsys.readouterr().out


def _stop_after_two_commits(case: Case, out_dir: Path, model: Path | None = None) -> None:
    with pytest.raises(KeyboardInterrupt):
        case.report(out_dir, model, executor=StopsAfter(2))
    folder = journal_folder(out_dir / "heldout.csv")
    assert folder is not None and len(list(folder.glob("part-*.npz"))) == 2
    assert not (out_dir / "report.json").exists()


def test_a_stopped_evaluation_resumes_computing_exactly_the_missing_units(case: Case, tmp_path: Path) -> None:
    _stop_after_two_commits(case, tmp_path)
    counting = Counting()
    got = case.report(tmp_path, executor=counting)
    assert counting.submitted == case.units() - 2
    _check_same(case, tmp_path, got)


def test_a_stale_journal_is_refused_in_one_line_and_restart_discards_it(case: Case, tmp_path: Path) -> None:
    _stop_after_two_commits(case, tmp_path, case.other)
    with pytest.raises(PredictionsError) as err:
        case.report(tmp_path, executor=ThreadExecutor(2))
    message = str(err.value)
    assert "\n" not in message and "journal of another run (model sha256 " in message and "--restart" in message
    _check_same(case, tmp_path, case.report(tmp_path, executor=ThreadExecutor(2), restart=True))
