"""`make features`: corpus scanning, extraction into the store, dedup, resume, bad input, crashes."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from factories import SMALL_SPECS, make_corpus, store_content

from specstore.pipeline.cli import main as features_main
from specstore.pipeline.corpus import CorpusError, scan_corpus
from specstore.pipeline.extract import ExtractError, extract
from specstore.pipeline.extract_run import plan_tasks
from specstore.pipeline.tasks import TaskItem
from specstore.pipeline.testing import (
    write_corrupt_flac,
    write_empty,
    write_music_like,
    write_short_wav,
    write_text_as_wav,
    write_truncated_mp3,
    write_truncated_wav,
    write_zero_length_wav,
)
from specstore.store import FeatureSpec, open_store, validate
from specstore.store.layout import CONTENT_HASH

ROOT = Path(__file__).resolve().parents[2]
SMALL = SMALL_SPECS


# -- corpus ---------------------------------------------------------------------------------------------
def test_scan_folder_labels_and_relative_paths(tmp_path: Path) -> None:
    make_corpus(tmp_path / "c", n=4)
    write_music_like(tmp_path / "c" / "loose.wav", 1.0)
    (tmp_path / "c" / "notes.txt").write_text("not audio")
    (tmp_path / "c" / ".hidden").mkdir()
    write_music_like(tmp_path / "c" / ".hidden" / "x.wav", 1.0)
    root, items = scan_corpus(tmp_path / "c")
    assert root == (tmp_path / "c").absolute()
    assert [it.path for it in items] == [
        "ambient/t02.ogg",
        "jazz/t01.flac",
        "loose.wav",
        "rock/t00.wav",
        "rock/t03.mp3",
    ]
    assert [it.label for it in items] == ["ambient", "jazz", None, "rock", "rock"]


def test_scan_manifest(tmp_path: Path) -> None:
    make_corpus(tmp_path / "audio", n=3)
    (tmp_path / "m.csv").write_text("path,label\naudio/rock/t00.wav,metal\naudio/jazz/t01.flac,\n")
    root, items = scan_corpus(tmp_path / "m.csv")
    assert [(it.path, it.label) for it in items] == [("audio/jazz/t01.flac", None), ("audio/rock/t00.wav", "metal")]
    (tmp_path / "bad.csv").write_text("file,genre\nx.wav,rock\n")
    with pytest.raises(CorpusError, match="'path' column"):
        scan_corpus(tmp_path / "bad.csv")
    (tmp_path / "dup.csv").write_text("path,label\na.wav,x\na.wav,y\n")
    with pytest.raises(CorpusError, match="listed twice"):
        scan_corpus(tmp_path / "dup.csv")


@pytest.mark.parametrize("what", ["missing", "empty"])
def test_unusable_corpus_is_one_line_exit_2(tmp_path: Path, what: str, capsys) -> None:
    corpus = tmp_path / "nothing"
    if what == "empty":
        corpus.mkdir()
        (corpus / "readme.txt").write_text("no audio here")
    assert features_main([str(corpus), str(tmp_path / "s.zarr"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("does not exist" in err or "holds no audio" in err)
    assert not (tmp_path / "s.zarr").exists()


def test_plan_tasks_bounds_and_order() -> None:
    items = [(TaskItem(f"f{k}", f"h{k}"), 10 << 20) for k in range(100)]
    tasks = plan_tasks(items, n_jobs=2)
    assert [it.hash for t in tasks for it in t] == [f"h{k}" for k in range(100)]
    assert len(tasks) >= 8 and max(len(t) for t in tasks) <= 64
    # the last two tasks (13 + 9 files) become tasks of halving size, two of each: two workers end together
    assert [len(t) for t in tasks] == [13] * 6 + [7, 7, 4, 4]
    assert [len(t) for t in plan_tasks(items[:48], n_jobs=2)] == [6] * 6 + [3, 3, 2, 2, 1, 1]
    big = plan_tasks([(TaskItem("a", "a"), 1 << 30), (TaskItem("b", "b"), 1)], n_jobs=1, max_files=10)
    assert [len(t) for t in big] == [1, 1]


# -- extraction -----------------------------------------------------------------------------------------
def test_extract_matches_librosa_reference(tmp_path: Path) -> None:
    import librosa

    files = make_corpus(tmp_path / "c", n=4)
    summary = extract(tmp_path / "c", str(tmp_path / "s.zarr"), jobs=1, progress=False)
    assert summary.decoded == 4 and not summary.errors
    s = open_store(tmp_path / "s.zarr")
    assert s.specs["mel"] == FeatureSpec.mel() and s.specs["cqt"] == FeatureSpec.cqt()
    for f in files:
        i = s.paths.index(f.relative_to(tmp_path / "c").as_posix())
        y, _ = librosa.load(f, sr=22050, mono=True)
        ref = librosa.power_to_db(
            librosa.feature.melspectrogram(y=y, sr=22050, n_fft=2048, hop_length=512, n_mels=128, fmax=8000.0),
            ref=1.0,
            top_db=None,
        )
        got = np.asarray(s[i], dtype=np.float32)
        assert got.shape == ref.shape
        # float16 storage: half a float16 step (<= 0.0313 dB below 64 dB magnitude) plus the decode tolerance
        assert np.max(np.abs(got - ref)) < 0.07
        assert s.durations[i] == pytest.approx(len(y) / 22050, abs=1e-3)
        assert s.label_names[s.labels[i]] == f.parent.name
    assert validate(str(tmp_path / "s.zarr")) == []


@pytest.mark.slow
def test_dedup_resume_and_grown_corpus(tmp_path: Path) -> None:
    c = tmp_path / "c"
    files = make_corpus(c, n=6)
    (c / "copies").mkdir()
    shutil.copy(files[0], c / "copies" / "same.wav")
    shutil.copy(files[1], c / "jazz" / "again.flac")
    first = extract(c, str(tmp_path / "s.zarr"), features=("mel", "cqt"), jobs=2, progress=False)
    assert first.decoded == 6 and first.duplicates == 2 and first.indexed == 8
    s = open_store(tmp_path / "s.zarr")
    a, b = s.paths.index("rock/t00.wav"), s.paths.index("copies/same.wav")
    assert s.hashes[a] == s.hashes[b] and s.label_names[s.labels[b]] == "copies"
    np.testing.assert_array_equal(s[a], s[b])
    # rerun: nothing to do
    again = extract(c, str(tmp_path / "s.zarr"), jobs=2, progress=False)
    assert again.decoded == 0 and again.unchanged == 8 and again.indexed == 0
    # grown corpus: only the new files are decoded; a new copy of old content is not decoded
    write_music_like(c / "rock" / "new.ogg", 3.0, seed=99)
    shutil.copy(files[2], c / "ambient" / "copy3.ogg")
    grown = extract(c, str(tmp_path / "s.zarr"), jobs=2, progress=False)
    assert grown.decoded == 1 and grown.indexed == 2 and grown.unchanged == 8
    assert len(open_store(tmp_path / "s.zarr")) == 10


def test_bad_inputs_are_recorded_and_good_files_all_go_through(tmp_path: Path) -> None:
    c = tmp_path / "c"
    good = make_corpus(c, n=6)
    (c / "bad").mkdir()
    (c / "odd").mkdir()
    bad = {
        "bad/empty.wav": write_empty(c / "bad" / "empty.wav"),
        "bad/text.wav": write_text_as_wav(c / "bad" / "text.wav"),
        "bad/zero.wav": write_zero_length_wav(c / "bad" / "zero.wav"),
        "bad/short.wav": write_short_wav(c / "bad" / "short.wav", n_samples=300),
        "bad/corrupt.flac": write_corrupt_flac(c / "bad" / "corrupt.flac"),
    }
    os.mkfifo(c / "bad" / "pipe.wav")  # not a regular file: must not hang the run
    bad["bad/pipe.wav"] = c / "bad" / "pipe.wav"
    os.symlink(c / "nowhere.wav", c / "bad" / "broken.wav")
    bad["bad/broken.wav"] = c / "bad" / "broken.wav"
    write_truncated_wav(c / "odd" / "truncated.wav", seconds=3.0)
    write_truncated_mp3(c / "odd" / "truncated.mp3", seconds=3.0)
    summary = extract(c, str(tmp_path / "s.zarr"), jobs=2, progress=False)
    s = open_store(tmp_path / "s.zarr")
    errors = dict(s.errors)
    assert set(bad) <= set(errors), set(bad) - set(errors)
    assert errors["bad/empty.wav"] == "empty file"
    assert errors["bad/broken.wav"] == "broken symlink"
    assert all(r and "\n" not in r for r in errors.values())
    for p in [g.relative_to(c).as_posix() for g in good]:
        assert p in s.paths
    # truncated files are recorded, not indexed as shorter clips
    for p in ("odd/truncated.wav", "odd/truncated.mp3"):
        assert p not in s.paths and errors[p].startswith("truncated: ")
    assert summary.errors == errors
    report = summary.report()
    assert "bad/empty.wav: empty file" in report
    assert validate(str(tmp_path / "s.zarr")) == []


def test_unreadable_files_are_recorded(tmp_path: Path, monkeypatch) -> None:
    from specstore.pipeline.corpus_hashes import hash_batch

    f = write_music_like(tmp_path / "locked.wav", 0.5)
    real_open = os.open

    def deny(path, *a, **kw):
        if str(path) == str(f):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *a, **kw)

    monkeypatch.setattr(os, "open", deny)
    assert hash_batch([str(f)], CONTENT_HASH) == [(None, "unreadable: permission denied")]


def test_write_failure_stops_with_one_line_and_keeps_last_commit(tmp_path: Path, monkeypatch) -> None:
    import specstore.pipeline.tasks as tasks_mod

    c = tmp_path / "c"
    make_corpus(c, n=6, seconds=1.0)
    real = tasks_mod.ShardWriter
    calls = {"n": 0}

    class Failing(real):  # the third shard hits a full disk
        def close(self):
            calls["n"] += 1
            if calls["n"] >= 3:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().close()

    monkeypatch.setattr(tasks_mod, "ShardWriter", Failing)
    with pytest.raises(ExtractError, match="No space left on device.*last commit"):
        extract(c, str(tmp_path / "s.zarr"), jobs=1, progress=False, commit_seconds=0.0)
    s = open_store(tmp_path / "s.zarr")
    assert len(s.shards) == 2 and 0 < len(s) < 6 and validate(str(tmp_path / "s.zarr")) == []
    monkeypatch.setattr(tasks_mod, "ShardWriter", real)
    done = extract(c, str(tmp_path / "s.zarr"), jobs=1, progress=False)
    assert done.decoded == 6 - len(s) and len(open_store(tmp_path / "s.zarr")) == 6


def test_commit_failure_leaves_previous_commit(tmp_path: Path, monkeypatch) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=3, seconds=1.0)
    extract(c, str(tmp_path / "s.zarr"), jobs=1, progress=False)
    write_music_like(c / "rock" / "more.wav", 1.0, seed=5)
    import specstore.store.writer as writer_mod

    real = writer_mod.write_segment

    def full(*a, **kw):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer_mod, "write_segment", full)
    assert features_main([str(c), str(tmp_path / "s.zarr"), "--jobs", "1", "--no-progress"]) == 2
    monkeypatch.setattr(writer_mod, "write_segment", real)
    assert len(open_store(tmp_path / "s.zarr")) == 3 and validate(str(tmp_path / "s.zarr")) == []


def test_workers_run_single_threaded_blas() -> None:
    """Extraction's local workers (``--backend loky``) run BLAS and OpenMP on one thread each."""
    from specstore.common.executors import open_executor

    def threads() -> list[int]:
        import numpy  # noqa: F401 - its BLAS is loaded
        from threadpoolctl import threadpool_info

        return [p["num_threads"] for p in threadpool_info()]

    with open_executor("loky", 2) as executor:
        got = [f.result() for f in [executor.submit(threads) for _ in range(2)]]
    assert all(n == 1 for g in got for n in g) and any(got)


