"""A store whose index lies is refused with one line, never read.

Each case builds a small store with the project's factories and then edits
it with plain zarr, as an attacker (or a broken tool) would: an extent that
overlaps another clip's frames, runs past its shard's end, starts before
it; a length, label or shard number out of range; a shard or segment name
that leaves the store; a spec that disagrees with the shard arrays.  The
index is forged in its one segment (``factories.index_group``: the store is
compacted first); stores of format 2 (one index group, the shard list in the
root document) are copies of ``tests/fixtures/pre_specstore``.
``open_store`` (what the notebook, ``specstore.infer``'s datasets and ``predict`` use)
and plain ``python -m specstore store validate`` must say what is wrong in one line
naming the store, the clip and the fault, and a read must never return
another clip's frames.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from factories import index_group, make_separable_store, make_store, store_content
from hypothesis import given, settings
from hypothesis import strategies as st

from specstore.store import IndexRow, StoreCorrupt, StoreWriter, open_store, validate
from specstore.store.__main__ import main as store_main

#: Four clips in one shard, rows sorted by path: frames [0, 30), [30, 70), [70, 120), [120, 140) in hash order.
LENGTHS = [30, 40, 50, 20]
#: Format-2 stores written before the ``specstore`` namespace (never modified: tests copy them).
PRE_SPECSTORE = Path(__file__).resolve().parents[1] / "fixtures" / "pre_specstore"


def _store(tmp_path: Path, layout: str = "raw", name: str = "s.zarr") -> Path:
    return make_store(tmp_path / name, lengths=LENGTHS, layout=layout)


def _meta(path: Path) -> dict[str, Any]:
    doc: Any = zarr.open_group(str(path), mode="r").attrs["specstore"]
    return dict(doc)


def _set_meta(path: Path, meta: dict[str, Any]) -> None:
    zarr.open_group(str(path), mode="r+").attrs["specstore"] = meta


def _format2(tmp_path: Path, layout: str = "raw") -> Path:
    """A copy of the format-2 fixture store of ``layout`` (4 clips in 3 shards, 1 error row)."""
    return Path(shutil.copytree(PRE_SPECSTORE / f"store_{layout}.zarr", tmp_path / f"old_{layout}.zarr"))


def _index_of(path: Path) -> str:
    """The group holding the whole committed index: format 2's ``commit.index``, else the one segment."""
    commit = _meta(path)["commit"]
    return str(commit["index"]) if "index" in commit else index_group(path)


def _group(path: Path, group: str) -> Any:
    """The zarr group or array ``group`` of the store at ``path``, writable."""
    root: Any = zarr.open_group(str(path), mode="r+")
    return root[group]


def _set_index(path: Path, column: str, row: int, value: Any) -> None:
    """Overwrite one value of a committed index column in place, with plain zarr."""
    arr: Any = _group(path, _index_of(path))[column]
    values = arr[...]
    values[row] = value
    arr[...] = values


def _set_shards(path: Path, column: str, values: list[Any]) -> None:
    """Overwrite a format-3 store's shard table column (``name`` or ``n_frames``) with plain zarr, same length."""
    arr: Any = _group(path, f"{index_group(path)}/shards")[column]
    assert arr.shape == (len(values),), (arr.shape, values)
    arr[...] = np.array(values, dtype=object if column == "name" else np.int64)


def _add_shard(path: Path) -> None:
    """Commit a second shard (one 4-frame clip)."""
    with StoreWriter.open(str(path)) as w:
        w.add_clips([{"path": "z.wav", "hash": "z", "duration": 0.1}], {"mel": [np.zeros((4, 16))]})


def _row_of(path: Path, hash_: str) -> int:
    s = open_store(path)
    return s.hashes.index(hash_)


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text, text
    return text


