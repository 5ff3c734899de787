"""`make eval`: the metrics against hand computations, label matching by name, the report files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from factories import make_checkpoint as _make_checkpoint
from factories import make_store

from specstore.infer.cli import main as infer_main
from specstore.infer.data.split import SplitRule
from specstore.infer.engine.predict import predict
from specstore.infer.evaluation.evaluate import EvaluateError, evaluate
from specstore.infer.explore import metrics_from_confusion, plot_confusion
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.store import FeatureSpec, open_store

SPEC = FeatureSpec.mel(n_bins=16)
MODEL_LABELS = ["ambient", "jazz", "rock"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def make_checkpoint(path: Path, *, split: dict | None = None, seed: int = 0) -> Path:
    return _make_checkpoint(path, labels=MODEL_LABELS, seed=seed, extra={"split": split} if split is not None else None)


def make_test_store(path: Path, labels: list[str | None], *, seed: int = 0) -> Path:
    """A store whose label list is ordered differently from the model's and holds a label it lacks."""
    return make_store(path, labels, label_names=["rock", "pop", "ambient"], seed=seed)


def test_metrics_match_a_hand_computation() -> None:
    # rows: truth, columns: prediction
    cm = np.array([[5, 1, 0],
                   [2, 3, 1],
                   [0, 0, 4]])
    m = metrics_from_confusion(cm, ["a", "b", "c"])
    assert m["n"] == 16
    assert m["accuracy"] == pytest.approx(12 / 16)
    pc = m["per_class"]
    # precision = tp / column sum (7, 4, 5); recall = tp / row sum (6, 6, 4)
    assert pc["a"]["precision"] == pytest.approx(5 / 7) and pc["a"]["recall"] == pytest.approx(5 / 6)
    assert pc["b"]["precision"] == pytest.approx(3 / 4) and pc["b"]["recall"] == pytest.approx(3 / 6)
    assert pc["c"]["precision"] == pytest.approx(4 / 5) and pc["c"]["recall"] == pytest.approx(4 / 4)
    # F1 = 2 tp / (2 tp + fp + fn)
    assert pc["a"]["f1"] == pytest.approx(10 / 13)
    assert pc["b"]["f1"] == pytest.approx(6 / 10)
    assert pc["c"]["f1"] == pytest.approx(8 / 9)
    assert [pc[k]["support"] for k in "abc"] == [6, 6, 4]
    assert [pc[k]["predicted"] for k in "abc"] == [7, 4, 5]
    assert m["macro_precision"] == pytest.approx((5 / 7 + 3 / 4 + 4 / 5) / 3)
    assert m["macro_recall"] == pytest.approx((5 / 6 + 1 / 2 + 1) / 3)
    assert m["macro_f1"] == pytest.approx((10 / 13 + 6 / 10 + 8 / 9) / 3)
    assert m["weighted_f1"] == pytest.approx((6 * 10 / 13 + 6 * 6 / 10 + 4 * 8 / 9) / 16)


def test_zero_division_is_zero_and_absent_classes_leave_the_macro_average() -> None:
    # class b is predicted once but never true; class c neither occurs nor is predicted
    cm = np.array([[1, 1, 0],
                   [0, 0, 0],
                   [0, 0, 0]])
    m = metrics_from_confusion(cm, ["a", "b", "c"])
    assert m["accuracy"] == pytest.approx(0.5)
    assert m["per_class"]["b"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0, "predicted": 1}
    assert m["per_class"]["c"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 0, "predicted": 0}
    assert m["macro_precision"] == pytest.approx((1.0 + 0.0) / 2)
    assert m["macro_recall"] == pytest.approx((0.5 + 0.0) / 2)
    assert m["macro_f1"] == pytest.approx((2 / 3 + 0.0) / 2)
    empty = metrics_from_confusion(np.zeros((2, 2), dtype=int), ["a", "b"])
    assert empty["accuracy"] == 0.0 and empty["macro_f1"] == 0.0 and empty["n"] == 0
    with pytest.raises(ValueError, match="3x3"):
        metrics_from_confusion(np.zeros((2, 2)), ["a", "b", "c"])