# -- crash safety ---------------------------------------------------------------------------------------
def _cli(corpus: Path, store: Path, jobs: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "specstore", "features",
        str(corpus),
        str(store),
        "--jobs",
        str(jobs),
        "--no-progress",
        "--features",
        "mel",
        "--commit-seconds",
        "0",
    ]


@pytest.mark.slow
def test_kill_9_at_several_points_then_resume_equals_uninterrupted(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=24, seconds=3.0)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ref = tmp_path / "ref.zarr"
    subprocess.run(_cli(c, ref), check=True, env=env, cwd=ROOT, capture_output=True, timeout=600)
    expected = store_content(ref)
    assert len(expected) == 24

    target = tmp_path / "killed.zarr"
    seen_sizes = []
    # kill before anything is committed, then after the 1st, 2nd, ... commit
    for wait_generation in (None, 1, 2, 3):
        proc = subprocess.Popen(
            _cli(c, target),
            env=env,
            cwd=ROOT,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        start_gen = open_store(target).generation if (target / "zarr.json").exists() else 0
        while time.monotonic() < deadline and proc.poll() is None:
            if wait_generation is None:
                time.sleep(0.8)
                break
            try:
                if open_store(target).generation >= start_gen + wait_generation:
                    break
            except Exception:
                pass
            time.sleep(0.02)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:  # it finished first
            pass
        proc.wait()
        if (target / "zarr.json").exists():
            assert validate(str(target)) == [], f"invalid after kill at generation {wait_generation}"
            got = store_content(target)
            seen_sizes.append(len(got))
            for p, v in got.items():  # exactly committed clips, each one right
                assert expected[p] == v
    assert any(0 < n < 24 for n in seen_sizes), seen_sizes  # the kills did land mid-run
    subprocess.run(_cli(c, target), check=True, env=env, cwd=ROOT, capture_output=True, timeout=600)
    assert store_content(target) == expected
    assert validate(str(target), deep=True) == []


@pytest.mark.slow
def test_reader_sees_consistent_state_during_extraction(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=16, seconds=2.0)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    target = tmp_path / "s.zarr"
    proc = subprocess.Popen(_cli(c, target), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sizes = []
    while proc.poll() is None:
        if (target / "zarr.json").exists():
            s = open_store(target)
            for i in range(len(s)):
                assert s[i].shape == (128, s.lengths[i])
            sizes.append(len(s))
        time.sleep(0.01)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    assert sizes == sorted(sizes) and len(open_store(target)) == 16
