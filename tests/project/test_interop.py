"""The interop recipes of docs/interop.md run, and what they read is what the store holds.

* ``examples/train_your_own.py``: the plain PyTorch loop (StoreDataset + BudgetBatchSampler +
  PadCollate in a DataLoader, a user model, AdamW), a specstore checkpoint, infer.predict on it;
* ``examples/lhotse_recipe.py``: a lhotse CutSet whose features come from the store through a
  registered features reader, DynamicBucketingSampler + collate_features on it;
* ``examples/hf_datasets_recipe.py``: a Hugging Face ``datasets.Dataset`` export.

lhotse and datasets are optional (the ``dev`` extra); their tests skip without them.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from factories import make_separable_store, make_store

from specstore.common import ConfigError
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.store import open_store

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def examples(monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples folder importable (as ``python examples/x.py`` makes it)."""
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _recipe(name: str) -> ModuleType:
    return importlib.import_module(name)


def _frames(s: object, row: int, feature: str = "mel") -> np.ndarray:
    return np.asarray(s.feature(feature).frames(row), dtype=np.float32)  # type: ignore[attr-defined]


# -- 1. the plain PyTorch loop ----------------------------------------------------------------------------

def test_train_your_own_loop_checkpoint_and_predict(tmp_path: Path, examples: None) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=48)
    recipe = _recipe("train_your_own")
    res = recipe.main([str(store), "--out", str(tmp_path / "mine.pt"), "--epochs", "4", "--width", "8",
                       "--lr", "0.003", "--budget-mb", "2", "--predictions", str(tmp_path / "p.csv")])
    losses = res["losses"]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    assert res["val_accuracy"] >= 0.9
    assert 0 < res["largest_batch_bytes"] <= res["budget_bytes"]  # the sampler's batches stay in the budget
    # the checkpoint rebuilds the user's class by import path + JSON arguments
    ck = load_checkpoint(res["checkpoint"])
    assert ck.model.target == "train_your_own:GenreNet"
    assert ck.model.kwargs == {"n_bins": 16, "n_classes": 3, "width": 8}
    net = ck.build(trust_model_code=True)  # the user's own class: trusted by its user
    assert type(net).__name__ == "GenreNet"
    # infer.predict on the checkpoint gives the loop's own held-out probabilities (not saturated ones)
    val_probs = res["val_probs"]
    assert float(val_probs.max(axis=1).min()) < 0.999  # some clip's probabilities are far from 0 and 1
    np.testing.assert_allclose(res["predict_probs"][res["val_rows"]], val_probs, atol=1e-4)
    assert res["max_prob_diff"] < 1e-4
    # ... and each is the clip's own result, computed alone
    s = open_store(store)
    for row in res["val_rows"][:3]:
        x = torch.from_numpy(_frames(s, row).T.copy())[None, None]
        with torch.no_grad():
            alone = torch.softmax(net(x, torch.tensor([x.shape[-1]])), dim=1)[0].numpy()
        np.testing.assert_allclose(res["predict_probs"][row], alone, atol=1e-4)
    assert (tmp_path / "p.csv").read_text().count("\n") == len(s) + 1


@pytest.mark.slow  # a fresh interpreter and 2 worker processes: 5-10 s on 2 cores
def test_train_your_own_runs_as_a_script_with_workers(tmp_path: Path) -> None:
    """``python examples/train_your_own.py`` (module ``__main__``): the checkpoint still names an importable class."""
    store = make_separable_store(tmp_path / "s.zarr", n=24)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, str(EXAMPLES / "train_your_own.py"), str(store), "--out",
                           str(tmp_path / "m.pt"), "--epochs", "2", "--width", "4", "--budget-mb", "2",
                           "--workers", "2"], capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["max_prob_diff"] < 1e-4
    assert load_checkpoint(tmp_path / "m.pt").model.target == "train_your_own:GenreNet"


