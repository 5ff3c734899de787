"""The realistic development corpus generator (realcorpus): the tiny size rendered for real, the full plan checked.

Needs music21 (the ``specstore.realcorpus`` extra), the fluidsynth CLI and the csound-soundfont
package (``make realcorpus-deps``).  Without them the rendering tests are skipped on a
developer's machine and fail in CI (``CI`` set), where ``.ci/run`` installs them.
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parents[2]


def _missing() -> str | None:
    try:
        import music21  # noqa: F401
    except ImportError:
        return "music21 is not installed (pip install 'specstore[realcorpus]')"
    from specstore.realcorpus.render import SOUNDFONTS

    if shutil.which("fluidsynth") is None:
        return "fluidsynth is not installed (make realcorpus-deps)"
    if not os.path.exists(SOUNDFONTS["csoundgm"].path):
        return "csound-soundfont is not installed (make realcorpus-deps)"
    return None


MISSING = _missing()


@pytest.fixture(scope="module", autouse=True)
def _deps() -> None:
    if MISSING:
        if os.environ.get("CI"):
            pytest.fail(f"{MISSING}: .ci/run must run `make realcorpus-deps`")
        pytest.skip(MISSING)


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    from specstore.realcorpus import generate

    out = tmp_path_factory.mktemp("rc") / "tiny"
    summary = generate(out, size="tiny", jobs=2, progress=False)
    return out, summary


# ---- the rendered tiny corpus ----------------------------------------------------------------


@pytest.mark.slow
def test_same_bytes_in_another_run_and_process_count(tiny, tmp_path: Path) -> None:
    from specstore.realcorpus import generate

    out, _ = tiny
    again = tmp_path / "again"
    generate(again, size="tiny", jobs=1, progress=False)
    a, b = _tree(out), _tree(again)
    assert sorted(a) == sorted(b)
    assert len([k for k in a if k.endswith((".wav", ".flac", ".ogg", ".mp3"))]) == 18
    differ = [k for k in a if a[k] != b[k]]
    assert not differ, f"not byte-identical: {differ}"


def test_manifest_and_split_files(tiny) -> None:
    from specstore.realcorpus import CLASSES

    out, summary = tiny
    with open(out / "manifest.csv", encoding="utf-8") as f:
        assert f.readline().strip() == "path,label,group,split"
    for name in ("train.csv", "test.csv"):
        with open(out / name, encoding="utf-8") as f:
            assert f.readline().strip() == "path,label,group"
    rows = _read(out / "manifest.csv")
    assert len(rows) == len(summary.clips) == 18
    assert len({r["path"] for r in rows}) == len(rows)
    for r in rows:
        assert (out / r["path"]).is_file(), r["path"]
        assert r["path"].split("/")[0] == r["label"]
        assert r["split"] in ("train", "test") and r["group"]
    # Classes as planned: every class, in both splits; a training work gives two clips (train_clips=2).
    assert Counter(r["label"] for r in rows) == {c: 3 for c in CLASSES}
    assert Counter((r["label"], r["split"]) for r in rows) == {
        (c, s): n for c in CLASSES for s, n in (("train", 2), ("test", 1))
    }
    assert all(n == (2 if s == "train" else 1) for (g, s), n in Counter((r["group"], r["split"]) for r in rows).items())
    # train.csv / test.csv hold exactly their rows.
    for split in ("train", "test"):
        want = sorted((r["path"], r["label"], r["group"]) for r in rows if r["split"] == split)
        got = sorted((r["path"], r["label"], r["group"]) for r in _read(out / f"{split}.csv"))
        assert got == want
    # No work in both splits.
    splits: dict[str, set[str]] = {}
    for r in rows:
        splits.setdefault(r["group"], set()).add(r["split"])
    assert all(len(s) == 1 for s in splits.values())
    readme = (out / "README.txt").read_text(encoding="utf-8")
    import music21

    assert f"music21 {music21.__version__}" in readme and "size=tiny seed=0 train_clips=2" in readme


def test_every_file_decodes_and_sounds(tiny) -> None:
    out, summary = tiny
    seen = Counter()
    major = {"wav": "WAV", "flac": "FLAC", "ogg": "OGG", "mp3": "MP3"}
    for clip in summary.clips:
        path = out / clip.relpath
        info = sf.info(str(path))
        assert info.format == major[clip.ext], path
        assert info.samplerate == clip.sample_rate and info.channels == clip.channels
        x, sr = sf.read(str(path), dtype="float32", always_2d=True)
        seconds = len(x) / sr
        assert 0.5 <= seconds <= clip.seconds + 3.1, (path, seconds)
        rms = float(np.sqrt(np.mean(x**2)))
        assert 10 ** (-40 / 20) < rms < 10 ** (-10 / 20), (path, rms)  # -30..-14 dBFS, lossy codecs allowed some slack
        assert float(np.max(np.abs(x))) <= 1.0
        seen.update([clip.ext, clip.sample_rate, clip.channels])
    assert all(seen[k] > 0 for k in ("wav", "flac", "ogg", "mp3", 22050, 44100, 1, 2)), seen


def test_pipeline_reads_the_split_csv(tiny, tmp_path: Path) -> None:
    from specstore import pipeline
    from specstore.store import open_store

    out, _ = tiny
    pipeline.extract(out / "train.csv", tmp_path / "train.zarr", features=("mel",), jobs=1, progress=False)
    s = open_store(tmp_path / "train.zarr")
    assert len(s.lengths) == 12 and not s.errors  # two clips from each class's training work
    assert sorted(s.label_names) == sorted({r["label"] for r in _read(out / "train.csv")})


@pytest.mark.slow
def test_rerun_renders_only_what_is_missing(tiny, tmp_path: Path) -> None:
    from specstore.realcorpus import generate

    out, summary = tiny
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    victim = summary.clips[3]
    (copy / victim.relpath).unlink()  # as if interrupted before this clip was written
    (copy / victim.relpath).with_name(f".{Path(victim.relpath).name}.part").write_bytes(b"half")
    again = generate(copy, size="tiny", jobs=1, progress=False)
    assert again.rendered == 1
    assert _tree(copy) == _tree(out)
    assert generate(copy, size="tiny", jobs=1, progress=False).rendered == 0


def test_foreign_files_are_refused(tiny, tmp_path: Path) -> None:
    from specstore.realcorpus import RealCorpusError, generate

    out, _ = tiny
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    (copy / "baroque" / "mine.wav").write_bytes(b"x")
    with pytest.raises(RealCorpusError, match="would not write"):
        generate(copy, size="tiny", jobs=1, progress=False)


# ---- the full plan (nothing rendered) --------------------------------------------------------


def test_full_plan_classes_counts_split_and_balance() -> None:
    from specstore.realcorpus import CLASSES, plan_corpus
    from specstore.realcorpus.catalogue import FORMATS, SIZES, per_class

    clips = plan_corpus("full")
    assert plan_corpus("full") == clips  # deterministic
    assert len(CLASSES) >= 6
    counts = per_class(clips)
    assert set(counts) == set(CLASSES)
    for label, d in counts.items():
        works = d["train_works"] + d["test_works"]
        # classical: every quartet work music21 holds (17); medieval: every Trecento work (about 100)
        assert works >= (15 if label == "classical" else 100), (label, d)
        assert d["train"] + d["test"] >= 50, (label, d)
        assert 0.2 <= d["test_works"] / works <= 0.35, (label, d)
    groups: dict[str, set[str]] = {}
    for c in clips:
        groups.setdefault(c.group, set()).add(c.split)
    assert all(len(s) == 1 for s in groups.values())
    assert len({c.relpath for c in clips}) == len(clips)
    # Balanced within 2 in the plan with one clip per training work, and in each round of extra training clips
    # (test_train_clips_add_clips_of_training_works_only), so within 2 + (rounds - 1) over the whole corpus.
    rounds = SIZES["full"].train_clips
    for plan, slack in ((plan_corpus("full", train_clips=1), 2), (clips, 2 + rounds - 1)):
        for label in CLASSES:
            mine = [c for c in plan if c.label == label]
            for key in (lambda c: c.ext, lambda c: c.sample_rate, lambda c: c.channels, lambda c: c.soundfont):
                n = Counter(key(c) for c in mine)
                assert max(n.values()) - min(n.values()) <= slack, (label, n)
            assert set(Counter(c.ext for c in mine)) == set(FORMATS)
            assert all(20.0 <= c.seconds <= 45.0 for c in mine)


@pytest.mark.parametrize("n", [2, 3])
def test_train_clips_add_clips_of_training_works_only(n: int) -> None:
    """More clips per training work keep every clip of the plan (so the test set), add n - 1 per training clip
    from the same work (its other movements first), and stay balanced in encodings and SoundFonts."""
    from specstore.realcorpus import catalogue

    base = catalogue.plan_corpus("full", train_clips=1)
    more = catalogue.plan_corpus("full", train_clips=n)
    if n == catalogue.SIZES["full"].train_clips:
        assert catalogue.plan_corpus("full") == more
    old = {c.relpath: c for c in base}
    assert all(old[c.relpath] == c for c in more if c.relpath in old)
    assert len(old.keys() & {c.relpath for c in more}) == len(base)
    # n clips extend n - 1: a rendered corpus grows by rendering the difference.
    before = set(catalogue.plan_corpus("full", train_clips=n - 1))
    assert before <= set(more)
    newest = [c for c in more if c not in before]  # the last round: one more clip per training clip
    assert len({c.relpath for c in more}) == len(more)
    extras = [c for c in more if c.relpath not in old]
    assert len(extras) == (n - 1) * sum(c.split == "train" for c in base)
    train_groups = {c.group for c in base if c.split == "train"}
    assert {c.group for c in extras} == train_groups and all(c.split == "train" for c in extras)
    # A mass gives its other movements before a second excerpt of the same one.
    used = {(c.group, c.piece.id) for c in base}
    masses = [c for c in extras if c.group.startswith("palestrina:")]
    assert masses and sum((c.group, c.piece.id) not in used for c in masses) > len(masses) / 2
    for c in extras:
        if (c.group, c.piece.id) in used:
            assert c.excerpt >= c.piece.excerpts  # past the planned excerpts: a seeded start
    for label in catalogue.CLASSES:
        mine = [c for c in newest if c.label == label]
        for key in (lambda c: c.ext, lambda c: c.sample_rate, lambda c: c.channels, lambda c: c.soundfont):
            counts = Counter(key(c) for c in mine)
            assert max(counts.values()) - min(counts.values()) <= 2, (label, counts)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_train_clips_must_be_a_positive_integer(bad: object) -> None:
    from specstore.realcorpus import RealCorpusError, plan_corpus

    with pytest.raises(RealCorpusError, match="train_clips must be a positive integer"):
        plan_corpus("tiny", train_clips=bad)  # type: ignore[arg-type]


def test_extra_excerpts_lie_inside_the_piece() -> None:
    from types import SimpleNamespace

    from specstore.realcorpus.catalogue import Piece, rng_for
    from specstore.realcorpus.render import excerpt_window

    piece = Piece("p", "x.krn")
    starts = set()
    for k in range(1, 40):
        clip = SimpleNamespace(seconds=30.0, label="renaissance", excerpt=k, piece=piece)
        start, length, plays = excerpt_window(SimpleNamespace(seconds=100.0), clip, rng_for(0, "render", k))
        assert 0.0 <= start <= 70.0 and length == 30.0 and plays == 1
        starts.add(round(start, 3))
    assert len(starts) == 39 and min(starts) < 20 and max(starts) > 50  # spread over the piece, not one place


@pytest.mark.slow
def test_small_plan_is_the_first_development_corpus() -> None:
    """``small`` keeps the 318-clip corpus that docs/model.md's first variants were measured on, balanced."""
    from specstore.realcorpus import plan_corpus
    from specstore.realcorpus.catalogue import per_class

    clips = plan_corpus("small")
    assert len(clips) == 318
    counts = per_class(clips)
    sizes = [d["train"] + d["test"] for d in counts.values()]
    assert min(sizes) >= 40 and max(sizes) <= 1.25 * min(sizes), counts
    assert all(20.0 <= c.seconds <= 60.0 for c in clips)
    full = {c.group for c in plan_corpus("full")}
    assert {c.group for c in clips if c.label != "renaissance"} <= full  # the larger corpus extends the smaller


