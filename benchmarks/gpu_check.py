"""``make gpu-check``: the GPU paths proven and measured in one call on a CUDA machine.

    python -m benchmarks.gpu_check [--out reports/gpu-check] [--clips 2000] [--dry-run]

Without CUDA it says so in one line and exits 0 (``--dry-run`` instead runs
every step on the CPU at toy sizes, which proves this script's logic).  With
CUDA it runs, writing ``gpu_check.json`` and ``gpu_check.md`` to ``--out``
after every step, so a run cut short still returns what it measured:

1. the test suite's CUDA tests (``pytest -m gpu``): budget from free memory,
   the cost probe against ``torch.cuda.max_memory_allocated``, pinned
   copies, bf16/fp16 autocast with the grad scaler, batched == alone under
   autocast, a real out-of-memory split and retried, training with and
   without gradient checkpointing;
2. the GPU figures, on a store of synthetic features made on the machine
   (``--clips`` clips, log-normal lengths, 128 mel bins):

   * ``gpu_infer_vs_fixed4``: clips/s of the engine's prediction loop against
     batches of 4 in arrival order, same model, autocast and loader (target >= 2);
   * ``gpu_peak_vs_budget``: peak allocated memory during prediction over the
     planned budget, under a budget the planner can fill (target <= 1 and >= 0.7);
   * ``gpu_oom_retries``: out-of-memory splits in that normal run (target 0),
     and ``gpu_forced_oom_recovered``: a run squeezed by
     ``torch.cuda.set_per_process_memory_fraction`` splits batches and still
     gives every clip the same probabilities (target 1 = yes);
   * ``gpu_idle_fraction``: the share of the loop's wall time the GPU spends
     between batches, from CUDA events around every forward (target < 0.1),
     for the default loader thread and for DataLoader workers;
   * ``gpu_train_ckpt_memory``: peak memory of training steps with gradient
     checkpointing over without (information);
3. the serving benchmark on the GPU (:mod:`benchmarks.bench_serve`, when time
   is left): ``gpu_serve_c32_vs_fixed4`` and the rest of its rows, the
   server's budgeted batcher against a fixed batch of 4 with the model on
   CUDA (the budget: free GPU memory minus the margin, read before every
   batch).

The figures can then be merged into ``docs/benchmarks.md`` / ``.json``
(``--merge REPORT.json``), under a "GPU" section with the date and device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger("gpu-check")

ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
LABELS = [f"genre{i}" for i in range(10)]
FPS = 22050 / 512


# -- the report -------------------------------------------------------------------------------------------

class Report:
    """Figures and step outcomes, rewritten to JSON and Markdown after every change."""

    def __init__(self, out: Path, meta: dict[str, Any]) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.doc: dict[str, Any] = {**meta, "steps": {}, "figures": {}}
        self.write()

    def step(self, name: str, **fields: Any) -> None:
        self.doc["steps"][name] = fields
        self.write()

    def figure(self, key: str, title: str, value: float | None, unit: str, description: str, *,
               target: float | None = None, op: str | None = None, details: dict[str, Any] | None = None,
               note: str = "") -> None:
        met = None
        if value is not None and target is not None and op is not None:
            met = bool(value >= target) if op == ">=" else bool(value <= target)
        self.doc["figures"][key] = {"title": title, "value": value, "unit": unit, "description": description,
                                    "target": target, "op": op, "met": met, "details": details or {},
                                    "note": note}
        self.write()

    def write(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.doc, indent=2, default=str) + "\n")
        (self.out / "gpu_check.md").write_text(markdown(self.doc))


def _fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def markdown(doc: dict[str, Any]) -> str:
    """The report as a Markdown section (what ``--merge`` puts into docs/benchmarks.md)."""
    lines = [f"## GPU ({doc.get('device', 'no CUDA device')})", "",
             f"Measured {doc.get('date', '?')} by `make gpu-check` ({doc.get('mode', '')}); torch "
             f"{doc.get('torch', '?')}, CUDA {doc.get('cuda', '?')}. Ratios are measured side by side in one run.",
             "", "| figure | value | target | met |", "|---|---|---|---|"]
    for key, f in doc.get("figures", {}).items():
        target = "-" if f["target"] is None else f"{f['op']} {_fmt(f['target'])}"
        met = {True: "yes", False: "**NO**", None: "-"}[f["met"]]
        lines.append(f"| `{key}`: {f['title']} | {_fmt(f['value'])} {f['unit']} | {target} | {met} |")
    lines.append("")
    for key, f in doc.get("figures", {}).items():
        extra = f" {f['note']}" if f.get("note") else ""
        lines.append(f"- `{key}`: {f['description']}.{extra}")
    tests = doc.get("steps", {}).get("cuda-tests")
    if tests:
        lines += ["", f"CUDA tests: {tests.get('summary', '?')} (`pytest -m gpu`, {tests.get('seconds', '?')} s)."]
    failed = [name for name, st in doc.get("steps", {}).items() if st.get("status") == "failed"]
    if failed:
        lines += ["", f"Steps that failed: {', '.join(failed)} (see gpu_check.json)."]
    return "\n".join(lines) + "\n"


# -- steps -----------------------------------------------------------------------------------------------

def run_cuda_tests(report: Report, timeout: float) -> None:
    """``pytest -m gpu`` over the test modules that hold CUDA tests."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           "tests/test_gpu.py", "tests/test_data.py", f"--junitxml={report.out / 'gpu_tests.xml'}"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        summary = next((ln for ln in reversed(tail) if " passed" in ln or " failed" in ln or " skipped" in ln
                        or " error" in ln), tail[-1] if tail else "no output")
        (report.out / "gpu_tests.log").write_text(proc.stdout + proc.stderr)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        summary, status = f"timed out after {timeout:.0f} s", "failed"
    report.step("cuda-tests", status=status, summary=summary.strip("= "), seconds=round(time.perf_counter() - t0, 1))


