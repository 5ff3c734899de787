"""store/FORMAT.md is enough to read a store with plain zarr: a subprocess that never imports `specstore.store`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specstore.store import FeatureSpec, IndexRow, create_store

READER = r'''
import json, sys
import google_crc32c
import numpy as np
import zarr

path = sys.argv[1]
g = zarr.open_group(path, mode="r")
meta = g.attrs["specstore"]
assert meta["format"] == "specstore" and meta["format_version"] == 3
commit = meta["commit"]
rows, bad, shards = {}, {}, []
for name in commit["segments"]:  # oldest first: the newest mention of a path decides
    seg = g[name]
    shards += [str(s) for s in seg["shards/name"][:]]
    for p in seg["gone/path"][:]:
        rows.pop(str(p), None)
        bad.pop(str(p), None)
    for p, reason in zip(seg["errors/path"][:], seg["errors/reason"][:]):
        rows.pop(str(p), None)
        bad[str(p)] = str(reason)
    cols = {c: seg[c][:] for c in ("path", "label", "shard", "offset", "n_frames", "group")}
    for i, p in enumerate(cols["path"]):
        bad.pop(str(p), None)
        rows[str(p)] = {c: cols[c][i] for c in cols}
assert len(rows) == commit["n_clips"] and len(bad) == commit["n_errors"] and len(shards) == commit["n_shards"]
out = []
for p in sorted(rows):
    row = rows[p]
    shard = shards[int(row["shard"])]
    off, n = int(row["offset"]), int(row["n_frames"])
    lab = int(row["label"])
    rec = {"path": p, "label": commit["label_names"][lab] if lab >= 0 else None, "group": str(row["group"])}
    for feat in meta["features"]:
        arr = g[f"shards/{shard}/{feat}"]
        rec[feat] = np.asarray(arr[off:off + n], dtype=np.float32).tolist()
        # every chunk's CRC-32C (of its values, little-endian) is in the shard's attributes
        sums = g[f"shards/{shard}"].attrs["checksums"][feat]
        cf = sums["chunk_frames"]
        for k, crc in enumerate(sums["crc32c"]):
            values = np.ascontiguousarray(arr[k * cf:(k + 1) * cf], dtype=arr.dtype.newbyteorder("<"))
            assert google_crc32c.value(values.tobytes()) == crc, (shard, feat, k)
    out.append(rec)
assert "store" not in sys.modules and "pipeline" not in sys.modules and "specstore" not in sys.modules
print(json.dumps({"clips": out, "errors": sorted(bad)}))
'''


@pytest.mark.parametrize("layout", ["raw", "zstd"])
def test_plain_zarr_reads_what_format_md_describes(tmp_path: Path, layout: str) -> None:
    rng = np.random.default_rng(0)
    specs = {"mel": FeatureSpec.mel(n_bins=8), "cqt": FeatureSpec.cqt(n_bins=6)}
    w = create_store(tmp_path / "s.zarr", specs, layout=layout)
    clips = {
        p: (rng.normal(-40, 9, (n, 8)), rng.normal(-30, 9, (n, 6))) for p, n in [("r/a.wav", 9), ("j/b.ogg", 5000)]
    }
    w.add_clips(
        [{"path": p, "hash": p, "duration": 1.0, "label": p[0], "group": f"work-{p[0]}"} for p in clips],
        {"mel": [c[0] for c in clips.values()], "cqt": [c[1] for c in clips.values()]},
    )
    w.commit(rows=[IndexRow("u/copy.wav", "r/a.wav", None)])
    from specstore.store import ErrorRow

    w.commit(errors=[ErrorRow("bad.wav", "empty file"), ErrorRow("worse.wav", "not audio")])
    w.commit(rows=[IndexRow("gone.wav", "j/b.ogg", "j")])
    w.commit(remove=["gone.wav", "worse.wav"])  # a removal in a later segment hides both tables' rows
    assert w.index_segments > 1  # the recipe merges several segments
    script = tmp_path / "read.py"
    script.write_text(READER)
    res = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "s.zarr")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    assert got["errors"] == ["bad.wav"]
    by_path = {c["path"]: c for c in got["clips"]}
    assert sorted(by_path) == ["j/b.ogg", "r/a.wav", "u/copy.wav"]
    assert by_path["u/copy.wav"]["label"] is None and by_path["r/a.wav"]["label"] == "r"
    assert by_path["r/a.wav"]["group"] == "work-r" and by_path["u/copy.wav"]["group"] == ""
    for p, (mel, cqt) in clips.items():
        np.testing.assert_array_equal(np.array(by_path[p]["mel"]), mel.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(np.array(by_path[p]["cqt"]), cqt.astype(np.float16).astype(np.float32))
    np.testing.assert_array_equal(by_path["u/copy.wav"]["mel"], by_path["r/a.wav"]["mel"])


def test_raw_chunk_file_is_plain_c_order_floats(tmp_path: Path) -> None:
    w = create_store(tmp_path / "s.zarr", {"mel": FeatureSpec.mel(n_bins=8)})
    a = np.random.default_rng(1).normal(-40, 9, (33, 8))
    w.add_clips([{"path": "a.wav", "hash": "h", "duration": 1.0}], {"mel": [a]})
    import zarr

    meta = json.loads((tmp_path / "s.zarr" / "zarr.json").read_text())["attributes"]["specstore"]
    shard = str(zarr.open_group(tmp_path / "s.zarr", mode="r")[meta["commit"]["segments"][0]]["shards/name"][0])
    raw = np.memmap(tmp_path / "s.zarr" / "shards" / shard / "mel" / "c" / "0" / "0", dtype="<f2", mode="r").reshape(
        -1, 8
    )
    np.testing.assert_array_equal(raw, a.astype(np.float16))


def test_format_md_recipe_runs_as_written(tmp_path: Path) -> None:
    """The plain-zarr recipe in store/FORMAT.md, run verbatim (only the store's path replaced), reads clip 0."""
    from specstore.store import open_store

    text = (Path(__file__).parents[2] / "store" / "FORMAT.md").read_text(encoding="utf-8")
    section = text[text.index("## Reading a clip with plain zarr"):]
    code = section[section.index("```python") + len("```python"):section.index("```", section.index("```python") + 9)]
    w = create_store(tmp_path / "s.zarr", {"mel": FeatureSpec.mel(n_bins=8)})
    rng = np.random.default_rng(2)
    for k in range(3):
        w.add_clips([{"path": f"{k}/a.wav", "hash": f"h{k}", "duration": 1.0, "label": f"l{k}"}],
                    {"mel": [rng.normal(-40, 9, (5 + k, 8))]})
    w.commit(remove=["0/a.wav"])
    w.close()
    script = tmp_path / "recipe.py"
    script.write_text(code.replace('"data/demo.zarr"', repr(str(tmp_path / "s.zarr")))
                      + "\nimport json\nprint(json.dumps({'mel': mel.tolist(), 'label': label}))\n")
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    s = open_store(tmp_path / "s.zarr")
    assert s.paths[0] == "1/a.wav" and got["label"] == "l1"
    np.testing.assert_array_equal(np.asarray(got["mel"], dtype=np.float16), s.feature("mel").frames(0))


@pytest.mark.parametrize("n_frames", [1, 33, 70_000])
def test_a_local_raw_shards_documents_are_the_ones_zarr_writes(tmp_path: Path, n_frames: int) -> None:
    """A raw shard on a local disk writes its zarr.json files itself (store.shard_writer): they must be the
    documents zarr writes for the same group and arrays, so plain zarr and any zarr v3 reader see no difference."""
    import zarr

    from specstore.store import ShardWriter
    from specstore.store.shard_writer import array_options

    specs = {"mel": FeatureSpec.mel(n_bins=8), "cqt": FeatureSpec.cqt(n_bins=12)}
    create_store(tmp_path / "s.zarr", specs).close()
    with ShardWriter(tmp_path / "s.zarr") as w:
        for name, spec in specs.items():
            w.append(name, np.full((n_frames, spec.n_bins), -20.0, dtype=np.float32))
        w.end_clip("h", 1.0)
        info = w.close()
    assert info is not None
    shard = tmp_path / "s.zarr" / "shards" / info.name
    for name, spec in specs.items():
        ref = tmp_path / f"ref-{name}"
        zarr.create_array(zarr.storage.LocalStore(ref), shape=(n_frames, spec.n_bins), dtype=spec.dtype,
                          **array_options("raw", n_frames, spec.n_bins))
        assert json.loads((shard / name / "zarr.json").read_text()) == json.loads((ref / "zarr.json").read_text())
        arr = zarr.open_array(zarr.storage.LocalStore(shard / name), mode="r")
        assert arr.shape == (n_frames, spec.n_bins) and float(arr[n_frames - 1, 0]) == -20.0
    ref_group = tmp_path / "ref-group"
    attrs = json.loads((shard / "zarr.json").read_text())["attributes"]
    zarr.create_group(zarr.storage.LocalStore(ref_group), zarr_format=3, attributes=attrs)
    assert json.loads((shard / "zarr.json").read_text()) == json.loads((ref_group / "zarr.json").read_text())
    assert attrs["complete"] is True and attrs["n_frames"] == n_frames and list(attrs)[:2] == ["complete", "created"]


def _files(root: Path) -> dict[str, object]:
    """Every file under ``root``: parsed JSON for ``zarr.json``, bytes for chunks."""
    return {str(p.relative_to(root)): json.loads(p.read_text()) if p.name == "zarr.json" else p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("n_rows", [0, 1, 257])
def test_a_local_commits_index_files_are_the_ones_zarr_writes(tmp_path: Path, n_rows: int) -> None:
    """A commit on a local disk writes its index tables as files (store.table, store.zarr_files): every
    document and every compressed chunk must be what zarr writes for the same columns."""
    import zarr

    from specstore.store.layout import ERROR_COLUMNS, INDEX_COLUMNS
    from specstore.store.table import read_columns, write_columns

    rng = np.random.default_rng(n_rows)
    names = ["rock/t\u00e9st \\xff.wav", "", "jazz/\u4e2d.flac", "a" * 300]
    columns = {name: (np.array([names[i % 4] + str(i) for i in range(n_rows)], dtype=np.dtypes.StringDType())
                      if dt == "str" else (rng.normal(size=n_rows) * 1e6).astype(dt))
               for name, dt in INDEX_COLUMNS.items()}
    errors = {"path": columns["path"][: n_rows // 2], "reason": columns["group"][: n_rows // 2]}
    for where, local in (("ours", True), ("zarr", False)):
        root = zarr.open_group(zarr.storage.LocalStore(tmp_path / where), mode="w")
        root.create_group("index")  # a store has it from its creation on
        (tmp_path / where / "index" / "g000001" / "stale").mkdir(parents=True)  # replaced, as zarr's overwrite does
        write_columns(root, "index/g000001", columns, INDEX_COLUMNS, tmp_path / where if local else None)
        write_columns(root, "index/g000001/errors", errors, ERROR_COLUMNS, tmp_path / where if local else None)
    assert _files(tmp_path / "ours" / "index") == _files(tmp_path / "zarr" / "index")
    back = read_columns(zarr.open_group(tmp_path / "ours", mode="r"), "index/g000001", INDEX_COLUMNS)
    for name, values in columns.items():
        assert back[name].tolist() == values.tolist()


def test_index_columns_go_through_zarr_when_its_documents_differ(tmp_path: Path, monkeypatch) -> None:
    """Another zarr version may choose other codecs for a column: the table is then written by zarr itself."""
    import zarr

    import specstore.store.table as table
    from specstore.store.layout import ERROR_COLUMNS

    real = table._template
    monkeypatch.setattr(table, "_template", lambda dtype: real(dtype).replace('"level": 3', '"level": 5'))
    columns = {"path": np.array(["a.wav", "b.wav"], dtype=np.dtypes.StringDType()),
               "reason": np.array(["empty file", "broken symlink"], dtype=np.dtypes.StringDType())}
    calls = []
    monkeypatch.setattr(table, "write_group_document", lambda *a: calls.append(a))
    root = zarr.open_group(zarr.storage.LocalStore(tmp_path / "s"), mode="w")
    table.write_columns(root, "t", columns, ERROR_COLUMNS, tmp_path / "s")
    assert calls == []  # not as files
    back = table.read_columns(zarr.open_group(tmp_path / "s", mode="r"), "t", ERROR_COLUMNS)
    assert back["reason"].tolist() == ["empty file", "broken symlink"]
