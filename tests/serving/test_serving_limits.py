"""`specstore serve` under attack: slow clients dropped, connections capped, uploads admitted by bytes
before their bodies are read, temporary files always removed, Host and Origin checked, option values bounded.

Real uvicorn servers on loopback sockets (in a thread), driven with raw sockets, since what is tested happens
below the ASGI layer (a test client hands the application whole bodies).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from factories import make_checkpoint
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from specstore.common import ConfigError
from specstore.infer.engine.runtime import RunOptions
from specstore.pipeline.testing import write_music_like
from specstore.serving.app import Service, create_app
from specstore.serving.config import ServeConfig
from specstore.serving.connections import ConnectionGuard, uvicorn_config
from specstore.serving.model import Classifier
from specstore.serving.policy import BatchPolicy
from specstore.store import FeatureSpec

SPEC = FeatureSpec.mel(n_bins=16)


@contextlib.contextmanager
def running(app: Any, config: ServeConfig, guard: ConnectionGuard) -> Iterator[int]:
    """Serve ``app`` through the guarded protocol on a free loopback port (in a thread); yields the port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn_config(app, config, guard, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    return s


def read_all(s: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything the server sends until it closes the connection (or ``timeout`` passes)."""
    s.settimeout(timeout)
    out = b""
    with contextlib.suppress(ConnectionResetError, TimeoutError, socket.timeout):
        while chunk := s.recv(65536):
            out += chunk
    return out


def closed_within(s: socket.socket, seconds: float) -> bool:
    """Whether the server closed ``s`` within ``seconds`` (what it sent before closing is ignored)."""
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    return True


# ------------------------------------------------------------------ the connection guard, on a trivial app

async def _echo(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"bytes": len(body)})


async def _hello(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


@pytest.fixture
def echo() -> Iterator[tuple[int, ConnectionGuard]]:
    config = ServeConfig(workers=1, read_timeout=1.0, min_upload_kib_s=4.0, max_connections=40,
                         max_client_connections=20)
    guard = ConnectionGuard(config)
    app = Starlette(routes=[Route("/echo", _echo, methods=["POST"]), Route("/hello", _hello)])
    with running(app, config, guard) as port:
        yield port, guard


def test_a_client_that_trickles_its_headers_is_dropped(echo: tuple[int, ConnectionGuard]) -> None:
    port, guard = echo
    s = connect(port)
    t0 = time.monotonic()
    request = b"GET /hello HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100
    for byte in request:  # one byte every 0.1 s: 10 s to send it all, far past the 1 s read deadline
        try:
            s.sendall(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.1)
        if time.monotonic() - t0 > 3:
            break
    answer = read_all(s, 5)
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - t0 < 3.5  # dropped at the deadline, not when the client chose to stop
    assert guard.metrics.dropped_connections.get("headers") == 1


def test_an_idle_connection_is_closed_at_the_read_deadline(echo: tuple[int, ConnectionGuard]) -> None:
    port, guard = echo
    s = connect(port)
    t0 = time.monotonic()
    assert closed_within(s, 5)
    assert 0.8 < time.monotonic() - t0 < 3
    assert guard.metrics.dropped_connections.get("idle") == 1


def test_a_body_below_the_minimum_rate_is_dropped_and_a_slow_real_one_is_not(
        echo: tuple[int, ConnectionGuard]) -> None:
    port, guard = echo
    body = b"x" * 40000
    head = (f"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    trickle = connect(port)
    trickle.sendall(head)
    t0 = time.monotonic()
    dropped = False
    for k in range(len(body)):  # 10 bytes a second: far under 4 KiB/s
        try:
            trickle.sendall(body[k:k + 1])
        except (BrokenPipeError, ConnectionResetError):
            dropped = True
            break
        time.sleep(0.1)
        if time.monotonic() - t0 > 4:
            break
    answer = read_all(trickle, 5)
    assert dropped or answer.startswith(b"HTTP/1.1 408"), answer
    assert time.monotonic() - t0 < 5
    assert guard.metrics.dropped_connections.get("body") == 1

    steady = connect(port)  # 16 KiB/s for 2.5 s: above the minimum rate, slower than the read deadline alone
    steady.sendall(head)
    for k in range(0, len(body), 1600):
        steady.sendall(body[k:k + 1600])
        time.sleep(0.1)
    answer = read_all(steady, 5)
    assert answer.startswith(b"HTTP/1.1 200") and b'{"bytes":40000}' in answer, answer


def test_connections_are_capped_per_client_and_in_all(echo: tuple[int, ConnectionGuard]) -> None:
    port, guard = echo
    held = [connect(port) for _ in range(20)]  # the per-client cap
    time.sleep(0.2)
    extra = connect(port)
    answer = read_all(extra, 5)
    assert answer.startswith(b"HTTP/1.1 503") and b"retry-after" in answer.lower()
    assert b"from your address" in answer
    # another client address still gets in (127.0.0.2 is loopback too) until the total cap is reached
    others = [connect(port, "127.0.0.2") for _ in range(20)]
    time.sleep(0.2)
    over = connect(port, "127.0.0.3")
    assert read_all(over, 5).startswith(b"HTTP/1.1 503")
    assert guard.metrics.refused_connections.get("client") == 1
    assert guard.metrics.refused_connections.get("total") == 1
    for s in held + others:
        s.close()
    deadline = time.monotonic() + 5
    while guard.total and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guard.total == 0 and not guard.by_client  # every slot was given back
    r = httpx.get(f"http://127.0.0.1:{port}/hello", headers={"host": "localhost"}, timeout=60)
    assert r.status_code == 200


def test_many_slow_clients_do_not_lock_out_a_quick_one(echo: tuple[int, ConnectionGuard]) -> None:
    port, guard = echo
    slow = [connect(port, f"127.0.0.{10 + k % 3}") for k in range(36)]
    for s in slow:
        s.sendall(b"GET /hello HTTP/1.1\r\n")
    t0 = time.monotonic()
    # at most one read deadline later, the slow ones are gone and a quick client is answered
    answered = None
    while time.monotonic() - t0 < 3 and answered is None:
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/hello", headers={"host": "localhost"}, timeout=2)
            answered = r.status_code if r.status_code == 200 else None
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    assert answered == 200
    assert all(closed_within(s, 3) for s in slow)
    for s in slow:
        s.close()


# ------------------------------------------------------------------ the service: admission by bytes, temp files

@dataclasses.dataclass
class Live:
    port: int
    service: Service
    audio: bytes

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def folder_bytes(self) -> int:
        folder = self.service._folder
        assert folder is not None
        return sum(p.stat().st_size for p in folder.iterdir())

    def folder_files(self) -> list[Path]:
        folder = self.service._folder
        assert folder is not None
        return list(folder.iterdir())


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("limits")
    ckpt = make_checkpoint(tmp / "m.pt", spec=SPEC)
    audio = write_music_like(tmp / "a.wav", 2.0, seed=1).read_bytes()
    config = ServeConfig(workers=1, max_queue=4, max_file_mb=1.0, max_inflight_mb=2.0, read_timeout=5.0,
                         policy=BatchPolicy(max_delay=0.05))
    service = Service(Classifier(ckpt, RunOptions(device="cpu", progress=False)), config)
    with running(create_app(service), config, service.guard) as port:
        yield Live(port, service, audio)


def _multipart(files: list[tuple[str, bytes]], boundary: str = "B0undary") -> bytes:
    out = b""
    for name, data in files:
        out += (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{name}\"\r\n"
                f"Content-Type: application/octet-stream\r\n\r\n").encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def _head(length: int | None, boundary: str = "B0undary") -> bytes:
    size = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Type: multipart/form-data; boundary={boundary}"
            f"\r\n{size}\r\n").encode()


def _settle(live: Live, used: int = 0) -> None:
    """Wait (up to 5 s) until the uploads in progress hold ``used`` bytes."""
    deadline = time.monotonic() + 5
    while live.service.upload_bytes.used != used and time.monotonic() < deadline:
        time.sleep(0.05)


def test_uploads_hold_what_arrived_plus_a_window_from_their_headers(live: Live) -> None:
    config = live.service.config
    window = config.upload_window_bytes
    declared = 768 << 10
    body = _multipart([("a.wav", b"\0" * (declared - 300))])[:declared]
    s = connect(live.port)
    s.sendall(_head(declared) + body[:40])  # before the body: a window of it is reserved, not all 768 KiB
    time.sleep(0.3)
    health = httpx.get(live.url("/health"), headers={"host": "localhost"}, timeout=60).json()
    assert health["inflight_upload_bytes"] == window < declared
    s.sendall(body[40:400 << 10])  # the reservation grows with what arrives, a window ahead of it
    time.sleep(0.3)
    assert (400 << 10) <= live.service.upload_bytes.used <= (400 << 10) + window
    assert live.folder_bytes() < (400 << 10)  # what is on disk is within what is held
    s.close()
    _settle(live)
    assert live.service.upload_bytes.used == 0 and live.folder_files() == []
    # a request that no client may send is 413, before its body
    s = connect(live.port)
    s.sendall(_head(config.max_request_bytes + 1))
    assert read_all(s, 5).startswith(b"HTTP/1.1 413")


class Uploader(threading.Thread):
    """A client uploading from ``source``: headers declaring ``declared`` bytes and ``first`` bytes of body at
    once, then ``piece`` bytes every ``every`` seconds until stopped or dropped; ``answer``: what it was told."""

    def __init__(self, port: int, source: str, declared: int, first: int, piece: int, every: float) -> None:
        super().__init__(daemon=True)
        self.sock = connect(port, source)
        self.body = _multipart([("big.wav", b"\0" * declared)])[:declared]
        self.sock.sendall(_head(declared) + self.body[:first])
        self.sent, self.piece, self.every = first, piece, every
        self.stop = threading.Event()
        self.answer = b""

    def run(self) -> None:
        with contextlib.suppress(OSError):
            while not self.stop.wait(self.every) and self.sent < len(self.body):
                self.sock.sendall(self.body[self.sent:self.sent + self.piece])
                self.sent += self.piece
        self.answer = read_all(self.sock, 0.5)

    def close(self) -> None:
        self.stop.set()
        self.join(10)
        self.sock.close()


def _post_with_retries(live: Live, tries: int) -> list[int]:
    """A normal client's upload, retried after each 503's Retry-After up to ``tries`` times; the statuses."""
    statuses = []
    for _ in range(tries):
        r = httpx.post(live.url("/classify"), files={"file": ("a.wav", live.audio)}, headers={"host": "localhost"},
                       timeout=60)
        statuses.append(r.status_code)
        if r.status_code != 503:
            break
        time.sleep(float(r.headers["retry-after"]))
    return statuses


def test_one_slow_upload_that_declared_the_whole_budget_cannot_starve_another_client(live: Live) -> None:
    # legal and slow: the largest request the server takes, sent at 40 KiB/s (over the 16 KiB/s floor, never
    # stalled), which would take it most of a minute
    slow = Uploader(live.port, "127.0.0.2", live.service.config.max_request_bytes, 20 << 10, 10 << 10, 0.25)
    slow.start()
    try:
        time.sleep(0.5)
        statuses = _post_with_retries(live, 3)
        assert statuses[-1] == 200, statuses  # answered, at worst on a retry after its Retry-After
        assert slow.is_alive()  # the slow upload goes on: it was never the one to give way
    finally:
        slow.close()
    _settle(live)
    assert live.service.upload_bytes.used == 0 and live.folder_files() == []


def test_a_group_of_clients_from_few_addresses_cannot_hold_the_budget(live: Live) -> None:
    config = live.service.config
    # four uploads from two addresses send 480 KiB at once, then 1 KiB every 0.25 s (fast enough on average,
    # never stalled): between them they hold 2000 KiB of the 2048 KiB budget
    group = [Uploader(live.port, f"127.0.0.{2 + k % 2}", 500 << 10, 480 << 10, 1 << 10, 0.25) for k in range(4)]
    for u in group:
        u.start()
    try:
        time.sleep(0.5)
        assert live.service.upload_bytes.used >= config.max_inflight_bytes - (64 << 10)
        cut_before = live.service.metrics.dropped_connections.get("cut")
        statuses = _post_with_retries(live, 3)
        assert statuses[-1] == 200, statuses  # another address still gets its share
        assert live.service.metrics.dropped_connections.get("cut") > cut_before
    finally:
        for u in group:
            u.close()
    told = [u.answer for u in group if u.answer]
    assert told and all(a.startswith(b"HTTP/1.1 503") and b"retry-after" in a.lower() for a in told), told
    _settle(live)
    assert live.service.upload_bytes.used == 0 and live.folder_files() == []


def test_one_client_holds_at_most_its_share_of_the_budget(live: Live) -> None:
    config = live.service.config
    share = config.client_inflight_bytes
    assert share < config.max_inflight_bytes
    first = Uploader(live.port, "127.0.0.2", 700 << 10, 690 << 10, 1 << 10, 0.25)
    first.start()
    try:
        time.sleep(0.3)
        second = connect(live.port, "127.0.0.2")  # the same address: together over its share
        body = _multipart([("b.wav", b"\0" * (700 << 10))])[:700 << 10]
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            second.sendall(_head(700 << 10) + body)
        answer = read_all(second, 5)
        assert answer.startswith(b"HTTP/1.1 503") and b"--max-client-inflight-mb" in answer, answer[:300]
        assert live.service.upload_bytes.held.by_client["127.0.0.2"] <= share
        statuses = _post_with_retries(live, 1)  # another address is not held up by it
        assert statuses == [200]
    finally:
        first.close()
    _settle(live)
    assert live.service.upload_bytes.used == 0


def test_when_the_budget_is_full_a_stalled_upload_gives_way_to_a_ready_one(live: Live) -> None:
    from specstore.serving.connections import STALLED_S

    held = []  # two uploads that hold the whole 2 MiB budget with bytes sent, then stall
    for source in ("127.0.0.2", "127.0.0.3"):
        s = connect(live.port, source)
        body = _multipart([("a.wav", b"\0" * (1 << 20))])[:1 << 20]
        s.sendall(_head(1 << 20) + body[:1000 << 10])
        held.append(s)
    time.sleep(STALLED_S + 0.3)
    assert live.service.upload_bytes.used == 2 << 20
    r = httpx.post(live.url("/classify"), files={"file": ("a.wav", live.audio)}, headers={"host": "localhost"},
                   timeout=60)
    assert r.status_code == 200, r.text  # the stalled uploads were dropped and their bytes freed at once
    assert all(closed_within(s, 2) for s in held)
    assert live.service.metrics.dropped_connections.get("stalled") == 2
    _settle(live)
    assert live.service.upload_bytes.used == 0 and live.folder_files() == []


def test_a_chunked_body_is_held_as_it_arrives_and_cut_off_at_the_limit(live: Live) -> None:
    window = live.service.config.upload_window_bytes
    s = connect(live.port)
    s.sendall(_head(None))
    part = _multipart([("big.wav", b"\0" * (600 << 10))])
    for k in range(0, 300 << 10, 64 << 10):
        chunk = part[k:k + (64 << 10)]
        s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    time.sleep(0.3)
    assert (300 << 10) <= live.service.upload_bytes.used <= (320 << 10) + window
    s.close()
    _settle(live)
    assert live.service.upload_bytes.used == 0 and live.folder_files() == []
    s = connect(live.port)  # over the request limit: 413, chunked or not
    s.sendall(_head(None))
    part = _multipart([("big.wav", b"\0" * (3 << 20))])
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        for k in range(0, len(part), 256 << 10):
            chunk = part[k:k + (256 << 10)]
            s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
    assert read_all(s, 5).startswith(b"HTTP/1.1 413")


def test_a_normal_upload_still_works_and_leaves_no_file(live: Live) -> None:
    r = httpx.post(live.url("/classify"), files={"file": ("a.wav", live.audio)}, headers={"host": "localhost"},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["files"][0]["top"][0]["label"] in r.json()["labels"]
    assert live.folder_files() == [] and live.service.upload_bytes.used == 0


def test_a_decode_worker_killed_mid_decode_leaves_no_upload_file(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    import crashing_decoder

    from specstore.serving import service as service_module

    monkeypatch.setattr(service_module, "decode_file", crashing_decoder.crash)
    r = httpx.post(live.url("/classify"), files={"file": ("a.wav", live.audio)}, headers={"host": "localhost"},
                   timeout=60)
    assert r.status_code == 422 and r.json()["error"] == "the decoder crashed on this file"
    assert live.folder_files() == []


def test_a_client_gone_mid_body_frees_its_bytes_and_files(live: Live) -> None:
    body = _multipart([("a.wav", live.audio)])
    s = connect(live.port)
    s.sendall(_head(len(body)) + body[: len(body) // 2])
    time.sleep(0.3)
    assert len(body) // 2 <= live.service.upload_bytes.used <= len(body)
    s.close()
    deadline = time.monotonic() + 5
    while (live.service.upload_bytes.used or live.folder_files()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert live.service.upload_bytes.used == 0 and live.folder_files() == []


def test_the_uploads_folder_is_removed_when_the_server_stops(tmp_path: Path) -> None:
    ckpt = make_checkpoint(tmp_path / "m.pt", spec=SPEC)
    config = ServeConfig(workers=1)
    service = Service(Classifier(ckpt, RunOptions(device="cpu", progress=False)), config)
    with running(create_app(service), config, service.guard):
        folder = service._folder
        assert folder is not None and folder.is_dir()
    assert not folder.exists()


# ------------------------------------------------------------------ Host and Origin

def test_an_unknown_host_header_is_refused(live: Live) -> None:
    assert httpx.get(live.url("/health"), headers={"host": "evil.example:8000"}, timeout=60).status_code == 400
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000"):
        assert httpx.get(live.url("/health"), headers={"host": host}, timeout=60).status_code == 200, host


def test_a_cross_origin_post_is_refused_and_the_page_s_own_is_not(live: Live) -> None:
    files = {"file": ("a.wav", live.audio)}
    r = httpx.post(live.url("/classify"), files=files,
                   headers={"host": "localhost:8000", "origin": "https://evil.example"}, timeout=60)
    assert r.status_code == 403 and "cross-origin" in r.json()["error"]
    r = httpx.post(live.url("/classify"), files=files, headers={"host": "localhost", "origin": "null"}, timeout=60)
    assert r.status_code == 403
    r = httpx.post(live.url("/classify"), files=files,
                   headers={"host": "localhost:8000", "origin": "http://localhost:8000"}, timeout=60)
    assert r.status_code == 200


def test_a_named_cors_origin_may_post(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    ckpt = make_checkpoint(tmp_path / "m.pt", spec=SPEC)
    config = ServeConfig(workers=1, cors_origins=("https://app.example",))
    service = Service(Classifier(ckpt, RunOptions(device="cpu", progress=False)), config)
    audio = write_music_like(tmp_path / "a.wav", 1.0, seed=2).read_bytes()
    with TestClient(create_app(service), base_url="http://localhost") as client:
        r = client.post("/classify", files={"file": ("a.wav", audio)}, headers={"origin": "https://app.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "https://app.example"
        r = client.post("/classify", files={"file": ("a.wav", audio)}, headers={"origin": "https://other.example"})
        assert r.status_code == 403


def test_listening_beyond_loopback_needs_allowed_hosts() -> None:
    with pytest.raises(ConfigError, match="--allowed-host"):
        ServeConfig(host="0.0.0.0")
    assert ServeConfig(host="0.0.0.0", allowed_hosts=("genres.example.org",)).hosts == ("genres.example.org",)
    assert ServeConfig(host="::1").hosts == ("127.0.0.1", "localhost", "[::1]")


# ------------------------------------------------------------------ option values

@pytest.mark.parametrize("option", [
    ["--workers", "0"], ["--timeout", "inf"], ["--timeout", "nan"], ["--read-timeout", "0"],
    ["--max-file-mb", "inf"], ["--max-queue", "0"], ["--max-connections", "0"], ["--min-upload-kib-s", "-1"],
    ["--max-client-connections", "100000"], ["--host", "0.0.0.0"], ["--max-inflight-mb", "0.01"],
])
def test_bad_serve_options_are_one_line_before_the_model_loads(tmp_path: Path, option: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "specstore", "serve", "--model", str(tmp_path / "missing.pt"),
                           *option], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("specstore: error:"), proc.stderr
    assert "missing.pt" not in lines[0]  # refused on the option, before the checkpoint is looked at
    assert option[0].lstrip("-").replace("-", "_") in lines[0] or "--allowed-host" in lines[0]


def test_health_names_every_limit(live: Live) -> None:
    limits = httpx.get(live.url("/health"), headers={"host": "localhost"}, timeout=60).json()["limits"]
    for key in ("max_file_mb", "max_files", "max_seconds", "max_queue", "max_client_clips", "max_inflight_mb",
                "timeout_s", "read_timeout_s", "min_upload_kib_s", "max_connections", "max_client_connections"):
        assert key in limits
    assert json.dumps(limits)  # plain JSON values


def test_decode_work_is_bounded_from_the_header_before_decoding(live: Live, tmp_path: Path) -> None:
    import numpy as np
    import soundfile as sf

    wide = tmp_path / "wide.wav"
    sf.write(wide, np.zeros((4410, 12), dtype=np.float32), 44100)
    fast = tmp_path / "fast.flac"
    sf.write(fast, np.zeros((38400, 1), dtype=np.float32), 384000)
    for path, words in ((wide, "12 channels is above the limit of 8"),
                        (fast, "384000 Hz is above the limit of 192000 Hz")):
        r = httpx.post(live.url("/classify"), files={"file": (path.name, path.read_bytes())},
                       headers={"host": "localhost"}, timeout=60)
        assert r.status_code == 422 and words in r.json()["error"], r.text
    assert live.folder_files() == []
