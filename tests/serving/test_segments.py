"""``specstore classify --segments SECONDS``: genre over time, one row per window, exact under batching."""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from factories import LABELS, make_checkpoint, make_corpus

from specstore.common import ConfigError
from specstore.infer.engine.runtime import RunOptions
from specstore.serving.classify import classify_files
from specstore.serving.cli import main as specstore_main
from specstore.serving.model import Classifier
from specstore.serving.segments import auto_seconds, parse_segments, segment_spans
from specstore.store import FeatureSpec

CPU = RunOptions(device="cpu", progress=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], Path]:
    root = tmp_path_factory.mktemp("seg")
    files = make_corpus(root / "c", n=3, seconds=1.3, step=0.9)  # 1.3, 2.2, 3.1 s
    return files, make_checkpoint(root / "m.pt", spec=FeatureSpec.mel(n_bins=16))


def test_spans_cover_the_clip_in_order_the_last_one_shorter() -> None:
    spans = segment_spans(100, 2.3, 1.0, 0.023, align=4)
    assert [(s, e) for s, e, _, _ in spans] == [(0.0, 1.0), (1.0, 2.0), (2.0, 2.3)]
    assert spans[0][2] == 0 and spans[-1][3] == 100
    assert all(a[3] == b[2] for a, b in zip(spans, spans[1:], strict=False))
    assert all(f0 % 4 == 0 and f1 > f0 for _, _, f0, f1 in spans)
    with pytest.raises(ConfigError, match="shorter than the model's time step"):
        segment_spans(100, 2.3, 0.05, 0.023, align=4)
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive number of seconds"):
            parse_segments(bad)


def test_cli_json_and_csv_rows_one_per_window(setup: tuple[list[Path], Path],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    files, ckpt = setup
    args = [str(f) for f in files] + ["--model", str(ckpt), "--device", "cpu", "--no-progress", "--segments", "1"]
    assert specstore_main(["classify", *args, "--json", "--topk", "2"]) == 0
    answer = json.loads(capsys.readouterr().out)
    data = answer["files"]
    assert (answer["calibration"], answer["temperature"]) == ("uncalibrated", None)
    for d in data:
        assert d["segment_s"] == 1.0
        segs = d["segments"]
        assert len(segs) == math.ceil(d["duration_s"] - 1e-6)
        assert [s["start_s"] for s in segs] == [float(k) for k in range(len(segs))]
        assert [s["end_s"] for s in segs] == [float(k + 1) for k in range(len(segs) - 1)] + [d["duration_s"]]
        for s in segs:
            probs = [t["prob"] for t in s["top"]]
            assert len(probs) == 2 and probs == sorted(probs, reverse=True) and s["answer"] == s["top"][0]["label"]
            assert s["answer"] in LABELS
    assert specstore_main(["classify", *args, "--csv", "--unknown-below", "1"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0])[:3] == ["path", "start_s", "end_s"]
    assert len(rows) == sum(len(d["segments"]) for d in data) and {r["pred"] for r in rows} == {"unknown"}
    assert {r["calibration"] for r in rows} == {"uncalibrated"}
    assert [r["path"] for r in rows] == [d["file"] for d in data for _ in d["segments"]]
    assert specstore_main(["classify", *args]) == 0  # the table: one line per file, one indented per window
    lines = capsys.readouterr().out.splitlines()
    assert sum(line.startswith("  ") for line in lines) == len(rows)
    assert specstore_main(["classify", *args[:-1], "0.01"]) == 2
    assert "shorter than the model's time step" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's one line
        specstore_main(["classify", *args[:-2], "--segments=0"])
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--segments" in err and "'0'" in err, err


def test_segments_do_not_depend_on_the_other_files_of_the_run(setup: tuple[list[Path], Path]) -> None:
    files, ckpt = setup
    one_batch = RunOptions(device="cpu", progress=False, batch_overhead_frames=1e9)  # masking must hold
    classifier = Classifier(ckpt, one_batch)
    together = classify_files(files, classifier, segments=0.7, progress=False, topk=3)
    for i, f in enumerate(files):
        alone = classify_files([f], classifier, segments=0.7, progress=False, topk=3).results[0]
        got = together.results[i]
        assert len(got.segments) == len(alone.segments) == math.ceil(got.duration / 0.7 - 1e-9)
        for a, b in zip(got.segments, alone.segments, strict=True):
            assert (a.start_s, a.end_s) == (b.start_s, b.end_s) and [x[0] for x in a.top] == [x[0] for x in b.top]
            np.testing.assert_allclose([x[1] for x in a.top], [x[1] for x in b.top], rtol=1e-5, atol=1e-6)
    assert len({tuple(s.top[0][1] for s in r.segments) for r in together.results}) == 3  # not one constant


def test_auto_never_picks_a_window_shorter_than_the_models_step() -> None:
    assert auto_seconds(90.0) == 5.0 and auto_seconds(180.0) == 10.0  # the plain rule: at most 24 windows
    assert auto_seconds(3.0, 5.94) == 10.0 and auto_seconds(90.0, 9.66) == 10.0
    assert auto_seconds(400.0, 9.66) == 30.0  # more windows than 24 at 10 and 15 s
    assert auto_seconds(60.0, 700.0) == 700.0  # a step longer than every listed window: the step itself


def test_the_page_gets_an_answer_for_a_short_clip_from_a_model_with_a_long_step(tmp_path: Path) -> None:
    """The page always asks ``segments=auto``: a model pooling ~6 s windows gets 200 for a 3 s clip, not 500."""
    from starlette.testclient import TestClient

    from specstore.pipeline.testing import write_music_like
    from specstore.serving.app import Service, create_app
    from specstore.serving.config import ServeConfig

    spec = FeatureSpec.mel(n_bins=16)
    ckpt = make_checkpoint(tmp_path / "m.pt", spec=spec, pool_window=256)  # 256 frames of 512 / 22050 Hz: 5.94 s
    classifier = Classifier(ckpt, CPU)
    step_s = classifier.window_align * classifier.frame_seconds
    assert 5.9 < step_s < 6.0
    audio = write_music_like(tmp_path / "a.wav", 3.0, seed=1).read_bytes()
    with TestClient(create_app(Service(classifier, ServeConfig(workers=1))), base_url="http://localhost") as client:
        r = client.post("/classify?picture=1&topk=5&segments=auto", files=[("file", ("a.wav", audio))])
    assert r.status_code == 200, r.text
    got = r.json()["files"][0]
    assert got["segment_s"] == 10.0 and got["segment_s"] >= step_s
    assert [(s["start_s"], s["end_s"]) for s in got["segments"]] == [(0.0, got["duration_s"])]
