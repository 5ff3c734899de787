"""Library figures: specstore's data pieces in the user's own PyTorch loop, side by side with the alternatives.

1. **Training throughput** (``library_train_vs_plain``): one epoch of the same model, whole
   clips, through ``StoreDataset`` + ``BudgetBatchSampler(shuffle=True)`` + ``PadCollate`` in a
   ``DataLoader``, against a plain ``DataLoader(dataset, shuffle=True, batch_size=B,
   collate_fn=pad to longest)``.  Both stay within one memory budget: ``B`` is 16, or the
   largest batch size whose worst batch (B clips padded to the longest clip) fits the budget
   when 16 does not (the figure's details say which).
2. **Sampler padding efficiency vs lhotse** (``library_sampler_vs_lhotse``): our
   ``BudgetBatchSampler(shuffle=True)`` against lhotse's own ``DynamicBucketingSampler`` (10
   buckets, shuffled) over dummy cuts of the same lengths, its ``max_duration`` the same
   budget in seconds of padded audio; plus the batches over the budget (ours must be 0).
3. **Anonymous memory of DataLoader workers** (``library_workers_anon_per_store_byte``):
   RssAnon/Pss_Anon of the main process and its workers (psutil), iterating a store with 4
   workers and with none, on a small and a large store, each in a fresh interpreter.
4. **Reader thread vs DataLoader workers** (``library_prefetch_vs_workers1/2``): the same
   inference pass fed by :func:`infer.data.prefetch` (the built-in commands' loader) and by a
   ``DataLoader`` with 1 and 2 worker processes (information: it backs the default).

The memory probe runs in a fresh interpreter:

    python -m benchmarks.bench_library anon-probe STORE WORKERS BUDGET_MB EPOCHS

Its last stdout line is a JSON object.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .bench_common import ROOT, CpuWindow, Figure, GroupResult, log, median, rotated
from .bench_plan import ALIGN, BUDGET, COST, FPS, MAX_BATCH, lengths_for, quantile_lengths

N_BINS = 128
N_CLASSES = 10
#: Median clip length (s) of bench_plan's log-normal distribution (sigma 0.9).
PLAN_MEDIAN_S = 60.0


# ---------------------------------------------------------------- helpers


def _lognormal_frames(n: int, median_s: float, seed: int) -> np.ndarray:
    """bench_plan's stratified log-normal lengths (sigma 0.9), rescaled to a median of ``median_s`` seconds."""
    base = quantile_lengths("lognormal", n, seed=seed)
    return np.maximum(1, np.round(base * (median_s / PLAN_MEDIAN_S))).astype(np.int64)


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _computed(lengths: np.ndarray, batches: list[list[int]], align: int) -> int:
    """Frames computed for ``batches``: batch size x longest clip rounded up to ``align``."""
    from infer.budget import align_frames

    return int(sum(len(b) * align_frames(int(lengths[b].max()), align) for b in batches))


# ---------------------------------------------------------------- 1. training throughput


def _train_epoch(net: Any, loader: Any, budget: Any) -> dict[str, Any]:
    """One training epoch (forward, backward, AdamW step) of ``net`` over ``loader``."""
    import torch
    import torch.nn.functional as F

    net.train()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    real = computed = batches = over = 0
    worst = 0.0
    for batch in loader:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(net(batch.x, batch.lengths), batch.labels).backward()
        opt.step()
        n, t = len(batch), batch.n_frames
        real += int(batch.lengths.sum())
        computed += n * t
        batches += 1
        over += int(not budget.fits(n, t))
        worst = max(worst, float(budget.bytes(n, t)) / budget.budget_bytes)
    return {"real": real, "computed": computed, "batches": batches, "over": over, "worst": worst}


