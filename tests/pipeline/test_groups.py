"""Groups of folder corpora (`--group-by`) and the warning on a small split by content hash.

A folder corpus has no ``group`` column, so without ``--group-by`` the stems
of one song are split by content and land on both sides of a held-out
split; these tests build such corpora from tiny tones and check that the
groups are stored like a manifest's, that every split keeps a group on one
side, and that a small ungrouped split says what it risks.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from factories import make_separable_store

from specstore.common import ConfigError
from specstore.pipeline.cli import main as features_main
from specstore.pipeline.testing import write_tone
from specstore.store import open_store

LABELS = ("drums", "bass", "keys")
#: Fast extraction: one thread, one small feature.
FAST = ["--no-progress", "--jobs", "1", "--backend", "threading", "--features", "mel", "--n-mels", "16"]


def _stem_corpus(root: Path, songs: int = 8, stems: int = 2) -> dict[str, str]:
    """``root/<instrument>/song<k>/stem<j>.wav``: the stems of ``songs`` songs, filed by instrument (label).

    Each file is a distinct 0.3 s tone.  Returns each stored path's expected
    ``--group-by parent`` group: its song, whatever the instrument.
    """
    expected = {}
    for li, label in enumerate(LABELS):
        for k in range(songs):
            for j in range(stems):
                rel = f"{label}/song{k}/stem{j}.wav"
                write_tone(root / rel, 0.3, freq=200.0 + 37.0 * (li * 100 + k * 10 + j))
                expected[rel] = f"song{k}"
    return expected


def _groups(store: Path) -> dict[str, str]:
    s = open_store(store)
    return dict(zip(s.paths, s.groups, strict=True))


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


# -- the rule ------------------------------------------------------------------------------------------

def test_group_rule_parent_and_regex() -> None:
    from specstore.pipeline.corpus import group_rule

    parent = group_rule("parent")
    assert parent("rock/artist/album/t.wav") == "artist/album"  # the folder below the label folder
    assert parent("bass/song1/stem.wav") == parent("drums/song1/stem.wav") == "song1"  # stems across labels
    assert parent("rock/t.wav") == "" and parent("loose.wav") == ""  # directly in a label folder / the root
    captured = group_rule(r"^[^/]+/([^_/]+)_")
    assert captured("rock/song7_drums.wav") == "song7"
    assert captured("rock/nounderscore.wav") == ""  # no match: no group
    whole = group_rule(r"song\d+")
    assert whole("rock/song12-take3.wav") == "song12"  # no capture group: the whole match
    with pytest.raises(ConfigError, match="not a valid regular expression"):
        group_rule("(unclosed")
    with pytest.raises(ConfigError, match="needs a value"):
        group_rule("")


# -- stored groups -------------------------------------------------------------------------------------

def test_group_by_parent_stores_groups_and_keeps_every_group_on_one_side(tmp_path: Path) -> None:
    from specstore.infer.data.split import SplitRule, training_rows, ungrouped_split_warning

    expected = _stem_corpus(tmp_path / "c")
    write_tone(tmp_path / "c" / "keys" / "solo.wav", 0.3, freq=3000.0)  # directly in a label folder: no group
    expected["keys/solo.wav"] = ""
    store = tmp_path / "s.zarr"
    assert features_main([str(tmp_path / "c"), str(store), "--group-by", "parent", *FAST]) == 0
    assert _groups(store) == expected
    s = open_store(store)
    straddled = 0
    for seed in range(8):
        train_rows, val_rows = training_rows(s, SplitRule(0.5, seed))
        assert len(train_rows) + len(val_rows) == len(expected)
        train_groups = {s.groups[int(r)] for r in train_rows} - {""}
        val_groups = {s.groups[int(r)] for r in val_rows} - {""}
        assert not train_groups & val_groups  # every song on one side, all its instruments with it
        # the same split by content alone (what a folder corpus got before --group-by) splits songs
        hashes = SplitRule(0.5, seed).is_val(list(s.hashes))
        by_song: dict[str, set[bool]] = {}
        for g, v in zip(s.groups, hashes.tolist(), strict=True):
            by_song.setdefault(g, set()).add(v)
        straddled += sum(len(sides) == 2 for g, sides in by_song.items() if g)
    assert straddled > 0
    assert ungrouped_split_warning(s) is None  # grouped: nothing to warn about


def test_group_by_regex_and_files_it_does_not_match(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    c = tmp_path / "c"
    for i, rel in enumerate(["rock/song1_drums.wav", "rock/song1_bass.wav", "jazz/song2_vox.wav",
                             "jazz/take.wav", "jazz/live/song3_keys.wav"]):
        write_tone(c / rel, 0.3, freq=300.0 + 50.0 * i)
    store = tmp_path / "s.zarr"
    with caplog.at_level(logging.WARNING):
        assert features_main([str(c), str(store), "--group-by", r"(song\d+)_", *FAST]) == 0
    assert _groups(store) == {"rock/song1_drums.wav": "song1", "rock/song1_bass.wav": "song1",
                              "jazz/song2_vox.wav": "song2", "jazz/take.wav": "",
                              "jazz/live/song3_keys.wav": "song3"}
    unmatched = _warnings(caplog, "gives no group")
    assert len(unmatched) == 1 and "1 of 5 files" in unmatched[0] and "jazz/take.wav" in unmatched[0]


def test_rerun_with_another_group_by_regroups_without_decoding(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    expected = _stem_corpus(tmp_path / "c", songs=2, stems=2)
    store = tmp_path / "s.zarr"
    assert features_main([str(tmp_path / "c"), str(store), *FAST]) == 0
    assert set(_groups(store).values()) == {""}  # a folder corpus without --group-by: no groups
    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert features_main([str(tmp_path / "c"), str(store), "--group-by", "parent", *FAST]) == 0
    assert _groups(store) == expected
    assert "decoded      0 clips" in capsys.readouterr().out  # regrouping decodes nothing
    regrouped = _warnings(caplog, "another group")
    assert len(regrouped) == 1 and regrouped[0].startswith(f"{len(expected)} indexed paths")


@pytest.mark.parametrize("case", ["bad regex", "manifest"])
def test_group_by_errors_are_one_line_exit_2(tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]) -> None:
    write_tone(tmp_path / "c" / "rock" / "a" / "t.wav", 0.3)
    corpus, group_by, says = tmp_path / "c", "(unclosed", "not a valid regular expression"
    if case == "manifest":
        (tmp_path / "c" / "m.csv").write_text("path,label\nrock/a/t.wav,rock\n")
        corpus, group_by, says = tmp_path / "c" / "m.csv", "parent", "group' column"
    assert features_main([str(corpus), str(tmp_path / "s.zarr"), "--group-by", group_by, *FAST]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err
    assert not (tmp_path / "s.zarr").exists()  # refused before any work


# -- the warning on a small split by content ---------------------------------------------------------------

def test_ungrouped_warning_names_the_smallest_class_under_30(tmp_path: Path) -> None:
    from specstore.infer.data.split import MIN_CLIPS_UNGROUPED, ungrouped_split_warning

    assert MIN_CLIPS_UNGROUPED == 30
    enough = open_store(make_separable_store(tmp_path / "90.zarr", n=90))  # 30 clips in each class
    assert ungrouped_split_warning(enough) is None
    short = open_store(make_separable_store(tmp_path / "89.zarr", n=89))  # rock: 29
    why = ungrouped_split_warning(short)
    assert why is not None and "'rock', has 29 clips" in why and "--group-by" in why and "\n" not in why


def test_a_small_ungrouped_split_is_warned_once_in_train_cv_and_eval(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from specstore.infer.evaluation.evaluate import evaluate
    from specstore.infer.options.run_options import RunOptions
    from specstore.infer.train import TrainConfig, train
    from specstore.infer.train.crossval import cross_validate

    store = make_separable_store(tmp_path / "s.zarr", n=36)  # 12 clips a class, no groups
    tiny = dict(epochs=1, width=4, depth=2, run=RunOptions(max_batch=8, device="cpu"), crop_seconds=None,
                stats_head=False)
    with caplog.at_level(logging.WARNING):
        train(store, tmp_path / "m.pt", TrainConfig(val_fraction=0.25, **tiny), progress=False)
    assert len(_warnings(caplog, "by content hash")) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        evaluate(store, tmp_path / "m.pt", split="val", device="cpu", progress=False)
    assert len(_warnings(caplog, "by content hash")) == 1
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cross_validate(store, tmp_path / "cv", TrainConfig(**tiny), folds=2, progress=False, baselines=False)
    assert len(_warnings(caplog, "by content hash")) == 1  # once for the run, not once per fold
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # no split, nothing to warn about
        train(store, tmp_path / "all.pt", TrainConfig(val_fraction=0.0, **tiny), progress=False)
    assert not _warnings(caplog, "by content hash")
