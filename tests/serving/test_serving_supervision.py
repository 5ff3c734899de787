"""The server's moving parts under failure: a supervised batcher, shutdowns off the event loop, and metrics in a
registry of each server's own.

The one new behaviour here: a failure of the batcher's task outside a batch's own error handling is
logged, answers every clip waiting or running with 500 at once, refuses later clips at once and turns
``/health`` unhealthy (it used to end the task silently, and every later request waited out its timeout).
"""

from __future__ import annotations

import asyncio
import time
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
from specstore.serving.batcher import Batcher, BatchError
from specstore.serving.config import ServeConfig
from specstore.serving.metrics import Metrics
from specstore.serving.model import Classifier
from specstore.serving.policy import BatchPolicy
from specstore.store import FeatureSpec

SPEC = FeatureSpec.mel(n_bins=16)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Classifier:
    ckpt = make_checkpoint(tmp_path_factory.mktemp("supervision") / "m.pt", spec=SPEC)
    return Classifier(ckpt, RunOptions(device="cpu", progress=False))


def _clip(frames: int) -> np.ndarray:
    return np.random.default_rng(frames).standard_normal((16, frames)).astype(np.float32)


def test_a_failed_batcher_answers_its_waiting_clips_at_once_and_refuses_later_ones(
        classifier: Classifier, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # clips may wait 60 s for their batch to fill: only the failure can answer them sooner
    batcher = Batcher(classifier, BatchPolicy(max_delay=60.0), Metrics())
    step = batcher._step

    async def failing_step() -> None:  # a bug in the queue's bookkeeping once three clips wait
        if batcher.waiting >= 3:
            raise RuntimeError("simulated bookkeeping bug")
        await step()

    monkeypatch.setattr(batcher, "_step", failing_step)

    async def run() -> tuple[list[BaseException | np.ndarray], float]:
        await batcher.start()
        t0 = time.monotonic()
        answers = await asyncio.wait_for(asyncio.gather(*(batcher.classify(_clip(n)) for n in (40, 60, 80)),
                                                        return_exceptions=True), timeout=10)
        elapsed = time.monotonic() - t0
        with pytest.raises(BatchError, match="simulated bookkeeping bug"):  # a later clip: refused at once
            await asyncio.wait_for(batcher.classify(_clip(50)), timeout=1)
        await batcher.stop()
        return answers, elapsed

    answers, elapsed = asyncio.run(run())
    assert elapsed < 5
    assert all(isinstance(a, BatchError) and str(a) == "the batcher stopped: RuntimeError: simulated bookkeeping bug"
               for a in answers), answers
    assert batcher.failure == "the batcher stopped: RuntimeError: simulated bookkeeping bug"
    assert batcher.waiting == 0 and batcher.metrics.waiting.get() == 0
    assert "the batcher stopped" in caplog.text  # logged, with its traceback


@pytest.fixture
def server(classifier: Classifier, tmp_path: Path) -> Iterator[tuple[TestClient, Service, bytes]]:
    audio = write_music_like(tmp_path / "a.wav", 1.5, seed=3).read_bytes()
    service = Service(classifier, ServeConfig(workers=1, timeout=60.0, policy=BatchPolicy(max_delay=0.05)))
    with TestClient(create_app(service), base_url="http://localhost") as client:
        yield client, service, audio


def test_a_batcher_that_fails_mid_batch_answers_500_and_turns_health_unhealthy(
        server: tuple[TestClient, Service, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    client, service, audio = server
    assert client.post("/classify", files={"file": ("a.wav", audio)}).status_code == 200
    assert client.get("/health").status_code == 200

    def broken(*args: Any, **kwargs: Any) -> None:  # fails after the model ran, outside the batch's own try
        raise RuntimeError("simulated metrics failure")

    monkeypatch.setattr(service.metrics, "add_batch", broken)
    for _ in range(2):  # the running batch's clip, then a later request: both answered at once
        t0 = time.monotonic()
        r = client.post("/classify", files={"file": ("a.wav", audio)})
        assert r.status_code == 500 and "simulated metrics failure" in r.json()["error"], r.text
        assert time.monotonic() - t0 < 10  # not the 60 s timeout
    health = client.get("/health")
    assert health.status_code == 503
    assert health.json()["status"] == "unhealthy"
    assert health.json()["reason"] == "the batcher stopped: RuntimeError: simulated metrics failure"
    assert 'specstore_requests_total{code="500"} 2' in client.get("/metrics").text


def test_stopping_the_batcher_keeps_the_event_loop_responsive(classifier: Classifier,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    batcher = Batcher(classifier, BatchPolicy(max_delay=0.0), Metrics())
    run = classifier.run

    def slow(*args: Any, **kwargs: Any) -> Any:  # a batch still on the model thread when the server stops
        time.sleep(1.0)
        return run(*args, **kwargs)

    monkeypatch.setattr(classifier, "run", slow)

    async def scenario() -> tuple[float, float]:
        await batcher.start()
        clip = asyncio.create_task(batcher.classify(_clip(40)))
        await asyncio.sleep(0.2)  # its batch is running
        ticks: list[float] = []

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        t0 = time.monotonic()
        await batcher.stop()  # waits for the model thread's batch, off the loop
        stopped = time.monotonic() - t0
        tick.cancel()
        with pytest.raises(BatchError, match="shutting down"):
            await clip
        return stopped, max(b - a for a, b in zip(ticks, ticks[1:], strict=False))

    stopped, gap = asyncio.run(scenario())
    assert stopped > 0.5  # the batch was waited for ...
    assert gap < 0.3  # ... while the loop went on ticking


def test_stopping_the_service_leaves_no_folder_and_no_worker(classifier: Classifier) -> None:
    service = Service(classifier, ServeConfig(workers=1))

    async def scenario() -> Path:
        await service.start()
        folder = service.folder
        await service.stop()
        return folder

    folder = asyncio.run(scenario())
    assert not folder.exists() and not service.pool.running


def test_each_server_has_its_own_registry_and_no_created_series() -> None:
    a, b = Metrics(), Metrics()  # two in one process: the process-global registry would refuse the second
    a.requests.inc(1, "200")
    a.files.inc(2, 'odd"label\nvalue')
    text = a.render()
    assert 'specstore_requests_total{code="200"} 1\n' in text and b.requests.get("200") == 0
    assert 'specstore_files_total{outcome="odd\\"label\\nvalue"} 2\n' in text  # label values escaped
    assert "_created" not in text and "_created" not in b.render()
    assert not hasattr(a.queue_depth, "inc")  # a gauge is set, never counted
