"""The default recipe: auto options from the training data, no choice on validation, the statistics head, CV."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from factories import make_separable_store

from specstore.infer.data.split import RULE, RULE_OFFSET, SplitRule, split_keys
from specstore.infer.models import MaskedClassifier
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train import TrainConfig, TrainError, config_path_for, train
from specstore.infer.train.crossval import CrossValError, cross_validate
from specstore.infer.train.recipe import (
    CROPS_PER_EPOCH,
    MAX_CROPS_PER_CLIP,
    VAL_FRACTION,
    DataFacts,
    resolve,
    resolve_validation,
)
from specstore.infer.train.stats_head import (
    C_GRID,
    DEFAULT_WEIGHT,
    MIN_VALIDATION_CLIPS,
    WEIGHTS,
    choose_weight,
    fit_stats_head,
    grouped_folds,
)
from specstore.store import open_store

#: A tiny model and short schedule; the recipe's auto options are left to resolve.
TINY = dict(width=4, depth=2, epochs=3, lr=3e-2, crop_seconds=0.5, dropout=0.0, time_masks=1, freq_masks=1,
            freq_mask_bins=2, time_mask_frames=8, run=RunOptions(device="cpu"), val_fraction=0.25)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_separable_store(tmp_path_factory.mktemp("recipe") / "s.zarr", n=60, duplicates=4)


def facts(clips: int) -> DataFacts:
    return DataFacts(clips=clips, groups=clips, classes=6, smallest_class=clips // 6, median_seconds=30.0,
                     total_seconds=30.0 * clips)


def test_every_epoch_trains_a_fixed_number_of_crops_drawn_from_enough_crops_per_clip() -> None:
    sizes = (20, 60, 120, 160, 184, 240, 479, 480, 5000)
    got = {n: (c.crops_per_clip, c.crops_per_epoch) for n in sizes
           for c in [resolve(TrainConfig(), facts(n)).config]}
    assert got == {20: (MAX_CROPS_PER_CLIP, 160), 60: (8, 480), 120: (4, 480), 160: (3, 480), 184: (3, 480),
                   240: (2, 480), 479: (2, 480), 480: (1, 480), 5000: (1, 5000)}
    for n, (crops, epoch) in got.items():  # CROPS_PER_EPOCH an epoch, every clip once at least, from the fewest crops
        assert epoch == min(max(n, CROPS_PER_EPOCH), n * MAX_CROPS_PER_CLIP) <= n * crops
        assert crops == MAX_CROPS_PER_CLIP or n * (crops - 1) < epoch
    rules = resolve(TrainConfig(), facts(184)).rules
    assert "480: random crops an epoch" in rules["crops_per_epoch"] and "3: the fewest" in rules["crops_per_clip"]
    assert "once an epoch" in resolve(TrainConfig(), facts(5000)).rules["crops_per_epoch"]
    assert "all 8 crops" in resolve(TrainConfig(), facts(20)).rules["crops_per_epoch"]
    given = resolve(TrainConfig(crops_per_clip=2), facts(184))  # the user's crops: every one of them each epoch
    assert given.config.crops_per_epoch == 368 and "crops_per_clip" not in given.rules
    fewer = resolve(TrainConfig(crops_per_epoch=300), facts(184)).config
    assert (fewer.crops_per_clip, fewer.crops_per_epoch) == (2, 300)


def test_options_the_user_sets_are_kept_and_whole_clips_take_one_pass() -> None:
    given = resolve(TrainConfig(crops_per_clip=5, crops_per_epoch=400, stats_head=False, pool_seconds=3.0,
                                val_every=2), facts(160))
    assert given.config.crops_per_clip == 5 and given.config.stats_head is False and not given.rules
    assert given.config.val_every == 2
    whole = resolve(TrainConfig(crop_seconds=None), facts(40))
    assert whole.config.crops_per_clip == 1 and "whole clips" in whole.rules["crops_per_clip"]
    assert whole.config.crops_per_epoch == 40


def test_validation_is_held_out_only_when_it_can_measure_something() -> None:
    small, why = resolve_validation(TrainConfig(), 400)
    assert small.val_fraction == 0.0 and why is not None and "fewer than 60" in why and "specstore-cv" in why
    large, why = resolve_validation(TrainConfig(), 1850)
    assert large.val_fraction == VAL_FRACTION and why is not None and "185 of the 1850" in why
    given, why = resolve_validation(TrainConfig(val_fraction=0.3), 100)
    assert given.val_fraction == 0.3 and why is None


def test_a_small_corpus_trains_on_every_clip(tmp_path: Path) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=30)
    res = train(store, tmp_path / "m.pt", TrainConfig(**{**TINY, "val_fraction": None, "epochs": 1}), progress=False)
    assert res.n_val == 0 and res.n_train == 30 and "val_fraction (auto): 0:" in res.summary()
    fit = res.extra["stats_head"]  # with nothing held out, the baseline's own grouped CV figure is still reported
    chosen = fit["cv"][format(fit["C"], "g")]
    assert fit["folds"] >= 2 and f"accuracy {chosen['accuracy']:.3f} by" in res.summary()
    assert res.extra["stats_weight"]["weight"] == DEFAULT_WEIGHT  # nothing held out: the rule's weight


def test_validation_runs_every_epoch_only_when_it_chooses() -> None:
    assert resolve(TrainConfig(), facts(100)).config.val_every == 5  # a third of 15 epochs: 5, 10, 15
    assert resolve(TrainConfig(epochs=4), facts(100)).config.val_every == 2
    assert resolve(TrainConfig(epochs=2), facts(100)).config.val_every == 1
    best = resolve(TrainConfig(select="best"), facts(100))
    assert best.config.val_every == 1 and "chooses" in best.rules["val_every"]
    with pytest.raises(TrainError, match="val_every"):
        TrainConfig(val_every=0)


@pytest.mark.slow
def test_epochs_between_validations_report_nothing_and_are_never_chosen(store: Path, tmp_path: Path) -> None:
    cfg = TrainConfig(**{**TINY, "epochs": 5, "val_every": 2, "select": "best", "stats_head": False})
    res = train(store, tmp_path / "e.pt", cfg, progress=False)
    validated = [h["epoch"] for h in res.history if h["val_accuracy"] is not None]
    assert validated == [2, 4, 5]  # every 2 epochs and after the last
    assert res.best_epoch in validated
    rows = (tmp_path / "e.metrics.csv").read_text(encoding="utf-8").splitlines()
    assert rows[1].split(",")[3] == "" and rows[2].split(",")[3] != ""  # epoch 1 blank, epoch 2 measured


def test_pooling_windows_are_as_long_as_the_training_crops() -> None:
    assert resolve(TrainConfig(), facts(100)).config.pool_seconds == TrainConfig().crop_seconds == 10.0
    assert resolve(TrainConfig(crop_seconds=5.0), facts(100)).config.pool_seconds == 5.0
    assert resolve(TrainConfig(crop_seconds=None), facts(100)).config.pool_seconds == 0.0
    assert resolve(TrainConfig(arch="user_models:TinyNet"), facts(100)).config.pool_seconds == 0.0
    assert resolve(TrainConfig(pool_seconds=0.0), facts(100)).config.pool_seconds == 0.0


def test_the_statistics_head_is_on_for_built_in_models_only() -> None:
    assert resolve(TrainConfig(), facts(100)).config.stats_head is True
    assert resolve(TrainConfig(arch="resnet"), facts(100)).config.stats_head is True
    user = resolve(TrainConfig(arch="user_models:TinyNet"), facts(100))
    assert user.config.stats_head is False and "built-in" in user.rules["stats_head"]
    assert resolve(TrainConfig(), facts(100), builtin=False).config.stats_head is False


def test_auto_options_parse_from_the_command_line_and_files(tmp_path: Path) -> None:
    import argparse

    from specstore.infer.train import add_config_arguments, config_from_args

    p = argparse.ArgumentParser()
    add_config_arguments(p)
    assert config_from_args(p.parse_args(["--crops-per-clip", "auto"])).crops_per_clip is None
    assert config_from_args(p.parse_args(["--crops-per-clip", "4", "--no-stats-head"])).stats_head is False
    (tmp_path / "c.toml").write_text("crops_per_clip = 2\nselect = 'best'\n", encoding="utf-8")
    cfg = TrainConfig.from_file(tmp_path / "c.toml")
    assert cfg.crops_per_clip == 2 and cfg.select == "best"
    with pytest.raises(TrainError, match="select"):
        TrainConfig(select="median")


@pytest.mark.slow
def test_default_training_keeps_the_last_epoch_and_reports_the_model_and_its_experts(store: Path,
                                                                                      tmp_path: Path) -> None:
    model_path = tmp_path / "m.pt"
    seen: list[float] = []
    res = train(store, model_path, TrainConfig(**TINY), progress=False,
                on_epoch_end=lambda e: seen.append(e["val_accuracy"]))
    assert res.best_epoch == 3 == len(seen)  # the end of the schedule, whatever validation said
    record = json.loads(config_path_for(model_path).read_text(encoding="utf-8"))
    assert record["recipe"]["requested"]["crops_per_clip"] is None
    n_train = record["recipe"]["facts"]["clips"]
    per_epoch = min(max(n_train, CROPS_PER_EPOCH), MAX_CROPS_PER_CLIP * n_train)
    assert record["train_config"]["crops_per_epoch"] == per_epoch
    assert record["train_config"]["crops_per_clip"] == min(MAX_CROPS_PER_CLIP, -(-per_epoch // n_train))
    assert sum(h["batches"] for h in res.history) >= len(res.history) * -(-per_epoch // TrainConfig().run.max_batch)
    assert set(record["recipe"]["rules"]) == {"crops_per_clip", "crops_per_epoch", "pool_seconds", "stats_head",
                                              "stats_weight", "val_every"}
    assert record["train_config"]["val_every"] == 1  # a third of 3 epochs: every epoch
    stride = 2 * 2**2  # input time pool 2, two blocks
    crop = int(round(0.5 / open_store(store).spec.frame_seconds)) // stride * stride
    assert record["model"]["kwargs"]["pool_window"] == crop  # windows as long as the training crops
    n_val = record["recipe"]["facts"]["clips"]  # a tiny store: too few validation clips to choose the weight
    assert record["stats_weight"]["weight"] == DEFAULT_WEIGHT == record["model"]["kwargs"]["stats_weight"]
    assert f"fewer than {MIN_VALIDATION_CLIPS} validation clips" in record["stats_weight"]["how"] and n_val
    assert record["stats_head"]["C"] in C_GRID and set(record["stats_head"]["cv"]) == {f"{c:g}" for c in C_GRID}
    names = [r["name"] for r in record["held_out"]]
    assert names == ["model", "CNN alone", "band-statistics logistic regression alone"]
    for r in record["held_out"]:
        lo, hi = r["accuracy_ci"]
        assert 0.0 <= lo <= r["accuracy"] <= hi <= 1.0
    ckpt = load_checkpoint(model_path)
    assert ckpt.extra["held_out"] == record["held_out"] and ckpt.extra["best_epoch"] == 3
    model = ckpt.build()
    assert isinstance(model, MaskedClassifier) and model.stats_linear is not None
    assert float(model.stats_linear.weight.abs().sum()) > 0  # fitted, and saved with the weights
    assert "crops_per_clip (auto)" in res.summary() and "band-statistics logistic regression alone" in res.summary()


@pytest.mark.slow
def test_select_best_keeps_the_best_validation_epoch(store: Path, tmp_path: Path) -> None:
    res = train(store, tmp_path / "b.pt", TrainConfig(**{**TINY, "select": "best", "stats_head": False}),
                progress=False)
    scores = [(h["val_accuracy"], -h["val_loss"]) for h in res.history]
    assert res.best_epoch == 1 + max(range(len(scores)), key=lambda i: scores[i])
    assert "CNN alone" not in json.dumps(load_checkpoint(tmp_path / "b.pt").extra["held_out"])


def test_statistics_head_chooses_c_by_grouped_cross_validation(store: Path) -> None:
    s = open_store(store)
    keys = split_keys(s)
    folds = grouped_folds(keys, 5, seed=1)
    by_key: dict[str, set[int]] = {}
    for k, f in zip(keys, folds.tolist(), strict=True):
        by_key.setdefault(k, set()).add(f)
    assert all(len(v) == 1 for v in by_key.values())  # duplicates never straddle folds
    rows = np.flatnonzero(s.labels >= 0)
    torch.manual_seed(0)
    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.options.defaults import PLAIN_MODEL

    model = build_model(ModelConfig(**PLAIN_MODEL, n_bins=16, n_classes=3, width=4, depth=2, stats_head=True))
    assert isinstance(model, MaskedClassifier)
    fit = fit_stats_head(model, s, "mel", rows, seed=0)
    losses = {c: v["log_loss"] for c, v in fit.cv.items()}
    assert fit.c == float(min(losses, key=lambda c: losses[c])) and fit.folds == 5
    assert fit.oof_log_proba is not None and fit.oof_log_proba.shape == (len(rows), 3)
    assert fit.cv[f"{fit.c:g}"]["accuracy"] > 0.9  # the classes differ in band energy: a linear model sees it


def test_split_folds_partition_the_keys_and_round_trip() -> None:
    keys = [f"work-{i}" for i in range(200)]
    masks = [SplitRule.fold(k, 4, seed=3).is_val(keys) for k in range(4)]
    assert (np.sum(masks, axis=0) == 1).all()  # every key in exactly one fold
    rule = SplitRule.fold(2, 4, seed=3)
    assert rule.to_dict()["rule"] == RULE_OFFSET and SplitRule.from_dict(rule.to_dict()) == rule
    assert SplitRule(0.2, 1).to_dict() == {"rule": RULE, "val_fraction": 0.2, "seed": 1}  # unchanged record
    with pytest.raises(Exception, match="folds"):
        SplitRule.fold(4, 4)


@pytest.mark.slow
def test_cross_validation_predicts_every_clip_once_by_a_model_that_never_saw_it(store: Path, tmp_path: Path) -> None:
    config = TrainConfig(**{**TINY, "epochs": 1})
    res = cross_validate(store, tmp_path / "cv", config, folds=3, progress=False)
    s = open_store(store)
    rows = np.flatnonzero(s.labels >= 0)
    assert res.n_clips == len(rows) and len(res.fold_accuracy) == 3
    lines = (tmp_path / "cv" / "cv.csv").read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(rows) + 1 and all(line.split(",")[4] for line in lines[1:])
    keys = split_keys(s)
    for k in range(3):
        ckpt = load_checkpoint(tmp_path / "cv" / f"fold-{k}.pt")
        assert SplitRule.from_dict(ckpt.extra["split"]) == SplitRule.fold(k, 3, 0)
        fold_keys = {keys[int(r)] for r in rows if SplitRule.fold(k, 3, 0).is_val([keys[int(r)]])[0]}
        assert ckpt.extra["n_val"] == sum(1 for r in rows if keys[int(r)] in fold_keys)
    assert 0.0 <= res.accuracy_ci[0] <= res.accuracy <= res.accuracy_ci[1] <= 1.0
    assert list(res.baselines) and json.loads((tmp_path / "cv" / "cv.json").read_text())["folds"] == 3
    with pytest.raises(CrossValError, match="folds"):
        cross_validate(store, tmp_path / "cv2", config, folds=1)


def test_the_statistics_weight_is_chosen_by_validation_log_loss_only_on_enough_clips() -> None:
    rng = np.random.default_rng(0)
    n, k = 200, 4
    truth = rng.integers(0, k, n)
    onehot = np.eye(k)[truth]
    cnn = 3.0 * onehot + rng.normal(0, 1.5, (n, k))  # a decent expert
    useful = 2.0 * onehot + rng.normal(0, 1.5, (n, k))  # another, with independent errors
    noise = rng.normal(0, 3.0, (n, k))  # an expert that knows nothing
    assert choose_weight(cnn, useful, truth).weight > 0
    assert choose_weight(cnn, noise, truth).weight == 0.0
    chosen = choose_weight(cnn, useful, truth)
    assert set(chosen.log_loss) == {f"{w:g}" for w in WEIGHTS}
    assert chosen.log_loss[f"{chosen.weight:g}"] == min(chosen.log_loss.values())
    few = choose_weight(cnn[:MIN_VALIDATION_CLIPS - 1], noise[:MIN_VALIDATION_CLIPS - 1],
                        truth[:MIN_VALIDATION_CLIPS - 1])
    assert few.weight == DEFAULT_WEIGHT and not few.log_loss and "fewer than" in few.how
    assert choose_weight(cnn, np.zeros((n, k)), truth).weight == 0.0  # a tie goes to the CNN alone