# -- 2. lhotse ------------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore:You are using DynamicBucketingSampler")
def test_lhotse_cuts_read_the_store_through_a_registered_reader(tmp_path: Path, examples: None) -> None:
    pytest.importorskip("lhotse")
    from lhotse import CutSet
    from lhotse.dataset import DynamicBucketingSampler
    from lhotse.features.io import get_reader
    from torch.utils.data import DataLoader

    from specstore.infer.batching.budget import Budget

    recipe = _recipe("lhotse_recipe")
    assert get_reader("specstore") is recipe.SpecstoreReader
    store = make_separable_store(tmp_path / "s.zarr", n=30)
    s = open_store(store)
    cuts = recipe.cuts_from_store(store)
    assert len(cuts) == len(s)
    shift = s.spec.hop_length / s.spec.sample_rate
    for cut in cuts:
        row = cut.custom["row"]
        assert cut.id == s.paths[row] and cut.num_frames == s.lengths[row]  # lhotse's frame count is the store's
        assert cut.frame_shift == pytest.approx(shift) and cut.num_features == 16
        assert cut.custom["label"] == s.labels[row]
    one = cuts[5]
    np.testing.assert_array_equal(one.load_features(), _frames(s, one.custom["row"]))
    # a manifest written and read back loads its features from the store too
    cuts.to_file(tmp_path / "cuts.jsonl.gz")
    again = CutSet.from_file(tmp_path / "cuts.jsonl.gz")
    np.testing.assert_array_equal(again[5].load_features(), one.load_features())
    # a part of a clip: lhotse's truncate reads only those frames
    part = one.truncate(offset=10 * shift, duration=20 * shift)
    np.testing.assert_array_equal(part.load_features(), _frames(s, one.custom["row"])[10:30])

    # lhotse's bucketing sampler + collate_features over an epoch, in a DataLoader with a worker
    budget = Budget(2 << 20, 1024.0)  # 2 MiB at 1 KiB per padded frame: 2048 frames per batch
    max_duration = recipe.max_duration_for(budget, shift)
    assert max_duration == pytest.approx(2048 * shift)
    sampler = DynamicBucketingSampler(cuts, max_duration=max_duration, num_buckets=3, shuffle=True, seed=1)
    loader = DataLoader(recipe.GenreCutDataset(), sampler=sampler, batch_size=None, num_workers=1)
    seen: list[str] = []
    for batch in loader:
        x, lengths, feats = batch["x"], batch["lengths"], batch["features"]
        assert x.shape == (len(lengths), 1, 16, feats.shape[1]) and int(lengths.max()) == feats.shape[1]
        for i, cut_id in enumerate(batch["cut_ids"]):
            row = s.paths.index(cut_id)
            n = int(lengths[i])
            assert n == s.lengths[row] and int(batch["labels"][i]) == s.labels[row]
            np.testing.assert_array_equal(feats[i, :n].numpy(), _frames(s, row))
            np.testing.assert_array_equal(x[i, 0, :, :n].numpy(), _frames(s, row).T)
            assert not x[i, 0, :, n:].any()  # zero beyond the clip, as specstore models expect
        seen += batch["cut_ids"]
    assert sorted(seen) == sorted(s.paths)  # every clip exactly once

    with pytest.raises(ConfigError, match="no clip"):
        recipe.SpecstoreReader(str(s.location)).read("mel:missing.wav")


# -- 3. Hugging Face datasets ---------------------------------------------------------------------------------

def test_hf_datasets_export_holds_the_store_values(tmp_path: Path, examples: None) -> None:
    pytest.importorskip("datasets")
    recipe = _recipe("hf_datasets_recipe")
    store = make_store(tmp_path / "s.zarr", labels=["rock", None, "jazz", "ambient", None, "rock"],
                       lengths=[10, 30, 50, 20, 7, 64])
    s = open_store(store)
    ds = recipe.to_hf_dataset(store, cache_dir=str(tmp_path / "hf"))
    assert len(ds) == len(s)
    assert ds.features["label"].names == s.label_names and ds.features["features"].dtype == "float16"
    as_numpy = ds.with_format("numpy")
    as_torch = ds.with_format("torch")
    for i in range(len(ds)):
        row = int(ds[i]["row"])
        stored = np.asarray(s.feature("mel").frames(row))
        assert stored.dtype == np.float16
        np.testing.assert_array_equal(as_numpy[i]["features"], stored)  # the same float16 values
        t = as_torch[i]
        assert isinstance(t["features"], torch.Tensor) and t["features"].shape == (s.lengths[row], 16)
        np.testing.assert_array_equal(t["features"].numpy(), stored.astype(np.float32))
        assert int(t["label"]) == s.labels[row] and int(t["n_frames"]) == s.lengths[row]
        assert ds[i]["path"] == s.paths[row] and ds[i]["duration"] == pytest.approx(s.durations[row], rel=1e-6)
    # a split: some rows, labelled only, as float32
    part = recipe.to_hf_dataset(store, rows=[0, 1, 2, 5], labelled_only=True, dtype="float32",
                                cache_dir=str(tmp_path / "hf"))
    assert part["row"] == [r for r in (0, 1, 2, 5) if s.labels[r] >= 0] and len(part) == 3
    assert part.features["features"].dtype == "float32"
    got = part.with_format("numpy")[0]
    np.testing.assert_array_equal(got["features"], np.asarray(s.feature("mel").frames(int(got["row"])), np.float32))
    with pytest.raises(ConfigError, match="dtype"):
        recipe.to_hf_dataset(store, dtype="int8")


# -- the reader thread in a loop that stops early ------------------------------------------------------------

def test_prefetch_closes_at_once_when_the_loop_stops_early(tmp_path: Path) -> None:
    """A user's loop that ``break``s: the reader thread must not hang on a full queue (it used to, for 5 s)."""
    import threading
    import time

    from specstore.infer.data import PadCollate, StoreDataset, prefetch

    ds = StoreDataset(make_store(tmp_path / "s.zarr", lengths=[10, 20, 30, 40]))
    for batches in ([[0], [1], [2]], [[0], [1], [2], [3]]):
        gen = prefetch(ds, batches, PadCollate(), ahead=2)
        first = next(gen)
        assert first.ids.tolist() == [0]
        time.sleep(0.3)  # the reader has filled the queue (and is done, for three batches)
        t0 = time.perf_counter()
        gen.close()
        assert time.perf_counter() - t0 < 1.0
        assert not [t for t in threading.enumerate() if t.name == "specstore-prefetch" and t.is_alive()]
    # a full pass still yields every batch, then stops
    assert [b.ids.tolist() for b in prefetch(ds, [[0, 1], [2], [3]], PadCollate(), ahead=1)] == [[0, 1], [2], [3]]
