"""Index segments: a commit writes what it adds, the merged index is the same however it is cut, labels are
numbered by name, and a commit interrupted anywhere leaves the previous one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from specstore.store import ErrorRow, FeatureSpec, IndexRow, StoreWriter, create_store, open_store, validate
from specstore.store.segments import MAX_SEGMENTS, merge_count

SPECS = {"mel": FeatureSpec.mel(n_bins=4)}


def _clip(rng: np.random.Generator, n: int = 3) -> np.ndarray:
    return rng.normal(-40, 9, (n, 4)).astype(np.float32)


def _add(w: StoreWriter, rng: np.random.Generator, paths: list[str], label: str | None = None) -> None:
    w.add_clips([{"path": p, "hash": f"h-{p}", "duration": 1.0, "label": label} for p in paths],
                {"mel": [_clip(rng, 2 + i % 3) for i in range(len(paths))]})


# -- the merge policy ---------------------------------------------------------------------------------------
def test_one_row_commits_keep_few_segments_and_rewrite_each_entry_a_few_times() -> None:
    """The policy as a binary counter: after n one-entry commits, at most log2(n) + 1 segments, and every
    entry rewritten at most log2(n) + 1 times."""
    sizes: list[int] = []
    written = 0
    n = 5000
    for _ in range(n):
        k = merge_count(sizes, 1)
        merged = sum(sizes[len(sizes) - k:]) + 1
        written += merged
        sizes = [*sizes[:len(sizes) - k], merged]
        assert len(sizes) <= np.log2(n) + 1
    assert sum(sizes) == n and written <= n * (np.log2(n) + 1)


def test_the_segment_cap_merges_older_segments() -> None:
    sizes = [2 ** (40 - i) for i in range(MAX_SEGMENTS)]  # no carry: each holds more than what follows
    k = merge_count(sizes, 1)
    assert len(sizes) - k + 1 <= MAX_SEGMENTS and k >= 1


# -- what a commit writes -----------------------------------------------------------------------------------
def test_a_commit_writes_what_it_adds_and_the_root_lists_no_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    w = create_store(tmp_path / "s.zarr", SPECS)
    for k in range(40):
        _add(w, rng, [f"a/{k:03d}-{j}.wav" for j in range(8)], "a")
    root_doc = (tmp_path / "s.zarr" / "zarr.json").read_text()
    meta = json.loads(root_doc)["attributes"]["specstore"]
    assert "shards" not in meta["commit"] and meta["commit"]["n_shards"] == 40
    before = len(root_doc)
    _add(w, rng, ["b/one.wav"], "b")
    commit = w.metadata.commit
    assert commit.segment_sizes[-1] <= 2 * (1 + 1)  # its row and its shard, or those merged with one like it
    assert len((tmp_path / "s.zarr" / "zarr.json").read_text()) < before + 200  # the root grows by a label
    assert w.index_segments == len(commit.segments or ()) <= 8
    w.close()
    s = open_store(tmp_path / "s.zarr")
    assert len(s) == 321 and len(s.shards) == 41 and validate(tmp_path / "s.zarr") == []


def test_a_commit_interrupted_before_its_root_write_leaves_the_previous_commit(tmp_path: Path, monkeypatch) -> None:
    rng = np.random.default_rng(1)
    w = create_store(tmp_path / "s.zarr", SPECS)
    _add(w, rng, ["a.wav", "b.wav"], "x")
    gen = w.metadata.commit.generation

    def crash(*a: Any, **kw: Any) -> None:
        raise OSError("power cut")

    monkeypatch.setattr(type(w._root.attrs), "update", crash)
    with pytest.raises(OSError, match="power cut"):
        _add(w, rng, ["c.wav"], "x")
    monkeypatch.undo()
    w.close()
    assert (tmp_path / "s.zarr" / "index" / f"s{gen + 1:06d}").is_dir()  # the segment no commit names
    s = open_store(tmp_path / "s.zarr")
    assert s.paths == ["a.wav", "b.wav"] and s.generation == gen
    with StoreWriter.open(tmp_path / "s.zarr") as w2:
        w2.remove_orphans()
        _add(w2, rng, ["d.wav"], "x")
    assert open_store(tmp_path / "s.zarr").paths == ["a.wav", "b.wav", "d.wav"]
    assert validate(tmp_path / "s.zarr") == []


# -- labels ------------------------------------------------------------------------------------------------
def test_labels_are_numbered_by_name_whatever_order_they_are_committed_in(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    names = {}
    for order in (["rock", "techno", "reggae"], ["techno", "reggae", "rock"]):
        where = tmp_path / "-".join(order)
        with create_store(where, SPECS) as w:
            assert w.add_labels(["rock", "reggae", "techno"]) == ["reggae", "rock", "techno"]
            for lab in order:
                _add(w, rng, [f"{lab}/x.wav"], lab)
            assert w.drop_unused_labels() == []
        names[where] = open_store(where).label_names
        assert json.loads((where / "zarr.json").read_text())["attributes"]["specstore"]["commit"][
            "label_numbering"] == {"rule": "sorted-per-run", "since": 0}
    assert list(names.values()) == [["reggae", "rock", "techno"]] * 2


def test_labels_a_later_run_adds_come_after_sorted_and_earlier_ids_are_kept(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    with create_store(tmp_path / "s.zarr", SPECS) as w:
        w.add_labels(["rock", "jazz"])
        _add(w, rng, ["rock/a.wav"], "rock")
        _add(w, rng, ["jazz/a.wav"], "jazz")
    with StoreWriter.open(tmp_path / "s.zarr") as w:
        w.add_labels(["rock", "jazz", "zouk", "blues"])
        _add(w, rng, ["zouk/a.wav"], "zouk")
        _add(w, rng, ["blues/a.wav"], "blues")
    s = open_store(tmp_path / "s.zarr")
    assert s.label_names == ["jazz", "rock", "blues", "zouk"]
    assert {p: s.label_names[lab] for p, lab in zip(s.paths, s.labels.tolist(), strict=True)} == {
        "blues/a.wav": "blues", "jazz/a.wav": "jazz", "rock/a.wav": "rock", "zouk/a.wav": "zouk"}


@pytest.mark.parametrize("failed", ["zouk", "blues"])  # the last label, or one in the middle
def test_a_label_whose_files_all_failed_gets_no_id(tmp_path: Path, failed: str) -> None:
    rng = np.random.default_rng(4)
    labels = ["blues", "rock", "zouk"]
    with create_store(tmp_path / "s.zarr", SPECS) as w:
        w.add_labels(labels)
        for lab in labels:
            if lab == failed:
                w.commit(errors=[ErrorRow(f"{lab}/a.wav", "not audio")])
            else:
                _add(w, rng, [f"{lab}/a.wav", f"{lab}/b.wav"], lab)
        assert w.drop_unused_labels() == [failed]
    s = open_store(tmp_path / "s.zarr")
    assert s.label_names == [n for n in labels if n != failed] and validate(tmp_path / "s.zarr") == []
    assert all(s.label_names[lab] == p.split("/")[0] for p, lab in zip(s.paths, s.labels.tolist(), strict=True))
    assert dict(s.errors) == {f"{failed}/a.wav": "not audio"}


# -- the merged index equals a model of it, whatever the commits --------------------------------------------
PATHS = [f"{d}/{f}.wav" for d in ("a", "b", "c") for f in range(4)]


class IndexMachine(RuleBasedStateMachine):
    """Random commits (new clips, copies, errors, removals, cleared errors), reopened writers and compactions:
    the store always reads as a plain dict model of its index and error table."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, tuple[str, str | None]] = {}  # path -> (content, label)
        self.errors: dict[str, str] = {}
        self.rng = np.random.default_rng(0)
        self.k = 0

    @initialize(where=st.just(None))
    def start(self, where: None) -> None:
        import tempfile

        self.dir = Path(tempfile.mkdtemp(prefix="specstore-segments-"))
        self.path = self.dir / "s.zarr"
        self.w = create_store(self.path, SPECS)

    def teardown(self) -> None:
        import shutil

        self.w.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(paths=st.lists(st.sampled_from(PATHS), min_size=1, max_size=4, unique=True),
          label=st.sampled_from([None, "x", "y", "z"]))
    def add_clips(self, paths: list[str], label: str | None) -> None:
        self.k += 1
        rows = [{"path": p, "hash": f"h{self.k}-{i}", "duration": 1.0, "label": label} for i, p in enumerate(paths)]
        self.w.add_clips(rows, {"mel": [_clip(self.rng) for _ in rows]})
        for r in rows:
            self.rows[r["path"]] = (r["hash"], label)
            self.errors.pop(r["path"], None)

    @rule(path=st.sampled_from(PATHS), data=st.data())
    def copy(self, path: str, data: st.DataObject) -> None:
        held = sorted({h for h, _ in self.rows.values()})  # a content an indexed row holds
        if not held:
            return
        content = data.draw(st.sampled_from(held))
        self.w.commit(rows=[IndexRow(path, content, "y")])
        self.rows[path] = (content, "y")
        self.errors.pop(path, None)

    @rule(path=st.sampled_from(PATHS))
    def fail(self, path: str) -> None:
        self.w.commit(errors=[ErrorRow(path, f"bad {path}")])
        self.rows.pop(path, None)
        self.errors[path] = f"bad {path}"

    @rule(paths=st.lists(st.sampled_from(PATHS), max_size=3))
    def remove(self, paths: list[str]) -> None:
        self.w.commit(remove=paths)
        for p in paths:
            self.rows.pop(p, None)
            self.errors.pop(p, None)

    @rule(path=st.sampled_from(PATHS))
    def clear(self, path: str) -> None:
        self.w.commit(clear_errors=[path])
        self.errors.pop(path, None)

    @rule()
    def reopen(self) -> None:
        self.w.close()
        self.w = StoreWriter.open(self.path)

    @rule()
    def compact(self) -> None:
        self.w.compact()
        assert self.w.index_segments <= 1

    @invariant()
    def reads_as_the_model(self) -> None:
        if not hasattr(self, "w"):
            return
        s = open_store(self.path)
        got = {p: (h, s.label_names[lab] if lab >= 0 else None)
               for p, h, lab in zip(s.paths, s.hashes, s.labels.tolist(), strict=True)}
        assert got == self.rows and s.paths == sorted(s.paths)
        assert dict(s.errors) == self.errors and [p for p, _ in s.errors] == sorted(self.errors)
        assert {p: (r.hash, r.label) for p, r in self.w.committed_rows().items()} == self.rows
        assert self.w.committed_errors() == self.errors


IndexMachine.TestCase.settings = settings(max_examples=25, stateful_step_count=20, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
TestIndexMachine = IndexMachine.TestCase


def test_validate_holds_after_random_commits(tmp_path: Path) -> None:
    """One long run of mixed commits keeps the store valid and as many segments as the policy allows."""
    rng = np.random.default_rng(5)
    with create_store(tmp_path / "s.zarr", SPECS) as w:
        for k in range(60):
            _add(w, rng, [f"{k % 7}/{k}.wav"], f"l{k % 3}")
            if k % 11 == 0:
                w.commit(errors=[ErrorRow(f"bad/{k}.wav", "empty file")], remove=[f"{(k - 5) % 7}/{k - 5}.wav"])
        assert w.index_segments <= np.log2(2 * 60 + 10) + 1
    assert validate(tmp_path / "s.zarr", deep=True) == []
