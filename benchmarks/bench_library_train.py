"""Library figure 1, ``library_train_vs_plain``: one training epoch through StoreDataset + BudgetBatchSampler +
PadCollate against a plain shuffled DataLoader under the same memory budget (see bench_library)."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bench_common import CpuWindow, Figure, log, median, rotated
from .bench_library_shared import N_BINS, N_CLASSES, _cores, _lognormal_frames
from .bench_plan import FPS, MAX_BATCH

__all__ = ["train_throughput"]

Series = dict[str, list[float]]
"""Variant name -> one value per repeat."""


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

    from specstore.infer.batching.budget import Budget
    from specstore.infer.data import BudgetBatchSampler, PadCollate, StoreDataset
    from specstore.infer.engine.cost import measure_cost_per_frame
    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.models.contract import time_stride
    from specstore.infer.options.defaults import PLAIN_MODEL

    from .bench_infer_data import make_store

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

    variants_for = _variants(net0, ds, sampler, collate, plain_bs, budget)

    # warm-up (oneDNN primitives, allocator): one small batch, untimed
    warm = copy.deepcopy(net0)
    x = torch.zeros(2, 1, N_BINS, 4 * stride)
    logits = warm(x, torch.full((2,), 4 * stride))
    torch.nn.functional.cross_entropy(logits, torch.zeros(2, dtype=torch.long)).backward()
    times, foreign, stats, cpu = _time_repeats(variants_for, repeats, n_clips, plain_bs)
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


def _variants(net0: Any, ds: Any, sampler: Any, collate: Any, plain_bs: int,
              budget: Any) -> Callable[[int], dict[str, Callable[[], dict[str, Any]]]]:
    """The two runners of repeat ``r``'s epoch from ``net0``'s weights: ours (BudgetBatchSampler) and plain
    (DataLoader(shuffle=True, batch_size=plain_bs)), each returning :func:`_train_epoch`'s counts."""
    import torch
    from torch.utils.data import DataLoader

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

    return lambda r: {"ours": ours(r), "plain": plain(r)}



def _time_repeats(variants_for: Callable[[int], dict[str, Callable[[], dict[str, Any]]]], repeats: int,
                  n_clips: int, plain_bs: int) -> tuple[Series, Series, dict[str, list[dict[str, Any]]], Series]:
    """``repeats`` interleaved epochs of each variant: wall times (s), foreign cores, epoch counts, own CPU (s)."""
    times: dict[str, list[float]] = {"ours": [], "plain": []}
    foreign: dict[str, list[float]] = {"ours": [], "plain": []}
    stats: dict[str, list[dict[str, Any]]] = {"ours": [], "plain": []}
    cpu: dict[str, list[float]] = {"ours": [], "plain": []}
    for r in range(repeats):
        variants = variants_for(r)
        for name in rotated(list(variants), r):
            with CpuWindow() as w:
                st = variants[name]()
            times[name].append(w.wall)
            foreign[name].append(w.foreign_cores)
            cpu[name].append(w.own_cores * w.wall)
            stats[name].append(st)
        log.info("training repeat %d/%d: ours %.1f clips/s, plain (batch %d) %.1f clips/s", r + 1, repeats,
                 n_clips / times["ours"][-1], plain_bs, n_clips / times["plain"][-1])
    return times, foreign, stats, cpu
