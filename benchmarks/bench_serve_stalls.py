"""The serve-limits group's clients, and its two rows of clients that stall the server rather than trickle.

Normal clients (:func:`uploads`: one WAV each, a 503 retried after its
``Retry-After``) and the ``/health`` poller (:func:`poll_health`: every
100 ms, with the open connections and upload bytes it reports) serve every
phase.  The two rows, each beside normal clients from 127.0.0.1 and the
poller:

* **unread** (:func:`unread_row`): clients that never read their answers.
  Each opens a connection with a 4 KiB receive buffer (and a 1460-byte
  segment size, as on a real network), pipelines 32 ``GET /`` and reads
  nothing, ever.  1.25 x ``max_connections`` of them, from nine addresses
  (127.0.0.20-28, each under the per-client cap), arrive evenly over three
  read deadlines: a server that never drops them has its every connection
  taken after 2.4 deadlines and refuses everyone, ``/health`` included;
  the normal clients upload 2.5 deadlines in.  Measured: when each was
  dropped (its TCP state leaves ESTABLISHED, read without reading)
  against ``read_timeout``.
* **slowup** (:func:`slow_upload_row`): 8 addresses (127.0.0.30-37) x 4
  uploaders, each declaring the largest request the server takes and
  sending just above ``min_upload_kib_s`` (3 % more), reconnecting a
  second after the server closes it; the normal clients upload a second
  in.  Measured: the upload bytes held at the peak against the budget.

For both: whether every normal upload was answered 200 by its first retry
(the ``Retry-After`` hint kept), and ``/health`` latency p99.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .bench_common import Figure

UNREAD_ADDRESSES = [f"127.0.0.{k}" for k in range(20, 29)]
UPLOAD_ADDRESSES = [f"127.0.0.{k}" for k in range(30, 38)]
UPLOADERS_PER_ADDRESS = 4
PIPELINED = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n" * 32
TCP_ESTABLISHED = 1
FRAMING = 64 << 10  # serving.config.MULTIPART_FRAMING_BYTES

Normal = tuple[int, float, int]
"""One normal upload: final status, seconds from its first try, tries."""


@dataclass
class Polls:
    """What the ``/health`` poller saw: latencies (inf: failed), open connections, upload bytes held."""

    latency: list[float] = field(default_factory=list)
    connections: list[int] = field(default_factory=list)
    inflight: list[int] = field(default_factory=list)

    def p99(self) -> float:
        return float(np.percentile(self.latency, 99, method="higher")) if self.latency else float("inf")

    def p50(self) -> float | None:
        finite = [h for h in self.latency if np.isfinite(h)]
        return round(float(np.median(finite)), 4) if finite else None


async def _normal(client: Any, name: str, data: bytes, give_up: float) -> Normal:
    """Upload one file, retrying a 503 after its Retry-After; (final status, seconds from first try, tries)."""
    import httpx

    t0 = time.monotonic()
    tries = 0
    while True:
        tries += 1
        try:
            r = await client.post("/classify", files={"file": (name, data, "audio/wav")})
            status, retry = r.status_code, float(r.headers.get("retry-after", "1"))
        except httpx.HTTPError:
            status, retry = 0, 1.0
        if status not in (0, 503) or time.monotonic() + retry > give_up:
            return status, time.monotonic() - t0, tries
        await asyncio.sleep(retry)


async def uploads(base: str, payloads: list[tuple[str, bytes]], give_up_s: float) -> list[Normal]:
    """Every payload uploaded at once by its own normal client (see :func:`_normal`)."""
    import httpx

    limits = httpx.Limits(max_connections=len(payloads), max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base, timeout=give_up_s, limits=limits) as client:
        give_up = time.monotonic() + give_up_s
        return list(await asyncio.gather(*(_normal(client, n, d, give_up) for n, d in payloads)))


async def poll_health(base: str, until: asyncio.Event, out: Polls) -> None:
    """``GET /health`` every 100 ms, each on a new connection (so a full connection cap shows), until ``until``
    is set."""
    import httpx

    fresh = httpx.Limits(max_keepalive_connections=0)  # a new connection each time, as a load balancer's probe
    async with httpx.AsyncClient(base_url=base, timeout=10, limits=fresh) as client:
        while not until.is_set():
            t0 = time.perf_counter()
            try:
                r = await client.get("/health")
                ok = r.status_code == 200
                if ok:
                    body = r.json()
                    out.connections.append(int(body.get("open_connections", 0)))
                    out.inflight.append(int(body.get("inflight_upload_bytes", 0)))
            except httpx.HTTPError:
                ok = False
            out.latency.append(time.perf_counter() - t0 if ok else float("inf"))
            await asyncio.sleep(0.1)


def _tcp_state(s: socket.socket) -> int:
    try:
        return s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    except OSError:
        return 0


async def _non_reader(port: int, source: str) -> socket.socket | None:
    """A connection that pipelines :data:`PIPELINED` and never reads (None when it could not connect)."""
    loop = asyncio.get_running_loop()
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 1460)
        s.bind((source, 0))
        s.setblocking(False)
        await asyncio.wait_for(loop.sock_connect(s, ("127.0.0.1", port)), 5)
        await asyncio.wait_for(loop.sock_sendall(s, PIPELINED), 5)
    except (OSError, TimeoutError):
        s.close()
        return None
    return s


async def _unread_clients(port: int, n: int, over_s: float, lives: list[float]) -> None:
    """Open ``n`` non-readers evenly over ``over_s`` seconds; each one's life (s) joins ``lives`` when the server
    drops it (0: refused at once; inf: still open ``2 x over_s`` after the first one opened)."""
    opened: list[tuple[socket.socket, float]] = []
    t0 = time.monotonic()
    k = 0
    give_up = t0 + 2 * over_s
    while time.monotonic() < give_up and (k < n or opened):
        while k < n and time.monotonic() >= t0 + k * over_s / n:
            s = await _non_reader(port, UNREAD_ADDRESSES[k % len(UNREAD_ADDRESSES)])
            if s is None:
                lives.append(0.0)  # refused at the door: not held
            else:
                opened.append((s, time.monotonic()))
            k += 1
        still = []
        for s, at in opened:
            if _tcp_state(s) == TCP_ESTABLISHED:
                still.append((s, at))
            else:
                lives.append(time.monotonic() - at)
                s.close()
        opened = still
        await asyncio.sleep(0.05)
    for s, _ in opened:
        lives.append(float("inf"))
        s.close()


async def unread_row(port: int, base: str, payloads: list[tuple[str, bytes]], n: int,
                     read_timeout: float) -> tuple[list[float], list[Normal], Polls]:
    """The unread row (see the module docstring): the non-readers' lives, the normal uploads, the polls."""
    polls, done, lives = Polls(), asyncio.Event(), list[float]()
    poller = asyncio.create_task(poll_health(base, done, polls))
    attack = asyncio.create_task(_unread_clients(port, n, 3 * read_timeout, lives))
    await asyncio.sleep(2.5 * read_timeout)
    normal = await uploads(base, payloads, 3 * read_timeout + 60)
    await attack
    done.set()
    await poller
    return lives, normal, polls