@pytest.mark.slow
def test_seed_changes_the_choice() -> None:
    from specstore.realcorpus import plan_corpus

    a = {c.group for c in plan_corpus("full", seed=0) if c.label == "fiddle"}
    b = {c.group for c in plan_corpus("full", seed=1) if c.label == "fiddle"}
    assert a != b


# ---- CLI -------------------------------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specstore", "realcorpus", *args], capture_output=True, text=True, cwd=REPO, check=False,
        timeout=120)


@pytest.mark.slow
def test_cli_help_and_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.realcorpus import main

    r = _cli("--help")
    assert r.returncode == 0 and "--tiny" in r.stdout and "--jobs" in r.stdout and "manifest.csv" in r.stdout
    assert "--train-clips" in r.stdout
    r = _cli(str(tmp_path / "out"), "--tiny", "--jobs", "0")
    assert r.returncode == 2 and r.stderr.startswith("specstore: error: --jobs must be an integer in [1, "), r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    f = tmp_path / "file"
    f.write_text("x")
    for args in (["--classes", "jazz"], ["--seed", "-1"], ["--classes", ""], ["--train-clips", "0"]):
        try:
            status = main([str(tmp_path / "out"), "--tiny", "-q", *args])
        except SystemExit as e:  # a number out of its bounds is refused as the command line is parsed
            status = e.code
        assert status == 2, args
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("specstore: error: "), (args, err)
    assert main([str(f), "--tiny", "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specstore: error: ") and "not a folder" in err
    assert not (tmp_path / "out").exists()
