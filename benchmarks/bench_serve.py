"""``make bench ONLY=serve``: the server's memory-budgeted batcher against a fixed batch of 4, same server, same run.

One server process (``python -m benchmarks.bench_serve server ...``) holds
one model and two services side by side: ``/budget`` (the default batcher:
length-binned batches under the memory budget) and ``/fixed4`` (the
article's baseline: the 4 oldest clips whatever their lengths), each with
its own decode workers, driven one at a time.  Clients (httpx, asyncio, in
the benchmark's process) upload distinct WAV files of 15-240 s (the
article's range: a stratified sample, in a fixed random order) over
127.0.0.1 only, with 8 and 32 concurrent clients, each client sending its
share of the files one after the other.  Repeats interleave the two
variants (order rotated).  Measured per phase: throughput (seconds of
audio per wall second, first upload sent to last answer), request latency
p50/p99, padding efficiency from the server's own counters, peak RssAnon
of the server process tree (sampled every 20 ms), and errors (any answer
but 200).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .bench_common import CpuWindow, Figure, GroupResult, log, median, rotated

VARIANTS = ("budget", "fixed4")


# ---------------------------------------------------------------- the server process

def serve(model: str, port: int, workers: int, max_delay_ms: float, device: str = "cpu") -> None:
    """Both services in one uvicorn server on 127.0.0.1 (runs until terminated)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Mount

    from specstore.infer.engine.runtime import RunOptions
    from specstore.serving.app import Service, create_app
    from specstore.serving.config import ServeConfig
    from specstore.serving.model import Classifier
    from specstore.serving.policy import BatchPolicy

    classifier = Classifier(model, RunOptions(device=device, progress=False))
    services = {
        "budget": Service(classifier, ServeConfig(workers=workers, max_queue=256, timeout=600.0,
                                                  policy=BatchPolicy("budget", max_delay_ms / 1000))),
        "fixed4": Service(classifier, ServeConfig(workers=workers, max_queue=256, timeout=600.0,
                                                  policy=BatchPolicy("fixed", max_delay_ms / 1000, fixed_size=4))),
    }

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for s in services.values():
            await s.start()
        try:
            yield
        finally:
            for s in services.values():
                await s.stop()

    app = Starlette(routes=[Mount(f"/{k}", create_app(s)) for k, s in services.items()], lifespan=lifespan)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


# ---------------------------------------------------------------- the clients

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def save_model(work: Path, model: dict[str, Any]) -> Path:
    """An untrained checkpoint of ``model`` options for the default log-mel and 6 labels, at ``work/model.pt``."""
    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint
    from specstore.infer.options.defaults import PLAIN_MODEL
    from specstore.store import FeatureSpec

    spec = FeatureSpec.mel()
    labels = ["blues", "classical", "country", "jazz", "metal", "rock"]
    net = build_model(ModelConfig(n_bins=spec.n_bins, n_classes=len(labels), **{**PLAIN_MODEL, **model}))
    ckpt = work / "model.pt"
    save_checkpoint(Checkpoint.from_model(net, labels, "mel", spec), ckpt)
    return ckpt