# -- the index's extents ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_an_extent_overlapping_another_clip_is_refused_not_read(tmp_path: Path, layout: str) -> None:
    path = _store(tmp_path, layout)
    victim, liar = _row_of(path, "h0"), _row_of(path, "h1")  # h0 holds frames [0, 30), h1 [30, 70)
    _set_index(path, "offset", liar, 5)
    with pytest.raises(StoreCorrupt) as err:
        open_store(path)
    line = _one_line(err.value)
    assert str(path) in line and f"clip {liar} (" in line and "overlap" in line and f"clip {victim}" in line
    for deep in (False, True):  # --deep is the checksum pass on top of the plain checks
        problems = validate(str(path), deep=deep)
        assert any("overlap" in p for p in problems), problems


def test_an_extent_past_its_shards_end_is_refused_at_open(tmp_path: Path) -> None:
    path = _store(tmp_path)
    row = _row_of(path, "h3")  # the last clip of the shard: frames [120, 140)
    _set_index(path, "n_frames", row, 500)
    with pytest.raises(StoreCorrupt, match=r"claims frames 120\.\.620 of shard \w+, which holds 140 frames") as err:
        open_store(path)
    assert f"clip {row} (" in _one_line(err.value)
    assert any("which holds 140 frames" in p for p in validate(str(path)))


def test_an_old_commit_without_shard_frames_is_checked_when_a_shard_opens(tmp_path: Path) -> None:
    """Format-2 stores committed before commits recorded shard frame counts: the end is checked before any frame
    is read."""
    path = _format2(tmp_path)
    meta = _meta(path)
    frames = meta["commit"].pop("shard_frames")
    _set_meta(path, meta)
    intact = open_store(path)
    assert intact.metadata.commit.shard_frames is None
    in_first = [i for i in range(len(intact)) if intact._shard[i] == 0]
    assert len(in_first) == 2 and len(in_first) < len(intact)  # the fixture: two clips in shard 0, others elsewhere
    row = max(in_first, key=lambda i: int(intact._offset[i]))  # the last clip of shard 0
    start = int(intact._offset[row])
    _set_index(path, "n_frames", row, 500)
    s = open_store(path)  # nothing but the shard itself says how long it is
    for i in range(len(s)):
        if i in in_first:  # not even a clip that is itself fine is read from that shard
            with pytest.raises(StoreCorrupt, match=f"clip {row} .*which holds {frames[0]} frames"):
                s.feature("mel").frames(i)
        else:  # the other shards still read
            assert s.feature("mel").frames(i).shape[0] == s.lengths[i]
    problems = validate(str(path))
    assert any(f"holds {frames[0]} frames; the index needs {start + 500}" in p and f"clip {row}" in p
               for p in problems), problems


@pytest.mark.parametrize(("column", "value", "message"), [
    ("offset", -10, r"starts at frame -10 of its shard \(a negative offset\)"),
    ("offset", 2 ** 62, r"claims frames 4611686018427387904\.\.\d+ of shard \w+, which holds 140 frames"),
    ("offset", 2 ** 63 - 5, r"starts at frame 9223372036854775803, beyond any shard's end"),
    ("n_frames", 0, r"has 0 frames \(a clip has at least 1\)"),
    ("n_frames", -3, r"has -3 frames"),
    ("label", 99, r"has label number 99, but the store has 3 label name\(s\)"),
    ("label", -2, r"has label number -2"),
    ("shard", 7, r"points at shard number 7, but the commit lists 1 shard\(s\)"),
    ("shard", -1, r"points at shard number -1"),
])
def test_values_out_of_range_are_one_line_naming_the_clip(tmp_path: Path, column: str, value: int,
                                                           message: str, capsys) -> None:
    path = _store(tmp_path)
    _set_index(path, column, 2, value)
    with pytest.raises(StoreCorrupt, match=message) as err:
        open_store(path)
    line = _one_line(err.value)
    assert line.startswith(f"store {path}: clip 2 ({open_store_paths(path)[2]})"), line
    assert store_main(["validate", str(path)]) == 1
    out = capsys.readouterr().err.strip().splitlines()
    assert out and all(re.search(message, p) or p.startswith("invalid: store") for p in out), out
    assert store_main(["info", str(path)]) == 2
    err_lines = capsys.readouterr().err.strip().splitlines()
    assert len(err_lines) == 1 and re.search(message, err_lines[0]), err_lines


