"""Files written before the ``specstore`` namespace still load, give the same logits, open, read the same values,
validate and grow; so do stores written in format 2 after it.

The fixtures are ``tests/fixtures/pre_specstore`` (its README.md), written by its ``make_fixtures.py`` at the
last commit before the namespace; ``expected.json`` / ``expected.npz`` hold what that code read from them.
``tests/fixtures/format2`` holds the same corpus's stores written by the last commit of format 2 (after the
namespace): they must read the same.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from specstore.infer.models.checkpoint import load_checkpoint, read_torch_file
from specstore.infer.train.config import TrainConfig
from specstore.pipeline import extract
from specstore.store import Corpus, StoreWriter, open_store, validate

FIX = next(p / "fixtures" / "pre_specstore" for p in Path(__file__).resolve().parents
           if (p / "fixtures" / "pre_specstore" / "expected.json").is_file())
EXPECTED: dict[str, Any] = json.loads((FIX / "expected.json").read_text(encoding="utf-8"))
MODELS = sorted(EXPECTED["models"])
#: Each store fixture: its folder and name (the format-2 stores written after the namespace hold the same clips).
STORES = [f"{folder}/{n}" for folder in ("pre_specstore", "format2") for n in sorted(EXPECTED["stores"])]
OLD = ("store.", "pipeline.", "infer.", "serving.", "democorpus.", "realcorpus.")


@pytest.fixture(scope="module")
def arrays() -> dict[str, np.ndarray]:
    with np.load(FIX / "expected.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", MODELS)
def test_model_files_record_the_old_import_paths(name: str) -> None:
    """The fixture is what a user's file holds: the old names, as recorded (read raw, before any mapping)."""
    want = EXPECTED["models"][name]
    raw = read_torch_file(FIX / want["file"])["model"]
    assert raw["target"] == want["target"]
    targets = [raw["target"], *(m["model"]["target"] for m in raw.get("kwargs", {}).get("members", []))]
    assert targets == [want["target"], *want["member_targets"]]
    for target in targets:  # a built-in architecture is a bare name; every import path is an old one
        assert ":" not in target or target.startswith(OLD), target
    if name in ("sum", "transfer_musicnn"):
        assert raw["target"].startswith("infer.models."), raw["target"]
    if name == "sum":
        assert want["member_targets"] == ["cnn", "infer.models.transfer:TransferClassifier"]


@pytest.mark.parametrize("name", MODELS)
def test_model_files_load_and_give_the_same_logits(name: str, arrays: dict[str, np.ndarray]) -> None:
    want = EXPECTED["models"][name]
    ckpt = load_checkpoint(FIX / want["file"])  # the recorded import paths are mapped by the loader's table
    assert ckpt.label_names == want["label_names"] and ckpt.feature == want["feature"]
    assert ckpt.n_bins == want["n_bins"] and ckpt.outputs == want["outputs"]
    assert {k: v.to_dict() for k, v in ckpt.specs.items()} == want["specs"]
    if want["temperature"] is None:
        assert ckpt.calibration.temperature is None
    else:
        assert ckpt.calibration.temperature == pytest.approx(want["temperature"], rel=1e-12)
    model = ckpt.build().eval()
    x, lengths = arrays[f"{name}/x"], arrays["lengths"]
    with torch.no_grad():
        got = model(torch.from_numpy(x).transpose(1, 2).unsqueeze(1), torch.from_numpy(lengths)).numpy()
    # the same logits up to float32 rounding, which a thread count can change (logits reach 1e3: ulp 1e-4)
    np.testing.assert_allclose(got, arrays[f"{name}/logits"], rtol=2e-6, atol=1e-5)


@pytest.mark.parametrize("name", ["train.toml", "train_table.toml", "cnn.config.json"])
def test_training_configs_read_the_same(name: str) -> None:
    got = TrainConfig.from_file(FIX / name).to_dict()
    want = EXPECTED["configs"][name]
    assert {k: got.get(k, "<missing>") for k in want} == want


def _content_matches(s: Any, want: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Every recorded row of ``s`` (a store) reads as recorded, frames bit for bit."""
    for path, row in want["rows"].items():
        i = s.paths.index(path)
        label = s.label_names[s.labels[i]] if s.labels[i] >= 0 else None
        assert (s.hashes[i], label, int(s.lengths[i]), float(s.durations[i]), s.groups[i]) == (
            row["hash"], row["label"], row["n_frames"], row["duration"], row["group"]), path
        for f in sorted(s.specs):
            frames, expected = np.asarray(s.feature(f).frames(i)), arrays[f"frames/{f}/{path}"]
            assert frames.dtype == expected.dtype and np.array_equal(frames, expected), (f, path)


def _fixture(name: str, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A copy of fixture store ``name`` (folder/store; the committed one stays untouched) and what it holds."""
    folder, store = name.split("/")
    where = shutil.copytree(FIX.parent / folder / f"{store}.zarr", tmp_path / f"{store}.zarr")
    want = dict(EXPECTED["stores"][store])
    if folder != "pre_specstore":
        want["corpus_root"] = f"/work/main/tests/fixtures/{folder}/corpus"
    return where, want


def test_format2_fixtures_are_format_2() -> None:
    for name in STORES:
        folder, store = name.split("/")
        doc = json.loads((FIX.parent / folder / f"{store}.zarr" / "zarr.json").read_text(encoding="utf-8"))
        assert doc["attributes"]["specstore"]["format_version"] == 2, name


@pytest.mark.parametrize("name", STORES)
def test_stores_open_read_the_same_and_validate(name: str, arrays: dict[str, np.ndarray], tmp_path: Path) -> None:
    where, want = _fixture(name, tmp_path)
    assert validate(str(where), deep=True) == []
    s = open_store(where)
    assert s.layout == want["layout"] and s.label_names == want["label_names"]
    assert {k: v.to_dict() for k, v in s.specs.items()} == want["specs"]
    assert sorted(s.paths) == sorted(want["rows"]) and dict(s.errors) == want["errors"] and want["errors"]
    assert s.metadata.commit.corpora[0].root == want["corpus_root"]
    _content_matches(s, want, arrays)


@pytest.mark.parametrize("name", STORES)
def test_stores_grow_by_one_file(name: str, arrays: dict[str, np.ndarray], tmp_path: Path) -> None:
    where, want = _fixture(name, tmp_path)
    corpus = shutil.copytree(FIX / "corpus", tmp_path / "corpus")
    # The store records the absolute corpus root it was written from; point it at this copy, so the run below
    # resumes the same corpus rather than adding another.
    with StoreWriter.open(str(where)) as w:
        w.commit(corpora=[Corpus(str(corpus.resolve()), "")])
    new = "jazz/t04.ogg"
    shutil.copy2(FIX / "grow" / new, corpus / new)
    specs = dict(open_store(where).specs)
    summary = extract(corpus, str(where), features=tuple(specs), specs=specs, layout=want["layout"], jobs=1,
                      progress=False)
    assert summary.decoded == 1 and summary.errors == want["errors"]
    assert validate(str(where), deep=True) == []
    s = open_store(where)
    assert s.layout == want["layout"] and sorted(s.paths) == sorted([*want["rows"], new])
    assert dict(s.errors) == want["errors"]
    _content_matches(s, want, arrays)  # the old clips are untouched
    assert s.metadata.format_version == 3 and s.label_names == want["label_names"]  # upgraded, numbering kept
    i = s.paths.index(new)
    assert s.label_names[s.labels[i]] == "jazz" and s.lengths[i] > 0
    assert all(np.isfinite(np.asarray(s.feature(f).frames(i), dtype=np.float32)).all() for f in s.specs)
