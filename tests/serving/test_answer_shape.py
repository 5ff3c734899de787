"""`specstore classify --json` prints the answer `POST /classify` gives: one object, the same keys, the same values.

Before, classify printed a list of ``{"path", ..., "calibration"}`` objects while the
server answered ``{"model", "labels", ..., "files": [{"file", ...}]}``; a script
written for one could not read the other.  Both now come from
:func:`specstore.serving.answers.answer_json` (docs/serving.md, "One answer shape").
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from factories import make_checkpoint

from specstore.pipeline.testing import write_music_like
from specstore.serving.cli import main as specstore_main
from specstore.store import FeatureSpec


def test_classify_json_is_the_servers_answer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from starlette.testclient import TestClient

    from specstore.infer.engine.runtime import RunOptions
    from specstore.serving.app import Service, create_app
    from specstore.serving.config import ServeConfig
    from specstore.serving.model import Classifier

    model = make_checkpoint(tmp_path / "genre.pt", spec=FeatureSpec.mel(n_bins=16))
    song = write_music_like(tmp_path / "song.wav", 2.5, seed=4)
    bad = tmp_path / "notes.txt"
    bad.write_text("not audio")
    assert specstore_main(["classify", str(song), str(bad), "--model", str(model), "--device", "cpu",
                           "--no-progress", "--json", "--topk", "2", "--segments", "1"]) == 1
    mine = json.loads(capsys.readouterr().out)
    service = Service(Classifier(model, RunOptions(device="cpu", progress=False)), ServeConfig(workers=1))
    with TestClient(create_app(service), base_url="http://localhost") as client:
        r = client.post("/classify?topk=2&segments=1", files=[("file", (str(song), song.read_bytes())),
                                                              ("file", (str(bad), bad.read_bytes()))])
    theirs = r.json()
    assert isinstance(mine, dict) and set(mine) == set(theirs) == {"model", "labels", "outputs", "calibration",
                                                                  "temperature", "files"}
    assert {k: v for k, v in mine.items() if k != "files"} == {k: v for k, v in theirs.items() if k != "files"}
    (a, a_bad), (b, b_bad) = mine["files"], theirs["files"]
    assert a_bad == {"file": str(bad), "error": "not an audio file: Format not recognised."}
    assert b_bad == {"file": "notes.txt", "error": a_bad["error"]}  # the server keeps a client's file name only
    assert set(a) == set(b) == {"file", "duration_s", "frames", "answer", "top", "segment_s", "segments"}
    assert (a["file"], b["file"]) == (str(song), "song.wav")
    for key in ("duration_s", "frames", "answer", "segment_s"):
        assert a[key] == b[key], key
    for x, y in zip([a, *a["segments"]], [b, *b["segments"]], strict=True):
        assert [t["label"] for t in x["top"]] == [t["label"] for t in y["top"]] and x["answer"] == y["answer"]
        np.testing.assert_allclose([t["prob"] for t in x["top"]], [t["prob"] for t in y["top"]], atol=2e-6)
    assert [set(s) for s in a["segments"]] == [{"start_s", "end_s", "answer", "top"}] * len(b["segments"])