def open_store_paths(path: Path) -> list[str]:
    """The index's paths, read with plain zarr (the store itself refuses to open)."""
    return [str(p) for p in _group(path, _index_of(path))["path"][...]]


def test_the_same_frames_under_another_content_hash_are_refused(tmp_path: Path) -> None:
    path = _store(tmp_path)
    a, b = _row_of(path, "h1"), _row_of(path, "h2")
    s = open_store(path)
    _set_index(path, "offset", b, int(s._offset[a]))
    _set_index(path, "n_frames", b, int(s.lengths[a]))
    with pytest.raises(StoreCorrupt, match=f"clip {max(a, b)} .* claims the same frames as clip {min(a, b)} but a "
                                           "different content hash"):
        open_store(path)


def test_a_column_of_the_wrong_type_is_one_line(tmp_path: Path) -> None:
    path = _store(tmp_path)
    group: Any = _group(path, _index_of(path))
    n = group["offset"].shape[0]
    del group["offset"]
    group.create_array("offset", shape=(n,), dtype=str)[...] = np.array(["x"] * n, dtype=object)
    with pytest.raises(StoreCorrupt, match="column offset of") as err:
        open_store(path)
    _one_line(err.value)


# -- names in the metadata that would leave the store ---------------------------------------------------------


def test_a_shard_name_leaving_the_store_is_refused_not_followed(tmp_path: Path) -> None:
    """A shard named ``../../decoy`` would read a copy placed beside the store: it must not be opened at all."""
    path = _store(tmp_path)
    real = open_store(path).shards[0]
    shutil.copytree(path / "shards" / real, tmp_path / "decoy")
    _set_shards(path, "name", ["../../decoy"])
    with pytest.raises(StoreCorrupt, match=r"commit.shards holds '\.\./\.\./decoy', which is not a shard name") as e:
        open_store(path)[0]
    _one_line(e.value)
    assert validate(str(path)) == [str(e.value)]


@pytest.mark.parametrize("where", ["segments", "history"])
@pytest.mark.parametrize("segment", ["../other.zarr/index/s000001", "index/../index/s000001", "/etc", "index",
                                     "index/s000001/../../../x"])
