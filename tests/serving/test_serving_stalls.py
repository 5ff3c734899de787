"""`specstore serve` against clients that stall it: answers never read, uploads that take for ever, limits turned off.

A client that pipelines requests and never reads the answers is dropped at its write deadline, and nothing more
of its requests is read meanwhile; an upload's time is capped however fast it keeps sending; and every number
the server is given has an upper bound, so ``nan``, ``inf`` or ``1e30`` never turns a limit off.  Real uvicorn
servers on loopback sockets (in a thread), driven with raw sockets: what is tested happens below the ASGI layer.
"""

from __future__ import annotations

import dataclasses
import socket
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from test_serving_limits import connect, read_all, running

from specstore.common import ConfigError
from specstore.infer.options.run_options import RunOptions
from specstore.serving.config import BatchingOptions, ClassifyOptions, ServeConfig
from specstore.serving.connections import ConnectionGuard

BIG = b"x" * (16 << 20)  # an answer larger than any kernel's socket buffers: some of it waits in the server
TCP_ESTABLISHED = 1


def _tcp_state(s: socket.socket) -> int:
    """The TCP state of ``s`` as Linux reports it (1: established), read without reading any data."""
    return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


@pytest.fixture
def stall() -> Iterator[tuple[int, ConnectionGuard, Counter[str]]]:
    """A trivial app (``/big``: 16 MiB, ``/health``) behind the guard: 1 s deadlines, 6 connections at most;
    the counter counts ``/health`` answers by client address."""
    served: Counter[str] = Counter()

    async def big(request: Request) -> Response:
        return Response(BIG, media_type="application/octet-stream")

    async def health(request: Request) -> JSONResponse:
        served[request.client.host if request.client else ""] += 1
        return JSONResponse({"status": "ok"})

    config = ServeConfig(workers=1, read_timeout=1.0, min_upload_kib_s=4.0, max_connections=6,
                         max_client_connections=6)
    guard = ConnectionGuard(config)
    app = Starlette(routes=[Route("/big", big), Route("/health", health)])
    with running(app, config, guard) as port:
        yield port, guard, served


def _non_reader(port: int, source: str) -> socket.socket:
    """A client with a 4 KiB receive buffer that pipelines ``GET /big`` and ``GET /health`` and never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /big HTTP/1.1\r\nHost: localhost\r\n\r\nGET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
    return s


def test_a_client_that_never_reads_its_answers_is_dropped_and_others_are_answered_meanwhile(
        stall: tuple[int, ConnectionGuard, Counter[str]]) -> None:
    port, guard, served = stall
    t0 = time.monotonic()
    held = [_non_reader(port, "127.0.0.2") for _ in range(5)]  # 5 of the 6 connections
    latencies = []
    while time.monotonic() - t0 < 0.8:  # meanwhile another client is answered at once, on the sixth
        t = time.monotonic()
        r = httpx.get(f"http://127.0.0.1:{port}/health", headers={"host": "localhost"}, timeout=5)
        assert r.status_code == 200
        latencies.append(time.monotonic() - t)
        time.sleep(0.1)
    assert max(latencies) < 0.9  # answered while the non-readers still held their slots (dropped at 1 s)
    assert served["127.0.0.2"] == 0  # the pipelined request waits behind the unsent answer: never read
    deadline = t0 + 4
    while any(_tcp_state(s) == TCP_ESTABLISHED for s in held) and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = time.monotonic() - t0
    assert all(_tcp_state(s) != TCP_ESTABLISHED for s in held), "the non-reading clients were never dropped"
    assert 0.9 < gone < 3.5  # at the read deadline (1 s), not when the client chose to leave (it never does)
    assert guard.metrics.dropped_connections.get("unread") == 5
    assert served["127.0.0.2"] == 0
    deadline = time.monotonic() + 2
    while guard.total and time.monotonic() < deadline:
        time.sleep(0.05)
    assert guard.total == 0  # every slot came back: six new connections all get in
    fresh = [connect(port, "127.0.0.3") for _ in range(6)]
    for s in fresh:
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    assert all(read_all(s, 5).startswith(b"HTTP/1.1 200") for s in fresh)
    for s in held + fresh:
        s.close()


def test_a_client_that_takes_a_large_answer_slowly_but_steadily_is_not_dropped(
        stall: tuple[int, ConnectionGuard, Counter[str]]) -> None:
    port, guard, _ = stall
    s = connect(port)
    s.sendall(b"GET /big HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
    time.sleep(0.8)  # within the deadline: nothing read yet
    got = b""
    for _ in range(10):  # then 64 KiB every 0.1 s past the deadline: far above 4 KiB/s
        got += s.recv(64 << 10)
        time.sleep(0.1)
    got += read_all(s, 10)
    assert got.startswith(b"HTTP/1.1 200") and got.endswith(BIG[-100:]) and len(got) > len(BIG)
    assert guard.metrics.dropped_connections.get("unread") == 0


def test_an_upload_that_keeps_the_minimum_rate_is_still_cut_at_max_upload_s() -> None:
    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"bytes": len(await request.body())})

    config = ServeConfig(workers=1, read_timeout=0.5, min_upload_kib_s=1.0, max_upload_s=1.5)
    guard = ConnectionGuard(config)
    app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
    with running(app, config, guard) as port:
        s = connect(port)
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000000\r\n\r\n")
        t0 = time.monotonic()
        cut_after = None
        try:  # 8 KiB/s: eight times the floor, so only the cap on its time can stop it (10 s: 80 KB of 1 MB)
            while time.monotonic() - t0 < 10:
                s.sendall(b"\0" * 1024)
                time.sleep(0.125)
        except (BrokenPipeError, ConnectionResetError):
            cut_after = time.monotonic() - t0
        answer = read_all(s, 3)
        assert answer.startswith(b"HTTP/1.1 408") and b"within 1.5 s" in answer, answer
        assert cut_after is not None and cut_after > 1.3  # cut by the server, not before its cap
        assert guard.metrics.dropped_connections.get("upload_time") == 1


# ------------------------------------------------------------------ every number has an upper bound

def _numeric_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get("limit") is not None]


@pytest.mark.parametrize("cls", [ServeConfig, BatchingOptions, RunOptions, ClassifyOptions])
def test_every_number_of_the_server_s_settings_refuses_nan_inf_and_1e30_in_one_line(cls: type) -> None:
    numeric = {f.name for f in dataclasses.fields(cls) if f.type in ("int", "float", "int | None", "float | None")}
    assert numeric and numeric <= set(_numeric_fields(cls)), numeric - set(_numeric_fields(cls))  # all bounded
    for name in numeric:
        for value in (float("nan"), float("inf"), 1e30, 10**30):
            with pytest.raises(ConfigError) as e:
                cls(**{name: value})
            message = str(e.value)
            assert "\n" not in message and name in message and "must be" in message, message


@pytest.mark.parametrize("value", ["1e30", "inf", "nan"])
def test_the_server_s_limits_refuse_huge_values_as_the_command_line_is_parsed(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.serving.cli import build_parser  # `specstore serve`'s own parser: refused before the model loads

    for option in ("--max-file-mb", "--max-seconds", "--max-inflight-mb", "--max-upload-s",
                   "--max-client-inflight-mb", "--read-timeout", "--batch-overhead-frames"):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args(["serve", "--model", "missing.pt", option, value])
        lines = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(lines) == 1, (option, lines)
        assert lines[0].startswith("specstore: error: ") and option in lines[0], lines