async def _slow_uploader(port: int, source: str, declared: int, rate: float, stop: asyncio.Event) -> int:
    """Upload ``declared`` bytes from ``source`` keeping ``rate`` B/s since its connection opened (paced by the
    clock, a quarter second's worth ahead), until ``stop``, reconnecting a second after the server closes the
    connection; how many connections it made."""
    part = b'--b0undary\r\nContent-Disposition: form-data; name="file"; filename="x.wav"\r\n\r\n'
    head = (f"POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Length: {declared}\r\n"
            f"Content-Type: multipart/form-data; boundary=b0undary\r\n\r\n").encode() + part
    connections = 0
    while not stop.is_set():
        connections += 1
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
        except OSError:
            await asyncio.sleep(1.0)
            continue
        t0, sent = time.monotonic(), len(part)  # body bytes
        try:
            writer.write(head)
            while not stop.is_set() and not reader.at_eof() and sent < declared:
                owed = min(declared, int(rate * (time.monotonic() - t0 + 0.25))) - sent
                writer.write(b"\0" * max(0, owed))
                sent += max(0, owed)
                await writer.drain()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.25)
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
    return connections


async def slow_upload_row(port: int, base: str, payloads: list[tuple[str, bytes]], declared: int,
                          rate: float, give_up_s: float) -> tuple[list[int], list[Normal], Polls]:
    """The slowup row (see the module docstring): each uploader's connections, the normal uploads, the polls."""
    polls, done, stop = Polls(), asyncio.Event(), asyncio.Event()
    poller = asyncio.create_task(poll_health(base, done, polls))
    slow = [asyncio.create_task(_slow_uploader(port, a, declared, rate, stop))
            for a in UPLOAD_ADDRESSES for _ in range(UPLOADERS_PER_ADDRESS)]
    await asyncio.sleep(1.0)
    normal = await uploads(base, payloads, give_up_s)
    await asyncio.sleep(1.0)
    stop.set()
    made = list(await asyncio.gather(*slow))
    done.set()
    await poller
    return made, normal, polls


