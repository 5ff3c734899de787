"""Figure 3: padding efficiency (real / computed frames) of batch planners on two length distributions.

Lengths (frames at 22 050 / 512 = 43.07 frames/s): uniform 15-240 s, and
log-normal with a median of 60 s and sigma 0.9.  Planners: a fixed batch of
4 in arrival order; lhotse-like shuffled equal-duration buckets
(:func:`specstore.infer.batching.planner_baselines.bucketed_batches` with lhotse's default of 10
buckets); ours (:func:`specstore.infer.batching.planner.plan_batches`);
our training plan (:func:`specstore.infer.batching.planner.shuffled_training_plan`), which
must also reshuffle its batches every epoch.  Budgeted planners share one
budget rule: the CPU default budget (2 GiB), the design's 33 MiB per 1000
clip-frames, max batch 16, lengths aligned to the CNN's time stride (16).
"""

from __future__ import annotations

import time

import numpy as np

from .bench_common import Figure, GroupResult, median

FPS = 22050 / 512
BUDGET = 2 << 30
COST = 33 * 2**20 / 1000
MAX_BATCH = 16
ALIGN = 16
EPOCHS = 4
#: lhotse's ``DynamicBucketingSampler(num_buckets=10)`` default.
LHOTSE_BUCKETS = 10


def lengths_for(dist: str, n: int, seed: int) -> np.ndarray:
    """``n`` clip lengths in frames drawn from ``dist`` (``uniform`` or ``lognormal``)."""
    rng = np.random.default_rng(seed)
    if dist == "uniform":
        seconds = rng.uniform(15.0, 240.0, n)
    elif dist == "lognormal":
        seconds = np.exp(rng.normal(np.log(60.0), 0.9, n))
    else:
        raise ValueError(dist)
    return np.maximum(1, np.round(seconds * FPS)).astype(np.int64)


def quantile_lengths(dist: str, n: int, seed: int) -> np.ndarray:
    """A stratified sample: the distribution's ``n`` quantiles ``(i + 0.5) / n``, in a random order.

    For benchmarks that can afford only tens of clips: the lengths follow the
    distribution as closely as ``n`` values can, so the figures do not hinge
    on a lucky or unlucky draw; the arrival order (what a fixed batch of 4
    sees) is still random.
    """
    from scipy.stats import norm

    q = (np.arange(n) + 0.5) / n
    if dist == "uniform":
        seconds = 15.0 + 225.0 * q
    elif dist == "lognormal":
        seconds = np.exp(np.log(60.0) + 0.9 * norm.ppf(q))
    else:
        raise ValueError(dist)
    lengths = np.maximum(1, np.round(seconds * FPS)).astype(np.int64)
    return np.random.default_rng(seed).permutation(lengths)


def _batch_sets(plan: object) -> set[tuple[int, ...]]:
    return {tuple(sorted(b.tolist())) for b in plan.batches}  # type: ignore[attr-defined]


def run(*, n_clips: int, repeats: int) -> GroupResult:
    from specstore.infer.batching.budget import Budget
    from specstore.infer.batching.planner import plan_batches, shuffled_training_plan
    from specstore.infer.batching.planner_baselines import bucketed_batches, fixed_batches

    budget = Budget(BUDGET, COST, max_batch=MAX_BATCH, frame_align=ALIGN)
    figures = []
    summary: dict[str, dict[str, float]] = {}
    for dist in ("uniform", "lognormal"):
        eff: dict[str, list[float]] = {"fixed4": [], "bucketed": [], "bucketed30": [], "ours": [], "training": []}
        fresh: list[float] = []
        batches: dict[str, list[int]] = {"ours": [], "fewest": []}
        plan_ms: list[float] = []
        for r in range(repeats):
            lengths = lengths_for(dist, n_clips, seed=1000 + r)
            eff["fixed4"].append(fixed_batches(lengths, 4).efficiency)
            eff["bucketed"].append(bucketed_batches(lengths, budget, num_buckets=LHOTSE_BUCKETS, seed=r).efficiency)
            eff["bucketed30"].append(bucketed_batches(lengths, budget, num_buckets=30, seed=r).efficiency)
            t0 = time.perf_counter()
            ours = plan_batches(lengths, budget)
            plan_ms.append((time.perf_counter() - t0) * 1e3)
            eff["ours"].append(ours.efficiency)
            batches["ours"].append(ours.n_batches)
            batches["fewest"].append(plan_batches(lengths, budget, batch_overhead_frames=float("inf")).n_batches)
            plans = [shuffled_training_plan(lengths, budget, seed=r, epoch=e) for e in range(EPOCHS)]
            eff["training"].append(min(p.efficiency for p in plans))
            for a, b in zip(plans, plans[1:], strict=False):
                sa, sb = _batch_sets(a), _batch_sets(b)
                fresh.append(len(sb - sa) / len(sb))
        med = {k: round(median(v), 4) for k, v in eff.items()}
        summary[dist] = med
        details = {"clips": n_clips, "repeats (independent samples)": repeats, "efficiency": med,
                   "budget_bytes": BUDGET, "cost_per_frame": round(COST, 1), "max_batch": MAX_BATCH,
                   "frame_align": ALIGN}
        figures += [
            Figure(f"plan_{dist}_fixed4", f"Padding efficiency, {dist}: fixed batch of 4 (arrival order)",
                   med["fixed4"], "real/computed", "baseline: consecutive groups of 4 clips", details=details),
            Figure(f"plan_{dist}_bucketed", f"Padding efficiency, {dist}: lhotse-like shuffled buckets",
                   med["bucketed"], "real/computed",
                   f"baseline: {LHOTSE_BUCKETS} equal-duration buckets (lhotse's DynamicBucketingSampler default), "
                   f"shuffled within buckets, same budget rule; with 30 buckets: {med['bucketed30']:.3f}"),
            Figure(f"plan_{dist}_ours", f"Padding efficiency, {dist}: plan_batches (ours)",
                   med["ours"], "real/computed",
                   f"sorted DP partition under the budget; {median(batches['ours']):.0f} batches vs "
                   f"{median(batches['fewest']):.0f} for the fewest possible; planning {median(plan_ms):.0f} ms "
                   f"for {n_clips} clips",
                   target=0.99, op=">=", details={"ratio_vs_fixed4": round(med["ours"] / med["fixed4"], 3),
                                                 "ratio_vs_bucketed": round(med["ours"] / med["bucketed"], 3),
                                                 "plan_ms": round(median(plan_ms), 1)}),
            Figure(f"plan_{dist}_training", f"Padding efficiency, {dist}: shuffled_training_plan (worst of "
                   f"{EPOCHS} epochs)", med["training"], "real/computed",
                   "training plan (jitter 0.04), the worst epoch's efficiency",
                   target=0.95, op=">="),
            Figure(f"plan_{dist}_training_reshuffle", f"Training plan, {dist}: batches new each epoch",
                   round(median(fresh), 4), "fraction",
                   "share of an epoch's batches (as clip sets) that the previous epoch did not have "
                   "(batch order is shuffled too)", target=0.5, op=">="),
        ]
    method = (f"{n_clips} clip lengths per distribution, {repeats} independent samples (medians); "
              f"budget {BUDGET >> 20} MiB at {COST / 1024:.1f} KiB per padded frame, max batch {MAX_BATCH}, "
              f"frame align {ALIGN}. Efficiency = real frames / (batch size x padded length) summed over batches.")
    return GroupResult("batch planner", figures, method=method)