def lognormal_lengths(n: int, seed: int = 0, median_s: float = 20.0, sigma: float = 0.9,
                      cap_s: float = 300.0) -> np.ndarray:
    """Clip lengths (frames) in arrival order: log-normal seconds, median ``median_s``, capped."""
    rng = np.random.default_rng(seed)
    seconds = np.minimum(np.exp(rng.normal(np.log(median_s), sigma, n)), cap_s)
    return np.maximum(8, np.round(seconds * FPS)).astype(np.int64)


def make_store(path: Path, lengths: np.ndarray, n_bins: int = 128, per_shard: int = 128) -> Path:
    """A raw store of synthetic dB-like float16 features (a spectral slope plus correlated noise)."""
    from store import FeatureSpec, IndexRow, create_store, write_shard

    spec = FeatureSpec.mel(n_bins=n_bins)
    w = create_store(path, {"mel": spec}, label_names=LABELS)
    rng = np.random.default_rng(1)
    slope = np.linspace(-20.0, -60.0, n_bins, dtype=np.float32)
    shards, rows = [], []
    for s0 in range(0, len(lengths), per_shard):
        chunk = lengths[s0:s0 + per_shard]
        feats = [(slope + rng.standard_normal((int(n), n_bins), dtype=np.float32) * 6.0).astype(np.float16)
                 for n in chunk]
        hashes = [f"gpu{s0 + k:07d}" for k in range(len(chunk))]
        shards.append(write_shard(path, {"mel": feats}, hashes, [int(n) / FPS for n in chunk]))
        rows += [IndexRow(f"c{s0 + k:07d}.flac", h, LABELS[(s0 + k) % len(LABELS)]) for k, h in enumerate(hashes)]
    w.commit(shards, rows)
    close = getattr(w, "close", None)
    if callable(close):
        close()
    return path


