"""Reads refuse what ``validate`` refuses: an extent whose end wraps in int64, a path twice, counts that
disagree with the commit, durations that are not a finite positive number of seconds.

Each case builds a small store with the project's factories and edits its index (its one segment:
``factories.index_group``) or its commit with plain zarr, as a broken tool or an attacker would; cases about
stores of format 2 (one index group, the shard list in the root document) edit copies of
``tests/fixtures/pre_specstore``.  ``python -m specstore store validate`` (quick and ``--deep``),
``open_store`` and ``python -m specstore infer`` must all refuse it, each in one line naming the store.
"""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from factories import index_group, make_checkpoint, make_store
from hypothesis import given, settings
from hypothesis import strategies as st

from specstore.store import StoreCorrupt, open_store, validate
from specstore.store.__main__ import main as store_main
from specstore.store.extents import MAX_FRAMES, index_problems

#: Four clips in one shard: frames [0, 30), [30, 70), [70, 120), [120, 140) in hash order.
LENGTHS = [30, 40, 50, 20]
#: Format-2 stores written before the ``specstore`` namespace (never modified: tests copy them).
PRE_SPECSTORE = Path(__file__).resolve().parents[1] / "fixtures" / "pre_specstore"


def _store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "s.zarr", lengths=LENGTHS)


def _format2(tmp_path: Path) -> Path:
    """A copy of the raw format-2 fixture store (4 clips in shards of 130, 44 and 65 frames; clip 1 ends shard 0)."""
    return Path(shutil.copytree(PRE_SPECSTORE / "store_raw.zarr", tmp_path / "old.zarr"))


def _meta(path: Path) -> dict[str, Any]:
    doc: Any = zarr.open_group(str(path), mode="r").attrs["specstore"]
    return dict(doc)


def _group(path: Path, group: str) -> Any:
    """The zarr group or array ``group`` of the store at ``path``, writable."""
    root: Any = zarr.open_group(str(path), mode="r+")
    return root[group]


def _edit_commit(path: Path, **values: Any) -> None:
    meta = _meta(path)
    meta["commit"] = {k: v for k, v in {**meta["commit"], **values}.items() if v is not None}
    zarr.open_group(str(path), mode="r+").attrs["specstore"] = meta


def _index_of(path: Path) -> str:
    """The group holding the whole committed index: format 2's ``commit.index``, else the one segment."""
    commit = _meta(path)["commit"]
    return str(commit["index"]) if "index" in commit else index_group(path)


def _edit_index(path: Path, column: str, row: int, value: Any) -> None:
    """Overwrite one value of a committed index column in place, with plain zarr."""
    arr = _group(path, _index_of(path))[column]
    values = arr[...]
    values[row] = value
    arr[...] = values


def _paths(path: Path) -> list[str]:
    return [str(p) for p in _group(path, _index_of(path))["path"][...]]


def _wrap(path: Path) -> None:
    """Clip 1 claims frames 2**62 .. 2**63: each value is in range, their int64 sum is -2**63."""
    _edit_index(path, "offset", 1, 2 ** 62)
    _edit_index(path, "n_frames", 1, 2 ** 62)


def _same_path_adjacent(path: Path) -> None:
    _edit_index(path, "path", 2, _paths(path)[1])


def _same_path_apart(path: Path) -> None:
    _edit_index(path, "path", 3, _paths(path)[0])


#: Each defect: how to make it, and words of the line that refuses it.
DEFECTS = {
    "offset = n_frames = 2**62": (_wrap, r"clip 1 \(.*\) claims frames 4611686018427387904\.\.9223372036854775808 "
                                         r"of shard \w+, which holds 140 frames"),
    "a path twice, adjacent": (_same_path_adjacent, r"clip 2 \(.*\) has the same path as clip 1"),
    "a path twice, apart": (_same_path_apart, r"clip 3 \(.*\) has the same path as clip 0"),
    "n_clips": (lambda p: _edit_commit(p, n_clips=5), "the index has 4 rows but the commit records n_clips = 5"),
    "n_errors": (lambda p: _edit_commit(p, n_errors=2),
                 "the error table has 0 rows but the commit records n_errors = 2"),
    "NaN duration": (lambda p: _edit_index(p, "duration", 2, math.nan), r"clip 2 \(.*\) lasts nan s"),
    "infinite duration": (lambda p: _edit_index(p, "duration", 0, math.inf), r"clip 0 \(.*\) lasts inf s"),
    "negative duration": (lambda p: _edit_index(p, "duration", 3, -1.5), r"clip 3 \(.*\) lasts -1.5 s"),
    "zero duration": (lambda p: _edit_index(p, "duration", 1, 0.0), r"clip 1 \(.*\) lasts 0.0 s"),
}


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_validate_and_open_store_refuse_it_in_one_line(tmp_path: Path, defect: str, capsys) -> None:
    make, message = DEFECTS[defect]
    path = _store(tmp_path)
    make(path)
    for deep in (False, True):
        problems = validate(str(path), deep=deep)
        assert len(problems) == 1 and str(path) in problems[0] and re.search(message, problems[0]), problems
    assert store_main(["validate", str(path)]) == 1
    assert capsys.readouterr().err.count("invalid: ") == 1
    with pytest.raises(StoreCorrupt, match=message) as err:
        open_store(path)
    assert "\n" not in str(err.value) and str(err.value).startswith(f"store {path}: ")