def test_report_matches_predictions_by_label_name(tmp_path: Path) -> None:
    labels: list[str | None] = (["rock", "ambient", "jazz", "pop", None] * 6)[:28]
    store = make_test_store(tmp_path / "s.zarr", labels)
    ck = make_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "reports"
    report = evaluate(store, ck, out, device="cpu", progress=False, budget_mb=4)

    # reference: predict() over the store, then count by hand with label names
    s = open_store(store)
    pred = predict(s, load_checkpoint(ck), device="cpu", progress=False)
    evaluated = [i for i in range(len(s)) if s.labels[i] >= 0]
    truth_names = [s.label_names[s.labels[i]] for i in evaluated]
    pred_names = [MODEL_LABELS[int(np.argmax(pred.probs[i]))] for i in evaluated]
    correct = sum(t == p for t, p in zip(truth_names, pred_names, strict=False))
    assert report.n_clips == len(evaluated) == 23
    assert report.n_unlabelled == 5
    assert report.n_unknown_label == truth_names.count("pop") == 5 and report.unknown_labels == ["pop"]
    assert report.label_names == MODEL_LABELS + ["pop"]
    assert report.accuracy == pytest.approx(correct / len(evaluated))
    top = np.argsort(-pred.probs, axis=1)[:, :3]
    top_hits = sum(t in [MODEL_LABELS[j] for j in top[i]] for i, t in zip(evaluated, truth_names, strict=False))
    assert report.topk_accuracy == pytest.approx(top_hits / len(evaluated)) and report.topk == 3
    assert report.topk_accuracy < 1.0  # "pop" clips can never be right
    cm = np.array(report.confusion)
    for a, name_a in enumerate(report.label_names):
        for b, name_b in enumerate(report.label_names):
            expected = sum(t == name_a and p == name_b for t, p in zip(truth_names, pred_names, strict=False))
            assert cm[a, b] == expected, (name_a, name_b)
    assert cm[:, 3].sum() == 0  # the model never predicts a label it does not know
    assert len(report.misclassified) == len(evaluated) - correct

    data = json.loads((out / "report.json").read_text())
    for key in ("accuracy", "topk_accuracy", "macro_f1", "macro_precision", "macro_recall", "per_class",
                "confusion", "label_names", "n_clips", "n_unlabelled", "n_unknown_label"):
        assert key in data, key
    assert data["accuracy"] == pytest.approx(report.accuracy) and data["confusion"] == report.confusion
    assert set(data["per_class"]) == set(report.label_names)
    assert data["per_class"]["jazz"]["support"] == truth_names.count("jazz")
    text = (out / "report.txt").read_text()
    assert "macro avg" in text and "pop" in text and f"{report.accuracy:.3f}" in text
    png = (out / "confusion.png").read_bytes()
    assert png.startswith(PNG_SIGNATURE) and len(png) > 2000


def test_a_class_without_clips_reads_as_such_in_the_report(tmp_path: Path) -> None:
    """jazz has no clips here: its recall and F1 are undefined, not 0.000, and the row says why."""
    store = make_test_store(tmp_path / "s.zarr", ["rock", "ambient"] * 6)
    report = evaluate(store, make_checkpoint(tmp_path / "m.pt"), tmp_path / "r", device="cpu", progress=False)
    jazz = report.per_class["jazz"]
    assert jazz["support"] == 0
    row = next(line for line in (tmp_path / "r" / "report.txt").read_text().splitlines()
               if line.strip().startswith("jazz"))
    cells = row.split()
    assert cells[2:5] == ["-", "-", "0"] and "no clips of this class here" in row
    assert cells[1] == ("-" if not jazz["predicted"] else f"{jazz['precision']:.3f}")
    rock = next(line for line in report.text().splitlines() if line.strip().startswith("rock"))
    assert " - " not in rock and "no clips" not in rock