class EventTimer:
    """CUDA events around every forward of a model: GPU busy time vs the loop's wall time."""

    def __init__(self, model: Any, device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = device.type == "cuda"
        self.pairs: list[tuple[Any, Any]] = []
        self.cpu_spans: list[tuple[float, float]] = []
        self._handles = [model.register_forward_pre_hook(self._start), model.register_forward_hook(self._stop)]

    def _start(self, *_: Any) -> None:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pairs.append((ev, None))
        else:
            self.cpu_spans.append((time.perf_counter(), 0.0))

    def _stop(self, *_: Any) -> None:
        if self.cuda:
            ev = self.torch.cuda.Event(enable_timing=True)
            ev.record()
            self.pairs[-1] = (self.pairs[-1][0], ev)
        else:
            self.cpu_spans[-1] = (self.cpu_spans[-1][0], time.perf_counter())

    def idle_fraction(self) -> float:
        """1 - (time inside forwards) / (first forward's start to last forward's end)."""
        if self.cuda:
            self.torch.cuda.synchronize()
            done = [(a, b) for a, b in self.pairs if b is not None]
            if not done:
                return float("nan")
            busy = sum(a.elapsed_time(b) for a, b in done)
            wall = done[0][0].elapsed_time(done[-1][1])
        else:
            if not self.cpu_spans:
                return float("nan")
            busy = sum(b - a for a, b in self.cpu_spans)
            wall = self.cpu_spans[-1][1] - self.cpu_spans[0][0]
        return max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


def _fixed_batches(engine: Any, model: Any, store: Any, batch_size: int = 4) -> float:
    """Batches of ``batch_size`` in arrival order through the same loader and autocast; returns seconds."""
    import torch

    from infer.data import PadCollate, StoreDataset, prefetch

    ds = StoreDataset(store, "mel")
    batches = [list(range(i, min(i + batch_size, len(ds)))) for i in range(0, len(ds), batch_size)]
    _sync(engine)
    t0 = time.perf_counter()
    with torch.inference_mode(), engine.amp():
        for batch in prefetch(ds, batches, PadCollate(model.time_stride), pin=engine.device.type == "cuda"):
            b = batch.to(engine.device, non_blocking=True)
            x = b.x.contiguous(memory_format=torch.channels_last) if engine.channels_last else b.x
            torch.softmax(model(x, b.lengths).float(), dim=1).cpu()
    _sync(engine)
    return time.perf_counter() - t0


def _sync(engine: Any) -> None:
    import torch

    if engine.device.type == "cuda":
        torch.cuda.synchronize()


def run_figures(report: Report, work: Path, *, device: str, clips: int, repeats: int, budget_mb: float,
                deadline: float) -> None:
    import torch

    from infer.defaults import PLAIN_MODEL
    from infer.models import ModelConfig, build_model
    from infer.runtime import Engine, RunOptions
    from store import open_store

    t0 = time.perf_counter()
    lengths = lognormal_lengths(clips)
    store = open_store(make_store(work / "gpu.zarr", lengths))
    report.step("store", status="ok", clips=clips, hours=round(float(lengths.sum()) / FPS / 3600, 2),
                seconds=round(time.perf_counter() - t0, 1))
    torch.manual_seed(0)
    net = build_model(ModelConfig(**PLAIN_MODEL, n_bins=128, n_classes=len(LABELS))).eval()
    rows = np.arange(len(store))

    # 1. throughput: the engine's loop (defaults) vs batches of 4, same autocast and loader
    engine = Engine(RunOptions(device=device, progress=False))
    model = engine.prepare(net)
    budget = engine.budget(model, 128)
    engine.logits(model, store, rows[: min(64, len(rows))], budget=budget)  # warm-up: kernels, cuDNN choice
    _fixed_batches(engine, model, open_store(store.location))
    ours, fixed, ooms = [], [], 0
    for r in range(repeats):
        for name in (("ours", "fixed") if r % 2 == 0 else ("fixed", "ours")):
            if name == "ours":
                _sync(engine)
                t = time.perf_counter()
                res = engine.logits(model, store, rows, budget=budget)
                _sync(engine)
                ours.append(time.perf_counter() - t)
                ooms += res.oom_retries
            else:
                fixed.append(_fixed_batches(engine, model, store))
        if time.perf_counter() > deadline:
            break
    ratio = float(np.median([f / o for f, o in zip(fixed, ours, strict=False)]))
    report.figure("gpu_infer_vs_fixed4", "prediction throughput: ours vs a fixed batch of 4", round(ratio, 3), "x",
                  f"clips/s of Engine.logits (length-binned batches under the budget, max_batch "
                  f"{engine.options.max_batch}) / clips/s of batches of 4 in arrival order; same model, "
                  f"autocast {engine.autocast}, loader thread; {len(lengths)} clips, log-normal lengths",
                  target=2.0, op=">=", details={"ours_s": ours, "fixed4_s": fixed})
    report.figure("gpu_oom_retries", "out-of-memory splits in the normal runs", float(ooms), "count",
                  "batches split after a CUDA out-of-memory error while measuring throughput", target=0.0, op="<=")

    # 2. memory: peak allocated vs a budget the planner can fill (many clips per batch allowed)
    big = Engine(RunOptions(device=device, progress=False, max_batch=4096, budget_mb=budget_mb))
    model_big = big.prepare(net)
    b_big = big.budget(model_big, 128)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    timer = EventTimer(model_big, big.device)
    t = time.perf_counter()
    res_big = big.logits(model_big, store, rows, budget=b_big)
    _sync(big)
    big_s = time.perf_counter() - t
    idle_big = timer.idle_fraction()
    timer.remove()
    peak = (torch.cuda.max_memory_allocated() - base) if device == "cuda" else res_big.peak_bytes
    report.figure("gpu_peak_vs_budget", "peak allocated memory / planned budget", round(peak / b_big.budget_bytes, 4),
                  "fraction", f"torch.cuda.max_memory_allocated during prediction above what was allocated before, "
                  f"over the planned budget of {b_big.budget_bytes / MIB:.0f} MiB (BUDGET_MB={budget_mb:.0f}, "
                  f"max_batch 4096 so the budget, not the batch size, binds); must stay <= 1 and use >= 0.7",
                  target=1.0, op="<=", details={"peak_mib": round(peak / MIB, 1), "batches": res_big.batches,
                                                "efficiency": round(res_big.efficiency, 4), "seconds": round(big_s, 2)})
    report.figure(
        "gpu_budget_used",
        "peak allocated memory / planned budget (use)",
        round(peak / b_big.budget_bytes, 4),
        "fraction",
        "the same ratio against the lower target: a budget that is never used is a wasted GPU",
        target=0.7,
        op=">=",
    )

    # 3. the loader keeps the GPU busy: idle share between forwards, thread vs DataLoader workers
    idle = {"thread, budget-bound batches": idle_big}
    for workers in (4, 8):
        if time.perf_counter() > deadline:
            break
        eng = Engine(
            RunOptions(device=device, progress=False, max_batch=4096, budget_mb=budget_mb, loader_workers=workers)
        )
        m = eng.prepare(net)
        tm = EventTimer(m, eng.device)
        eng.logits(m, store, rows, budget=b_big)
        idle[f"{workers} DataLoader workers"] = tm.idle_fraction()
        tm.remove()
    best = min(idle, key=lambda k: idle[k])
    report.figure(
        "gpu_idle_fraction",
        "GPU idle time between batches / loop time",
        round(idle[best], 4),
        "fraction",
        f"1 - (sum of CUDA-event times of every forward) / (first forward's start to last forward's end), "
        f"best loader: {best}",
        target=0.1,
        op="<=",
        details={k: round(v, 4) for k, v in idle.items()},
    )

    # 4. forced out-of-memory: squeezed allocator, same probabilities, batches split
    if device == "cuda" and time.perf_counter() < deadline:
        sub = rows[: min(256, len(rows))]
        ref = big.logits(model_big, store, sub, budget=b_big).logits
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(0).total_memory
        allowed = torch.cuda.memory_allocated() + b_big.budget_bytes // 8
        torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total))
        try:
            squeezed = big.logits(model_big, store, sub, budget=b_big)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
            torch.cuda.empty_cache()
        same = bool(np.allclose(squeezed.logits, ref, atol=5e-2)) and squeezed.oom_retries > 0
        report.figure(
            "gpu_forced_oom_recovered",
            "forced out-of-memory: split, retried, nothing lost",
            1.0 if same else 0.0,
            "yes=1",
            "prediction with the allocator capped at an eighth of the planned budget: batches must split "
            "and every clip keep its logits (bf16 tolerance 5e-2)",
            target=1.0,
            op=">=",
            details={
                "oom_retries": squeezed.oom_retries,
                "max_abs_logit_diff": float(np.abs(squeezed.logits - ref).max()),
            },
        )

    # 5. training memory with and without gradient checkpointing (information)
    if time.perf_counter() < deadline:
        report.figure(*_train_ckpt_figure(device))


