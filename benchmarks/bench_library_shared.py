"""What the library figures share: the feature and class counts of their synthetic stores, their clip lengths
(bench_plan's log-normal sample at another median), the cores they use and the frames a plan computes."""

from __future__ import annotations

import os

import numpy as np

from .bench_plan import quantile_lengths

__all__ = ["N_BINS", "N_CLASSES", "PLAN_MEDIAN_S"]


N_BINS = 128
N_CLASSES = 10
#: Median clip length (s) of bench_plan's log-normal distribution (sigma 0.9).
PLAN_MEDIAN_S = 60.0


def _lognormal_frames(n: int, median_s: float, seed: int) -> np.ndarray:
    """bench_plan's stratified log-normal lengths (sigma 0.9), rescaled to a median of ``median_s`` seconds."""
    base = quantile_lengths("lognormal", n, seed=seed)
    return np.maximum(1, np.round(base * (median_s / PLAN_MEDIAN_S))).astype(np.int64)


def _cores() -> int:
    return len(os.sched_getaffinity(0))


def _computed(lengths: np.ndarray, batches: list[list[int]], align: int) -> int:
    """Frames computed for ``batches``: batch size x longest clip rounded up to ``align``."""
    from specstore.infer.batching.budget import align_frames

    return int(sum(len(b) * align_frames(int(lengths[b].max()), align) for b in batches))
