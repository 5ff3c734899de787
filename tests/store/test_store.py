"""The store format: round trips, layouts, commits, validation, concurrency of readers."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from specstore.store import (
    FeatureSpec,
    IndexRow,
    SpecMismatch,
    StoreCorrupt,
    StoreNotFound,
    create_store,
    open_store,
    validate,
    write_shard,
)
from specstore.store.__main__ import main as store_main

SPECS = {"mel": FeatureSpec.mel(n_bins=16), "cqt": FeatureSpec.cqt(n_bins=12)}


def _clip(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "mel": rng.normal(-40, 15, (n, 16)).astype(np.float32),
        "cqt": rng.normal(-50, 10, (n, 12)).astype(np.float32),
    }


def _add(writer, rng, names_lengths, label="rock"):
    clips = [_clip(rng, n) for _, n in names_lengths]
    rows = [{"path": p, "hash": f"h-{p}", "duration": n * 512 / 22050, "label": label} for p, n in names_lengths]
    writer.add_clips(rows, {k: [c[k] for c in clips] for k in SPECS})
    return {p: c for (p, _), c in zip(names_lengths, clips, strict=False)}


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_round_trip_values_and_index(tmp_path: Path, layout: str) -> None:
    rng = np.random.default_rng(1)
    w = create_store(tmp_path / "s.zarr", SPECS, layout=layout)
    data = _add(w, rng, [("b/1.wav", 7), ("a/2.flac", 300), ("c/3.mp3", 1)])
    s = open_store(tmp_path / "s.zarr")
    assert len(s) == 3 and s.paths == sorted(data)  # rows sorted by path
    for i, p in enumerate(s.paths):
        assert s.lengths[i] == data[p]["mel"].shape[0]
        np.testing.assert_array_equal(s[i], data[p]["mel"].astype(np.float16).T)
        np.testing.assert_array_equal(s.feature("cqt")[i], data[p]["cqt"].astype(np.float16).T)
        assert s[i].shape == (16, s.lengths[i])
    assert s.label_names == ["rock"] and (s.labels == 0).all()
    assert s.durations == pytest.approx(s.lengths * 512 / 22050)
    assert validate(str(tmp_path / "s.zarr")) == []


def test_raw_local_reads_are_zero_copy_mmap(tmp_path: Path) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    _add(w, np.random.default_rng(2), [("x.wav", 50)])
    s = open_store(tmp_path / "s.zarr")
    a = s.feature("mel").frames(0)
    base: Any = a
    while getattr(base, "base", None) is not None:
        base = base.base
    import mmap

    assert isinstance(base, mmap.mmap)
    assert not a.flags.writeable


def test_raw_and_zstd_read_identical_values(tmp_path: Path) -> None:
    stores = {}
    for layout in ("raw", "zstd"):
        w = create_store(tmp_path / f"{layout}.zarr", SPECS, layout=layout)
        _add(w, np.random.default_rng(3), [("a.wav", 5000), ("b.wav", 9000)])
        stores[layout] = open_store(tmp_path / f"{layout}.zarr")
    for i in range(2):
        np.testing.assert_array_equal(stores["raw"][i], stores["zstd"][i])
    size = lambda p: sum(f.stat().st_size for f in p.rglob("*") if f.is_file())  # noqa: E731
    assert size(tmp_path / "zstd.zarr") < size(tmp_path / "raw.zarr")


def test_duplicates_share_data_and_labels_are_per_path(tmp_path: Path) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    data = _add(w, np.random.default_rng(4), [("rock/a.wav", 20)])
    w.commit(rows=[IndexRow("jazz/copy.wav", "h-rock/a.wav", "jazz")])
    s = open_store(tmp_path / "s.zarr")
    assert s.paths == ["jazz/copy.wav", "rock/a.wav"]
    np.testing.assert_array_equal(s[0], s[1])
    np.testing.assert_array_equal(s[1], data["rock/a.wav"]["mel"].astype(np.float16).T)
    assert [s.label_names[k] for k in s.labels] == ["jazz", "rock"]
    assert s.hashes[0] == s.hashes[1]


def test_unknown_hash_is_refused(tmp_path: Path) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    with pytest.raises(Exception, match="in no shard"):
        w.commit(rows=[IndexRow("a.wav", "nope")])


def test_uncommitted_shard_is_invisible_and_removed_as_orphan(tmp_path: Path) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    _add(w, np.random.default_rng(5), [("a.wav", 10)])
    c = _clip(np.random.default_rng(6), 12)
    info = write_shard(str(tmp_path / "s.zarr"), {k: [c[k]] for k in SPECS}, ["hx"], [0.3])
    s = open_store(tmp_path / "s.zarr")
    assert len(s) == 1 and info.name not in s.shards
    assert validate(str(tmp_path / "s.zarr")) == []
    assert w.remove_orphans() == [info.name]
    assert not (tmp_path / "s.zarr" / "shards" / info.name).exists()


def test_a_reader_whose_index_was_pruned_meanwhile_opens_the_newer_commit(tmp_path: Path, monkeypatch) -> None:
    """A reader slow enough for a writer to commit KEEP_GENERATIONS times reads the newer commit, no error."""
    import specstore.store.reader as reader
    from specstore.store.metadata import load_metadata

    w = create_store(tmp_path / "s.zarr", SPECS)
    rng = np.random.default_rng(12)
    _add(w, rng, [("a.wav", 5)])
    stale = load_metadata(reader.as_location(tmp_path / "s.zarr"))  # generation 1, read "before" the commits
    for k in range(4):
        _add(w, rng, [(f"b{k}.wav", 5)])
    real, calls = reader.open_root, []

    def slow_open_root(loc, mode):
        root, meta = real(loc, mode)
        calls.append(meta.commit.generation)
        return (root, stale) if len(calls) == 1 else (root, meta)

    monkeypatch.setattr(reader, "open_root", slow_open_root)
    s = open_store(tmp_path / "s.zarr")
    assert len(s) == 5 and calls == [5, 5]


@pytest.mark.slow
def test_reader_snapshot_is_stable_while_writer_commits(tmp_path: Path) -> None:
    from specstore.store.layout import KEEP_GENERATIONS
    from specstore.store.location import as_location
    from specstore.store.metadata import load_metadata
    from specstore.store.reader import Store

    w = create_store(tmp_path / "s.zarr", SPECS)
    rng = np.random.default_rng(7)
    first = _add(w, rng, [("a0.wav", 30)])
    s = open_store(tmp_path / "s.zarr")
    stop = threading.Event()
    failures: list[str] = []

    def read_loop() -> None:
        while not stop.is_set():
            r = open_store(tmp_path / "s.zarr")
            if validate(str(tmp_path / "s.zarr")):
                failures.append("invalid during write")
            for i in range(len(r)):
                if r[i].shape[1] != r.lengths[i]:
                    failures.append("length mismatch")

    t = threading.Thread(target=read_loop)
    t.start()
    docs = []  # the root document as a reader read it after each commit
    for k in range(1, 12):
        _add(w, rng, [(f"a{k}.wav", 10 + k)])
        docs.append(load_metadata(as_location(tmp_path / "s.zarr")))
    stop.set()
    t.join()
    assert failures == []
    assert len(s) == 1  # the old snapshot still reads its own committed state
    np.testing.assert_array_equal(s[0], first["a0.wav"]["mel"].astype(np.float16).T)
    assert len(open_store(tmp_path / "s.zarr")) == 12
    # segments merged away are pruned; those the current commit and the KEEP_GENERATIONS - 1 before it name are
    # kept (`history`), so a reader that read one of those root documents still opens the index it names
    commit = docs[-1].commit
    assert commit.segments is not None and commit.segments[-1] == f"index/s{commit.generation:06d}"
    assert len(commit.history) == KEEP_GENERATIONS - 1
    named = {*commit.segments, *(g for h in commit.history for g in h)}
    on_disk = {f"index/{p.name}" for p in (tmp_path / "s.zarr" / "index").iterdir() if p.is_dir()}
    assert on_disk == named and len(on_disk) < commit.generation
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="r")
    for meta in docs[-KEEP_GENERATIONS:]:
        assert len(Store(as_location(tmp_path / "s.zarr"), root, meta)) == meta.commit.generation


def test_errors_table_and_recovery(tmp_path: Path) -> None:
    from specstore.store import ErrorRow

    w = create_store(tmp_path / "s.zarr", SPECS)
    w.commit(errors=[ErrorRow("bad.wav", "empty file"), ErrorRow("x.mp3", "broken symlink")])
    assert open_store(tmp_path / "s.zarr").errors == [("bad.wav", "empty file"), ("x.mp3", "broken symlink")]
    _add(w, np.random.default_rng(8), [("bad.wav", 9)])  # fixed file indexed: leaves the error table
    s = open_store(tmp_path / "s.zarr")
    assert s.errors == [("x.mp3", "broken symlink")] and s.paths == ["bad.wav"]


def test_spec_mismatch_and_layout_mismatch_refused(tmp_path: Path) -> None:
    create_store(tmp_path / "s.zarr", SPECS)
    with pytest.raises(SpecMismatch, match="mel.n_bins: 16 != 32"):
        create_store(tmp_path / "s.zarr", {"mel": FeatureSpec.mel(n_bins=32), "cqt": SPECS["cqt"]})
    with pytest.raises(SpecMismatch, match="layout"):
        create_store(tmp_path / "s.zarr", SPECS, layout="zstd")
    create_store(tmp_path / "s.zarr", SPECS)  # same specs: reopens


def test_compute_versions_old_stores_resume_newer_ones_are_refused(tmp_path: Path) -> None:
    from specstore.store import COMPUTE_VERSION

    legacy = {k: {f: v for f, v in s.to_dict().items() if f != "compute_version"} for k, s in SPECS.items()}
    old = {k: FeatureSpec.from_dict(d) for k, d in legacy.items()}
    assert {s.compute_version for s in old.values()} == {1} and SPECS["mel"].compute_version == COMPUTE_VERSION
    create_store(tmp_path / "s.zarr", old)  # a store written before the field existed
    create_store(tmp_path / "s.zarr", SPECS)  # resumed by this computation: same values (tested in test_features)
    assert open_store(tmp_path / "s.zarr").specs["mel"].compute_version == 1  # it keeps saying what made it
    other = {k: FeatureSpec.from_dict({**d, "compute_version": 99}) for k, d in legacy.items()}
    with pytest.raises(SpecMismatch, match=r"compute_version: 1 != 99 \(values computed differently"):
        create_store(tmp_path / "s.zarr", other)


def test_missing_and_foreign_stores_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFound, match="no store at"):
        open_store(tmp_path / "nothing.zarr")
    zarr.open_group(str(tmp_path / "plain.zarr"), mode="w")
    with pytest.raises(StoreCorrupt, match="not a specstore store"):
        open_store(tmp_path / "plain.zarr")
    meta = tmp_path / "v.zarr"
    create_store(meta, SPECS)
    doc = json.loads((meta / "zarr.json").read_text())
    doc["attributes"]["specstore"]["format_version"] = 99
    (meta / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(StoreCorrupt, match="format version 99"):
        open_store(meta)


def test_validate_detects_damage(tmp_path: Path) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    _add(w, np.random.default_rng(9), [("a.wav", 40), ("b.wav", 40)])
    s = open_store(tmp_path / "s.zarr")
    chunk = tmp_path / "s.zarr" / "shards" / s.shards[0] / "mel" / "c" / "0" / "0"
    chunk.write_bytes(chunk.read_bytes()[: 16 * 2 * 50])  # truncate to 50 frames
    problems = validate(str(tmp_path / "s.zarr"))
    assert any(s.shards[0] in p and "chunk 0 has 1600 bytes" in p for p in problems), problems
    assert store_main(["validate", str(tmp_path / "s.zarr")]) == 1


def test_cli_info_and_validate(tmp_path: Path, capsys) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    _add(w, np.random.default_rng(10), [("a.wav", 40)])
    assert store_main(["validate", str(tmp_path / "s.zarr"), "--deep"]) == 0
    assert store_main(["info", str(tmp_path / "s.zarr")]) == 0
    out = capsys.readouterr().out
    assert "clips:    1" in out and "mel (16 bins, float16)" in out
    assert store_main(["info", str(tmp_path / "missing.zarr")]) == 2
    assert "no store at" in capsys.readouterr().err


#: Files opened while a test spies on them (``None``: nobody is spying); see :func:`_spy_on_opened_files`.
_OPENED: list[str] | None = None
_HOOKED = False


def _record_open(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, bytes, Path)):
        _OPENED.append(args[0].decode() if isinstance(args[0], bytes) else str(args[0]))


def _spy_on_opened_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file the process opens from now to the test's end (the ``open`` audit event: ``open()``,
    ``Path.read_bytes``, ``os.open``: zarr's local store, the index's own column reader, numpy's memmap).
    An audit hook cannot be removed, so one is added once and records only while a test spies."""
    global _HOOKED
    if not _HOOKED:
        sys.addaudithook(_record_open)
        _HOOKED = True
    opened: list[str] = []
    monkeypatch.setattr(sys.modules[__name__], "_OPENED", opened)
    return opened


