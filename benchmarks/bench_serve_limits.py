"""``make bench ONLY=serve-limits``: `specstore serve` under a bounded slow-client attack, on loopback only.

One server, started as a user starts it (``python -m specstore serve``, its
default limits but ``--max-file-mb 10 --max-queue 16 --workers 1`` and
``--max-connections`` from the sizes, a small CNN), with its temporary
folder in the benchmark's work folder.
First a quiet phase: 16 normal clients upload one WAV each (5-15 s of
audio) at once; their latencies are the reference.  Then the attack: 300
slow clients from ten loopback addresses (127.0.0.2-11, 30 each, under the
per-client connection cap, so every one must be dropped by the read
deadline rather than refused at the door):

* 75 held uploads, connected first: headers declaring the largest request
  the server takes (16 x 10 MiB, within one client's share of the upload
  budget), 64 KiB of body, then nothing; each holds what it sent plus a
  window of the budget until it is dropped (as a stalled upload once the
  budget is full, or at its read deadline);
* 75 body tricklers: whole headers declaring a 1 MiB upload, then one
  body byte every 2 s;
* 75 header tricklers: a request line, then one header byte every 2 s;
* 75 idle: connect and send nothing.

One second in, the same 16 normal clients upload again (each retries a
503 after its ``Retry-After``, as HTTP clients should), while ``/health``
is polled every 100 ms.  Measured: when each slow client was dropped
against its own deadline (``read_timeout``, or the longer time its bytes
buy at ``min_upload_kib_s``), each normal client's latency against its quiet
one (side by side, in deadlines), ``/health`` latency p50/p99, peak
RssAnon of the server's process tree over its idle figure, peak bytes in
the server's temporary folder against ``max_inflight_mb``, and the files
left there afterwards.

Then two rows of clients that stall the server rather than trickle
(:mod:`benchmarks.bench_serve_stalls`), each beside the normal clients and
the ``/health`` poller: 1.25 x ``max_connections`` clients that pipeline
``GET /`` and never read the answers, arriving over three read deadlines
(a server that never dropped them would refuse everyone after 2.4), and
8 addresses x 4 uploaders that declare the largest request and send just
above ``min_upload_kib_s``.  Measured: the non-readers' lives against
``read_timeout``, whether every normal upload was answered 200 by its
first retry (its ``Retry-After`` hint kept), ``/health`` p99, and the
upload bytes held at the peak.  Every count and wait is bounded; the run
takes about ten read deadlines plus the uploads.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import bench_serve_stalls as stalls
from .bench_common import Figure, GroupResult
from .bench_serve import PeakSampler, _free_port, _rss_anon_kib, make_files, running_server, save_model
from .bench_serve_stalls import Normal, Polls, largest_request, poll_health, uploads

KINDS = ("held", "body", "headers", "idle")
SLOW_ADDRESSES = [f"127.0.0.{k}" for k in range(2, 12)]
FILE_MB = 10.0
QUEUE = 16
FRAMING = 64 << 10  # serving.config.MULTIPART_FRAMING_BYTES


@dataclass
class Slow:
    kind: str
    opened: float = 0.0
    closed: float | None = None
    sent: int = 0
    answer: bytes = b""


async def _slow_client(port: int, kind: str, source: str, stop_at: float, largest: int) -> Slow:
    """One slow client of ``kind``; returns when the server closed its connection or ``stop_at`` passed."""
    me = Slow(kind)
    me.opened = time.monotonic()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(source, 0))
    except OSError:
        me.closed = time.monotonic()
        return me

    async def sender() -> None:
        if kind == "idle":
            return
        if kind == "headers":
            writer.write(b"POST /classify HTTP/1.1\r\nHost: localhost\r\n")
            while True:
                await asyncio.sleep(2.0)
                writer.write(b"X")
                me.sent += 1
                await writer.drain()
        boundary = "b0undary"
        size = (1 << 20) if kind == "body" else largest
        writer.write((f"POST /classify HTTP/1.1\r\nHost: localhost\r\nContent-Length: {size}\r\n"
                      f"Content-Type: multipart/form-data; boundary={boundary}\r\n\r\n").encode())
        head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.wav\"\r\n\r\n").encode()
        writer.write(head)
        if kind == "held":
            writer.write(b"\0" * (64 << 10))
            me.sent = len(head) + (64 << 10)
            await writer.drain()
            await asyncio.sleep(3600)
        me.sent = len(head)
        while True:
            await asyncio.sleep(2.0)
            writer.write(b"\0")
            me.sent += 1
            await writer.drain()

    task = asyncio.create_task(sender())
    try:
        while time.monotonic() < stop_at:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=max(0.01, stop_at - time.monotonic()))
            if not chunk:
                break
            me.answer += chunk
        me.closed = time.monotonic()
    except (TimeoutError, ConnectionError):
        me.closed = None if time.monotonic() >= stop_at else time.monotonic()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await task
        writer.close()
    return me


async def _attack(port: int, base: str, payloads: list[tuple[str, bytes]], n_slow: int, largest: int,
                  give_up_s: float) -> tuple[list[Slow], list[Normal], Polls]:
    stop_at = time.monotonic() + give_up_s
    # in blocks, held uploads first: they take what they can of the upload budget, so normal clients meet the worst
    slow = [asyncio.create_task(_slow_client(port, KINDS[k * len(KINDS) // n_slow],
                                             SLOW_ADDRESSES[k % len(SLOW_ADDRESSES)], stop_at, largest))
            for k in range(n_slow)]
    health = Polls()
    done = asyncio.Event()
    poller = asyncio.create_task(poll_health(base, done, health))
    await asyncio.sleep(1.0)
    normal = await uploads(base, payloads, give_up_s)
    slow_done = await asyncio.gather(*slow)
    done.set()
    await poller
    return slow_done, normal, health


def _deadline(s: Slow, read_timeout: float, min_rate: float) -> float:
    """Seconds the server should allow ``s`` before dropping it (its bytes buy time at the minimum rate)."""
    return max(read_timeout, s.sent / min_rate) if s.kind in ("body", "held") else read_timeout


def run(work: Path, *, n_slow: int, n_normal: int, seconds: tuple[float, float], read_timeout: float,
        max_connections: int, model: dict[str, Any]) -> GroupResult:
    """The serve-limits group (see the module docstring)."""
    import httpx

    work.mkdir(parents=True, exist_ok=True)
    files, _ = make_files(work, n_normal, *seconds, seed=3)
    payloads = [(f.name, f.read_bytes()) for f in files]
    ckpt = save_model(work, model)
    tmp = work / "tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    min_rate_kib = 16.0
    argv = [sys.executable, "-m", "specstore", "serve", "--model", str(ckpt), "--port", str(port), "--workers", "1",
            "--max-file-mb", str(FILE_MB), "--max-queue", str(QUEUE), "--read-timeout", str(read_timeout),
            "--min-upload-kib-s", str(min_rate_kib), "--max-connections", str(max_connections),
            "--max-client-connections", str(min(64, max_connections)), "--device", "cpu"]
    with running_server(argv, f"{base}/health", work / "server.log", {"TMPDIR": str(tmp)}) as proc:
        asyncio.run(uploads(base, payloads[:2], 120))  # warm: decode worker, oneDNN kernels
        quiet = asyncio.run(uploads(base, payloads, 120))
        idle_kib = _rss_anon_kib(proc.pid)
        limits = httpx.get(f"{base}/health", timeout=30).json()["limits"]
        largest = largest_request(limits)
        give_up = 3 * read_timeout + 60
        with PeakSampler(proc.pid, tmp, every=0.05) as sampler:
            slow, normal, health = asyncio.run(_attack(port, base, payloads, n_slow, largest, give_up))
            unread = asyncio.run(stalls.unread_row(port, base, payloads, -(-5 * max_connections // 4), read_timeout))
            slowup = asyncio.run(stalls.slow_upload_row(port, base, payloads, largest, 1.03 * min_rate_kib * 1024,
                                                        give_up))
        time.sleep(0.5)
        uploads_left = [p for p in tmp.iterdir() if p.name.startswith("specstore-uploads-")]
        left = sum(len(list(p.iterdir())) for p in uploads_left)
    left_after_stop = sum(1 for p in tmp.iterdir() if p.name.startswith("specstore-uploads-"))
    figures = _figures(slow, quiet, normal, health, sampler, idle_kib, left, left_after_stop, read_timeout,
                       min_rate_kib * 1024, n_slow, n_normal)
    budget = int(limits["max_inflight_mb"] * (1 << 20))
    figures[4:4] = stalls.row_figures(unread, slowup, read_timeout, max_connections, budget, largest)
    method = f"`python -m benchmarks --only serve-limits`: {__doc__.split(chr(10) + chr(10), 1)[1]}"
    return GroupResult("serve-limits", figures, method=method)


def _figures(slow: list[Slow], quiet: list[Normal], normal: list[Normal], polls: Polls, sampler: PeakSampler,
             idle_kib: int, left: int, left_after_stop: int, read_timeout: float, min_rate: float, n_slow: int,
             n_normal: int) -> list[Figure]:
    late = [((s.closed - s.opened) / _deadline(s, read_timeout, min_rate)) if s.closed is not None else float("inf")
            for s in slow]
    by_kind = {k: [x for s, x in zip(slow, late, strict=True) if s.kind == k] for k in KINDS}
    answers = {k: sum(1 for s in slow if s.kind == k and s.answer.startswith(b"HTTP/1.1 503")) for k in KINDS}
    ok = sum(1 for status, _, _ in normal if status == 200)
    lateness = [(a[1] - q[1]) / read_timeout for a, q in zip(normal, quiet, strict=True)]
    health = polls.latency
    bound = QUEUE * ((int(FILE_MB) << 20) + FRAMING)
    return [
        Figure("slow_dropped_in_deadline", "slow clients dropped within their read deadline",
               sum(1 for x in late if x <= 1.1) / n_slow, "fraction",
               f"{n_slow} slow clients (idle, trickled headers, trickled body, held upload); dropped when the server "
               "closed the connection, within 1.1 x its own deadline (read_timeout, or the longer time its bytes buy "
               "at the minimum rate); refused at once counts", 1.0, ">=",
               {"max_drop_over_deadline": {k: round(max(v), 3) if v else None for k, v in by_kind.items()},
                "answered_503": answers, "read_timeout_s": read_timeout}),
        Figure("normal_answered", "normal clients answered 200 under attack", ok / n_normal, "fraction",
               f"{n_normal} uploads at full speed among the slow clients; a 503 is retried after its Retry-After",
               1.0, ">=", {"statuses": sorted(status for status, _, _ in normal),
                           "tries": [t for _, _, t in normal]}),
        Figure("normal_lateness", "normal clients' extra latency under attack, in read deadlines",
               round(max(lateness), 3), "deadlines",
               "each client's latency under attack minus its latency in the quiet phase just before, divided by "
               "read_timeout; the worst client", 1.0, "<=",
               {"quiet_s": [round(q[1], 2) for q in quiet], "attack_s": [round(a[1], 2) for a in normal]}),
        Figure("health_p99_s", "/health latency p99 during the attack", round(polls.p99(), 4), "s",
               f"GET /health every 100 ms from the start of the attack to the last drop ({len(health)} polls, "
               f"{sum(1 for h in health if not np.isfinite(h))} failed; a failure counts as infinite)", 0.5, "<=",
               {"p50_s": polls.p50()}),
        Figure("temp_disk_over_bound", "peak temporary disk / documented bound", round(sampler.peak_disk / bound, 4),
               "ratio", f"peak bytes in the server's TMPDIR during the attack and the two rows over max_inflight_mb "
               f"(default max_queue x (max_file_mb + 64 KiB framing) = {bound} bytes)", 1.0, "<=",
               {"peak_bytes": sampler.peak_disk, "bound_bytes": bound}),
        Figure("rss_growth_mib", "server RSS growth under attack", round((sampler.peak_kib - idle_kib) / 1024, 1),
               "MiB", "peak RssAnon of the server and its decode worker during the attack and the two rows minus "
                      "the idle figure after the quiet phase; the documented bound: 64 KiB of read buffer per open "
                      "connection (512 by default: 32 MiB) plus the decoded features of the queued clips", None, None,
               {"idle_mib": round(idle_kib / 1024, 1), "peak_mib": round(sampler.peak_kib / 1024, 1)}),
        Figure("temp_files_left", "upload files left in the server's folder afterwards", left, "files",
               "after the attack, before the server stops (and the folder itself is removed when it stops: "
               f"{left_after_stop} entries left in TMPDIR after stopping)", 0, "<=",
               {"after_stop": left_after_stop}),
    ]
