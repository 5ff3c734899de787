"""`specstore serve`'s HTTP API through Starlette's test client: answers, errors, limits, metrics.

One server (classifier, one decode worker, batcher) for the module; tests
that need other limits swap the service's config and put it back.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from factories import make_checkpoint
from starlette.testclient import TestClient

from specstore.infer.engine.runtime import RunOptions
from specstore.pipeline.testing import write_music_like
from specstore.serving.app import Service, create_app
from specstore.serving.clips import decode_file
from specstore.serving.config import ServeConfig
from specstore.serving.model import Classifier
from specstore.serving.picture import PictureScale
from specstore.serving.policy import BatchPolicy
from specstore.serving.segments import segment_spans
from specstore.store import FeatureSpec

SPEC = FeatureSpec.mel(n_bins=16)
GENRES = ["ambient", "blues", "folk", "jazz", "metal", "rock"]


@dataclasses.dataclass
class Server:
    client: TestClient
    service: Service
    files: list[Path]

    def post(self, *files: tuple[str, bytes], query: str = "") -> Any:
        return self.client.post(f"/classify{query}", files=[("file", (name, data, "application/octet-stream"))
                                                             for name, data in files])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("serve")
    ckpt = make_checkpoint(tmp / "m.pt", spec=SPEC, labels=GENRES)
    files = [write_music_like(tmp / name, seconds, seed=k, sr=sr, channels=ch)
             for k, (name, seconds, sr, ch) in enumerate([("a.wav", 3.0, 22050, 1), ("b.flac", 5.5, 44100, 2),
                                                         ("c.ogg", 1.5, 22050, 1), ("d.mp3", 4.0, 44100, 1)])]
    config = ServeConfig(workers=1, max_queue=8, policy=BatchPolicy(max_delay=0.5), max_seconds=30.0)
    # the GPU's price of a batch: clips of different lengths share batches, so batch composition is exercised
    service = Service(Classifier(ckpt, RunOptions(device="cpu", progress=False, batch_overhead_frames=1024.0)),
                      config)
    with TestClient(create_app(service), base_url="http://localhost") as client:
        yield Server(client, service, files)


def swap(server: Server, **changes: Any) -> ServeConfig:
    old = server.service.config
    server.service.config = dataclasses.replace(old, **changes)
    return old


def test_health_page_and_metrics(server: Server) -> None:
    h = server.client.get("/health").json()
    assert h["status"] == "ok" and h["labels"] == GENRES and h["model"] == "m.pt" and h["device"] == "cpu"
    from specstore.pipeline import decode_av

    assert {"wav", "flac", "ogg", "opus", "mp3", "aiff"} <= set(h["formats"])  # the page lists what it takes
    assert ("m4a" in h["formats"]) == decode_av.available() == ("wma" in h["formats"])
    assert (h["calibration"], h["temperature"]) == ("uncalibrated", None)  # the page says so beside the model
    page = server.client.get("/")
    assert page.status_code == 200 and 'type="file"' in page.text and "classify?picture=1" in page.text
    m = server.client.get("/metrics")
    assert m.headers["content-type"].startswith("text/plain; version=0.0.4")
    for name in ("specstore_requests_total", "specstore_batches_total", "specstore_padding_efficiency",
                 "specstore_queue_depth", "specstore_oom_splits_total", "specstore_request_seconds_bucket"):
        assert name in m.text


def test_the_favicon_is_served_and_the_page_links_it(server: Server) -> None:
    icon = server.client.get("/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg") and icon.text.endswith("</svg>")
    assert 'rel="icon"' in server.client.get("/").text


def test_many_files_are_batched_together_and_each_answer_is_its_own(server: Server) -> None:
    before = server.service.metrics.batches.get()
    r = server.post(*[(f.name, f.read_bytes()) for f in server.files], query="?picture=1")
    assert r.status_code == 200, r.text
    answers = r.json()["files"]
    assert [a["file"] for a in answers] == [f.name for f in server.files]
    alone = server.service.classifier.run([decode_file(f, {"mel": SPEC}).features for f in server.files[:1]])
    for f, a in zip(server.files, answers, strict=True):
        clip = decode_file(f, {"mel": SPEC})
        assert a["frames"] == clip.n_frames and abs(a["duration_s"] - clip.duration) < 1e-3
        probs = [t["prob"] for t in a["top"]]
        assert len(a["top"]) == 5 and probs == sorted(probs, reverse=True)
        png = base64.b64decode(a["picture"].removeprefix("data:image/png;base64,"))
        assert png.startswith(b"\x89PNG")
        assert a["picture_axes"] == PictureScale.of(SPEC, (-60.0, 40.0)).axes(a["frames"])
        solo = server.service.classifier.run([clip.features]).probs[0]  # the clip alone, in a batch of one
        expected = sorted(zip(solo.tolist(), GENRES, strict=True), reverse=True)[:5]
        assert [t["label"] for t in a["top"]] == [lab for _, lab in expected]
        np.testing.assert_allclose(probs, [p for p, _ in expected], atol=2e-6)
    np.testing.assert_allclose(answers[0]["top"][0]["prob"], alone.probs[0].max(), atol=2e-6)
    assert server.service.metrics.batches.get() - before < len(server.files)  # they shared batches


def test_a_bad_upload_is_a_json_error_and_does_not_touch_the_others(server: Server) -> None:
    good = server.files[0]
    r = server.post(("notes.txt", b"just some text, not audio" * 20), (good.name, good.read_bytes()))
    assert r.status_code == 200
    bad, ok = r.json()["files"]
    assert bad == {"file": "notes.txt", "error": "not an audio file: Format not recognised."}
    assert ok["file"] == good.name and len(ok["top"]) == 5
    r = server.post(("x.wav", b"RIFF\x00\x00\x00\x00WAVEfmt "))
    assert r.status_code == 422 and r.json()["error"].startswith("not an audio file")
    r = server.post(("empty.mp3", b""))
    assert r.status_code == 422 and r.json()["error"] == "empty file"


def test_a_client_file_name_is_only_text(server: Server) -> None:
    r = server.post(("../../../../etc/passwd", server.files[2].read_bytes()))
    assert r.status_code == 200 and r.json()["files"][0]["file"] == "passwd"


def test_bad_requests(server: Server) -> None:
    assert server.client.post("/classify", data={"a": "b"}).status_code == 400
    assert server.client.post("/classify", content=b"--x\r\nnonsense", headers={
        "content-type": "multipart/form-data; boundary=x"}).status_code == 400
    r = server.post(("a.wav", server.files[0].read_bytes()), query="?topk=zero")
    assert r.status_code == 400 and "topk" in r.json()["error"]
    assert server.client.get("/classify").status_code == 405


def test_limits_answer_413_503_and_504(server: Server) -> None:
    data = server.files[1].read_bytes()
    old = swap(server, max_file_mb=len(data) / 2 / 2**20)
    try:
        r = server.post(("b.flac", data))
        assert r.status_code == 413 and "limit" in r.json()["error"]
        r = server.post(("b.flac", data), ("c.ogg", server.files[2].read_bytes()))
        assert r.status_code == 200 and "error" in r.json()["files"][0] and "top" in r.json()["files"][1]
    finally:
        server.service.config = old
    old = swap(server, max_files=1)
    try:
        r = server.post(("a.wav", data), ("b.wav", data))
        assert r.status_code in (400, 413)
    finally:
        server.service.config = old
    old = swap(server, max_queue=1)
    try:  # more files than the queue holds can never succeed: 413 (not 503), before any decode
        r = server.post(("a.wav", data), ("b.wav", data))
        assert r.status_code == 413 and "limit" in r.json()["error"]
    finally:
        server.service.config = old
    old = swap(server, max_queue=2)
    server.service.in_flight += 1  # another request's clip
    try:
        r = server.post(("a.wav", data), ("b.wav", data))
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and "queue" in r.json()["error"]
    finally:
        server.service.in_flight -= 1
        server.service.config = old
    old = swap(server, max_seconds=2.0)
    try:
        r = server.post(("b.flac", data))
        assert r.status_code == 422 and "longer than the limit" in r.json()["error"]
    finally:
        server.service.config = old
    old = swap(server, timeout=0.001)
    try:
        r = server.post(("b.flac", data))
        assert r.status_code == 504
    finally:
        server.service.config = old
    r = server.post(("b.flac", data))  # the server is fine afterwards
    assert r.status_code == 200 and server.service.in_flight == 0
    text = server.client.get("/metrics").text
    for code in ("413", "503", "504"):
        assert f'specstore_requests_total{{code="{code}"}}' in text


def test_a_model_failure_answers_its_own_request_and_the_server_goes_on(server: Server,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    data = server.files[2].read_bytes()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("simulated device failure")

    with monkeypatch.context() as m:
        m.setattr(server.service.classifier, "run", broken)
        r = server.post(("c.ogg", data))
    assert r.status_code == 500 and "simulated device failure" in r.json()["error"]
    r = server.post(("c.ogg", data))
    assert r.status_code == 200 and len(r.json()["files"][0]["top"]) == 5


def test_a_decoder_that_kills_its_worker_fails_that_file_only(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    import crashing_decoder

    from specstore.serving import service as service_module

    data = server.files[0].read_bytes()
    with monkeypatch.context() as m:
        m.setattr(service_module, "decode_file", crashing_decoder.crash)
        r = server.post(("hostile.wav", data))
    assert r.status_code == 422 and r.json()["error"] == "the decoder crashed on this file"
    r = server.post(("a.wav", data))  # a new pool took over
    assert r.status_code == 200 and len(r.json()["files"][0]["top"]) == 5


def test_segments_are_each_windows_own_answer_and_bad_values_are_400(server: Server) -> None:
    """``?segments=2``: ceil(duration / 2) windows per file, each the probabilities of its frames run alone (the
    files' windows shared batches); ``auto`` picks 1 s for these short files; bad values answer 400."""
    r = server.post(*[(f.name, f.read_bytes()) for f in server.files[:2]], query="?segments=2&topk=2")
    assert r.status_code == 200, r.text
    c = server.service.classifier
    for f, a in zip(server.files[:2], r.json()["files"], strict=True):
        clip = decode_file(f, {"mel": SPEC})
        spans = segment_spans(clip.n_frames, clip.duration, 2.0, c.frame_seconds, c.window_align)
        assert a["segment_s"] == 2.0 and len(a["segments"]) == len(spans) == math.ceil(clip.duration / 2 - 1e-9)
        solo = c.run([clip.features[:, lo:hi] for _, _, lo, hi in spans]).probs
        for s, p, (start, end, _, _) in zip(a["segments"], solo, spans, strict=True):
            assert (s["start_s"], s["end_s"]) == (round(start, 3), round(end, 3))
            assert [t["label"] for t in s["top"]] == [GENRES[i] for i in np.argsort(-p, kind="stable")[:2]]
            np.testing.assert_allclose([t["prob"] for t in s["top"]], np.sort(p)[::-1][:2], atol=2e-6)
    auto = server.post((server.files[2].name, server.files[2].read_bytes()), query="?segments=auto").json()
    assert auto["files"][0]["segment_s"] == 1.0 and len(auto["files"][0]["segments"]) == 2  # 1.5 s
    for bad, says in (("0", "positive number"), ("x", "number of seconds or auto"), ("0.01", "time step")):
        r = server.post(("a.wav", server.files[0].read_bytes()), query=f"?segments={bad}")
        assert r.status_code == 400 and says in r.json()["error"], r.text


def test_health_names_the_calibration_of_a_single_label_model_only() -> None:
    from types import SimpleNamespace

    from specstore.infer.models.calibration import Calibration
    from specstore.serving.app import _calibration

    assert _calibration(SimpleNamespace(outputs="classes", calibration=Calibration(1.7, 20))) == {
        "calibration": "temperature", "temperature": 1.7}
    assert _calibration(SimpleNamespace(outputs="classes", calibration=Calibration())) == {
        "calibration": "uncalibrated", "temperature": None}
    assert _calibration(SimpleNamespace(outputs="tags", calibration=Calibration())) == {}