@pytest.mark.parametrize("defect", ["offset = n_frames = 2**62", "a path twice, adjacent", "n_clips", "NaN duration"])
def test_infer_predict_refuses_it_in_one_line_and_writes_nothing(tmp_path: Path, defect: str, capsys) -> None:
    from specstore.infer.cli import main as infer_main

    make, message = DEFECTS[defect]
    path = _store(tmp_path)
    make(path)
    model = make_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "p.csv"
    assert infer_main(["predict", str(path), str(model), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and re.search(message, err[0]), err
    assert not out.exists()


def test_a_wrapping_extent_in_an_old_commit_is_refused_at_open_not_read_as_empty(tmp_path: Path) -> None:
    """Without recorded shard frame counts (format 2, before they were recorded) nothing but 2**62 bounds an
    extent's end; 2**62 + 2**62 passes it."""
    path = _format2(tmp_path)
    _edit_commit(path, shard_frames=None)
    assert open_store(path).metadata.commit.shard_frames is None
    _wrap(path)
    with pytest.raises(StoreCorrupt, match=r"clip 1 \(.*\) claims frames 4611686018427387904\.\."
                                           r"9223372036854775808, past frame 4611686018427387904"):
        open_store(path)
    assert validate(str(path))


def test_a_shard_frame_count_beyond_int64_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """The segment's shard table as a uint64 column (its kind is an integer's, so it is read) holding 2**64 - 1."""
    path = _store(tmp_path)
    shards = _group(path, f"{index_group(path)}/shards")
    assert shards["n_frames"].shape == (1,)
    del shards["n_frames"]
    shards.create_array("n_frames", shape=(1,), dtype=np.uint64)[...] = np.array([2 ** 64 - 1], dtype=np.uint64)
    s = open_store(path)
    with pytest.raises(StoreCorrupt, match=f"holds 140 frames but commit {s.generation} records {2 ** 64 - 1}") as e:
        s[0]
    assert "\n" not in str(e.value)
    assert validate(str(path))


def test_a_format_2_shard_frame_count_beyond_int64_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    """Format 2 records the counts in the root document's JSON, where any integer fits."""
    path = _format2(tmp_path)
    frames = _meta(path)["commit"]["shard_frames"]
    _edit_commit(path, shard_frames=[2 ** 70, *frames[1:]])
    with pytest.raises(StoreCorrupt, match=f"holds {frames[0]} frames but commit 1 records {2 ** 70}") as e:
        open_store(path)[0]
    assert "\n" not in str(e.value)
    assert validate(str(path))


def test_stores_as_written_pass_and_unsorted_unique_paths_are_not_a_problem(tmp_path: Path) -> None:
    path = _store(tmp_path)
    assert validate(str(path)) == [] and len(open_store(path)) == 4
    paths = _paths(path)
    _edit_index(path, "path", 0, paths[3] + "z")  # now after every other path: the rows are not sorted
    s = open_store(path)
    assert s.paths[0] == paths[3] + "z" and validate(str(path)) == []


# -- the vectorised extent checks against exact (Python int) arithmetic near 2**62 ------------------------------------

_BIG = st.sampled_from([-1, 0, 1, 5, MAX_FRAMES - 5, MAX_FRAMES - 1, MAX_FRAMES, MAX_FRAMES + 1, 2 ** 63 - 1])


def _exact(rows: list[tuple[int, int]], frames: int | None) -> bool:
    """Whether every extent ends inside its shard (or at most at 2**62) and no two share a frame."""
    end = MAX_FRAMES if frames is None else min(frames, MAX_FRAMES)
    if not all(0 <= off and n >= 1 and off + n <= end for off, n in rows):
        return False
    spans = sorted(rows)
    return all(a[0] + a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_BIG, _BIG), max_size=4),
       st.one_of(st.none(), _BIG.filter(lambda f: f >= 0), st.just(2 ** 70)))
def test_extent_checks_never_wrap(rows: list[tuple[int, int]], frames: int | None) -> None:
    rows = list(dict.fromkeys(rows))  # identical extents are legal only with one hash; keep them distinct
    offset, n_frames = (np.array([r[k] for r in rows], dtype=np.int64) for k in (0, 1))
    found = index_problems(np.zeros(len(rows), dtype=np.int64), offset, n_frames, np.zeros(len(rows)),
                           [f"h{k}" for k in range(len(rows))], shard_names=["s0"], n_labels=1,
                           shard_frames=None if frames is None else [frames])
    assert (not found) == _exact(rows, frames), found