def _train_ckpt_figure(device: str) -> tuple[Any, ...]:
    import torch
    import torch.nn.functional as F

    from infer.defaults import PLAIN_MODEL
    from infer.models import ModelConfig, build_model

    peaks = {}
    frames = 2048 if device == "cuda" else 64
    for flag in (False, True):
        torch.manual_seed(0)
        model = build_model(ModelConfig(**PLAIN_MODEL,
                                        arch="resnet", n_bins=128, n_classes=10, dropout=0.0)).to(device).train()
        model.grad_checkpoint = flag
        x = torch.randn(8, 1, 128, frames, device=device) * 20 - 40
        lengths = torch.full((8,), frames, device=device)
        if device == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        F.cross_entropy(model(x, lengths), torch.arange(8, device=device) % 10).backward()
        peaks[flag] = (torch.cuda.max_memory_allocated() - base) if device == "cuda" else 1
    return (
        "gpu_train_ckpt_memory",
        "training peak memory: gradient checkpointing / without",
        round(peaks[True] / peaks[False], 3),
        "fraction",
        "one training step of the ResNet on 8 x 2048 frames, torch.cuda.max_memory_allocated",
    )


# -- merging into the docs --------------------------------------------------------------------------------


def run_serve(report: Report, work: Path, *, device: str, dry_run: bool, deadline: float) -> None:
    """The serving benchmark with the model on ``device``; skipped (and said so) when too little time is left."""
    left = deadline - time.perf_counter()
    if left < 150 and not dry_run:
        report.step("serve", status="skipped", reason=f"{left:.0f} s left of the time limit")
        return
    from . import bench_serve

    sizes: dict[str, Any] = (
        dict(n_files=4, clients=(2, 4), repeats=1, seconds=(2.0, 6.0), workers=1, ramp_s=0.2,
             model=dict(width=8, depth=2))
        if dry_run else
        dict(n_files=32, clients=(8, 32), repeats=1, seconds=(15.0, 240.0), workers=8, ramp_s=4.0, model={}))
    t = time.perf_counter()
    group = bench_serve.run(work / "serve", max_delay_ms=50.0, device=device, **sizes)
    for f in group.figures:
        report.figure(f"gpu_{f.key}", f"GPU: {f.title}", f.value, f.unit, f.description,
                      target=f.target, op=f.op, details=f.details, note=f.note)
    report.step("serve", status="ok", seconds=round(time.perf_counter() - t, 1), profile=group.profile)


