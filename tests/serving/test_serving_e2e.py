"""`specstore serve` end to end: a real server process on 127.0.0.1, its page in headless Chromium, and a
bounded load test.

The browser is Debian's Chromium driven by Playwright (``make install``
installs both; Playwright's own browser downloads are never used).  Without
Chromium the browser test is skipped with the reason; CI installs it.
Traffic goes to 127.0.0.1 only, in a bounded number of requests.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from factories import make_checkpoint

from specstore.pipeline.testing import write_music_like
from specstore.store import FeatureSpec

pytestmark = pytest.mark.slow

SPEC = FeatureSpec.mel(n_bins=16)
GENRES = ["ambient", "blues", "folk", "jazz", "metal", "rock"]
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.path.exists(p)),
                shutil.which("chromium"))
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[Path]]]:
    """``specstore serve`` in its own process on a free port; its base URL and a few audio files."""
    tmp = tmp_path_factory.mktemp("e2e")
    ckpt = make_checkpoint(tmp / "m.pt", spec=SPEC, labels=GENRES)
    files = [write_music_like(tmp / f"song{k}.{ext}", 2.0 + 1.5 * k, seed=k, sr=22050, channels=1)
             for k, ext in enumerate(["wav", "flac", "ogg", "wav"])]
    port = free_port()
    log = open(tmp / "server.log", "wb")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "specstore", "serve", "--model", str(ckpt), "--port", str(port),
                             "--device", "cpu", "--workers", "1", "--max-queue", "32", "--max-delay-ms", "100",
                             "--batch-overhead-frames", "1024"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                pytest.fail(f"the server did not start: {(tmp / 'server.log').read_text()[-2000:]}")
            time.sleep(0.3)
        yield url, files
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_the_page_in_a_real_browser_uploads_a_file_and_shows_the_top_5(served: tuple[str, list[Path]],
                                                                       tmp_path: Path) -> None:
    if CHROMIUM is None:
        pytest.skip("no Chromium (apt-get install chromium; `make install` does it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (make install)")
    url, files = served
    expected = httpx.post(f"{url}/classify?picture=1&segments=auto",
                          files={"file": (files[1].name, files[1].read_bytes())}, timeout=60).json()["files"][0]
    picked = [files[1], files[0]]
    with sync_api.sync_playwright() as pw:
        # a fresh profile; Playwright adds --headless and takes the profile folder as user_data_dir
        browser = pw.chromium.launch_persistent_context(str(tmp_path / "profile"), executable_path=CHROMIUM,
                                                        headless=True, args=CHROMIUM_FLAGS,
                                                        viewport={"width": 1000, "height": 900})
        try:
            page = browser.new_page()
            page.goto(url + "/")
            page.wait_for_function("document.getElementById('model').textContent.includes('6 genres')",
                                   timeout=30_000)
            assert "percentages uncalibrated" in page.locator("#model").text_content()  # no validation split
            from specstore.pipeline import decode_av

            accept = page.locator("#pick").get_attribute("accept").split(",")  # what this install decodes
            assert {".wav", ".flac", ".mp3", ".aiff"} <= set(accept) and (".m4a" in accept) == decode_av.available()
            assert page.locator("#formats").text_content() == ", ".join(a[1:] for a in accept[1:])
            page.set_input_files("#pick", [str(f) for f in picked])
            page.wait_for_selector(".file[data-done='1'] >> nth=1", timeout=60_000)
            page.wait_for_function("[...document.querySelectorAll('img.mel')].every(i => i.complete)")
            assert page.locator(".file h2").all_text_contents() == [f.name for f in picked]  # upload order
            box = page.locator(".file", has_text=files[1].name)
            assert box.locator("tr.genre td.label").all_text_contents() == [t["label"] for t in expected["top"]]
            assert box.locator("tr.genre td.prob").all_text_contents() == [f"{100 * t['prob']:.1f} %"
                                                                           for t in expected["top"]]
            assert box.locator("img.mel").get_attribute("src").startswith("data:image/png;base64,")
            _check_axes(box, expected["picture_axes"])
            _check_strip(page, box, expected)
            for card in page.locator(".file").all():  # a player of the browser's own copy of the file
                assert card.locator("audio.player[controls]").count() == 1
                assert card.locator("audio.player").get_attribute("src").startswith("blob:")
            lefts = {round(b.bounding_box()["x"], 1) for b in page.locator(".file tr.genre .bar").all()}
            assert len(lefts) == 1, f"the bars' left edges differ between cards: {lefts}"
            assert page.locator(".file .error").count() == 0
            page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
            if os.environ.get("SPECSTORE_WRITE_SCREENSHOT") == "1":  # docs/page.png (docs/serving.md shows it)
                page.screenshot(path=str(Path(__file__).resolve().parents[2] / "docs" / "page.png"), full_page=True)
        finally:
            browser.close()


def _check_strip(page: Any, box: Any, expected: dict[str, Any]) -> None:
    """Genre over time: one cell per window (a 3.5 s upload, ``segments=auto``: 1 s windows, 4 cells), each
    labelled with its window's top genre, one colour per genre on every card."""
    cells = box.locator(".overtime .strip .cell")
    assert expected["segment_s"] == 1.0 and cells.count() == math.ceil(expected["duration_s"]) == 4
    assert cells.evaluate_all("cs => cs.map(c => c.dataset.genre)") == [s["top"][0]["label"]
                                                                         for s in expected["segments"]]
    assert all(t.startswith(f"{s['start_s']:.1f}–{s['end_s']:.1f} s: ")
               for t, s in zip(cells.evaluate_all("cs => cs.map(c => c.title)"), expected["segments"], strict=True))
    colours: dict[str, set[str]] = {}
    for genre, colour in page.locator(".overtime .cell").evaluate_all(
            "cs => cs.map(c => [c.dataset.genre, getComputedStyle(c).backgroundColor])"):
        colours.setdefault(genre, set()).add(colour)
    assert all(len(c) == 1 for c in colours.values()), colours