def test_opening_reads_no_feature_data(tmp_path: Path, monkeypatch) -> None:
    w = create_store(tmp_path / "s.zarr", SPECS)
    rng = np.random.default_rng(11)
    for k in range(5):
        _add(w, rng, [(f"{k}-{j}.wav", 5) for j in range(20)])
    store = (tmp_path / "s.zarr").resolve()
    opened = _spy_on_opened_files(monkeypatch)
    s = open_store(store)
    assert len(s) == 100
    inside = [Path(p).resolve().relative_to(store).parts for p in opened if Path(p).resolve().is_relative_to(store)]
    assert any(p[0] == "index" and p[-1] == "0" for p in inside), inside  # the spy sees the index's chunks read
    assert not any(p[0] == "shards" for p in inside), [p for p in inside if p[0] == "shards"]
    opened.clear()
    s.feature("cqt")[99]  # and it sees a shard read (the check above can fail)
    assert any(Path(p).resolve().is_relative_to(store / "shards") for p in opened), opened


class StoreModel(RuleBasedStateMachine):
    """Random sequences of commits; the store always equals a plain dict model."""

    def __init__(self) -> None:
        super().__init__()
        import tempfile

        self.dir = Path(tempfile.mkdtemp())
        self.rng = np.random.default_rng(0)
        self.model: dict[str, tuple[str, np.ndarray, str | None]] = {}
        self.contents: dict[str, np.ndarray] = {}

    @initialize(layout=st.sampled_from(["raw", "zstd"]))
    def create(self, layout: str) -> None:
        self.writer = create_store(self.dir / "s.zarr", {"mel": SPECS["mel"]}, layout=layout)

    @rule(
        n=st.integers(1, 4),
        lengths=st.lists(st.integers(1, 60), min_size=4, max_size=4),
        names=st.lists(st.sampled_from("abcdefgh"), min_size=4, max_size=4, unique=True),
        label=st.sampled_from([None, "rock", "jazz"]),
    )
    def add(self, n: int, lengths: list[int], names: list[str], label: str | None) -> None:
        arrays, hashes = [], []
        for k in range(n):
            h = f"c{len(self.contents)}"
            arr = self.rng.normal(-30, 10, (lengths[k], 16)).astype(np.float32)
            self.contents[h] = arr.astype(np.float16)
            arrays.append(arr)
            hashes.append(h)
        info = write_shard(str(self.dir / "s.zarr"), {"mel": arrays}, hashes, [1.0] * n)
        rows = [IndexRow(f"{names[k]}.wav", hashes[k], label) for k in range(n)]
        self.writer.commit([info], rows)
        for r in rows:
            self.model[r.path] = (r.hash, self.contents[r.hash], label)

    @rule(src=st.sampled_from("abcdefgh"), dst=st.sampled_from("abcdefgh"))
    def duplicate(self, src: str, dst: str) -> None:
        if f"{src}.wav" not in self.model:
            return
        h, arr, _ = self.model[f"{src}.wav"]
        self.writer.commit(rows=[IndexRow(f"{dst}.wav", h, None)])
        self.model[f"{dst}.wav"] = (h, arr, None)

    @invariant()
    def matches_model(self) -> None:
        if not hasattr(self, "writer"):
            return
        s = open_store(self.dir / "s.zarr")
        assert s.paths == sorted(self.model)
        for i, p in enumerate(s.paths):
            h, arr, label = self.model[p]
            assert s.hashes[i] == h
            np.testing.assert_array_equal(s.feature("mel").frames(i), arr)
            assert (s.label_names[s.labels[i]] if s.labels[i] >= 0 else None) == label


TestStoreModel = StoreModel.TestCase
TestStoreModel.settings = settings(
    max_examples=12, stateful_step_count=6, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
