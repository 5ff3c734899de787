"""Shipped models by name (:mod:`specstore.infer.models.shipped`) and multi-label tag outputs, on a tiny stand-in tagger
(``tests/shipped_stub.py``: a width-4 CNN on 16 mel bins), so nothing here needs the real weights."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
import shipped_stub
import torch
from factories import SPEC16, make_corpus, make_store

from specstore.infer.engine.predict import predict
from specstore.infer.engine.predictions import PredictionsError, read_predictions_csv
from specstore.infer.models.checkpoint import CheckpointError
from specstore.infer.models.shipped import is_shipped, resolve_checkpoint
from specstore.store import FeatureSpec, open_store

NAME = shipped_stub.NAME
stand_in = shipped_stub.stand_in  # the module's autouse fixture: the stand-in tagger registered




@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_store(tmp_path_factory.mktemp("tags") / "s.zarr", lengths=[12, 40, 90, 25])


def test_a_name_resolves_to_the_shipped_model_and_a_file_of_that_name_wins(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    ckpt = resolve_checkpoint(NAME)
    assert ckpt.outputs == "tags" and ckpt.label_names == shipped_stub.TAGS and ckpt.spec == SPEC16
    assert ckpt.extra["shipped"] == NAME and ckpt.feature == "mel"
    monkeypatch.chdir(tmp_path)
    (tmp_path / NAME).write_bytes(b"not a checkpoint")
    assert not is_shipped(NAME)
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        resolve_checkpoint(NAME)


def test_predict_gives_independent_sigmoid_scores_and_a_tags_csv(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.csv"
    res = predict(store, NAME, out, topk=3, device="cpu")
    model, _, _ = shipped_stub.load(NAME)
    s = open_store(store)
    x = torch.from_numpy(np.ascontiguousarray(s.feature("mel")[2], dtype=np.float32))[None, None]
    with torch.no_grad():
        expected = torch.sigmoid(model(x, torch.tensor([x.shape[-1]])))[0].numpy()
    np.testing.assert_allclose(res.probs[2], expected, atol=1e-5)
    assert res.outputs == "tags" and not np.allclose(res.probs.sum(axis=1), 1.0)
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["path", "tags", "truth"] and len(rows[1][1].split(";")) == 3
    with pytest.raises(PredictionsError, match="tagger's scores"):
        read_predictions_csv(out)


def test_labels_restrict_the_output_and_unknown_ones_are_named(store: Path) -> None:
    res = predict(store, NAME, topk=5, labels="jazz,80s", device="cpu")
    full = predict(store, NAME, topk=5, device="cpu")
    assert res.label_names == ["jazz", "80s"]
    np.testing.assert_array_equal(res.probs, full.probs[:, [1, 4]])
    with pytest.raises(PredictionsError, match="no label 'polka'"):
        predict(store, NAME, labels="rock,polka", device="cpu")
    with pytest.raises(PredictionsError, match="single-label models"):
        predict(store, NAME, unknown_below=0.5, device="cpu")


def test_a_store_without_the_models_feature_names_make_features(tmp_path: Path) -> None:
    other = make_store(tmp_path / "cqt.zarr", lengths=[20, 30], specs={"cqt": FeatureSpec.cqt(n_bins=16)})
    with pytest.raises(CheckpointError, match=r"needs feature 'mel'.*`make features FEATURES=mel"):
        predict(other, NAME, device="cpu")


@pytest.fixture(scope="module")
def song(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("songs"), n=1, seconds=1.0)[0]


def _classify(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    from specstore.serving.cli import main

    code = main(["classify", *args, "--model", NAME, "--device", "cpu", "--no-progress"])
    got = capsys.readouterr()
    return code, got.out, got.err


def test_classify_says_tags_in_json_csv_and_table(song: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _classify([str(song), "--json", "--topk", "2"], capsys)
    whole = json.loads(out)  # the server's answer shape
    answer = whole["files"][0]
    assert code == 0 and "answer" not in answer and "top" not in answer and whole["outputs"] == "tags"
    assert "calibration" not in whole and "temperature" not in whole  # independent scores: no temperature
    assert [t["tag"] for t in answer["tags"]][0] in shipped_stub.TAGS and len(answer["tags"]) == 2
    code, out, _ = _classify([str(song), "--csv", "--labels", "rock,jazz"], capsys)
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["path", "tags", "truth"] and {p.split(":")[0] for p in rows[1][1].split(";")} == {"rock", "jazz"}
    code, out, _ = _classify([str(song)], capsys)
    assert "tags (independent scores)" in out.splitlines()[0]
    # --segments: each window has the tagger's output shape, and no calibration either
    code, out, _ = _classify([str(song), "--json", "--topk", "2", "--segments", "0.5"], capsys)
    segs = json.loads(out)["files"][0]["segments"]
    assert code == 0 and len(segs) == 2 and all(set(s) == {"start_s", "end_s", "tags"} for s in segs)
    assert all(len(s["tags"]) == 2 and s["tags"][0]["tag"] in shipped_stub.TAGS for s in segs)
    code, out, _ = _classify([str(song), "--csv", "--segments", "0.5"], capsys)
    rows = list(csv.reader(io.StringIO(out)))
    assert rows[0] == ["path", "start_s", "end_s", "tags", "truth"] and len(rows) == 3


def test_classify_lists_tags_and_refuses_unknown_labels(song: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _classify(["--list-tags"], capsys)
    assert code == 0 and out.splitlines() == shipped_stub.TAGS
    code, out, err = _classify([str(song), "--labels", "rock,polka"], capsys)
    assert code == 2 and err.strip().splitlines() == [err.strip()] and "no label 'polka'" in err
    code, out, err = _classify([str(song), "--unknown-below", "0.5"], capsys)
    assert code == 2 and "single-label models" in err


def test_the_server_answers_tags_for_a_shipped_name(song: Path) -> None:
    from starlette.testclient import TestClient

    from specstore.infer.engine.runtime import RunOptions
    from specstore.serving.app import Service, create_app
    from specstore.serving.config import ServeConfig
    from specstore.serving.model import Classifier

    service = Service(Classifier(NAME, RunOptions(device="cpu", progress=False)), ServeConfig(workers=1))
    with TestClient(create_app(service), base_url="http://localhost") as client:
        health = client.get("/health").json()
        assert health["outputs"] == "tags" and health["labels"] == shipped_stub.TAGS and health["model"] == NAME
        assert "calibration" not in health and "temperature" not in health  # sigmoid scores take no temperature
        r = client.post("/classify?topk=3&segments=0.5", files=[("file", (song.name, song.read_bytes(), "audio/wav"))])
        answer = r.json()
        assert r.status_code == 200 and answer["outputs"] == "tags"
        assert "calibration" not in answer and "temperature" not in answer
        tags = answer["files"][0]["tags"]
        assert "top" not in answer["files"][0] and len(tags) == 3 and {"tag", "score"} == set(tags[0])
        assert [set(s) for s in answer["files"][0]["segments"]] == [{"start_s", "end_s", "tags"}] * 2
        assert 'answer.tags' in client.get("/").text


def test_eval_refuses_a_tagger_in_one_line(store: Path) -> None:
    from specstore.common import ConfigError
    from specstore.infer.evaluation.evaluate import evaluate

    with pytest.raises(ConfigError, match="is a tagger"):
        evaluate(store, NAME, device="cpu", progress=False)