def largest_request(limits: dict[str, Any]) -> int:
    """The largest request the server takes, from ``/health``'s limits (a server without per-client shares
    takes as much as its budget holds)."""
    per_file = int(limits["max_file_mb"] * (1 << 20)) + FRAMING
    share = limits.get("max_client_inflight_mb", limits["max_inflight_mb"])
    return min(limits["max_files"] * per_file, int(share * (1 << 20)))


def _by_retry(normal: list[Normal]) -> float:
    """The fraction of normal uploads answered 200 on their first try or on the retry their hint asked for."""
    return sum(1 for status, _, tries in normal if status == 200 and tries <= 2) / len(normal)


def row_figures(unread: tuple[list[float], list[Normal], Polls], slowup: tuple[list[int], list[Normal], Polls],
                read_timeout: float, max_connections: int, budget: int, declared: int) -> list[Figure]:
    """The two rows' figures."""
    lives, normal_a, polls_a = unread
    made, normal_b, polls_b = slowup
    late = [x / read_timeout for x in lives]
    hint = "answered 200 on the first try or on the one retry its Retry-After asked for"
    return [
        Figure("unread_dropped_in_deadline", "clients that never read dropped within their write deadline",
               round(sum(1 for x in late if x <= 1.25) / len(late), 4), "fraction",
               f"{len(lives)} clients pipelining GET / with a 4 KiB receive buffer and never reading, arriving over "
               f"three read deadlines (1.25 x --max-connections {max_connections}); dropped within 1.25 x "
               "read_timeout of connecting (refused at once counts)", 1.0, ">=",
               {"max_life_over_deadline": round(max(late), 3), "refused_at_once": sum(1 for x in lives if x == 0),
                "peak_open_connections": max(polls_a.connections, default=None)}),
        Figure("unread_normal_by_retry", "normal uploads answered by their first retry, beside non-readers",
               round(_by_retry(normal_a), 4), "fraction", f"{len(normal_a)} normal uploads from another address "
               f"2.5 read deadlines into the non-readers' arrival; {hint}", 1.0, ">=",
               {"statuses": sorted(s for s, _, _ in normal_a), "tries": [t for _, _, t in normal_a]}),
        Figure("unread_health_p99_s", "/health latency p99 beside non-readers", round(polls_a.p99(), 4), "s",
               f"GET /health every 100 ms through the row ({len(polls_a.latency)} polls, "
               f"{sum(1 for h in polls_a.latency if not np.isfinite(h))} failed; a failure counts as infinite)",
               0.5, "<=", {"p50_s": polls_a.p50()}),
        Figure("slowup_normal_by_retry", "normal uploads answered by their first retry, beside slow uploads",
               round(_by_retry(normal_b), 4), "fraction",
               f"{len(normal_b)} normal uploads from another address while {len(made)} uploaders from "
               f"{len(UPLOAD_ADDRESSES)} addresses each declare {declared} bytes (the largest request) and send "
               f"just above --min-upload-kib-s; {hint}", 1.0, ">=",
               {"statuses": sorted(s for s, _, _ in normal_b), "tries": [t for _, _, t in normal_b],
                "uploader_connections": sum(made)}),
        Figure("slowup_health_p99_s", "/health latency p99 beside slow uploads", round(polls_b.p99(), 4), "s",
               f"GET /health every 100 ms through the row ({len(polls_b.latency)} polls, "
               f"{sum(1 for h in polls_b.latency if not np.isfinite(h))} failed; a failure counts as infinite)",
               0.5, "<=", {"p50_s": polls_b.p50()}),
        Figure("slowup_budget_held", "peak upload bytes held / budget, beside slow uploads",
               round(max(polls_b.inflight, default=0) / budget, 4), "ratio",
               "the most upload bytes the server reported held (GET /health) during the row over max_inflight_mb",
               None, None, {"peak_bytes": max(polls_b.inflight, default=0), "budget_bytes": budget}),
    ]
