"""Every typed error of the classify service and its HTTP answer: status, JSON body and headers, one table.

The contract ``POST /classify`` had before its errors became types: a refusal before decoding closes
the connection, a busy server says when to retry, a request whose every file failed is 422 (the uploads) or 500
(the server), and a bug answers without details.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from specstore.serving.answers import Answer, Classified, Failed
from specstore.serving.app import create_app
from specstore.serving.errors import (
    FileRefused,
    InternalError,
    NoFileClassified,
    NotRunning,
    Refused,
    RequestError,
    TimedOut,
)
from specstore.serving.responses import answer_json, error_response


@pytest.mark.parametrize(("error", "status", "body", "headers"), [
    (Refused(400, "topk must be at least 1"), 400, {"error": "topk must be at least 1"}, {"connection": "close"}),
    (Refused(503, "the queue is full", {"Retry-After": "2"}), 503, {"error": "the queue is full"},
     {"connection": "close", "retry-after": "2"}),
    (NotRunning(3), 503, {"error": "the server is not running"}, {"retry-after": "3"}),
    (FileRefused("file is over the limit of 1 MiB", "b.flac"), 413,
     {"error": "file is over the limit of 1 MiB", "file": "b.flac"}, {}),
    (TimedOut(0.5), 504, {"error": "the request took longer than 0.5 s"}, {}),
    (NoFileClassified([Failed("x.wav", "empty file")]), 422,
     {"error": "empty file", "files": [{"file": "x.wav", "error": "empty file"}]}, {}),
    (NoFileClassified([Failed("a", "not audio"), Failed("b", "the model failed", server_fault=True)]), 500,
     {"error": "no file could be classified",
      "files": [{"file": "a", "error": "not audio"}, {"file": "b", "error": "the model failed"}]}, {}),
    (InternalError(), 500, {"error": "internal error (logged by the server)"}, {}),
])
def test_each_error_is_one_response(error: RequestError, status: int, body: dict[str, Any],
                                    headers: dict[str, str]) -> None:
    response = error_response(error)
    assert response.status_code == status
    assert json.loads(bytes(response.body)) == body
    assert {k: v for k, v in response.headers.items() if k in ("connection", "retry-after")} == headers


def test_an_answer_is_the_json_it_always_was() -> None:
    answer = Answer("m.pt", ["a", "b"], [Classified("x.wav", 1.23456, 53, [("b", 0.7000004), ("a", 0.2999996)],
                                                    b"\x89PNG"), Failed("y.txt", "not an audio file")])
    assert answer_json(answer) == {"model": "m.pt", "labels": ["a", "b"], "outputs": "classes",
                                   "calibration": "uncalibrated", "temperature": None, "files": [
        {"file": "x.wav", "duration_s": 1.235, "frames": 53, "answer": "b", "top": [{"label": "b", "prob": 0.7},
                                                                                     {"label": "a", "prob": 0.3}],
         "picture": "data:image/png;base64,iVBORw=="},
        {"file": "y.txt", "error": "not an audio file"}]}


def test_a_service_not_started_answers_503_through_the_handler(tmp_path: Any) -> None:
    from factories import make_checkpoint

    from specstore.infer.engine.runtime import RunOptions
    from specstore.serving.config import ServeConfig
    from specstore.serving.model import Classifier
    from specstore.serving.service import Service

    service = Service(Classifier(make_checkpoint(tmp_path / "m.pt"), RunOptions(device="cpu", progress=False)),
                      ServeConfig(workers=1))
    client = TestClient(create_app(service), base_url="http://localhost")  # no lifespan: never started
    r = client.post("/classify", files={"file": ("a.wav", b"RIFF")})
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    assert r.json() == {"error": "the server is not running"}
    assert 'specstore_requests_total{code="503"} 1' in client.get("/metrics").text
