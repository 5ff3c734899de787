"""Checksummed shards: a damaged chunk is reported, never read back as other data, and repair drops it.

Every fault is tried in both layouts: a deleted chunk (zarr would read its
fill value, zeros), a truncated one (the raw mmap would be a shorter array)
and a bit flip.  Reads raise :class:`StoreCorrupt` naming the shard, quick
validation finds missing and short chunks, deep validation every checksum,
and ``python -m specstore store repair`` drops exactly the damaged shard.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from factories import store_content

from specstore.store import FeatureSpec, ShardWriter, StoreCorrupt, StoreWriter, create_store, open_store, validate
from specstore.store.__main__ import main as store_main
from specstore.store.checksum import crc32c, values_bytes

SPECS = {"mel": FeatureSpec.mel(n_bins=16), "cqt": FeatureSpec.cqt(n_bins=12)}
#: Clip lengths: the long one spans two zstd chunks (4096 frames each).
LENGTHS = {"a/long.wav": 5000, "a/short.wav": 30}


def _store(path: Path, layout: str) -> tuple[Path, str, str]:
    """Two shards: the first holds LENGTHS, the second one more clip. Returns (path, damaged shard, intact shard)."""
    rng = np.random.default_rng(0)
    w = create_store(path, SPECS, layout=layout, label_names=["a", "b"])
    for names in (LENGTHS, {"b/other.wav": 50}):
        clips = [{k: rng.normal(-40, 10, (n, s.n_bins)) for k, s in SPECS.items()} for n in names.values()]
        w.add_clips([{"path": p, "hash": f"h-{p}", "duration": n * 512 / 22050, "label": p[0]}
                     for p, n in names.items()], {k: [c[k] for c in clips] for k in SPECS})
    w.close()
    s = open_store(path)
    first = s.shards[int(s._shard[s.paths.index("a/long.wav")])]
    second = s.shards[int(s._shard[s.paths.index("b/other.wav")])]
    return path, first, second


def _damage(path: Path, shard: str, layout: str, fault: str) -> Path:
    chunk = path / "shards" / shard / "mel" / "c" / ("1" if layout == "zstd" else "0") / "0"
    data = chunk.read_bytes()
    if fault == "deleted":
        chunk.unlink()
    elif fault == "truncated":
        chunk.write_bytes(data[: len(data) // 2])
    else:  # one bit flipped in the middle
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0x10
        chunk.write_bytes(bytes(flipped))
    return chunk


@pytest.mark.parametrize("fault", ["deleted", "truncated", "flipped"])
@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_damaged_chunk_is_reported_and_repaired(tmp_path: Path, layout: str, fault: str, capsys) -> None:
    path, bad, good = _store(tmp_path / "s.zarr", layout)
    before = store_content(path)
    _damage(path, bad, layout, fault)
    s = open_store(path)
    i = s.paths.index("a/long.wav")
    if layout == "raw" and fault == "flipped":
        # the mmap read of a whole-size file cannot see a flipped bit; verify=True and --deep do
        s.feature("mel").frames(i)
        with pytest.raises(StoreCorrupt, match=f"shard {bad}/mel: .*checksum"):
            open_store(path, verify=True).feature("mel").frames(i)
    else:
        with pytest.raises(StoreCorrupt, match=f"shard {bad}"):
            np.asarray(s.feature("mel").frames(i))
    # the intact shard still reads
    j = s.paths.index("b/other.wav")
    assert np.ascontiguousarray(s.feature("mel").frames(j)).tobytes() == before["b/other.wav"][5]
    quick, deep = validate(str(path)), validate(str(path), deep=True)
    if fault == "flipped":
        assert quick == []  # every size is right: only the checksums can tell
    else:
        assert quick and all(bad in p for p in quick), quick
    assert deep and any(bad in p for p in deep), deep
    # repair drops the damaged shard and its paths, nothing else
    assert store_main(["repair", str(path)]) == 0
    out = capsys.readouterr().out
    assert "dropped 1 damaged shard(s) holding 2 path(s)" in out
    assert validate(str(path), deep=True) == []
    after = store_content(path)
    assert sorted(after) == ["b/other.wav"] and after["b/other.wav"] == before["b/other.wav"]
    assert not (path / "shards" / bad).exists()


def test_checksums_are_crc32c_of_the_values(tmp_path: Path) -> None:
    path, bad, _ = _store(tmp_path / "s.zarr", "zstd")
    attrs = json.loads((path / "shards" / bad / "zarr.json").read_text())["attributes"]
    sums = attrs["checksums"]["mel"]
    assert sums["algorithm"] == "crc32c" and sums["chunk_frames"] == 4096 and len(sums["crc32c"]) == 2
    s = open_store(path)
    i = s.paths.index("a/long.wav")
    frames = np.asarray(s.feature("mel").frames(i))
    assert crc32c(values_bytes(frames[:4096], "float16")) == sums["crc32c"][0]
    assert all(n > 0 for n in sums["nbytes"])


def test_corrupt_root_metadata_says_so(tmp_path: Path, capsys) -> None:
    path, _, _ = _store(tmp_path / "s.zarr", "raw")
    (path / "zarr.json").write_text('{"zarr_format": 3, "node_type": "gro')
    with pytest.raises(StoreCorrupt, match="corrupt store metadata"):
        open_store(path)
    assert store_main(["info", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "corrupt store metadata" in err and str(path) in err
    assert any("corrupt store metadata" in p for p in validate(str(path)))


def test_corrupt_shard_metadata_names_the_shard(tmp_path: Path) -> None:
    path, bad, _ = _store(tmp_path / "s.zarr", "raw")
    (path / "shards" / bad / "zarr.json").write_text("{not json")
    with pytest.raises(StoreCorrupt, match=f"shard {bad} has corrupt metadata"):
        open_store(path).feature("mel").frames(0)


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_a_clip_dropped_half_way_leaves_no_trace(tmp_path: Path, layout: str) -> None:
    """ShardWriter.drop_clip rolls back frames already written (a chunk boundary crossed included)."""
    w = create_store(tmp_path / "s.zarr", {"mel": SPECS["mel"]}, layout=layout)
    rng = np.random.default_rng(1)
    a, c = rng.normal(size=(100, 16)), rng.normal(size=(4500, 16))
    with ShardWriter(tmp_path / "s.zarr") as sw:
        sw.append("mel", a)
        sw.end_clip("ha", 1.0)
        for _ in range(3):  # 6000 frames of a clip that then fails
            sw.append("mel", rng.normal(size=(2000, 16)))
        sw.drop_clip()
        sw.append("mel", c[:4000])
        sw.append("mel", c[4000:])
        sw.end_clip("hc", 2.0)
        info = sw.close()
    assert info is not None
    assert [(x.hash, x.offset, x.n_frames) for x in info.clips] == [("ha", 0, 100), ("hc", 100, 4500)]
    from specstore.store import IndexRow

    w.commit([info], [IndexRow("a.wav", "ha"), IndexRow("c.wav", "hc")])
    s = open_store(tmp_path / "s.zarr")
    np.testing.assert_array_equal(s.feature("mel").frames(0), a.astype(np.float16))
    np.testing.assert_array_equal(s.feature("mel").frames(1), c.astype(np.float16))
    assert validate(str(tmp_path / "s.zarr"), deep=True) == []
    chunks = sorted(p.name for p in (tmp_path / "s.zarr" / "shards" / info.name / "mel" / "c").iterdir())
    assert chunks == (["0"] if layout == "raw" else ["0", "1"])  # no stale chunk of the dropped clip


def test_rerun_of_extraction_repairs_a_damaged_store(tmp_path: Path) -> None:
    from factories import SMALL_SPECS, make_corpus

    from specstore.pipeline.extract import extract

    make_corpus(tmp_path / "c", n=4, seconds=1.0)
    extract(tmp_path / "c", str(tmp_path / "s.zarr"), specs=SMALL_SPECS, jobs=1, progress=False, commit_seconds=0)
    expected = store_content(tmp_path / "s.zarr")
    s = open_store(tmp_path / "s.zarr")
    (tmp_path / "s.zarr" / "shards" / s.shards[0] / "cqt" / "c" / "0" / "0").unlink()
    summary = extract(tmp_path / "c", str(tmp_path / "s.zarr"), specs=SMALL_SPECS, jobs=1, progress=False)
    assert summary.repaired >= 1 and summary.decoded == summary.repaired
    assert "repaired" in summary.report()
    got = store_content(tmp_path / "s.zarr")
    assert got == expected and validate(str(tmp_path / "s.zarr"), deep=True) == []


def test_writer_refuses_format_1(tmp_path: Path) -> None:
    path, _, _ = _store(tmp_path / "s.zarr", "raw")
    doc = json.loads((path / "zarr.json").read_text())
    doc["attributes"]["specstore"]["format_version"] = 1
    (path / "zarr.json").write_text(json.dumps(doc))
    with pytest.raises(StoreCorrupt, match="format version 1.*extract the corpus again into a new STORE"):
        StoreWriter.open(path)
