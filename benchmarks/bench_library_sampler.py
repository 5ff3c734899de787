"""Library figures 2, ``library_sampler_vs_lhotse`` and the batches over the budget: BudgetBatchSampler(shuffle)
against lhotse's DynamicBucketingSampler over dummy cuts of the same lengths (see bench_library)."""

from __future__ import annotations

import warnings

import numpy as np

from .bench_common import Figure, median
from .bench_library_shared import _computed
from .bench_plan import ALIGN, BUDGET, COST, FPS, MAX_BATCH, lengths_for

__all__ = ["sampler_vs_lhotse"]


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
    from specstore.infer.batching.budget import Budget
    from specstore.infer.data import BudgetBatchSampler

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