@contextlib.contextmanager
def running_server(argv: list[str], health_url: str, log_path: Path,
                   env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """The server process ``argv`` (output to ``log_path``), once ``health_url`` answers 200; stopped after the
    block (SIGTERM, then kill after 30 s)."""
    import httpx

    with open(log_path, "wb") as server_log:
        proc = subprocess.Popen(argv, stdout=server_log, stderr=subprocess.STDOUT,
                                env={"OMP_WAIT_POLICY": "PASSIVE", **os.environ, "PYTHONUNBUFFERED": "1",
                                     **(env or {})})
        try:
            deadline = time.monotonic() + 180
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(health_url, timeout=2).status_code == 200:
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the benchmark server did not start: {log_path.read_text()[-2000:]}")
                time.sleep(0.5)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _rss_anon_kib(pid: int) -> int:
    """RssAnon of ``pid`` and its children (KiB); 0 for processes gone meanwhile."""
    total = 0
    pids = [pid]
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            pids += [int(p) for p in f.read().split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("RssAnon:"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def _dir_bytes(folder: Path) -> int:
    """Bytes of the files below ``folder`` (files vanishing meanwhile count 0)."""
    total = 0
    for root, _, names in os.walk(folder):
        for n in names:
            with contextlib.suppress(OSError):
                total += (Path(root) / n).stat().st_size
    return total


class PeakSampler:
    """The highest RssAnon of a process tree while the block runs, and the most bytes below ``folder`` if given,
    sampled every ``every`` seconds."""

    def __init__(self, pid: int, folder: Path | None = None, every: float = 0.02) -> None:
        self.pid, self.folder, self.every = pid, folder, every
        self.peak_kib = 0
        self.peak_disk = 0
        self._stop = threading.Event()

    def __enter__(self) -> PeakSampler:
        def run() -> None:
            while not self._stop.is_set():
                self.peak_kib = max(self.peak_kib, _rss_anon_kib(self.pid))
                if self.folder is not None:
                    self.peak_disk = max(self.peak_disk, _dir_bytes(self.folder))
                self._stop.wait(self.every)

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _counters(url: str) -> dict[str, float]:
    import httpx

    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


async def _drive(url: str, payloads: list[tuple[str, bytes]], clients: int,
                 ramp_s: float) -> tuple[list[float], list[int], float]:
    """Every payload uploaded once by ``clients`` concurrent clients; (latencies s, status codes, makespan s).

    Client ``k`` starts ``k * ramp_s / clients`` seconds in (a ramp-up, as load generators spawn users), then
    sends its share one after the other.  Started all at once, the uploads' bodies would finish arriving in
    order of size, handing the server a first wave sorted by length that no real traffic gives.
    """
    import httpx

    share = [payloads[k::clients] for k in range(clients)]
    latencies: list[float] = []
    codes: list[int] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        async def one(k: int, mine: list[tuple[str, bytes]]) -> None:
            await asyncio.sleep(k * ramp_s / clients)
            for name, data in mine:
                t0 = time.perf_counter()
                try:
                    r = await client.post("/classify", files={"file": (name, data, "audio/wav")})
                    codes.append(r.status_code)
                except httpx.HTTPError:
                    codes.append(0)
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.wait_for(asyncio.gather(*(one(k, m) for k, m in enumerate(share) if m)), timeout=1800)
        makespan = time.perf_counter() - t0
    return latencies, codes, makespan


def _phase(base: str, variant: str, payloads: list[tuple[str, bytes]], clients: int, pid: int,
           ramp_s: float = 0.0) -> dict[str, Any]:
    url = f"{base}/{variant}"
    before = _counters(url)
    with PeakSampler(pid) as peak, CpuWindow() as cpu:
        latencies, codes, makespan = asyncio.run(_drive(url, payloads, clients, ramp_s))
    after = _counters(url)

    def delta(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    computed = delta("specstore_computed_frames_total")
    return {"makespan": makespan, "latencies": latencies, "errors": sum(c != 200 for c in codes),
            "audio": delta("specstore_audio_seconds_total"), "efficiency": delta("specstore_real_frames_total") /
            computed if computed else 1.0, "batches": delta("specstore_batches_total"),
            "model_busy": delta("specstore_batch_seconds_sum") / makespan,
            "decode_s": delta("specstore_decode_seconds_sum") / max(len(payloads), 1),
            "peak_mib": peak.peak_kib / 1024, "foreign": cpu.foreign_cores, "own": cpu.own_cores}


def make_files(work: Path, n: int, lo: float, hi: float, seed: int) -> tuple[list[Path], list[float]]:
    """``n`` distinct WAV files (22.05 kHz mono) with lengths the ``n`` quantiles of uniform(lo, hi) s, shuffled."""
    from specstore.pipeline.testing import write_music_like

    seconds = lo + (hi - lo) * (np.arange(n) + 0.5) / n
    order = np.random.default_rng(seed).permutation(n)
    files = [write_music_like(work / f"u{k:03d}.wav", float(seconds[i]), seed=1000 + k, sr=22050, channels=1,
                              loop_seconds=10.0) for k, i in enumerate(order)]
    return files, [float(seconds[i]) for i in order]


def run(work: Path, *, n_files: int, clients: tuple[int, ...], repeats: int, seconds: tuple[float, float],
        workers: int, max_delay_ms: float, ramp_s: float, model: dict[str, Any], device: str = "cpu") -> GroupResult:
    """The serving group (see the module docstring); ``device`` is the model's (``make gpu-check`` runs it on CUDA)."""
    work.mkdir(parents=True, exist_ok=True)
    files, lengths = make_files(work, n_files, *seconds, seed=0)
    payloads = [(f.name, f.read_bytes()) for f in files]
    ckpt = save_model(work, model)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    results: dict[tuple[int, str], list[dict[str, Any]]] = {(c, v): [] for c in clients for v in VARIANTS}
    argv = [sys.executable, "-m", "benchmarks.bench_serve", "server", "--model", str(ckpt), "--port", str(port),
            "--workers", str(workers), "--max-delay-ms", str(max_delay_ms), "--device", device]
    with running_server(argv, f"{base}/budget/health", work / "server.log") as proc:
        for v in VARIANTS:  # warm: imports, oneDNN kernels, decode workers
            _phase(base, v, payloads[: max(2, min(8, n_files))], 4, proc.pid)
        for r in range(repeats):
            for c in clients:
                for v in rotated(VARIANTS, r):
                    res = _phase(base, v, payloads, c, proc.pid, ramp_s)
                    results[(c, v)].append(res)
                    log.info("   serve %s, %d clients: %.0f s audio in %.1f s (%.0fx), efficiency %.3f, "
                             "%d batches, %d errors", v, c, res["audio"], res["makespan"],
                             res["audio"] / res["makespan"], res["efficiency"], res["batches"], res["errors"])
    return _figures(results, clients, lengths, workers, max_delay_ms, repeats, ramp_s)


def _figures(results: dict[tuple[int, str], list[dict[str, Any]]], clients: tuple[int, ...], lengths: list[float],
             workers: int, max_delay_ms: float, repeats: int, ramp_s: float) -> GroupResult:
    figures: list[Figure] = []
    total_audio = float(sum(lengths))
    all_errors = sum(p["errors"] for runs in results.values() for p in runs)
    for c in clients:
        b, f = results[(c, "budget")], results[(c, "fixed4")]
        ratios = [fx["makespan"] / bx["makespan"] for bx, fx in zip(b, f, strict=True)]

        def pct(runs: list[dict[str, Any]], q: float) -> float:
            return float(median([float(np.percentile(p["latencies"], q)) for p in runs]))

        def both(key: str, digits: int = 2, pick: Any = median, b: Any = b, f: Any = f) -> dict[str, float]:
            return {v: round(pick([p[key] for p in runs]), digits) for v, runs in (("budget", b), ("fixed4", f))}

        efficiency = both("efficiency", 4)
        details: dict[str, Any] = {
            "uploads": len(lengths), "audio_seconds": round(total_audio, 1), "clients": c, "repeats": repeats,
            "audio_s_per_s": {"budget": round(total_audio / median([p["makespan"] for p in b]), 1),
                              "fixed4": round(total_audio / median([p["makespan"] for p in f]), 1)},
            "makespan_s": {"budget": [round(p["makespan"], 2) for p in b],
                           "fixed4": [round(p["makespan"], 2) for p in f]},
            "latency_p50_s": {"budget": round(pct(b, 50), 2), "fixed4": round(pct(f, 50), 2)},
            "latency_p99_s": {"budget": round(pct(b, 99), 2), "fixed4": round(pct(f, 99), 2)},
            "padding_efficiency": efficiency,
            "closed_batches": both("batches", 1),
            "peak_rss_anon_mib (server + decode workers)": both("peak_mib", 0, max),
            "errors": both("errors", 0, sum),
            "foreign_cores": both("foreign"),
            "own_cores (server, its workers and the clients)": both("own"),
            "model_busy_share (model time / wall)": both("model_busy", 3),
            "decode_s_per_upload (in the pool, queueing included)": both("decode_s"),
        }
        target = 1.5 if c == max(clients) else None
        figures.append(Figure(
            f"serve_c{c}_vs_fixed4", f"Serving throughput, {c} clients: budgeted batcher vs fixed batch of 4",
            round(median(ratios), 3), "x",
            f"seconds of audio per wall second (first upload to last answer) of the server's memory-budgeted "
            f"batcher / the same server's fixed batch of 4 (oldest clips first), {len(lengths)} uploads of "
            f"{min(lengths):.0f}-{max(lengths):.0f} s WAV from {c} concurrent clients; median of per-repeat ratios",
            target=target, op=">=" if target else None, details=details))
        figures.append(Figure(
            f"serve_c{c}_p99_vs_fixed4", f"Serving p99 latency, {c} clients: budgeted batcher / fixed batch of 4",
            round(pct(b, 99) / pct(f, 99), 3), "x (<1: lower latency)",
            "99th-percentile request latency (upload to answer) of the budgeted batcher / the fixed batch of 4; "
            "p50 and p99 in seconds in the details of the throughput row"))
        figures.append(Figure(
            f"serve_c{c}_padding_efficiency", f"Serving padding efficiency, {c} clients: budgeted batcher",
            efficiency["budget"], "real/computed",
            f"real / computed frames of the budgeted batcher's batches (server counters); fixed batch of 4: "
            f"{efficiency['fixed4']}"))
    figures.append(Figure(
        "serve_errors", "Serving: failed requests (both variants, every phase)", float(all_errors), "count",
        "answers other than 200 (or no answer) over every timed phase", target=0.0, op="<="))
    peak = max(p["peak_mib"] for runs in results.values() for p in runs)
    figures.append(Figure(
        "serve_peak_memory", "Serving: peak anonymous memory of the server", round(peak), "MiB",
        f"highest RssAnon of the server process and its decode workers ({2 * workers} processes, both variants' "
        "pools) over every phase, sampled every 20 ms"))
    method = (
        f"One server process on 127.0.0.1 with one model (the default CNN, untrained weights: speed does not "
        f"depend on them) on 128-bin log-mel (the default spec, float32, CPU, the default 2048 MiB budget, max "
        f"batch 16) and two services side by side: the budgeted batcher and a fixed batch of 4, each with "
        f"{workers} decode worker processes and a {max_delay_ms:g} ms max delay. {len(lengths)} distinct WAV "
        f"uploads (22.05 kHz mono, music-like, lengths the quantiles of uniform {min(lengths):.0f}-"
        f"{max(lengths):.0f} s, {total_audio / 3600:.2f} h in all) in a fixed shuffled order; each phase uploads "
        f"every file once, split over {' or '.join(str(c) for c in clients)} concurrent httpx clients, each "
        f"sending its share one after the other; the clients start evenly over the first {ramp_s:g} s (a ramp-up: "
        "started all at once, the bodies finish arriving in order of size and hand the server a first wave sorted "
        f"by length, which flatters the fixed batch). One untimed warm-up phase per variant, then {repeats} repeats "
        "with the variants interleaved (order rotated). Decoding (soundfile + log-mel) runs in the same server "
        "and counts in every figure, as a user would see it.")
    return GroupResult("serving", figures, method=method, profile=_where_the_time_goes(figures))


def _where_the_time_goes(figures: list[Figure]) -> str:
    """What bounds each throughput ratio that missed its target, from the phases' own figures (for the report)."""
    lines = []
    for f in figures:
        if not f.key.endswith("_vs_fixed4") or "p99" in f.key or f.met is not False:
            continue
        d = f.details
        eff, busy = d["padding_efficiency"], d["model_busy_share (model time / wall)"]
        ideal = eff["budget"] / eff["fixed4"] if eff["fixed4"] else float("nan")
        own, foreign = d["own_cores (server, its workers and the clients)"], d["foreign_cores"]
        per_batch = d["uploads"] / max(d["closed_batches"]["budget"], 1)
        bound = ("so both runs are bound by the model, not by decoding" if min(busy.values()) >= 0.5 else
                 "so neither run is bound by the model: the uploads and their decoding set the pace, and a better "
                 "batch cannot change it")
        lines.append(
            f"{d['clients']} clients: the model thread was busy {busy['budget']:.0%} (budgeted) and "
            f"{busy['fixed4']:.0%} (fixed 4) of the wall time, {bound}; padding efficiency "
            f"{eff['budget']:.3f} vs {eff['fixed4']:.3f}, a ratio of {ideal:.2f}: "
            f"what a fixed cost per computed frame allows (the budgeted batcher closed {per_batch:.1f} clips per "
            f"batch). Measured {f.value:.2f}x. This process tree used {own['budget']:.2f} / {own['fixed4']:.2f} "
            f"cores while other processes used {foreign['budget']:.2f} / {foreign['fixed4']:.2f}; decoding (the "
            "same work in both variants) shares the cores the model gets and dilutes the ratio.")
    return "\n\n".join(textwrap.fill(line, 110) for line in lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_serve", description="the serving benchmark's server")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server", help="both services on 127.0.0.1:PORT")
    s.add_argument("--model", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--workers", type=int, default=2)
    s.add_argument("--max-delay-ms", type=float, default=50.0)
    s.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    serve(args.model, args.port, args.workers, args.max_delay_ms, args.device)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