def test_a_segment_path_leaving_the_store_is_one_line(tmp_path: Path, segment: str, where: str, capsys) -> None:
    path = _store(tmp_path)
    meta = _meta(path)
    assert len(meta["commit"]["segments"]) == len(meta["commit"]["history"]) == 1  # one commit: one segment
    if where == "segments":
        meta["commit"]["segments"] = [segment]
    else:  # the segments kept for readers of an earlier commit
        meta["commit"]["history"] = [[segment]]
    _set_meta(path, meta)
    with pytest.raises(StoreCorrupt, match=re.escape(f"commit.segments names {segment!r}, which is not an index "
                                                     "segment")) as e:
        open_store(path)
    _one_line(e.value)
    assert store_main(["validate", str(path)]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    with pytest.raises(StoreCorrupt, match="is not an index segment"):  # nor does a writer follow it
        StoreWriter.open(str(path))


def test_a_format_2_group_named_as_a_segment_is_refused(tmp_path: Path) -> None:
    """``index/gNNNNNN`` is a format-2 index group: a format-3 commit may keep it in its history, never read it."""
    path = _store(tmp_path)
    meta = _meta(path)
    meta["commit"]["segments"] = ["index/g000001"]
    _set_meta(path, meta)
    with pytest.raises(StoreCorrupt, match=r"commit.segments names 'index/g000001', which is not an index segment"):
        open_store(path)


@pytest.mark.parametrize("edit", ["feature", "duplicate"])
def test_feature_names_and_duplicate_shards_are_refused(tmp_path: Path, edit: str) -> None:
    path = _store(tmp_path)
    meta = _meta(path)
    if edit == "feature":
        meta["features"]["../../x"] = meta["features"].pop("mel")
        meta["default_feature"] = "../../x"
        want = r"feature name '\.\./\.\./x' is not one path segment"
    else:
        _add_shard(path)
        names = [str(n) for n in _group(path, f"{index_group(path)}/shards/name")[...]]
        assert len(names) == 2
        _set_shards(path, "name", [names[0], names[0]])
        meta = _meta(path)
        want = "commit.shards names a shard twice"
    _set_meta(path, meta)
    with pytest.raises(StoreCorrupt, match=want) as e:
        open_store(path)
    _one_line(e.value)


# -- shard arrays that disagree with the spec ------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_bins_differing_from_the_spec_say_what_differs(tmp_path: Path, layout: str) -> None:
    """The red team's ``nbins`` case said "chunk 0 has 119552 bytes, its record says 119552"."""
    path = _store(tmp_path, layout)
    meta = _meta(path)
    meta["features"]["mel"]["n_bins"] = 17
    _set_meta(path, meta)
    problems = validate(str(path))
    assert len(problems) == 1 and "shape (140, 16), but the store's mel spec has 17 bins" in problems[0], problems
    for p in problems:
        sizes = re.search(r"has (\d+) bytes, its record says (\d+)", p)
        assert sizes is None or sizes[1] != sizes[2], p
    with pytest.raises(StoreCorrupt, match="the store's mel spec has 17 bins") as e:
        open_store(path)[0]
    _one_line(e.value)


def test_a_dtype_differing_from_the_spec_is_refused_even_when_the_bytes_fit(tmp_path: Path) -> None:
    """float16 x 16 bins and float32 x 8 bins take the same bytes: a raw mmap would reinterpret them."""
    path = _store(tmp_path)
    meta = _meta(path)
    meta["features"]["mel"].update(n_bins=8, dtype="float32")
    _set_meta(path, meta)
    with pytest.raises(StoreCorrupt, match="but the store's mel spec has 8 bins"):
        open_store(path)[0]
    assert validate(str(path))


def test_a_commit_recording_more_frames_than_the_shard_holds_is_caught_at_the_shard(tmp_path: Path) -> None:
    path = _store(tmp_path)
    row = _row_of(path, "h3")
    _set_index(path, "n_frames", row, 500)
    _set_shards(path, "n_frames", [1000])  # the lie told twice: the shard table agrees with the index
    s = open_store(path)
    with pytest.raises(StoreCorrupt, match=f"holds 140 frames but commit {s.generation} records 1000"):
        s[0]
    assert validate(str(path))


# -- who reads through open_store: infer's predict --------------------------------------------------------------


@pytest.mark.parametrize(("column", "value", "message"), [
    ("offset", -10, "negative offset"),
    ("offset", 2 ** 62, "which holds 140 frames"),
    ("label", 99, "has label number 99"),
    ("offset", 5, "overlap"),
])
def test_predict_on_a_lying_index_is_one_line_and_writes_nothing(tmp_path: Path, column: str, value: int,
                                                                 message: str, capsys) -> None:
    from factories import make_checkpoint

    from specstore.infer.cli import main as infer_main

    path = _store(tmp_path)
    _set_index(path, column, _row_of(path, "h1"), value)
    model = make_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "p.csv"
    assert infer_main(["predict", str(path), str(model), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(path) in err[0], err
    assert not out.exists()


# -- what must keep working ------------------------------------------------------------------------------------------


def test_stores_written_by_the_writer_pass(tmp_path: Path) -> None:
    """Duplicates (one extent under several paths), several shards, unlabelled rows, a repair: all valid."""
    dup = make_separable_store(tmp_path / "dup.zarr", n=12, duplicates=3)
    s = open_store(dup)
    assert len(s) == 15 and validate(str(dup)) == []
    many = make_store(tmp_path / "many.zarr", [None, "rock", "jazz"], lengths=[5, 6, 7])
    with StoreWriter.open(many) as w:
        rng = np.random.default_rng(1)
        w.add_clips([{"path": "z/new.wav", "hash": "new", "duration": 0.5, "label": "rock"}],
                    {"mel": [rng.normal(-40, 9, (9, 16))]})
        w.commit(rows=[IndexRow("z/copy.wav", "new", None)])
    s = open_store(many)
    assert len(s.shards) == 2 and s.metadata.commit.shard_frames == (18, 9)
    assert validate(str(many)) == [] and validate(str(many), deep=True) == []
    np.testing.assert_array_equal(s[s.paths.index("z/copy.wav")], s[s.paths.index("z/new.wav")])


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_a_writer_upgrades_a_format_2_store_without_shard_frames(tmp_path: Path, layout: str) -> None:
    """Its first commit rewrites the index as one format-3 segment, recording every shard's frames (read from
    the shards), and every committed clip reads as before."""
    path = _format2(tmp_path, layout)
    meta = _meta(path)
    frames = tuple(meta["commit"].pop("shard_frames"))
    _set_meta(path, meta)
    old = open_store(path)
    assert old.metadata.format_version == 2 and old.metadata.commit.shard_frames is None
    before = store_content(path)
    with StoreWriter.open(str(path)) as w:
        w.add_clips([{"path": "z.wav", "hash": "z", "duration": 0.1}],
                    {"mel": [np.zeros((4, 16))], "cqt": [np.zeros((4, 24))]})
    s = open_store(path)
    commit = _meta(path)["commit"]
    assert s.metadata.format_version == 3 and s.metadata.commit.segmented
    assert not {"index", "shards", "shard_frames"} & set(commit) and commit["n_shards"] == len(frames) + 1
    assert s.shards[:len(frames)] == old.shards and s.metadata.commit.shard_frames == (*frames, 4)
    after = store_content(path)
    assert set(after) == {*before, "z.wav"} and {p: after[p] for p in before} == before
    assert s.errors == old.errors and s.label_names == old.label_names
    assert validate(str(path)) == [] and validate(str(path), deep=True) == []


# -- the vectorised check against a brute-force one ----------------------------------------------------------------


def _brute_force(rows: list[tuple[int, int, int, str]], frames: list[int]) -> bool:
    """Whether every extent lies inside its shard and any two are disjoint or identical with one hash."""
    for k, (sh, off, n, h) in enumerate(rows):
        if not (0 <= sh < len(frames) and off >= 0 and n >= 1 and off + n <= frames[sh]):
            return False
        for sh2, off2, n2, h2 in rows[k + 1:]:
            if sh2 == sh and off < off2 + n2 and off2 < off + n and ((off, n, h) != (off2, n2, h2)):
                return False
    return True


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 2), st.integers(-2, 12), st.integers(-1, 6), st.sampled_from("ab")),
                max_size=8),
       st.lists(st.integers(0, 14), min_size=2, max_size=2))
def test_index_problems_agree_with_a_brute_force_check(rows: list[tuple[int, int, int, str]],
                                                      frames: list[int]) -> None:
    from specstore.store.extents import index_problems

    cols = [np.array([r[k] for r in rows], dtype=np.int64) for k in range(3)]
    hashes = [r[3] for r in rows]
    found = index_problems(cols[0], cols[1], cols[2], np.zeros(len(rows), dtype=np.int64), hashes,
                           shard_names=["s0", "s1"],
                           n_labels=1, shard_frames=frames)
    assert (not found) == _brute_force(rows, frames), found

