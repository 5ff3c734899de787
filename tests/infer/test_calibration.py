"""Honest confidence: the temperature fit, the expected calibration error, and every output applying and
saying the checkpoint's calibration (``make infer`` CSV, ``make eval`` report, ``specstore classify``).

Training records the temperature: tests/infer/test_train.py (its runs hold out validation clips)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from factories import make_checkpoint, make_corpus, make_store

from specstore.common import ConfigError
from specstore.infer.engine.predict import predict
from specstore.infer.evaluation.evaluate import evaluate
from specstore.infer.models.calibration import Calibration, expected_calibration_error, fit_temperature, probabilities
from specstore.infer.models.checkpoint import CheckpointError, load_checkpoint
from specstore.serving.cli import main as specstore_main
from specstore.store import FeatureSpec

T = 2.0


def _toy_logits(accuracy: float, scale: float, n: int = 300, k: int = 4, seed: int = 0) -> tuple[np.ndarray,
                                                                                                  np.ndarray]:
    """Logits of ``n`` clips whose top class is right for a share ``accuracy`` of them; ``scale``: the top
    logit over the others (large: very sure)."""
    rng = np.random.default_rng(seed)
    truth = rng.integers(0, k, n)
    pred = np.where(rng.random(n) < accuracy, truth, (truth + rng.integers(1, k, n)) % k)
    logits = rng.normal(0.0, 0.1, (n, k))
    logits[np.arange(n), pred] += scale
    return logits.astype(np.float32), truth


def _nll(logits: np.ndarray, truth: np.ndarray, t: float) -> float:
    return float(F.cross_entropy(torch.from_numpy(logits).double() / t, torch.from_numpy(truth)))


def test_the_fit_softens_an_over_confident_model_and_sharpens_an_under_confident_one() -> None:
    over = _toy_logits(accuracy=0.6, scale=8.0)  # says ~0.999, right 60% of the time
    under = _toy_logits(accuracy=0.95, scale=0.5)  # says ~0.4, right 95% of the time
    fit_over, fit_under = fit_temperature(*over), fit_temperature(*under)
    assert fit_over.temperature is not None and fit_over.temperature > 1.5
    assert fit_under.temperature is not None and fit_under.temperature < 0.7
    for (logits, truth), fit in ((over, fit_over), (under, fit_under)):
        t = fit.temperature
        assert t is not None and fit.n_clips == len(truth)
        # a minimum: neighbours do no better, and it beats T = 1
        assert _nll(logits, truth, t) <= min(_nll(logits, truth, t * 1.05), _nll(logits, truth, t / 1.05)) + 1e-9
        assert fit.nll_after is not None and fit.nll_before is not None and fit.nll_after < fit.nll_before
        assert fit.nll_before == pytest.approx(_nll(logits, truth, 1.0))
        # calibration brings the ECE down
        assert (expected_calibration_error(probabilities(logits, fit), truth)
                < expected_calibration_error(probabilities(logits), truth))
    assert fit_temperature(*over) == fit_over  # deterministic
    with pytest.raises(ConfigError, match="logits"):
        fit_temperature(np.zeros((3, 2)), np.zeros(2, dtype=np.int64))
    with pytest.raises(ConfigError, match="positive"):
        Calibration(0.0)


def test_a_checkpoint_with_a_bad_temperature_is_refused_when_read(tmp_path: Path) -> None:
    for bad in (-1.0, float("nan"), "hot"):
        record = {"method": "temperature", "temperature": bad}
        path = make_checkpoint(tmp_path / "bad.pt", extra={"calibration": record})
        with pytest.raises(CheckpointError, match="calibration|temperature"):
            load_checkpoint(path)


def test_ece_matches_a_hand_computation() -> None:
    """Four clips, 15 bins: 0.9 right (bin 13), 0.75 wrong (bin 11), 0.7 right and 0.72 wrong (both bin 10):
    ECE = (|1 - 0.9| + |0 - 0.75|) / 4 + 2/4 * |0.5 - 0.71| = 0.3175."""
    probs = np.array([[0.9, 0.1], [0.75, 0.25], [0.3, 0.7], [0.28, 0.72]])
    truth = np.array([0, 1, 1, 0])
    assert expected_calibration_error(probs, truth) == pytest.approx(0.3175)
    assert expected_calibration_error(probs, truth, n_bins=1) == pytest.approx(abs(0.5 - (0.9 + 0.75 + 0.7 + 0.72) / 4))
    assert expected_calibration_error(np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([0, 1])) == 0.0
    # a label the model has no column for is always wrong
    assert expected_calibration_error(np.array([[1.0, 0.0]]), np.array([2])) == pytest.approx(1.0)
    assert expected_calibration_error(np.zeros((0, 2)), np.zeros(0, dtype=np.int64)) == 0.0


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A store, and one untrained checkpoint twice: as it is (uncalibrated) and recording T = 2."""
    d = tmp_path_factory.mktemp("cal")
    return {"store": make_store(d / "s.zarr", lengths=[20, 35, 50, 65] * 3), "plain": make_checkpoint(d / "p.pt"),
            "scaled": make_checkpoint(d / "t.pt", extra={"calibration": Calibration(T, 12).to_dict()})}