def test_val_split_is_the_recorded_one(tmp_path: Path) -> None:
    labels: list[str | None] = ["rock", "ambient"] * 20
    store = make_test_store(tmp_path / "s.zarr", labels)
    rule = SplitRule(0.3, seed=2)
    ck = make_checkpoint(tmp_path / "m.pt", split=rule.to_dict())
    s = open_store(store)
    val = evaluate(store, ck, device="cpu", progress=False, split="val")
    train = evaluate(store, ck, device="cpu", progress=False, split="train")
    assert val.n_clips == int(rule.is_val(s.hashes).sum()) > 0
    assert val.n_clips + train.n_clips == len(s)
    everything = evaluate(store, ck, device="cpu", progress=False)
    assert np.array_equal(np.array(val.confusion) + np.array(train.confusion), np.array(everything.confusion))


def test_bad_requests_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = make_test_store(tmp_path / "s.zarr", ["rock", None, "ambient"])
    no_split = make_checkpoint(tmp_path / "m.pt")
    with pytest.raises(EvaluateError, match="records no train/validation split"):
        evaluate(store, no_split, split="val", device="cpu", progress=False)
    assert infer_main(["eval", str(store), str(no_split), "--split", "val", "--out-dir", str(tmp_path / "r"),
                       "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "split" in err
    all_trained = make_checkpoint(tmp_path / "all.pt", split=SplitRule(0.0).to_dict())  # the small-corpus default
    with pytest.raises(EvaluateError, match="held out no validation clips.*specstore-cv"):
        evaluate(store, all_trained, split="val", device="cpu", progress=False)
    unlabelled = make_test_store(tmp_path / "u.zarr", [None, None])
    with pytest.raises(EvaluateError, match="no labelled clips"):
        evaluate(unlabelled, no_split, device="cpu", progress=False)
    assert infer_main(["eval", str(unlabelled), str(no_split), "--out-dir", str(tmp_path / "r"),
                       "--no-progress"]) == 2
    assert "no labelled clips" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_confusion_png_for_many_classes(tmp_path: Path) -> None:
    names = [f"genre{i:02d}" for i in range(40)]
    cm = np.random.default_rng(0).integers(0, 5, (40, 40)) + np.eye(40, dtype=int) * 20
    p = plot_confusion(cm, names, tmp_path / "big.png")
    assert p.read_bytes().startswith(PNG_SIGNATURE)
    with pytest.raises(ValueError, match="40x40"):
        plot_confusion(cm[:3, :3], names, tmp_path / "bad.png")


def test_the_clips_scored_are_listed_beside_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``heldout.csv``: path, content hash, label and prediction of each clip of the held-out split, named by
    the report (json, txt) and the command's output."""
    import csv

    labels: list[str | None] = ["rock", "ambient", None] * 8
    store = make_test_store(tmp_path / "s.zarr", labels)
    rule = SplitRule(0.3, seed=2)
    ck = make_checkpoint(tmp_path / "m.pt", split=rule.to_dict())
    out = tmp_path / "r"
    assert infer_main(["eval", str(store), str(ck), "--split", "val", "--out-dir", str(out), "--device", "cpu",
                       "--no-progress"]) == 0
    assert "heldout.csv" in capsys.readouterr().out
    s = open_store(store)
    held = [i for i in range(len(s)) if rule.is_val([s.hashes[i]])[0] and s.labels[i] >= 0]
    with open(out / "heldout.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert [r["path"] for r in rows] == [s.paths[i] for i in held] and held
    assert [r["hash"] for r in rows] == [s.hashes[i] for i in held]
    assert [r["label"] for r in rows] == [s.label_names[s.labels[i]] for i in held]
    report = json.loads((out / "report.json").read_text())
    assert report["files"]["clips"] == str(out / "heldout.csv") and "clips" not in report
    wrong = {(m["path"], m["pred"]) for m in report["misclassified"]}
    assert wrong == {(r["path"], r["prediction"]) for r in rows if r["prediction"] != r["label"]}
    assert all(r["prediction"] in MODEL_LABELS for r in rows)
    assert str(out / "heldout.csv") in (out / "report.txt").read_text()