def merge(report_json: Path, docs: Path) -> None:
    """Put a report's figures into docs/benchmarks.json (``gpu`` key) and docs/benchmarks.md (a GPU section)."""
    doc = json.loads(report_json.read_text())
    bench_json = docs / "benchmarks.json"
    bench = json.loads(bench_json.read_text()) if bench_json.exists() else {}
    bench["gpu"] = doc
    bench_json.write_text(json.dumps(bench, indent=2, default=str) + "\n")
    md = docs / "benchmarks.md"
    text = md.read_text() if md.exists() else "# Benchmarks\n"
    start = text.find("\n## GPU (")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + ("" if end < 0 else text[end:])
    md.write_text(text.rstrip("\n") + "\n\n" + markdown(doc))


# -- the command -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "gpu-check", help="report folder")
    p.add_argument("--clips", type=int, default=2000, help="clips in the synthetic store (default 2000)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the throughput figure")
    p.add_argument(
        "--budget-mb",
        type=float,
        default=8192.0,
        help="the budget of the memory figure, MiB (default 8192: one the planner can fill)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=420.0,
        help="seconds after which optional steps are skipped (default 420: leaves room in 8 minutes)",
    )
    p.add_argument("--skip-tests", action="store_true", help="only the figures")
    p.add_argument("--dry-run", action="store_true", help="no CUDA needed: every step on the CPU at toy sizes")
    p.add_argument(
        "--merge",
        type=Path,
        default=None,
        metavar="REPORT_JSON",
        help="merge a report's figures into docs/benchmarks.md/json and exit",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.merge is not None:
        merge(args.merge, ROOT / "docs")
        print(f"merged {args.merge} into docs/benchmarks.md and docs/benchmarks.json")
        return 0
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing to check")
        return 0
    device = "cuda" if cuda and not args.dry_run else "cpu"
    start = time.perf_counter()
    deadline = start + args.time_limit
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.processor() or 'cpu'})",
        "mode": "dry run on the CPU, toy sizes: values mean nothing" if args.dry_run else "full",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    report = Report(args.out, meta)
    steps: list[tuple[str, Callable[[], None]]] = []
    if not args.skip_tests:
        steps.append(("cuda-tests", lambda: run_cuda_tests(report, timeout=max(60.0, args.time_limit * 0.45))))
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    clips = min(args.clips, 40) if args.dry_run else args.clips
    budget_mb = 64.0 if args.dry_run else args.budget_mb
    steps.append(
        (
            "figures",
            lambda: run_figures(
                report,
                work,
                device=device,
                clips=clips,
                repeats=1 if args.dry_run else args.repeats,
                budget_mb=budget_mb,
                deadline=deadline,
            ),
        )
    )
    steps.append(("serve", lambda: run_serve(report, work, device=device, dry_run=args.dry_run, deadline=deadline)))
    failed = False
    try:
        for name, step in steps:
            t = time.perf_counter()
            try:
                step()
            except Exception as e:  # record it and go on: a partial report is still a report
                failed = True
                log.exception("step %s failed", name)
                report.step(
                    name + "-error",
                    status="failed",
                    error=f"{type(e).__name__}: {e}"[:500],
                    seconds=round(time.perf_counter() - t, 1),
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.step("done", status="failed" if failed else "ok", seconds=round(time.perf_counter() - start, 1))
    for key, f in report.doc["figures"].items():
        met = {True: "met", False: "MISSED", None: "info"}[f["met"]]
        print(f"{key:28s} {_fmt(f['value']):>10s} {f['unit']:8s} {met}")
    print(f"report: {args.out / 'gpu_check.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
