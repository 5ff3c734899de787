"""Simple baselines beside the model in `make eval`, and bootstrap intervals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from factories import make_separable_store, make_store

from specstore.common import ConfigError
from specstore.infer.cli import main as infer_main
from specstore.infer.data.split import SplitRule, training_rows
from specstore.infer.evaluation.baselines import bootstrap_ci, clip_stats, fit_baselines
from specstore.infer.evaluation.evaluate import evaluate
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train import TrainConfig, train
from specstore.store import FeatureSpec, open_store


def test_bootstrap_interval() -> None:
    assert bootstrap_ci(np.ones(50)) == (1.0, 1.0)
    half = np.array([1, 0] * 50)
    lo, hi = bootstrap_ci(half)
    assert lo < 0.5 < hi and 0.05 < hi - lo < 0.3  # about +-1.96 * sqrt(0.25 / 100)
    assert bootstrap_ci(half) == (lo, hi)  # seeded: the same interval every time
    wide = bootstrap_ci(np.array([1, 0] * 10))
    assert wide[1] - wide[0] > hi - lo  # fewer clips, wider interval


def test_clip_stats_are_band_mean_std_and_delta(tmp_path: Path) -> None:
    s = open_store(make_store(tmp_path / "s.zarr", lengths=[20, 7]))
    got = clip_stats(s, [1], ["mel"])
    x = np.asarray(s.feature("mel").frames(1), dtype=np.float64)
    expected = np.concatenate([x.mean(0), x.std(0), np.abs(np.diff(x, axis=0)).mean(0)])
    np.testing.assert_allclose(got[0], expected)
    with pytest.raises(ConfigError, match="unknown statistic"):
        clip_stats(s, [0], ["mel"], stats=("median",))


@pytest.mark.slow
def test_baselines_learn_separable_classes_on_both_features(tmp_path: Path) -> None:
    specs = {"mel": FeatureSpec.mel(n_bins=16), "cqt": FeatureSpec.cqt(n_bins=12)}
    train_s = open_store(make_store(tmp_path / "a.zarr", lengths=[40] * 30, specs=specs, seed=1))
    test_s = open_store(make_store(tmp_path / "b.zarr", lengths=[40] * 12, specs=specs, seed=2))
    truth = [test_s.label_names[k] for k in test_s.labels]
    results = fit_baselines(train_s, np.arange(30), test_s, np.arange(12), truth)
    assert [r.name.split(" on ")[1].split(" ")[0] for r in results] == ["mel", "mel", "mel+cqt", "mel+cqt"]
    for r in results:  # random noise: about chance (1/3), and the interval says how uncertain
        assert 0.0 <= r.accuracy_ci[0] <= r.accuracy <= r.accuracy_ci[1] <= 1.0 and r.n_train == 30


@pytest.mark.slow
def test_eval_reports_baselines_beside_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=40)
    model = tmp_path / "m.pt"
    train(store, model, TrainConfig(epochs=3, width=4, depth=2, lr=0.03, crop_seconds=None,
                                    run=RunOptions(device="cpu"),
                                    val_fraction=0.25), progress=False)
    report = evaluate(store, model, baselines=True, device="cpu", progress=False)
    s = open_store(store)
    n_train = len(training_rows(s, SplitRule(0.25, 0))[0])
    assert report.split == "val" and len(report.baselines) == 2
    assert all(b["n_train"] == n_train for b in report.baselines)  # fitted on the model's training clips only
    lr = report.baselines[0]
    assert lr["name"].startswith("logistic regression") and lr["accuracy"] >= 0.8  # band energy separates them
    assert report.accuracy_ci[0] <= report.accuracy <= report.accuracy_ci[1]
    text = report.text()
    assert "margin over the best baseline" in text and "95% CI" in text
    other = make_separable_store(tmp_path / "o.zarr", n=12, seed=9)
    assert infer_main(["eval", str(other), str(model), "--baselines", "--baseline-store", str(store),
                       "--out-dir", str(tmp_path / "r"), "--device", "cpu", "--no-progress"]) == 0
    assert "margin over the best baseline" in (tmp_path / "r" / "report.txt").read_text()
