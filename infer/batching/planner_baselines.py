"""Batch planners the project's planner is measured against: what users would otherwise run.

Not used by any command; ``make bench`` and the planner tests compare
:func:`specstore.infer.batching.planner.plan_batches` with them.

* :func:`fixed_batches`: consecutive groups of ``batch_size`` clips in
  arrival order, no budget (what a plain ``DataLoader(batch_size=4)`` does);
* :func:`bucketed_batches`: like lhotse's ``DynamicBucketingSampler`` with
  equal-duration buckets, each cut greedily under the same budget rule as
  the project's planner, so efficiencies compare like for like.  (The bench
  also measures lhotse's real sampler where lhotse is installed.)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specstore.infer.batching.budget import Budget
from specstore.infer.batching.constraints import FixedBatch
from specstore.infer.batching.planner import _RNG_SALT, Plan, check_lengths, split_fitting
from specstore.infer.errors import PlanError

__all__ = ["bucketed_batches", "fixed_batches"]


def fixed_batches(lengths: np.ndarray, batch_size: int = 4) -> Plan:
    """Consecutive groups of ``batch_size`` clips in arrival order (no budget):
    :class:`~specstore.infer.batching.constraints.FixedBatch`'s plan."""
    return FixedBatch(batch_size).plan(lengths)


def _greedy_partition(order: np.ndarray, padded: np.ndarray, budget: Budget) -> list[np.ndarray]:
    """Cut ``order`` into consecutive batches, each as large as the budget allows.

    The constraint uses each batch's true longest clip (a running maximum),
    so it holds for any order.
    """
    batches: list[np.ndarray] = []
    i = 0
    sizes = np.arange(1, budget.max_batch + 1)
    while i < len(order):
        window = order[i: i + budget.max_batch]
        longest = np.maximum.accumulate(padded[window])
        k = int(np.count_nonzero(budget.fits(sizes[: len(window)], longest)))  # feasible sizes are a prefix
        if k < 1:
            raise PlanError(f"clip {int(window[0])} does not fit the budget alone")
        batches.append(window[:k].copy())
        i += k
    return batches


def bucketed_batches(lengths: np.ndarray, budget: Budget, *, num_buckets: int = 30, seed: int = 0) -> Plan:
    """Shuffled equal-duration buckets, each cut greedily under ``budget``; batch order shuffled.

    Bucket boundaries split the total duration into ``num_buckets`` equal
    parts (long clips get narrow buckets), as lhotse's
    ``DynamicBucketingSampler`` estimates them; lhotse caps summed duration
    instead of padded cost, so this is the fairer like-for-like variant.
    """
    lengths = check_lengths(lengths)
    if num_buckets < 1:
        raise PlanError(f"num_buckets must be >= 1, got {num_buckets}")
    rng = np.random.default_rng((_RNG_SALT, int(seed)))
    padded, fit_ids, too_long = split_fitting(lengths, budget)
    fit_lengths = lengths[fit_ids]
    sorted_lengths = np.sort(fit_lengths)
    cumulative = np.cumsum(sorted_lengths)
    total = cumulative[-1] if len(cumulative) else 0
    cut_positions = np.searchsorted(cumulative, total * np.arange(1, num_buckets) / num_buckets)
    boundaries: Any = sorted_lengths[np.minimum(cut_positions, max(len(sorted_lengths) - 1, 0))] if total else []
    bucket_of = np.searchsorted(np.asarray(boundaries), fit_lengths, side="right")
    batches: list[np.ndarray] = []
    for bucket in np.unique(bucket_of):
        members = fit_ids[bucket_of == bucket]
        batches.extend(_greedy_partition(rng.permutation(members), padded, budget))
    batches = [batches[i] for i in rng.permutation(len(batches))]
    return Plan(lengths, batches, too_long, budget, name=f"bucketed batches ({num_buckets} equal-duration buckets)")
