"""`make features` never leaves wrong or missing data unreported.

A file that changes while it is extracted, odd file names, folder links,
vanished files, short clips, a second corpus, bad arguments, a killed run's
leftovers: each ends in the right data or a one-line error, and every file
is either indexed or in the error table.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from factories import SMALL_SPECS, make_corpus, store_content

from specstore.common import ConfigError
from specstore.pipeline.cli import main as features_main
from specstore.pipeline.corpus import CorpusError, scan_corpus
from specstore.pipeline.extract import extract
from specstore.pipeline.features import compute_features
from specstore.pipeline.hashing import content_hash
from specstore.pipeline.testing import write_music_like
from specstore.store import open_store, unescape_path, validate

ROOT = Path(__file__).resolve().parents[2]
MEL = {"mel": SMALL_SPECS["mel"]}


def _features(path: Path, specs=MEL) -> bytes:
    """The float16 features the store should hold for the file at ``path`` now."""
    r = compute_features(path, specs, out_dtypes={k: s.dtype for k, s in specs.items()})
    return np.ascontiguousarray(r.arrays["mel"]).tobytes()


def _run(corpus: Path, store: Path, **kw) -> object:
    kw.setdefault("specs", MEL)
    return extract(corpus, str(store), jobs=1, progress=False, **kw)


def _stored(store: Path, path: str) -> tuple[str, bytes]:
    s = open_store(store)
    i = s.paths.index(path)
    return s.hashes[i], np.ascontiguousarray(s.feature("mel").frames(i)).tobytes()


# -- 1. a file that changes while it is extracted ----------------------------------------------------------
@pytest.mark.parametrize("when", ["after hashing", "during decoding (in place)", "during decoding (replaced)"])
def test_recorded_hash_is_the_hash_of_the_decoded_bytes(tmp_path: Path, monkeypatch, when: str) -> None:
    import specstore.pipeline.tasks as tasks_mod
    from specstore.common.executors import InlineExecutor

    c = tmp_path / "c"
    make_corpus(c, n=3, seconds=1.0)
    target = c / "ambient" / "t02.ogg"  # the first file decoded (paths are sorted)
    original = shutil.copy(target, tmp_path / "original.wav")
    new = write_music_like(tmp_path / "new.wav", 1.7, seed=42)
    calls = {"n": 0}

    def swap() -> None:
        if when.endswith("(replaced)"):  # a new file renamed over the path: the open one keeps its bytes
            shutil.copy(new, target.parent / ".tmp.wav")
            os.replace(target.parent / ".tmp.wav", target)
        else:  # rewritten in place
            target.write_bytes(new.read_bytes())

    executor = None
    if when == "after hashing":
        class SwapBeforeTheFirstTask(InlineExecutor):  # the corpus is hashed and the tasks planned by now
            def submit(self, fn, /, *args, **kw):
                if calls["n"] == 0:
                    calls["n"] += 1
                    swap()
                return super().submit(fn, *args, **kw)

        executor = SwapBeforeTheFirstTask()
    else:
        real_features = tasks_mod.compute_features

        def decode_then_swap(path, *a, **kw):  # the hook in the decode path: the file changes mid-decode
            out = real_features(path, *a, **kw)
            calls["n"] += 1
            if calls["n"] == 1:
                swap()
            return out

        monkeypatch.setattr(tasks_mod, "compute_features", decode_then_swap)
    _run(c, tmp_path / "s.zarr", executor=executor)
    h, feats = _stored(tmp_path / "s.zarr", "ambient/t02.ogg")
    # the new content, under the new content's hash (a file replaced mid-decode is unlinked, which moves
    # its ctime, so the worker decodes again what the path now holds)
    assert (h, feats) == (content_hash(new), _features(new))
    assert validate(str(tmp_path / "s.zarr"), deep=True) == []
    monkeypatch.undo()
    # a byte-copy of the original added later is decoded or deduplicated onto the original's features
    shutil.copy(original, c / "jazz" / "copy.wav")
    summary = _run(c, tmp_path / "s.zarr")
    assert _stored(tmp_path / "s.zarr", "jazz/copy.wav") == (content_hash(original), _features(original))
    assert _stored(tmp_path / "s.zarr", "ambient/t02.ogg")[0] == content_hash(target)
    assert summary.changed == 0 and summary.unchanged == 3


def test_rerun_counts_changed_files(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=3, seconds=1.0)
    _run(c, tmp_path / "s.zarr")
    write_music_like(c / "rock" / "t00.wav", 1.0, seed=77)  # same name, same length, new content
    os.utime(c / "jazz" / "t01.flac")  # touched only: same content
    again = _run(c, tmp_path / "s.zarr")
    assert again.changed == 1 and again.decoded == 1 and again.unchanged == 2 and again.refreshed == 1
    assert "changed      1 paths" in again.report()
    assert _stored(tmp_path / "s.zarr", "rock/t00.wav") == (content_hash(c / "rock" / "t00.wav"),
                                                           _features(c / "rock" / "t00.wav"))
    import zarr  # the index records each source's size and mtime (FORMAT.md)
    from factories import index_group

    group = index_group(tmp_path / "s.zarr")  # the whole index as one segment
    s = open_store(tmp_path / "s.zarr")
    i = s.paths.index("jazz/t01.flac")
    st = os.stat(c / "jazz" / "t01.flac")
    idx = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")[group]
    assert int(idx["size"][i]) == st.st_size and int(idx["mtime_ns"][i]) == st.st_mtime_ns


# -- 4. every file stored or named in the error table ------------------------------------------------------
def test_non_utf8_name_is_stored_escaped_and_the_run_goes_on(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=3, seconds=1.0)
    write_music_like(tmp_path / "odd.wav", 1.0, seed=5)
    os.rename(os.fsencode(str(tmp_path / "odd.wav")), os.fsencode(str(c / "rock")) + b"/caf\xe9 \\ n.wav")
    summary = _run(c, tmp_path / "s.zarr")
    assert not summary.errors and summary.decoded == 4
    s = open_store(tmp_path / "s.zarr")
    stored = "rock/caf\\xe9 \\\\ n.wav"
    assert stored in s.paths
    assert unescape_path(stored) == b"rock/caf\xe9 \\ n.wav"
    assert _run(c, tmp_path / "s.zarr").unchanged == 4  # reruns find it again


def test_folder_links_are_followed_and_loops_recorded(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=3, seconds=1.0)
    elsewhere = tmp_path / "elsewhere" / "blues"
    make_corpus(elsewhere.parent, n=2, seconds=1.0, labels=("blues",))
    os.symlink(elsewhere, c / "blues")  # a whole class behind a folder link (outside the root: asked for)
    os.symlink(c, c / "rock" / "again")  # a loop
    summary = _run(c, tmp_path / "s.zarr", follow_links=True)
    s = open_store(tmp_path / "s.zarr")
    blues = [p for p in s.paths if p.startswith("blues/")]
    assert len(blues) == 2 and all(s.label_names[s.labels[s.paths.index(p)]] == "blues" for p in blues)
    assert summary.errors == {"rock/again": "folder link loop: links to a folder above it (not followed)"}
    assert dict(s.errors) == summary.errors


def test_vanished_files_are_reported_and_removed_on_request(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=4, seconds=1.0)
    _run(c, tmp_path / "s.zarr")
    (c / "rock" / "t03.mp3").unlink()
    again = _run(c, tmp_path / "s.zarr")
    assert again.missing == 1 and "rock/t03.mp3" in open_store(tmp_path / "s.zarr").paths
    assert "missing      1 indexed paths no longer in the corpus (--remove-missing drops them)" in again.report()
    gone = _run(c, tmp_path / "s.zarr", remove_missing=True)
    assert gone.missing == 1 and gone.removed == 1
    assert "rock/t03.mp3" not in open_store(tmp_path / "s.zarr").paths
    assert _run(c, tmp_path / "s.zarr").missing == 0


def test_half_second_clip_is_stored_with_mel_and_cqt(tmp_path: Path) -> None:
    c = tmp_path / "c"
    write_music_like(c / "rock" / "half.wav", 0.5, seed=3)
    write_music_like(c / "rock" / "long.wav", 2.0, seed=4)
    summary = extract(c, str(tmp_path / "s.zarr"), features=("mel", "cqt"), jobs=1, progress=False)
    assert not summary.errors and summary.decoded == 2
    s = open_store(tmp_path / "s.zarr")
    i = s.paths.index("rock/half.wav")
    assert s[i].shape == (128, 22) and s.feature("cqt")[i].shape == (84, 22)


# -- 7. worker memory independent of file length ---------------------------------------------------------
def test_worker_memory_does_not_grow_with_the_clips_output(tmp_path: Path) -> None:
    """Features go to the shard block by block: a 10x longer file needs no more memory, not even its output."""
    import tracemalloc

    from specstore.pipeline.tasks import TaskItem, run_task
    from specstore.store import FeatureSpec, create_store

    spec = FeatureSpec.mel()
    create_store(tmp_path / "s.zarr", {"mel": spec}).close()
    files = {n: write_music_like(tmp_path / f"{n}.wav", sec, seed=1, loop_seconds=10.0)
             for n, sec in (("short", 30.0), ("long", 300.0))}

    def peak(name: str) -> tuple[int, object]:
        tracemalloc.start()
        try:
            res = run_task(str(tmp_path / "s.zarr"), [TaskItem(str(files[name]), name)], {"mel": spec.to_dict()}, 5.0)
            return tracemalloc.get_traced_memory()[1], res
        finally:
            tracemalloc.stop()

    peak("short")  # warm caches (plans, imports)
    p_short, _ = peak("short")
    p_long, res = peak("long")
    output = res.shard.n_frames * spec.n_bins * 2  # the long clip's float16 log-mel: 3.3 MB
    assert res.shard.n_frames > 12_000 and not res.failed
    assert p_long - p_short < 0.25 * output, (p_short, p_long, output)


# -- 5. no silent merge or overwrite -----------------------------------------------------------------------
def test_another_corpus_needs_a_flag_and_gets_its_own_prefix(tmp_path: Path, capsys) -> None:
    from specstore.store import FeatureSpec

    a, b = tmp_path / "a", tmp_path / "b"
    make_corpus(a, n=3, seconds=1.0)
    make_corpus(b, n=3, seconds=1.2)  # same relative paths, other audio
    mel = {"mel": FeatureSpec.mel()}  # what the command line's --features mel makes

    def _run(corpus: Path, store: Path, **kw) -> object:
        return extract(corpus, str(store), specs=mel, jobs=1, progress=False, **kw)

    _run(a, tmp_path / "s.zarr")
    before = store_content(tmp_path / "s.zarr")
    with pytest.raises(ConfigError, match=rf"holds the corpus {a}, not {b}: .*--add-corpus"):
        _run(b, tmp_path / "s.zarr")
    assert store_content(tmp_path / "s.zarr") == before
    args = [str(b), str(tmp_path / "s.zarr"), "--features", "mel", "--no-progress"]
    assert features_main(args) == 2 and "--add-corpus" in capsys.readouterr().err
    added = _run(b, tmp_path / "s.zarr", add_corpus=True)
    assert added.decoded == 3
    after = store_content(tmp_path / "s.zarr")
    assert {p: v for p, v in after.items() if p in before} == before  # nothing replaced
    assert sorted(p for p in after if p not in before) == ["b/" + p for p in sorted(before)]
    s = open_store(tmp_path / "s.zarr")
    assert [c.prefix for c in s.metadata.commit.corpora] == ["", "b/"]
    assert _run(b, tmp_path / "s.zarr").unchanged == 3 and _run(a, tmp_path / "s.zarr").missing == 0


# -- 6. bad arguments fail before work starts, in one line ------------------------------------------------
@pytest.mark.parametrize("extra, message", [
    (["--features", ""], "no features given"),
    (["--features", "mel,chroma"], "unknown feature 'chroma'"),
    (["--block-seconds", "0"], "(--block-seconds) must be a finite number in (0, 600]"),
    (["--block-seconds", "nan"], "(--block-seconds) must be a finite number in (0, 600]"),
    (["--jobs", "0"], "(--jobs) must be an integer in [1, 4096]"),
    (["--commit-seconds", "-1"], "(--commit-seconds) must be a finite number in [0, 3600]"),
    (["--backend", "spark"], "unknown backend 'spark'"),
    (["--backend", "multiprocessing"], "unknown backend 'multiprocessing' (loky runs the same local processes)"),
])
def test_bad_arguments_are_one_line_before_any_work(tmp_path: Path, capsys, extra: list[str], message: str) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=1, seconds=0.5)
    try:
        status = features_main([str(c), str(tmp_path / "s.zarr"), "--no-progress", *extra])
    except SystemExit as e:  # a number out of its bounds is refused as the command line is parsed
        status = e.code
    err = capsys.readouterr().err.strip()
    assert status == 2 and len(err.splitlines()) == 1 and message in err, err
    assert not (tmp_path / "s.zarr").exists()


def test_store_paths_that_cannot_be_stores(tmp_path: Path, capsys) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=1, seconds=0.5)
    (tmp_path / "file.txt").write_text("x")
    for store, message in [(tmp_path / "file.txt" / "s.zarr", "lies under"), (tmp_path / "file.txt", "is a file")]:
        assert features_main([str(c), str(store), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err and str(tmp_path / "file.txt") in err, err


def test_object_store_without_its_package_names_the_package(tmp_path: Path, capsys, monkeypatch) -> None:
    import importlib
    import sys

    loaded = importlib.import_module("fsspec.registry")._registry  # noqa: SLF001 - fsspec's loaded classes
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as on a machine without the s3 extra: importing it fails
    monkeypatch.delitem(loaded, "s3", raising=False)
    c = tmp_path / "c"
    make_corpus(c, n=1, seconds=0.5)
    assert features_main([str(c), "s3://bucket/s.zarr", "--layout", "zstd", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install s3fs" in err, err


def test_jobs_far_above_the_tasks_are_capped(tmp_path: Path) -> None:
    c = tmp_path / "c"
    make_corpus(c, n=2, seconds=0.5)
    summary = extract(c, str(tmp_path / "s.zarr"), specs=MEL, jobs=500, backend="threading", progress=False)
    assert summary.jobs == 2 and summary.decoded == 2


def test_extract_takes_an_options_object_or_its_fields(tmp_path: Path) -> None:
    """``extract(corpus, store, options)``; keywords are the options' fields (replacing the object's), and a
    bad value or an unknown keyword is refused before any work."""
    from specstore.pipeline import ExtractOptions

    c = tmp_path / "c"
    make_corpus(c, n=2, seconds=0.5)
    options = ExtractOptions(specs=MEL, jobs=1, progress=False)
    assert extract(c, str(tmp_path / "a.zarr"), options).decoded == 2
    assert extract(c, str(tmp_path / "b.zarr"), options, jobs=2, backend="threading").jobs == 2
    assert store_content(tmp_path / "a.zarr") == store_content(tmp_path / "b.zarr")
    with pytest.raises(ConfigError, match=r"^jobs must be an integer in \[1, 4096\] \(or unset\), got 0 "):
        extract(c, str(tmp_path / "c.zarr"), options, jobs=0)
    with pytest.raises(ConfigError, match="unknown backend 'spark'"):
        ExtractOptions(backend="spark")
    with pytest.raises(TypeError, match="jbos"):
        extract(c, str(tmp_path / "c.zarr"), jbos=2)
    assert not (tmp_path / "c.zarr").exists()


def test_manifest_with_bom_groups_and_other_separators(tmp_path: Path) -> None:
    make_corpus(tmp_path / "audio", n=3, seconds=0.5)
    shutil.copy(tmp_path / "audio" / "rock" / "t00.wav", tmp_path / "audio" / "same.wav")
    (tmp_path / "m.csv").write_bytes("\ufeffpath,label,group,notes\n"
                                     "audio/rock/t00.wav,rock,op. 1,x\n"
                                     "audio/same.wav,rock,op. 2,\n"
                                     "audio/jazz/t01.flac,jazz,,\n".encode("utf-8"))
    _, items = scan_corpus(tmp_path / "m.csv")
    assert [(it.path, it.label, it.group) for it in items] == [
        ("audio/jazz/t01.flac", "jazz", ""), ("audio/rock/t00.wav", "rock", "op. 1"),
        ("audio/same.wav", "rock", "op. 2")]
    _run(tmp_path / "m.csv", tmp_path / "s.zarr")
    s = open_store(tmp_path / "s.zarr")
    assert s.groups == ["", "op. 1", "op. 2"]  # identical files keep their own row's group
    assert s.hashes[1] == s.hashes[2]
    (tmp_path / "semi.csv").write_text("path;label\naudio/rock/t00.wav;rock\n")
    with pytest.raises(CorpusError, match=r"separated by ';' \(semicolon\)"):
        scan_corpus(tmp_path / "semi.csv")


def test_makefile_requires_store_and_model_and_quotes_values(tmp_path: Path) -> None:
    if shutil.which("make") is None:
        pytest.skip("make is not installed")

    def dry(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["make", "-n", "--no-print-directory", "-C", str(ROOT), *args, "VENV=/nonexistent", "TORCH_PIP=torch"],
            capture_output=True,
            text=True,
            timeout=60,
        )

    for target, var in [
        ("features", "STORE"),
        ("plan", "STORE"),
        ("infer", "MODEL"),
        ("train", "MODEL"),
        ("eval", "MODEL"),
        ("init-model", "MODEL"),
    ]:
        res = dry(target, *(["STORE=x.zarr"] if var == "MODEL" else []))
        assert res.returncode == 2 and f"make {target} needs {var}=" in res.stderr, (target, res.stderr)
        assert "/nonexistent/bin/pip" not in res.stdout  # stopped before installing anything
    res = dry("features", "CORPUS=my corpus", "STORE=it's here.zarr")
    assert res.returncode == 0, res.stderr
    assert "-m specstore features 'my corpus' 'it'\\''s here.zarr'" in res.stdout
    assert dry("demo").returncode == 0  # the demo keeps its own fixed paths


# -- 8. what a killed run leaves in /dev/shm -----------------------------------------------------------------
def test_stale_worker_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    from specstore.pipeline.cleanup import clean_stale_worker_files

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    old = time.time() - 3600
    names = {
        f"joblib_memmapping_folder_{pid}_0123abcd_4567ef": "dead, old",
        f"sem.loky-{pid}-ab_c12": "dead, old",
        f"sem.loky-{os.getpid()}-live1": "alive",
        f"joblib_memmapping_folder_{pid}_89ab_cdef": "dead, young",
        "sem.other-123-x": "not ours",
    }
    for name, kind in names.items():
        p = tmp_path / name
        p.mkdir() if name.startswith("joblib") else p.write_bytes(b"\0" * 32)
        if kind != "dead, young":
            os.utime(p, (old, old))
    removed = {p.name for p in clean_stale_worker_files([tmp_path])}
    assert removed == {n for n, k in names.items() if k == "dead, old"}
    assert {p.name for p in tmp_path.iterdir()} == {n for n, k in names.items() if k != "dead, old"}