def test_predict_applies_the_temperature_and_its_csv_says_which(models: dict[str, Path], tmp_path: Path) -> None:
    assert not load_checkpoint(models["plain"]).calibration.calibrated  # the old format: no record, uncalibrated
    assert load_checkpoint(models["scaled"]).calibration.temperature == T
    plain = predict(models["store"], models["plain"], tmp_path / "p.csv", device="cpu", progress=False)
    scaled = predict(models["store"], models["scaled"], tmp_path / "t.csv", device="cpu", progress=False,
                     unknown_below=0.5)
    # the same weights: softmax(logits / T), with log(plain probabilities) standing for the logits
    expected = torch.softmax(torch.log(torch.from_numpy(plain.probs).double()) / T, dim=1).numpy()
    np.testing.assert_allclose(scaled.probs, expected, atol=1e-5)
    assert not np.allclose(scaled.probs, plain.probs, atol=1e-3)
    rows = {name: list(csv.DictReader(open(tmp_path / f"{name}.csv", encoding="utf-8"))) for name in ("p", "t")}
    assert {r["calibration"] for r in rows["p"]} == {"uncalibrated"}
    assert {r["calibration"] for r in rows["t"]} == {"temperature=2.0000"}
    # --unknown-below reads the calibrated probabilities
    top = scaled.probs.max(axis=1)
    assert [r["prob"] for r in rows["t"]] == [f"{p:.4f}" for p in top]
    assert [r["pred"] == "unknown" for r in rows["t"]] == [bool(p < 0.5) for p in top]
    # --labels keeps columns of the calibrated softmax over every label (no renormalisation over the subset)
    kept = predict(models["store"], models["scaled"], device="cpu", progress=False, labels="rock,ambient")
    np.testing.assert_allclose(kept.probs, scaled.probs[:, [2, 0]], atol=1e-6)
    assert kept.calibration == "temperature=2.0000"


def test_a_tagger_takes_no_temperature(tmp_path: Path) -> None:
    logits = np.array([[2.0, -1.0, 0.5], [0.0, 3.0, -2.0]], dtype=np.float32)
    np.testing.assert_allclose(probabilities(logits, Calibration(T), "tags"), 1 / (1 + np.exp(-logits)), rtol=1e-6)
    np.testing.assert_allclose(probabilities(logits, Calibration(T)),
                               torch.softmax(torch.from_numpy(logits) / T, dim=1).numpy(), rtol=1e-6)
    # even a tagger's checkpoint that records a temperature reads uncalibrated: sigmoid scores take none
    path = make_checkpoint(tmp_path / "tags.pt", extra={"outputs": "tags", "calibration": Calibration(T).to_dict()})
    assert not load_checkpoint(path).calibration.calibrated


def test_eval_reports_the_ece_before_and_after_the_temperature(models: dict[str, Path]) -> None:
    plain = evaluate(models["store"], models["plain"], device="cpu", progress=False)
    scaled = evaluate(models["store"], models["scaled"], device="cpu", progress=False)
    assert plain.calibration == "uncalibrated" and plain.temperature is None and plain.ece_after is None
    assert plain.ece_bins == 15 and "uncalibrated" in plain.text() and "15 equal-width bins" in plain.text()
    assert scaled.calibration == "temperature" and scaled.temperature == T
    assert scaled.ece_before == pytest.approx(plain.ece_before)
    assert scaled.ece_after is not None and scaled.ece_after != pytest.approx(scaled.ece_before)
    assert "T = 2.000" in scaled.text() and {"ece_before", "ece_after", "temperature"} <= set(scaled.to_dict())
    assert scaled.accuracy == plain.accuracy  # a temperature never changes a prediction


def test_classify_applies_the_temperature_and_says_so(models: dict[str, Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(f) for f in make_corpus(tmp_path / "c", n=2, seconds=1.0)]
    spec = FeatureSpec.mel(n_bins=16)
    plain, scaled = (make_checkpoint(tmp_path / f"{n}.pt", spec=spec, extra=extra)
                     for n, extra in (("p", None), ("t", {"calibration": Calibration(T, 12).to_dict()})))
    args = ["--device", "cpu", "--no-progress", "--topk", "3"]
    out = {}
    for name, model in (("p", plain), ("t", scaled)):
        assert specstore_main(["classify", *files, "--model", str(model), "--json", *args]) == 0
        answer = json.loads(capsys.readouterr().out)
        out[name] = answer["files"]
        out[name + "-cal"] = (answer["calibration"], answer["temperature"])
    assert out["p-cal"] == ("uncalibrated", None) and out["t-cal"] == ("temperature", T)
    for p, t in zip(out["p"], out["t"], strict=True):
        raw = {e["label"]: e["prob"] for e in p["top"]}
        logits = torch.log(torch.tensor([raw[e["label"]] for e in t["top"]], dtype=torch.float64))
        np.testing.assert_allclose([e["prob"] for e in t["top"]], torch.softmax(logits / T, 0).numpy(), atol=1e-4)
    assert specstore_main(["classify", *files, "--model", str(scaled), "--csv", *args]) == 0
    assert {r["calibration"] for r in csv.DictReader(capsys.readouterr().out.splitlines())} == {"temperature=2.0000"}
    assert specstore_main(["classify", *files, "--model", str(plain), *args]) == 0
    assert "(probabilities uncalibrated)" in capsys.readouterr().out.splitlines()[0]
    assert specstore_main(["classify", *files, "--model", str(scaled), *args]) == 0
    assert "T = 2.00" in capsys.readouterr().out.splitlines()[0]
