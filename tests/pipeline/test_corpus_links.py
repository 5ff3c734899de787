"""Links never pull files from outside the corpus into a store unless asked.

A downloaded corpus can hold a link to any readable audio file of the
machine.  Such links (to files or folders, direct, relative or through
another link) are recorded as bad files with their reason; ``--follow-links``
follows them.  Links that stay inside the corpus root are followed as before.
A manifest applies the rule to the rows inside its folder; rows that name a
path outside it outright are read as written.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specstore.pipeline import corpus as corpus_module
from specstore.pipeline.cli import main as features_main
from specstore.pipeline.corpus import scan_corpus
from specstore.pipeline.extract import extract
from specstore.pipeline.testing import write_music_like
from specstore.store import FeatureSpec, open_store

MEL = {"mel": FeatureSpec.mel(n_bins=16)}
OUTSIDE = "link to a {} outside the corpus ({}): not followed without --follow-links"


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Path, Path]:
    """``(corpus, private)``: a corpus whose links lead into a private folder next to it, and within itself."""
    c, private = tmp_path / "c", tmp_path / "private"
    write_music_like(c / "rock" / "own.wav", 1.0, seed=1)
    write_music_like(private / "secret.wav", 1.0, seed=2)
    write_music_like(private / "album" / "song.flac", 1.0, seed=3)
    os.symlink(c / "rock" / "own.wav", c / "rock" / "again.wav")  # inside: fine
    os.symlink(c / "rock", c / "also-rock")  # a folder link inside: fine
    os.symlink(private / "secret.wav", c / "rock" / "stolen.wav")  # a file outside
    os.symlink("../../private/secret.wav", c / "rock" / "relative.wav")  # the same, relative
    os.symlink(c / "rock" / "stolen.wav", c / "hop.wav")  # inside, but on to a link outside
    os.symlink(private / "album", c / "jazz")  # a folder outside
    return c, private


def _escapes(c: Path, private: Path) -> dict[str, str]:
    secret = str((private / "secret.wav").resolve())
    return {
        "also-rock/stolen.wav": OUTSIDE.format("file", secret),
        "also-rock/relative.wav": OUTSIDE.format("file", secret),
        "hop.wav": OUTSIDE.format("file", secret),
        "jazz": OUTSIDE.format("folder", str((private / "album").resolve())),
        "rock/relative.wav": OUTSIDE.format("file", secret),
        "rock/stolen.wav": OUTSIDE.format("file", secret),
    }


def test_outside_root_names_links_that_leave(corpus: tuple[Path, Path]) -> None:
    c, private = corpus
    outside_root = corpus_module.outside_root  # public: serving's folder search can apply the same rule
    assert outside_root(c / "rock" / "again.wav", c) is None
    assert outside_root(c / "also-rock" / "own.wav", c) is None
    assert outside_root(c / "hop.wav", c) == OUTSIDE.format("file", (private / "secret.wav").resolve())
    assert outside_root(c / "jazz", c) == OUTSIDE.format("folder", (private / "album").resolve())


def test_scan_records_links_out_of_the_root(corpus: tuple[Path, Path]) -> None:
    c, private = corpus
    _, items = scan_corpus(c)
    problems = {it.path: it.problem for it in items if it.problem}
    assert problems == _escapes(c, private)
    fine = sorted(it.path for it in items if not it.problem)
    assert fine == ["also-rock/again.wav", "also-rock/own.wav", "rock/again.wav", "rock/own.wav"]
    _, followed = scan_corpus(c, follow_links=True)
    assert not any(it.problem for it in followed)
    assert {"jazz/song.flac", "rock/stolen.wav", "hop.wav"} <= {it.path for it in followed}


def test_extract_stores_no_file_from_outside(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    c, private = corpus
    summary = extract(c, str(tmp_path / "s.zarr"), specs=MEL, jobs=1, progress=False)
    assert summary.errors == _escapes(c, private)
    s = open_store(tmp_path / "s.zarr")
    assert dict(s.errors) == summary.errors
    assert sorted(s.paths) == ["also-rock/again.wav", "also-rock/own.wav", "rock/again.wav", "rock/own.wav"]
    assert len(set(s.hashes)) == 1  # only the corpus's own file was decoded
    followed = extract(c, str(tmp_path / "s.zarr"), specs=MEL, jobs=1, progress=False, follow_links=True)
    assert not followed.errors and "jazz/song.flac" in open_store(tmp_path / "s.zarr").paths
    # Rerun without: a file link's row becomes its error again; what the folder link led to is "missing",
    # kept until --remove-missing as for any file gone from the corpus.
    again = extract(c, str(tmp_path / "s.zarr"), specs=MEL, jobs=1, progress=False, remove_missing=True)
    assert again.errors == _escapes(c, private) and again.removed == 1
    assert sorted(open_store(tmp_path / "s.zarr").paths) == sorted(s.paths)


def test_the_command_line_switch(corpus: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    c, _ = corpus
    args = [str(c), str(tmp_path / "s.zarr"), "--features", "mel", "--n-mels", "16", "--jobs", "1", "--no-progress"]
    assert features_main(args) == 0
    out = capsys.readouterr().out
    assert "bad files    6" in out and "  jazz: link to a folder outside the corpus (" in out
    assert features_main([*args, "--follow-links"]) == 0
    assert "bad files    0" in capsys.readouterr().out
    assert "jazz/song.flac" in open_store(tmp_path / "s.zarr").paths


def test_manifest_rows_inside_its_folder_may_not_link_out(corpus: tuple[Path, Path], tmp_path: Path) -> None:
    c, private = corpus
    secret = private / "secret.wav"
    (c / "m.csv").write_text(f"path,label\nrock/own.wav,rock\nrock/stolen.wav,rock\nhop.wav,\n"
                             f"{secret},named\n../private/album/song.flac,named\n")
    _, items = scan_corpus(c / "m.csv")
    problems = {it.path: it.problem for it in items if it.problem}
    assert problems == {"hop.wav": OUTSIDE.format("file", secret.resolve()),
                        "rock/stolen.wav": OUTSIDE.format("file", secret.resolve())}
    named = {it.path: it.label for it in items if not it.problem}
    assert named == {"rock/own.wav": "rock", secret.as_posix(): "named", "../private/album/song.flac": "named"}
    summary = extract(c / "m.csv", str(tmp_path / "m.zarr"), specs=MEL, jobs=1, progress=False)
    assert summary.errors == problems and len(open_store(tmp_path / "m.zarr").paths) == 3
    _, followed = scan_corpus(c / "m.csv", follow_links=True)
    assert not any(it.problem for it in followed)