def _check_axes(box: Any, axes: dict[str, Any]) -> None:
    """The picture's tick labels in the DOM are the server's, in seconds, Hz and dB, and sit inside the picture."""
    time = box.locator(".axis.time .tick").all_text_contents()
    freq = box.locator(".axis.freq .tick").all_text_contents()
    db = box.locator(".axis.db .tick").all_text_contents()
    assert time == [t["label"] for t in axes["time"]] and time[0] == "0 s" and len(time) >= 3
    assert all(t.endswith(" s") for t in time)
    assert freq == [t["label"] for t in axes["frequency"]] and len(freq) >= 2
    assert all(t.endswith(" Hz") for t in freq)
    assert db[0] == "-60 dB" and db[-1] == "40 dB"
    img = box.locator("img.mel").bounding_box()
    ticks = box.locator(".axis.time .tick").all()
    for tick, t in zip(ticks, axes["time"], strict=True):
        b = tick.bounding_box()
        assert abs(b["x"] + b["width"] / 2 - (img["x"] + t["at"] * img["width"])) < 1.5
    assert "linear-gradient" in box.locator(".colorbar").get_attribute("style")


def test_bounded_load_on_localhost_answers_every_request(served: tuple[str, list[Path]]) -> None:
    """24 uploads from 8 concurrent clients to 127.0.0.1: all answered, batched together, nothing failed."""
    url, files = served
    payloads = [(f.name, f.read_bytes()) for f in files]

    async def run() -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            async def one_client(k: int) -> list[int]:
                codes = []
                for j in range(3):
                    name, data = payloads[(k + j) % len(payloads)]
                    codes.append((await client.post("/classify", files={"file": (name, data)})).status_code)
                return codes

            results = await asyncio.wait_for(asyncio.gather(*(one_client(k) for k in range(8))), timeout=180)
        return [c for codes in results for c in codes]

    before = _metric(url, "specstore_batches_total")
    codes = asyncio.run(run())
    assert codes == [200] * 24
    batches = _metric(url, "specstore_batches_total") - before
    assert 0 < batches < 24  # concurrent uploads shared batches
    assert _metric(url, "specstore_queue_depth") == 0


def _metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")
