"""`make train`: loss goes down, the best checkpoint reloads, resume continues, the split is by content."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from factories import make_separable_store

from specstore.infer.batching.budget import Budget
from specstore.infer.cli import main as infer_main
from specstore.infer.data import Item, PadCollate
from specstore.infer.data.augment import Augment, SpecAugment
from specstore.infer.data.split import RULE, SplitRule, split_score
from specstore.infer.engine.cost import measure_cost_per_frame
from specstore.infer.engine.device import DEFAULT_CPU_BUDGET_MB
from specstore.infer.engine.predict import predict
from specstore.infer.models import ModelConfig, build_model
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.infer.options.defaults import PLAIN_MODEL
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train import (
    MIN_TRAINING_EFFICIENCY as MIN_EFFICIENCY,
)
from specstore.infer.train import (
    TrainConfig,
    TrainError,
    lr_at,
    resume_path_for,
    train,
    training_plan,
    training_rows,
)
from specstore.store import FeatureSpec, open_store

SPEC = FeatureSpec.mel(n_bins=16)
LABELS = ["ambient", "jazz", "rock"]
#: A tiny, fast configuration: width 4, depth 2, whole clips, 16 bins.
TINY = dict(width=4, depth=2, lr=3e-2, crop_seconds=None, val_fraction=0.25, dropout=0.0, time_masks=1, freq_masks=1,
            freq_mask_bins=2, time_mask_frames=8, run=RunOptions(device="cpu", max_batch=8))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_separable_store(tmp_path_factory.mktemp("train") / "s.zarr", duplicates=6)


class Interrupt(Exception):
    """Stands in for Ctrl-C after an epoch."""


@pytest.mark.slow
def test_loss_decreases_and_best_checkpoint_reloads_to_same_predictions(store: Path, tmp_path: Path) -> None:
    model_path = tmp_path / "m.pt"
    res = train(store, model_path, TrainConfig(epochs=6, **TINY), progress=False)
    losses = [h["loss"] for h in res.history]
    assert len(losses) == 6 and res.epochs_run == 6 and res.resumed_from == 0
    assert losses[-1] < 0.7 * losses[0], losses
    assert res.best_val_accuracy is not None and res.best_val_accuracy >= 0.8
    assert all(h["efficiency"] >= MIN_EFFICIENCY for h in res.history)

    ck = load_checkpoint(model_path)
    assert ck.label_names == LABELS and ck.feature == "mel" and ck.spec == SPEC
    assert ck.extra["split"] == {"rule": RULE, "val_fraction": 0.25, "seed": 0}
    assert TrainConfig.from_dict(ck.extra["train_config"]) == res.config
    assert ck.extra["best_epoch"] == res.best_epoch and len(ck.extra["history"]) == 6
    # normalisation fitted on the training frames (noise around -50 dB with a +15 dB band)
    assert -50.0 < ck.config.input_mean < -44.0 and 6.0 < ck.config.input_std < 10.0

    # The saved weights are the best epoch's: its recorded validation loss and accuracy come back (from the
    # plain softmax: the checkpoint without its temperature).
    s = open_store(store)
    _, val_rows = training_rows(s, SplitRule(0.25, 0))
    plain = dataclasses.replace(ck, extra={k: v for k, v in ck.extra.items() if k != "calibration"})
    raw = predict(s, plain, device="cpu", progress=False).probs[val_rows]
    truth = torch.from_numpy(s.labels[val_rows].astype(np.int64))
    best = res.history[res.best_epoch - 1]
    val_loss = float(F.nll_loss(torch.log(torch.from_numpy(raw)), truth))
    assert val_loss == pytest.approx(best["val_loss"], rel=1e-4, abs=1e-5)
    assert float((raw.argmax(1) == truth.numpy()).mean()) == pytest.approx(best["val_accuracy"])
    # The temperature fitted on those validation clips is recorded; predictions are softmax(logits / T).
    cal = ck.calibration
    assert cal.temperature is not None and cal.n_clips == len(val_rows) and ck.extra["calibration"]["n_clips"]
    assert cal.nll_before == pytest.approx(val_loss, rel=1e-4, abs=1e-5)
    probs = predict(s, ck, device="cpu", progress=False).probs[val_rows]
    expected = torch.softmax(torch.log(torch.from_numpy(raw).double()) / cal.temperature, dim=1).numpy()
    np.testing.assert_allclose(probs, expected, atol=1e-5)
    assert float(F.nll_loss(torch.log(torch.from_numpy(probs)), truth)) == pytest.approx(cal.nll_after, abs=1e-4)
    # and a second load gives identical predictions
    again = predict(s, load_checkpoint(model_path), device="cpu", progress=False).probs[val_rows]
    np.testing.assert_array_equal(probs, again)


@pytest.mark.slow
def test_resume_continues_where_it_stopped(store: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = TrainConfig(epochs=4, **TINY)
    seen: list[dict[str, Any]] = []

    def stop_after_two(entry: dict[str, Any]) -> None:
        seen.append(entry)
        if entry["epoch"] == 2:
            raise Interrupt

    model_path = tmp_path / "m.pt"
    with pytest.raises(Interrupt):
        train(store, model_path, config, progress=False, on_epoch_end=stop_after_two)
    resume = resume_path_for(model_path)
    assert resume == tmp_path / "m.resume.pt" and resume.is_file() and model_path.is_file()
    state = torch.load(resume, weights_only=True)  # plain containers only
    assert state["epoch"] == 2 and len(state["history"]) == 2 and not state["complete"]

    res = train(store, model_path, config, progress=False)
    assert res.resumed_from == 2 and res.epochs_run == 2
    assert [h["epoch"] for h in res.history] == [1, 2, 3, 4]
    assert res.history[:2] == seen

    # The resumed run follows the uninterrupted run's path (every epoch is seeded from (seed, epoch)).
    straight = train(store, tmp_path / "straight.pt", config, progress=False)
    for a, b in zip(res.history, straight.history, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"])

    # Rerunning a finished run does nothing; a changed configuration is refused unless told to
    # overwrite, and then starts afresh with a warning.
    done = train(store, model_path, config, progress=False)
    assert done.epochs_run == 0 and done.resumed_from == 4 and len(done.history) == 4
    before = model_path.read_bytes()
    with pytest.raises(TrainError, match="different configuration.*--overwrite"):
        train(store, model_path, TrainConfig.from_dict({**config.to_dict(), "epochs": 1}), progress=False)
    assert model_path.read_bytes() == before  # the trained model is untouched
    with caplog.at_level(logging.WARNING, logger="specstore.infer.train"):
        fresh = train(store, model_path, TrainConfig.from_dict({**config.to_dict(), "epochs": 1}), progress=False,
                      overwrite=True)
    assert fresh.resumed_from == 0 and fresh.epochs_run == 1
    assert "different configuration" in caplog.text
    # runtime-only fields (device, precision, budget) do not invalidate a resume file
    rerun = train(store, model_path, TrainConfig.from_dict({**config.to_dict(), "epochs": 1, "budget_mb": 512.0}),
                  progress=False)
    assert rerun.resumed_from == 1 and rerun.epochs_run == 0


def test_split_is_by_content_and_deterministic(store: Path) -> None:
    hashes = [f"h{i}" for i in range(2000)]
    rule = SplitRule(0.25, seed=3)
    val = rule.is_val(hashes)
    assert 0.21 < val.mean() < 0.29
    # order and company do not matter: each hash decides alone
    perm = np.random.default_rng(0).permutation(len(hashes))
    np.testing.assert_array_equal(rule.is_val([hashes[i] for i in perm]), val[perm])
    np.testing.assert_array_equal(rule.is_val(hashes[:100]), val[:100])
    assert val[7] == (split_score("h7", 3) < 0.25)
    assert not np.array_equal(SplitRule(0.25, seed=4).is_val(hashes), val)  # the seed matters
    assert set(rule.select(hashes, "val")) | set(rule.select(hashes, "train")) == set(range(len(hashes)))

    s = open_store(store)  # 48 clips + 6 duplicate paths
    for seed in range(5):
        train_rows, val_rows = training_rows(s, SplitRule(0.3, seed))
        train_hashes = {s.hashes[r] for r in train_rows}
        val_hashes = {s.hashes[r] for r in val_rows}
        assert not train_hashes & val_hashes  # duplicates never straddle the split
        assert len(train_rows) == len(train_hashes)  # a duplicated content is trained on once
        assert len(train_hashes) + len(val_hashes) == 48
        assert len(val_rows) == sum(1 for h in s.hashes if h in val_hashes)  # every validation path counts


def test_store_without_labels_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = make_separable_store(tmp_path / "u.zarr", n=6, labelled=False)
    with pytest.raises(TrainError, match="no labelled clips"):
        train(store, tmp_path / "m.pt", TrainConfig(epochs=1, **TINY), progress=False)
    assert infer_main(["train", str(store), str(tmp_path / "m.pt"), "--epochs", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no labelled clips" in err
    assert not (tmp_path / "m.pt").exists()


def test_training_plans_are_efficient_on_the_store_lengths(store: Path) -> None:
    s = open_store(store)
    model = build_model(ModelConfig(**PLAIN_MODEL, n_bins=16, n_classes=3, width=4, depth=2)).train()
    cost = measure_cost_per_frame(model, 16, training=True)
    budget = Budget.for_cost(int(DEFAULT_CPU_BUDGET_MB * 2**20), cost, max_batch=8, frame_align=model.time_stride)
    train_rows, _ = training_rows(s, SplitRule(0.25, 0))
    whole = s.lengths[train_rows]
    cropped = np.minimum(whole, 64)
    for lengths in (whole, cropped):
        ids: set[int] = set()
        for epoch in range(4):
            plan = training_plan(lengths, budget, seed=0, epoch=epoch)
            assert plan.efficiency >= MIN_EFFICIENCY, plan.describe()
            assert np.mean([len(b) for b in plan.batches]) >= 3  # not bought with batches of one
            batched = np.concatenate(plan.batches)
            assert sorted(batched.tolist()) == list(range(len(lengths)))  # every clip once per epoch
            ids.add(hash(tuple(plan.batches[0].tolist())))
        assert len(ids) > 1  # batches change between epochs


def test_lr_schedule_and_spec_augment() -> None:
    cfg = TrainConfig(epochs=10, lr=1e-2, warmup_fraction=0.2, final_lr_ratio=0.01)
    lrs = [lr_at(p, cfg) for p in np.linspace(0, 10, 101)]
    peak = int(np.argmax(lrs))
    assert lrs[0] == pytest.approx(4e-4) and lrs[peak] == pytest.approx(1e-2) and 15 <= peak <= 25
    assert all(a <= b for a, b in zip(lrs[:peak], lrs[1:peak + 1], strict=False))
    assert all(a >= b for a, b in zip(lrs[peak:], lrs[peak + 1:], strict=False))
    assert lrs[-1] == pytest.approx(1e-4)

    rng = np.random.default_rng(0)
    augment = SpecAugment(time_masks=2, time_mask_frames=8, freq_masks=2, freq_mask_bins=4, fill=-45.0)
    items = [augment(np.full((16, n), -30.0, dtype=np.float32), rng) for n in (40, 25, 10)]
    batch = PadCollate()([Item(x, 0, k, k) for k, x in enumerate(items)])
    x, lengths = batch.x, batch.lengths
    for b, n in enumerate(lengths.tolist()):
        assert torch.all(x[b, :, :, n:] == 0.0)  # padding untouched
        real = x[b, :, :, :n]
        assert torch.all((real == -30.0) | (real == -45.0))
    assert int((x == -45.0).sum()) > 0
    with pytest.raises(TrainError, match="epochs"):
        TrainConfig(epochs=0)
    with pytest.raises(TrainError, match="unknown training config"):
        TrainConfig.from_dict({"epochs": 3, "colour": "red"})


def test_the_config_holds_run_options_and_reads_and_writes_them_flat() -> None:
    """The run settings live in the RunOptions the config holds; files and records spell them flat, as before."""
    flat = {"epochs": 2, "device": "cpu", "max_batch": 8, "budget_mb": 512, "precision": "fp32", "loader_workers": 1}
    config = TrainConfig.from_dict(flat)
    assert config.run == RunOptions(device="cpu", max_batch=8, budget_mb=512, precision="fp32", loader_workers=1,
                                    progress=False)
    assert config == TrainConfig(epochs=2, run=RunOptions(device="cpu", max_batch=8, budget_mb=512.0,
                                                          precision="fp32", loader_workers=1))  # bars: the command's
    record = config.to_dict()
    assert {k: record[k] for k in flat} == flat and "run" not in record
    assert TrainConfig.from_dict(record) == config
    assert "device" not in config.resume_key() and config.resume_key()["max_batch"] == 8
    with pytest.raises(TrainError, match="max_batch"):  # the run's bounds, one line, as the config's own
        TrainConfig.from_dict({"max_batch": 0})
    with pytest.raises(TrainError, match="threads"):  # this machine's, an argument of train(), never recorded
        TrainConfig(run=RunOptions(threads=1))
    with pytest.raises(TrainError, match="unknown training config field"):
        TrainConfig.from_dict({"run": {"device": "cpu"}})


def test_augment_rolls_only_the_cqt_rows_and_shifts_gain() -> None:
    x = np.tile(np.arange(10, dtype=np.float32)[:, None], (1, 6))  # row r holds r; rows 4-9 are the "CQT"
    fill = tuple(float(-100 - r) for r in range(10))
    shifts = set()
    for seed in range(40):
        y = Augment(pitch_bins=2, pitch_rows=(4, 10), fill=fill)(x.copy(), np.random.default_rng(seed))
        np.testing.assert_array_equal(y[:4], x[:4])  # the mel rows are never moved
        shift = int(6 - y[6, 0])  # row r now holds row r - shift
        shifts.add(shift)
        for r in range(4, 10):
            src = r - shift
            expected = src if 4 <= src < 10 else fill[r]  # rolled in from outside: the fill (input mean) of row r
            assert np.all(y[r] == expected), (shift, r)
    assert shifts == {-2, -1, 0, 1, 2}
    y = Augment(gain_db=6.0)(x.copy(), np.random.default_rng(0))
    offset = y - x
    np.testing.assert_allclose(offset, offset[0, 0], atol=1e-5)
    assert 0 < abs(offset[0, 0]) <= 6.0


def test_the_default_recipe_trains_on_every_stored_feature(tmp_path: Path) -> None:
    """A mel+CQT store trains on both (per-bin normalisation, CQT pitch roll, mixup); a mel-only one on mel."""
    from factories import make_store

    specs = {"mel": FeatureSpec.mel(n_bins=16), "cqt": FeatureSpec.cqt(n_bins=12)}
    store = make_store(tmp_path / "s.zarr", lengths=[30, 50, 70, 90, 40, 60] * 4, specs=specs)
    config = TrainConfig(epochs=2, width=4, depth=2, crop_seconds=0.5, run=RunOptions(device="cpu"), val_fraction=0.25,
                         pitch_shift=2, gain_db=3.0, mixup=0.4, crops_per_clip=2)
    assert config.feature is None
    res = train(store, tmp_path / "m.pt", config, progress=False)
    ck = load_checkpoint(res.model_path)
    assert ck.feature == "mel+cqt" and ck.n_bins == 28
    assert ck.calibration.temperature == ck.extra["calibration"]["temperature"] > 0  # fitted on the held-out clips
    assert "temperature-scaled" in res.summary()
    assert ck.config is not None and ck.config.bin_mean is not None and len(ck.config.bin_mean) == 28
    assert all(np.isfinite(h["loss"]) for h in res.history)
    mel_only = make_store(tmp_path / "m.zarr", lengths=[30, 50, 70, 90] * 3, specs={"mel": specs["mel"]})
    # pitch_shift: no CQT, logged, ignored; no validation clips: no temperature, the summary says uncalibrated
    res = train(mel_only, tmp_path / "mel.pt", dataclasses.replace(config, val_fraction=0.0), progress=False)
    assert load_checkpoint(res.model_path).feature == "mel"
    assert not load_checkpoint(res.model_path).calibration.calibrated and "uncalibrated" in res.summary()


@pytest.mark.slow
def test_cli_train_then_eval_on_the_held_out_split(store: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "cli.pt"
    args = ["train", str(store), str(model), "--epochs", "2", "--width", "4", "--depth", "2", "--lr", "0.03",
            "--max-batch", "8", "--crop-seconds", "0", "--val-fraction", "0.25", "--device", "cpu",
            "--no-progress"]
    assert infer_main(args) == 0
    out = capsys.readouterr().out
    assert "trained epochs 1-2 of 2" in out and str(model) in out
    assert load_checkpoint(model).extra["train_config"]["crop_seconds"] is None
    assert infer_main(args) == 0  # rerun: nothing left to do
    assert "already trained: 2 of 2 epochs done" in capsys.readouterr().out
    reports = tmp_path / "rep"
    assert infer_main(["eval", str(store), str(model), "--out-dir", str(reports), "--split", "val",
                       "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "accuracy" in out and "split 'val'" in out
    assert {p.name for p in reports.iterdir()} >= {"report.json", "report.txt", "confusion.png"}
    # the temperature fitted on the validation split, and the ECE before and after it on the clips scored
    report = json.loads((reports / "report.json").read_text())
    assert report["temperature"] == load_checkpoint(model).calibration.temperature > 0
    assert report["calibration"] == "temperature" and report["ece_bins"] == 15
    assert 0 <= report["ece_before"] <= 1 and 0 <= report["ece_after"] <= 1
    assert "T was fitted on these very clips" in (reports / "report.txt").read_text()


@pytest.mark.slow
def test_eval_is_honest_by_default(store: Path, tmp_path: Path) -> None:
    """On the store a model was trained on, eval scores the held-out split unless told otherwise, and says how
    many training clips a requested split holds; on other data it scores everything."""
    import shutil

    from specstore.infer.evaluation.evaluate import evaluate

    model = tmp_path / "m.pt"
    train(store, model, TrainConfig(epochs=1, **TINY), progress=False)
    s = open_store(store)
    train_rows, val_rows = training_rows(s, SplitRule(0.25, 0))
    auto = evaluate(store, model, device="cpu", progress=False)
    assert auto.split == "val" and auto.n_clips == len(val_rows) and auto.n_trained_on == 0
    everything = evaluate(store, model, split="all", device="cpu", progress=False)
    trained = sum(1 for r in range(len(s)) if s.hashes[r] in {s.hashes[t] for t in train_rows})
    assert everything.n_clips == len(s) and everything.n_trained_on == trained > 0
    assert f"{trained} of them were training clips" in everything.text()
    # the same data at another location is recognised by its fingerprint
    moved = tmp_path / "moved.zarr"
    shutil.copytree(store, moved)
    assert evaluate(moved, model, device="cpu", progress=False).split == "val"
    # other data: every labelled clip, and no claim about training clips
    other = make_separable_store(tmp_path / "other.zarr", n=12, seed=5)
    elsewhere = evaluate(other, model, device="cpu", progress=False)
    assert elsewhere.split == "all" and elsewhere.n_clips == 12 and elsewhere.n_trained_on is None
    assert {"topk_accuracy", "topk"} <= set(elsewhere.to_dict()) and "top5_accuracy" not in elsewhere.to_dict()