def train_throughput(work: Path, *, n_clips: int, median_s: float, budget_mb: float, repeats: int,
                     model: dict[str, Any], seed: int = 7) -> list[Figure]:
    import torch
    from torch.utils.data import DataLoader

    from infer.budget import Budget
    from infer.contract import time_stride
    from infer.cost import measure_cost_per_frame
    from infer.data import BudgetBatchSampler, PadCollate, StoreDataset
    from infer.defaults import PLAIN_MODEL
    from infer.models import ModelConfig, build_model

    from .bench_infer import make_store

    torch.set_num_threads(_cores())
    lengths = _lognormal_frames(n_clips, median_s, seed)
    store = make_store(work / "train.zarr", lengths)
    torch.manual_seed(0)
    net0 = build_model(ModelConfig(n_bins=N_BINS, n_classes=N_CLASSES, **{**PLAIN_MODEL, **model})).train()
    stride = time_stride(net0)
    cost = measure_cost_per_frame(copy.deepcopy(net0), N_BINS, training=True)
    budget = Budget.for_cost(int(budget_mb * 2**20), cost, max_batch=MAX_BATCH, frame_align=stride)
    ds = StoreDataset(str(store), "mel")  # whole clips
    longest = int(budget.align(int(ds.lengths.max())))
    if not budget.fits(1, longest):
        raise RuntimeError(f"the longest clip ({longest} frames) does not fit the budget alone; raise budget_mb")
    plain_bs = max(b for b in range(1, MAX_BATCH + 1) if budget.fits(b, longest))
    sampler = BudgetBatchSampler(ds, budget, shuffle=True, seed=0)
    collate = PadCollate(stride)

    def ours(epoch: int) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            sampler.set_epoch(epoch)
            return _train_epoch(copy.deepcopy(net0), DataLoader(ds, batch_sampler=sampler, collate_fn=collate),
                                budget)
        return go

    def plain(epoch: int) -> Callable[[], dict[str, Any]]:
        def go() -> dict[str, Any]:
            loader = DataLoader(ds, batch_size=plain_bs, shuffle=True, collate_fn=collate,
                                generator=torch.Generator().manual_seed(1000 + epoch))
            return _train_epoch(copy.deepcopy(net0), loader, budget)
        return go

    # warm-up (oneDNN primitives, allocator): one small batch, untimed
    warm = copy.deepcopy(net0)
    x = torch.zeros(2, 1, N_BINS, 4 * stride)
    logits = warm(x, torch.full((2,), 4 * stride))
    torch.nn.functional.cross_entropy(logits, torch.zeros(2, dtype=torch.long)).backward()
    times: dict[str, list[float]] = {"ours": [], "plain": []}
    foreign: dict[str, list[float]] = {"ours": [], "plain": []}
    stats: dict[str, list[dict[str, Any]]] = {"ours": [], "plain": []}
    cpu: dict[str, list[float]] = {"ours": [], "plain": []}
    for r in range(repeats):
        variants = {"ours": ours(r), "plain": plain(r)}
        for name in rotated(list(variants), r):
            with CpuWindow() as w:
                st = variants[name]()
            times[name].append(w.wall)
            foreign[name].append(w.foreign_cores)
            cpu[name].append(w.own_cores * w.wall)
            stats[name].append(st)
        log.info("training repeat %d/%d: ours %.1f clips/s, plain (batch %d) %.1f clips/s", r + 1, repeats,
                 n_clips / times["ours"][-1], plain_bs, n_clips / times["plain"][-1])
    ratio = median([p / o for p, o in zip(times["plain"], times["ours"], strict=True)])
    eff = {k: round(sum(s["real"] for s in v) / sum(s["computed"] for s in v), 4) for k, v in stats.items()}
    sixteen = budget.bytes(MAX_BATCH, longest) / budget.budget_bytes
    details = {
        "clips": n_clips, "audio_seconds": round(float(lengths.sum() / FPS), 1),
        "median_s": median_s, "longest_s": round(float(lengths.max() / FPS), 1), "repeats": repeats,
        "budget_mib": budget_mb, "train_cost_kib_per_frame": round(cost.bytes_per_frame / 1024, 1),
        "plain_batch_size": plain_bs, "batch16_worst_vs_budget": round(float(sixteen), 2),
        "clips_per_s": {k: round(n_clips / median(v), 2) for k, v in times.items()},
        "times_s": {k: [round(x, 2) for x in v] for k, v in times.items()},
        "foreign_cores": {k: round(median(v), 2) for k, v in foreign.items()},
        "cpu_seconds": {k: [round(x, 2) for x in v] for k, v in cpu.items()},
        "ratio_of_cpu_seconds (less sensitive to other load)": round(
            median([p / o for p, o in zip(cpu["plain"], cpu["ours"], strict=True)]), 3),
        "padding_efficiency": eff, "ideal_ratio (efficiency ratio)": round(eff["ours"] / eff["plain"], 3),
        "batches_per_epoch": {k: v[0]["batches"] for k, v in stats.items()},
        "worst_batch_vs_budget": {k: round(max(s["worst"] for s in v), 3) for k, v in stats.items()},
        "batches_over_budget": {k: sum(s["over"] for s in v) for k, v in stats.items()},
        "model": dict(model) or "default CNN (width 32, depth 4)",
    }
    batch16 = (f"batch_size=16 would need {sixteen:.1f}x the budget for the batch holding the longest clip, so the "
               f"plain loader uses batch_size={plain_bs}, the largest whose worst batch fits"
               if plain_bs < MAX_BATCH else "batch_size=16 fits the budget")
    shutil.rmtree(store, ignore_errors=True)
    return [Figure(
        "library_train_vs_plain", "Training throughput: our DataLoader path vs a plain shuffled DataLoader",
        round(ratio, 3), "x",
        f"clips/s of one training epoch (forward, backward, AdamW; float32, CPU) through StoreDataset + "
        f"BudgetBatchSampler(shuffle=True) + PadCollate / through DataLoader(shuffle=True, batch_size=B, pad to "
        f"longest), same model, same whole clips (log-normal, median {median_s:g} s, sigma 0.9), same "
        f"{budget_mb:g} MiB budget: {batch16}",
        target=1.5, op=">=", details=details)]


