"""The GPU figures of gpu-check (throughput vs a fixed batch of 4, peak memory vs the budget, idle time between
batches, a forced out-of-memory, training memory with gradient checkpointing) on a synthetic store made on the
machine (see gpu_check)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from .gpu_check_report import Report

__all__ = ["EventTimer", "LABELS", "lognormal_lengths", "make_store", "run_figures"]

MIB = 1 << 20
LABELS = [f"genre{i}" for i in range(10)]
FPS = 22050 / 512
FEWEST_BATCHES = float("inf")
"""The planner's price of a batch for the memory figures: the fewest batches, so the budget binds."""


def lognormal_lengths(n: int, seed: int = 0, median_s: float = 20.0, sigma: float = 0.9,
                      cap_s: float = 300.0) -> np.ndarray:
    """Clip lengths (frames) in arrival order: log-normal seconds, median ``median_s``, capped."""
    rng = np.random.default_rng(seed)
    seconds = np.minimum(np.exp(rng.normal(np.log(median_s), sigma, n)), cap_s)
    return np.maximum(8, np.round(seconds * FPS)).astype(np.int64)


def make_store(path: Path, lengths: np.ndarray, n_bins: int = 128, per_shard: int = 128) -> Path:
    """A raw store of synthetic dB-like float16 features (a spectral slope plus correlated noise)."""
    from specstore.store import FeatureSpec, IndexRow, create_store, write_shard

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

    from specstore.infer.data import PadCollate, StoreDataset, prefetch

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
    """Every GPU figure on a fresh synthetic store of ``clips`` clips; the optional ones are skipped once
    ``deadline`` (time.perf_counter seconds) has passed."""
    import torch

    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.options.defaults import PLAIN_MODEL
    from specstore.store import open_store

    t0 = time.perf_counter()
    lengths = lognormal_lengths(clips)
    store = open_store(make_store(work / "gpu.zarr", lengths))
    report.step("store", status="ok", clips=clips, hours=round(float(lengths.sum()) / FPS / 3600, 2),
                seconds=round(time.perf_counter() - t0, 1))
    torch.manual_seed(0)
    net = build_model(ModelConfig(**PLAIN_MODEL, n_bins=128, n_classes=len(LABELS))).eval()
    rows = np.arange(len(store))

    _throughput_figures(report, net, store, rows, lengths, device=device, repeats=repeats, deadline=deadline)
    big, model_big, b_big, idle_big = _memory_figures(report, net, store, rows, device=device, budget_mb=budget_mb)
    _idle_figure(report, net, store, rows, idle_big, b_big, device=device, budget_mb=budget_mb, deadline=deadline)

    # 4. forced out-of-memory: squeezed allocator, same probabilities, batches split
    if device == "cuda" and time.perf_counter() < deadline:
        _forced_oom_figure(report, big, model_big, b_big, store, rows)

    # 5. training memory with and without gradient checkpointing (information)
    if time.perf_counter() < deadline:
        report.figure(*_train_ckpt_figure(device))


def _train_ckpt_figure(device: str) -> tuple[Any, ...]:
    import torch
    import torch.nn.functional as F

    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.options.defaults import PLAIN_MODEL

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


def _throughput_figures(report: Report, net: Any, store: Any, rows: np.ndarray, lengths: np.ndarray, *, device: str,
                        repeats: int, deadline: float) -> None:
    """``gpu_infer_vs_fixed4`` and ``gpu_oom_retries``: the engine's loop with its defaults vs batches of 4."""
    from specstore.infer.engine.runtime import Engine, RunOptions
    from specstore.store import open_store

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


def _memory_figures(report: Report, net: Any, store: Any, rows: np.ndarray, *, device: str,
                    budget_mb: float) -> tuple[Any, Any, Any, float]:
    """``gpu_peak_vs_budget`` and ``gpu_budget_used`` under a budget of ``budget_mb`` MiB the planner can fill;
    returns that engine, its model, its budget and the idle fraction of its run."""
    import torch

    from specstore.infer.engine.runtime import Engine, RunOptions

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
    res_big = big.logits(model_big, store, rows, budget=b_big, batch_overhead_frames=FEWEST_BATCHES)
    _sync(big)
    big_s = time.perf_counter() - t
    idle_big = timer.idle_fraction()
    timer.remove()
    peak = (torch.cuda.max_memory_allocated() - base) if device == "cuda" else res_big.peak_bytes
    report.figure("gpu_peak_vs_budget", "peak allocated memory / planned budget", round(peak / b_big.budget_bytes, 4),
                  "fraction", f"torch.cuda.max_memory_allocated during prediction above what was allocated before, "
                  f"over the planned budget of {b_big.budget_bytes / MIB:.0f} MiB (BUDGET_MB={budget_mb:.0f}, "
                  f"max_batch 4096 and the planner's fewest-batches rule, so the budget, not the batch size "
                  f"or the padding trade-off, binds); must stay <= 1 and use >= 0.7",
                  target=1.0, op="<=", details={"peak_mib": round(peak / MIB, 1), "batches": res_big.batches,
                                                "cost_per_frame": b_big.cost_per_frame,
                                                "fixed_overhead": b_big.fixed_overhead,
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
    return big, model_big, b_big, idle_big


def _idle_figure(report: Report, net: Any, store: Any, rows: np.ndarray, idle_big: float, b_big: Any, *,
                 device: str, budget_mb: float, deadline: float) -> None:
    """``gpu_idle_fraction``: the idle share between forwards, reader thread vs 4 and 8 DataLoader workers."""
    from specstore.infer.engine.runtime import Engine, RunOptions

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
        eng.logits(m, store, rows, budget=b_big, batch_overhead_frames=FEWEST_BATCHES)
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


def _forced_oom_figure(report: Report, big: Any, model_big: Any, b_big: Any, store: Any, rows: np.ndarray) -> None:
    """``gpu_forced_oom_recovered``: the allocator capped at a quarter of the peak the 256 shortest clips reach
    uncapped; batches split, logits kept."""
    import torch

    # the shortest clips: one batch uncapped, and any one of them still fits under the cap
    sub = np.sort(rows[np.argsort(store.lengths[rows], kind="stable")[: min(256, len(rows))]])
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    ref = big.logits(model_big, store, sub, budget=b_big, batch_overhead_frames=FEWEST_BATCHES).logits
    peak = torch.cuda.max_memory_allocated() - base
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    allowed = torch.cuda.memory_allocated() + peak // 4
    torch.cuda.set_per_process_memory_fraction(min(1.0, allowed / total))
    try:
        squeezed = big.logits(model_big, store, sub, budget=b_big, batch_overhead_frames=FEWEST_BATCHES)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    same = bool(np.allclose(squeezed.logits, ref, atol=5e-2)) and squeezed.oom_retries > 0
    report.figure(
        "gpu_forced_oom_recovered",
        "forced out-of-memory: split, retried, nothing lost",
        1.0 if same else 0.0,
        "yes=1",
        "prediction of the 256 shortest clips with the allocator capped at a quarter of their uncapped peak: "
        "batches must split "
        "and every clip keep its logits (bf16 tolerance 5e-2)",
        target=1.0,
        op=">=",
        details={
            "oom_retries": squeezed.oom_retries,
            "max_abs_logit_diff": float(np.abs(squeezed.logits - ref).max()),
            "uncapped_peak_mib": round(peak / MIB, 1),
        },
    )