# ---------------------------------------------------------------- 2. sampler vs lhotse


def _lhotse_batches(lengths: np.ndarray, max_duration: float, epochs: int, seed: int) -> list[list[list[int]]]:
    """lhotse's DynamicBucketingSampler (10 buckets, shuffled, at most MAX_BATCH cuts) over dummy cuts."""
    from lhotse import CutSet, MonoCut
    from lhotse.dataset import DynamicBucketingSampler

    shift = 1.0 / FPS
    cuts = CutSet.from_cuts(MonoCut(id=str(i), start=0.0, duration=float(n) * shift, channel=0)
                            for i, n in enumerate(lengths.tolist()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "eagerly read CutSet": irrelevant here
        sampler = DynamicBucketingSampler(cuts, max_duration=max_duration, max_cuts=MAX_BATCH, num_buckets=10,
                                          shuffle=True, seed=seed)
        out = []
        for e in range(epochs):
            sampler.set_epoch(e)
            out.append([[int(c.id) for c in batch] for batch in sampler])
    return out


def sampler_vs_lhotse(*, n_clips: int, epochs: int, seed: int = 1000) -> list[Figure]:
    from infer.budget import Budget
    from infer.data import BudgetBatchSampler

    budget = Budget(BUDGET, COST, max_batch=MAX_BATCH, frame_align=ALIGN)
    drawn = lengths_for("lognormal", n_clips, seed=seed)
    lengths = drawn[budget.align(drawn) <= budget.max_window]  # clips too long for any batch are windowed apart
    n_clips = len(lengths)
    ours = BudgetBatchSampler(lengths, budget, shuffle=True, seed=0)
    ours_eff, ours_over, ours_batches = [], 0, 0
    for e in range(epochs):
        ours.set_epoch(e)
        batches = list(ours)
        ours_eff.append(float(lengths.sum()) / _computed(lengths, batches, ALIGN))
        ours_over += sum(int(not budget.fits(len(b), budget.align(int(lengths[b].max())))) for b in batches)
        ours_batches += len(batches)
    max_duration = (budget.budget_bytes - budget.fixed_overhead) // budget.cost_per_frame / FPS
    common = {"clips": n_clips, "left out (too long for a batch of one)": len(drawn) - n_clips,
              "epochs": epochs, "budget_mib": BUDGET >> 20,
              "cost_kib_per_frame": round(COST / 1024, 1), "max_batch": MAX_BATCH, "frame_align": ALIGN,
              "lhotse_max_duration_s": round(max_duration, 1), "ours_efficiency": round(median(ours_eff), 4),
              "ours_batches_per_epoch": ours_batches // epochs}
    try:
        import lhotse
    except ImportError:
        lhotse = None
    figures = []
    if lhotse is None:
        reason = "not measured: lhotse is not installed (pip install lhotse)"
        figures += [Figure("library_sampler_vs_lhotse", "Padding efficiency: BudgetBatchSampler vs lhotse", None,
                           "x", reason, note=reason, details=common),
                    Figure("library_lhotse_over_budget", "lhotse DynamicBucketingSampler: batches over the budget",
                           None, "fraction", reason, note=reason)]
    else:
        lh = _lhotse_batches(lengths, max_duration, epochs, seed)
        lh_eff = [float(sum(int(lengths[b].sum()) for b in bs)) / _computed(lengths, bs, ALIGN) for bs in lh]
        lh_over = [int(not budget.fits(len(b), budget.align(int(lengths[b].max())))) for bs in lh for b in bs]
        worst = max(float(budget.bytes(len(b), budget.align(int(lengths[b].max())))) / budget.budget_bytes
                    for bs in lh for b in bs)
        seen = sorted(i for b in lh[0] for i in b)
        details = {**common, "lhotse_version": lhotse.__version__, "lhotse_efficiency": round(median(lh_eff), 4),
                   "lhotse_batches_per_epoch": len(lh[0]), "lhotse_worst_batch_vs_budget": round(worst, 3),
                   "lhotse_clips_per_epoch": len(seen)}
        figures += [
            Figure("library_sampler_vs_lhotse", "Padding efficiency: BudgetBatchSampler(shuffle) vs lhotse's sampler",
                   round(median(ours_eff) / median(lh_eff), 4), "x",
                   f"real / computed frames of BudgetBatchSampler(shuffle=True) batches / the same for lhotse "
                   f"{lhotse.__version__} DynamicBucketingSampler(num_buckets=10, shuffle=True, max_cuts="
                   f"{MAX_BATCH}, max_duration={max_duration:.0f} s = the budget in seconds of padded audio), on "
                   f"the same {n_clips} log-normal lengths (median 60 s, sigma 0.9), medians over {epochs} epochs",
                   target=1.05, op=">=", details=details),
            Figure("library_lhotse_over_budget", "lhotse DynamicBucketingSampler: share of batches over the budget",
                   round(float(np.mean(lh_over)), 4), "fraction",
                   "batches whose size x longest clip (rounded to the model's stride) exceed the memory budget, "
                   f"all epochs; the worst is {worst:.2f}x the budget", details={"over": int(sum(lh_over))}),
        ]
    figures.append(Figure(
        "library_sampler_over_budget", "BudgetBatchSampler(shuffle): batches over the budget", float(ours_over),
        "count", f"batches of BudgetBatchSampler(shuffle=True) over the budget, {epochs} epochs of {n_clips} clips",
        target=0.0, op="<=", details={"batches": ours_batches}))
    return figures


# ---------------------------------------------------------------- 3. anonymous memory of workers


def _smaps_kib(pid: int) -> dict[str, int]:
    """RssAnon (status) and Pss_Anon (smaps_rollup) of ``pid`` in KiB; {} if it is gone."""
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    out["rss_anon"] = int(line.split()[1])
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss_Anon:"):
                    out["pss_anon"] = int(line.split()[1])
    except OSError:
        return {}
    return out


class _TreeSampler(threading.Thread):
    """Samples RssAnon and Pss_Anon of this process and its children (psutil) every ``period`` s."""

    def __init__(self, period: float = 0.01) -> None:
        super().__init__(daemon=True)
        import psutil

        self.me = psutil.Process()
        self.period = period
        self.peak = {"rss_anon": 0, "pss_anon": 0}
        self.first: dict[int, dict[str, int]] = {}
        self.worker_peak: dict[int, dict[str, int]] = {}
        self.samples = 0
        self._stop_event = threading.Event()

    def sample(self) -> dict[str, int]:
        import psutil

        total = {"rss_anon": 0, "pss_anon": 0}
        pids = [self.me.pid]
        try:
            pids += [c.pid for c in self.me.children(recursive=True)]
        except psutil.Error:
            pass
        for pid in pids:
            got = _smaps_kib(pid)
            if not got:
                continue
            for k in total:
                total[k] += got.get(k, got.get("rss_anon", 0))
            if pid != self.me.pid:
                self.first.setdefault(pid, dict(got))
                peak = self.worker_peak.setdefault(pid, dict(got))
                for k, v in got.items():
                    peak[k] = max(peak.get(k, 0), v)
        for k in total:
            self.peak[k] = max(self.peak[k], total[k])
        self.samples += 1
        return total

    def run(self) -> None:
        while not self._stop_event.is_set():
            self.sample()
            time.sleep(self.period)

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
        self.sample()


def anon_probe(store: str, workers: int, budget_mb: float, epochs: int = 1) -> dict[str, Any]:
    """``epochs`` epochs of StoreDataset + BudgetBatchSampler + PadCollate over ``store`` with ``workers`` workers.

    The workers persist across epochs.  Returns the anonymous memory (KiB) of this process and
    its workers before and at peak.
    """
    import torch
    from torch.utils.data import DataLoader

    from infer.budget import CostModel
    from infer.data import BudgetBatchSampler, PadCollate, StoreDataset

    torch.set_num_threads(1)
    ds = StoreDataset(store, "mel")
    sampler = BudgetBatchSampler(ds, budget_mb=budget_mb, cost=CostModel(COST, 0), frame_align=ALIGN,
                                 shuffle=True, seed=0)
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=PadCollate(ALIGN), num_workers=workers,
                        persistent_workers=workers > 0)
    watch = _TreeSampler()
    base = watch.sample()
    watch.peak = dict(base)
    watch.start()
    t0 = time.perf_counter()
    frames = batches = 0
    largest = 0
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            frames += int(batch.lengths.sum())
            batches += 1
            largest = max(largest, batch.x.numel() * batch.x.element_size())
            float(batch.x[:, :, :, :8].sum())  # touch it
    wall = time.perf_counter() - t0
    watch.stop()
    return {"workers": workers, "epochs": epochs, "base_kib": base, "peak_kib": watch.peak, "samples": watch.samples,
            "worker_first_kib": list(watch.first.values()), "worker_peak_kib": list(watch.worker_peak.values()),
            "frames": frames, "batches": batches, "largest_batch_bytes": largest, "wall_seconds": wall}


def _run_anon_probe(store: Path, workers: int, budget_mb: float, epochs: int) -> dict[str, Any]:
    import subprocess

    cmd = [sys.executable, "-m", "benchmarks.bench_library", "anon-probe", str(store), str(workers), str(budget_mb),
           str(epochs)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"anon probe failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _store_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def workers_memory(work: Path, *, median_s: float, n_base: int, tiles: tuple[int, int], workers: int,
                   budget_mb: float, repeats: int, seed: int = 5) -> list[Figure]:
    """Anonymous memory (Pss_Anon summed over the process tree) of one epoch with ``workers`` workers and none.

    Both stores hold the same ``n_base`` log-normal clip lengths (median ``median_s``), repeated
    ``tiles[0]`` and ``tiles[1]`` times.  The small store is read for ``tiles[1] // tiles[0]``
    epochs by the same (persistent) workers, the large one for one: both runs process alike
    batches, equally many, so the allocator's warm-up and the batches in flight cancel and the
    difference is what grows with the store's size.  Each case runs ``repeats`` times (medians).
    """
    import psutil

    from .bench_infer import make_store

    base = _lognormal_frames(n_base, median_s, seed)
    stores = {"small": make_store(work / "anon-small.zarr", np.tile(base, tiles[0])),
              "large": make_store(work / "anon-large.zarr", np.tile(base, tiles[1]))}
    nbytes = {k: _store_bytes(v) for k, v in stores.items()}
    cases = [("large", 0), ("small", workers), ("large", workers)]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in cases}
    for r in range(repeats):
        for key in rotated(cases, r):
            epochs = tiles[1] // tiles[0] if key[0] == "small" else 1
            res = _run_anon_probe(stores[key[0]], key[1], budget_mb, epochs)
            runs[key].append(res)
            log.info("anon probe %s store, %d workers: Pss_Anon %d -> %d MiB, RssAnon %d -> %d MiB", key[0], key[1],
                     res["base_kib"]["pss_anon"] >> 10, res["peak_kib"]["pss_anon"] >> 10,
                     res["base_kib"]["rss_anon"] >> 10, res["peak_kib"]["rss_anon"] >> 10)
    results = {k: v[0] for k, v in runs.items()}

    def growth(key: tuple[str, int], kind: str = "pss_anon") -> float:
        return 1024 * median([r["peak_kib"][kind] - r["base_kib"][kind] for r in runs[key]])

    def worker_rss_growth(key: tuple[str, int]) -> float:
        return 1024 * median([sum(p["rss_anon"] - f["rss_anon"] for f, p in
                                  zip(r["worker_first_kib"], r["worker_peak_kib"], strict=True)) for r in runs[key]])

    slope = (growth(("large", workers)) - growth(("small", workers))) / (nbytes["large"] - nbytes["small"])
    added = growth(("large", workers)) - growth(("large", 0))
    largest_batch = max(r["largest_batch_bytes"] for v in runs.values() for r in v)
    mib = 2**20
    details = {
        "store_mib": {k: round(v / mib, 1) for k, v in nbytes.items()},
        "tree_pss_anon_growth_mib": {f"{s} store, {w} workers": round(growth((s, w)) / mib, 1) for s, w in runs},
        "tree_rss_anon_growth_mib (counts shared copy-on-write pages once per process)": {
            f"{s} store, {w} workers": round(growth((s, w), "rss_anon") / mib, 1) for s, w in runs},
        "workers_rss_anon_growth_from_first_sample_mib": {f"{s} store": round(worker_rss_growth((s, w)) / mib, 1)
                                                          for s, w in runs if w},
        "workers_added_vs_no_workers_mib (large store)": round(added / mib, 1),
        "largest_batch_mib": round(largest_batch / mib, 1), "budget_mib": budget_mb,
        "epoch_seconds": {f"{s} store, {w} workers": round(median([r["wall_seconds"] for r in v]), 2)
                          for (s, w), v in runs.items()},
        "batches": {f"{s} store ({r['epochs']} epochs)": r["batches"] for (s, w), r in results.items() if w},
        "repeats": repeats,
        "psutil": psutil.__version__,
    }
    return [
        Figure("library_workers_anon_per_store_byte",
               f"DataLoader with {workers} workers: anonymous memory per byte of store",
               round(slope, 4), "bytes/byte",
               f"(peak - start) of Pss_Anon summed over the main process and its {workers} DataLoader workers (psutil "
               f"children, /proc/PID/smaps_rollup) while StoreDataset + BudgetBatchSampler + PadCollate read a "
               f"{nbytes['large'] / mib:.0f} MiB store once, minus the same while the same workers read a "
               f"{nbytes['small'] / mib:.0f} MiB store of the same clip lengths {tiles[1] // tiles[0]} times (as many "
               f"alike batches), divided by the difference in store bytes: the part of the workers' memory that "
               f"grows with the store (worker interpreters, allocator warm-up and {budget_mb:g} MiB-budget batches in "
               f"flight cancel); fresh interpreter each, median of {repeats}",
               target=0.10, op="<=", details=details),
        Figure("library_workers_anon_vs_store", f"DataLoader {workers} workers vs 0: added anonymous memory / store",
               round(added / nbytes["large"], 4), "fraction",
               f"Pss_Anon growth of the process tree with {workers} workers minus with 0, over one epoch of the "
               f"{nbytes['large'] / mib:.0f} MiB store, divided by the store's bytes ({added / mib:.0f} MiB: worker "
               "interpreters' private pages and prefetched batches, a fixed cost, not a copy of the store)"),
    ]


# ---------------------------------------------------------------- 4. reader thread vs workers


def prefetch_vs_workers(work: Path, *, n_clips: int, median_s: float, repeats: int, model: dict[str, Any],
                        seed: int = 11) -> list[Figure]:
    import torch
    from torch.utils.data import DataLoader

    from infer.data import BudgetBatchSampler, PadCollate, StoreDataset, prefetch
    from infer.runtime import Engine, RunOptions

    from .bench_infer import make_checkpoint, make_store

    torch.set_num_threads(_cores())
    lengths = _lognormal_frames(n_clips, median_s, seed)
    store = make_store(work / "loader.zarr", lengths)
    ckpt = make_checkpoint(work / "loader.pt", **model)
    from infer.checkpoint import load_checkpoint

    engine = Engine(RunOptions(device="cpu", progress=False))
    net = engine.prepare(load_checkpoint(ckpt).build())
    budget = engine.budget(net, N_BINS)
    ds = StoreDataset(str(store), "mel")
    plan = BudgetBatchSampler(ds, budget)  # raises if a clip does not fit the budget alone
    batches = list(plan)
    collate = PadCollate(budget.frame_align)

    def run(source: Any) -> int:
        done = 0
        with torch.inference_mode():
            for b in source:
                net(b.x.contiguous(memory_format=torch.channels_last), b.lengths)
                done += len(b)
        return done

    variants: dict[str, Callable[[], int]] = {
        "thread": lambda: run(prefetch(ds, batches, collate)),
        "workers1": lambda: run(DataLoader(ds, batch_sampler=batches, collate_fn=collate, num_workers=1)),
        "workers2": lambda: run(DataLoader(ds, batch_sampler=batches, collate_fn=collate, num_workers=2)),
    }
    run(prefetch(ds, batches[:1], collate))  # warm-up
    times: dict[str, list[float]] = {k: [] for k in variants}
    foreign: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(repeats):
        for name in rotated(list(variants), r):
            with CpuWindow() as w:
                done = variants[name]()
            if done != n_clips:
                raise RuntimeError(f"{name} ran {done} of {n_clips} clips")
            times[name].append(w.wall)
            foreign[name].append(w.foreign_cores)
        log.info("loader repeat %d/%d: %s", r + 1, repeats,
                 ", ".join(f"{k} {n_clips / v[-1]:.1f} clips/s" for k, v in times.items()))
    details = {"clips": n_clips, "median_s": median_s, "audio_seconds": round(float(lengths.sum() / FPS), 1),
               "batches": len(batches), "repeats": repeats,
               "clips_per_s": {k: round(n_clips / median(v), 2) for k, v in times.items()},
               "times_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
               "foreign_cores": {k: round(median(v), 2) for k, v in foreign.items()},
               "model": dict(model) or "default CNN (width 32, depth 4)", "cores": _cores()}
    shutil.rmtree(store, ignore_errors=True)
    figures = []
    for k in (1, 2):
        ratio = median([o / t for t, o in zip(times["thread"], times[f"workers{k}"], strict=True)])
        figures.append(Figure(
            f"library_prefetch_vs_workers{k}", f"Inference feed: reader thread vs DataLoader({k} worker"
            f"{'s' if k > 1 else ''})", round(ratio, 3), "x",
            f"clips/s of the same inference pass (planned batches, float32 channels-last, CPU) fed by "
            f"infer.data.prefetch (one reader thread, the built-in default) / fed by DataLoader(num_workers={k}, "
            f"worker start included); > 1: the thread is faster", details=details if k == 1 else {}))
    return figures


# ---------------------------------------------------------------- the group


def run(work: Path, *, train: dict[str, Any], sampler: dict[str, Any], memory: dict[str, Any],
        loader: dict[str, Any]) -> GroupResult:
    work.mkdir(parents=True, exist_ok=True)
    figures = train_throughput(work, **train)
    figures += sampler_vs_lhotse(**sampler)
    figures += workers_memory(work, **memory)
    figures += prefetch_vs_workers(work, **loader)
    method = (
        "The data pieces of infer.data in a user's own loop. Training: synthetic float16 128-bin stores (no audio), "
        f"clip lengths a stratified log-normal sample (sigma 0.9) at median {train['median_s']:g} s, whole clips, "
        f"{train['repeats']} interleaved repeats of one epoch per variant from the same initial weights. Plans "
        "scale with lengths and budget together, so a median of 60 s under a budget "
        f"{PLAN_MEDIAN_S / train['median_s']:g}x larger gives the same batch shapes; the smaller scale keeps an "
        "epoch of the CNN within the benchmark's time on 2 cores. Sampler: bench_plan's 2 GiB budget at 33 KiB per "
        "padded frame, lhotse's real DynamicBucketingSampler over dummy cuts (no audio). Memory: each case in a "
        "fresh interpreter (python -m benchmarks.bench_library anon-probe), a thread summing Pss_Anon (the "
        "proportional share of anonymous pages, so copy-on-write pages a worker shares with its parent count once) "
        "and RssAnon over the process and its workers every 10 ms; file-backed pages of the memory-mapped store "
        "are not anonymous and are not counted. Loader: the same planned inference batches fed by the reader "
        "thread or by DataLoader workers.")
    return GroupResult("library (users' own PyTorch code)", figures, method=method)


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[0] == "anon-probe":
        print(json.dumps(anon_probe(argv[1], int(argv[2]), float(argv[3]), int(argv[4]))))
        return 0
    print("usage: python -m benchmarks.bench_library anon-probe STORE WORKERS BUDGET_MB EPOCHS", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
