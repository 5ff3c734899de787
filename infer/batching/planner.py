"""The batch planner: clip lengths + a :class:`~specstore.infer.batching.budget.Budget` -> batches of clip ids.

Pure functions over a length index (frames per clip, e.g. ``specstore.store.lengths``).
Every batch is charged by the budget's rule (:mod:`specstore.infer.batching.budget`: ``B * T *
cost_per_frame + fixed_overhead`` for ``B`` clips padded to ``T`` aligned
frames) and stays within it: never over, unlike ESPnet's ``numel`` batching,
which adds the clip that crosses the limit.

:func:`plan_batches` (inference) sorts by length, longest first, and cuts
the sorted order into consecutive batches by dynamic programming: it
minimises ``computed frames + batch_overhead_frames * number of batches``
(a linear run-time model: per padded frame plus per batch), subject to the
budget and ``max_batch``.  Padding alone would favour batches of one; the
per-batch price keeps batches full where lengths are dense and splits them
only in the sparse tail (long clips), where a batch of ``max_batch`` would
pad heavily.  ``batch_overhead_frames=inf`` gives the fewest batches (the
greedy fill from the longest clip).  Measured: >= 99% efficiency on uniform
15-240 s and log-normal (median 60 s) corpora; see the tests.

Clips too long for a batch of one are not dropped: they are listed in
``Plan.too_long`` and run in windows of at most ``budget.max_window`` frames
(:mod:`specstore.infer.engine.windows`).

:func:`shuffled_training_plan` is the training variant: sort keys jittered by
a small relative noise (``jitter``), the same partition (tracking the
batch's true longest clip), batch order shuffled; deterministic in
``(seed, epoch)``.  :func:`training_plan` lowers the per-batch price until a
shuffled plan reaches a padding-efficiency target.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from specstore.infer.batching.budget import (
    DEFAULT_BATCH_OVERHEAD_FRAMES,
    TRAINING_BATCH_OVERHEAD_FRAMES,
    Budget,
    align_frames,
)
from specstore.infer.errors import PlanError

__all__ = [
    "DEFAULT_BATCH_OVERHEAD_FRAMES",
    "MIN_TRAINING_EFFICIENCY",
    "Plan",
    "PlanError",
    "TRAINING_BATCH_OVERHEAD_FRAMES",
    "check_lengths",
    "plan_batches",
    "shuffled_training_plan",
    "training_plan",
]

log = logging.getLogger(__name__)

_MIB = 1024.0 * 1024.0
_RNG_SALT = 0x5EED_B47C
"""Leads the planners' random seeds, so their streams differ from ``default_rng(seed)``
(numpy ignores trailing zero words: ``default_rng((s, 0)) == default_rng(s)``)."""

MIN_TRAINING_EFFICIENCY = 0.95
"""Padding efficiency (real / computed frames) :func:`training_plan` aims for; lower is logged."""


@dataclass(frozen=True)
class Plan:
    """Batches of clip ids (indices into ``lengths``) and the clips left for windowing.

    ``batches``: int64 id arrays, in the order to run them; ``too_long``: ids
    of clips that exceed the budget alone (run them with
    :func:`specstore.infer.engine.windows.run_windowed` in windows of at most
    :attr:`max_window` frames); ``budget``: the :class:`~specstore.infer.batching.budget.Budget`
    the plan was made under (None for a plan made without one, such as a
    benchmark's fixed-size baseline); ``pad_to``: every batch is padded to
    this many frames (equal windows of a model that does not mask padding)
    instead of to its longest clip.  A batch's padded length is
    :func:`~specstore.infer.batching.budget.align_frames` of that, and :attr:`efficiency` is the
    one padding efficiency figure every command reports.
    """

    lengths: np.ndarray
    batches: list[np.ndarray]
    too_long: np.ndarray
    budget: Budget | None = None
    name: str = "plan"
    pad_to: int | None = None
    _padded: np.ndarray = field(init=False, repr=False, compare=False)
    _real: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = np.array([len(b) for b in self.batches], dtype=np.int64)
        if len(sizes) and sizes.min() < 1:
            raise PlanError("a plan cannot hold an empty batch")
        if len(sizes):
            flat = self.lengths[np.concatenate(self.batches)]
            starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            longest = np.maximum.reduceat(flat, starts)
            real = int(flat.sum())
        else:
            longest = np.zeros(0, dtype=np.int64)
            real = 0
        if self.pad_to is not None:
            longest = np.maximum(longest, self.pad_to)
        object.__setattr__(self, "_padded", align_frames(longest, self.frame_align))
        object.__setattr__(self, "_real", real)

    @property
    def frame_align(self) -> int:
        """Padded lengths are multiples of this (the budget's alignment; 1 without a budget)."""
        return self.budget.frame_align if self.budget is not None else 1

    @property
    def max_window(self) -> int:
        """Longest window (frames) a too-long clip runs in (0 without a budget)."""
        return self.budget.max_window if self.budget is not None else 0

    def padded_length(self, batch: np.ndarray) -> int:
        """Frames a batch is padded to: its longest clip (or ``pad_to``) rounded up to ``frame_align``."""
        return int(align_frames(max(int(self.lengths[batch].max()), self.pad_to or 0), self.frame_align))

    @property
    def n_batches(self) -> int:
        return len(self.batches)

    @property
    def batch_frames(self) -> np.ndarray:
        """Padded length (frames) of each batch, in run order."""
        return self._padded.copy()

    @property
    def real_frames(self) -> int:
        """Sum of the batched clips' lengths (frames; windowed clips excluded)."""
        return self._real

    @property
    def computed_frames(self) -> int:
        """Sum over batches of ``batch size * padded length`` (frames)."""
        sizes = np.array([len(b) for b in self.batches], dtype=np.int64)
        return int((sizes * self._padded).sum()) if len(sizes) else 0

    @property
    def efficiency(self) -> float:
        """``real_frames / computed_frames`` (1.0 = no padding); 1.0 for an empty plan."""
        computed = self.computed_frames
        return self.real_frames / computed if computed else 1.0

    def batch_bytes(self, i: int) -> float:
        """Planned bytes of batch ``i`` by the budget's rule; nan without a budget."""
        if self.budget is None:
            return float("nan")
        return float(self.budget.bytes(len(self.batches[i]), int(self._padded[i])))

    def describe(self, top: int = 5) -> str:
        """A few lines for a user checking a plan before running a model."""
        n_batched = sum(len(b) for b in self.batches)
        sizes = np.array([len(b) for b in self.batches]) if self.batches else np.zeros(1, dtype=int)
        lines = [
            f"{self.name}: {n_batched} clips in {self.n_batches} batches "
            f"(size min {sizes.min()} / median {int(np.median(sizes))} / max {sizes.max()}); "
            f"efficiency {self.efficiency:.2%} ({self.real_frames} real of {self.computed_frames} computed frames)",
        ]
        if self.budget is not None:
            peak = max((self.batch_bytes(i) for i in range(self.n_batches)), default=0.0)
            lines.append(f"{self.budget.describe()}; largest planned batch {peak / _MIB:.1f} MiB")
        if len(self.too_long):
            longest = int(self.lengths[self.too_long].max())
            lines.append(
                f"{len(self.too_long)} clip(s) too long for one batch (longest {longest} frames): "
                f"run in windows of <= {self.max_window} frames"
            )
        if top > 0 and self.batches:
            sizes_frames = np.array([len(b) for b in self.batches]) * self._padded
            order = np.argsort(-sizes_frames, kind="stable").tolist()
            lines.append(f"largest {min(top, self.n_batches)} batches:")
            for i in order[:top]:
                size = f" = {self.batch_bytes(i) / _MIB:.1f} MiB" if self.budget is not None else ""
                lines.append(f"  #{i}: {len(self.batches[i])} clips x {int(self._padded[i])} frames{size}")
        return "\n".join(lines)


def check_lengths(lengths: np.ndarray) -> np.ndarray:
    """``lengths`` as a 1-D int64 array of whole frame counts >= 1; :class:`PlanError` otherwise."""
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise PlanError(f"lengths must be 1-D (frames per clip), got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.equal(np.mod(arr, 1), 0)):
            raise PlanError("lengths must be whole frame counts")
    arr = arr.astype(np.int64)
    bad = np.flatnonzero(arr < 1)
    if bad.size:
        raise PlanError(f"{bad.size} clip(s) have fewer than 1 frame (first ids: {bad[:5].tolist()})")
    return arr


def _dp_partition(order: np.ndarray, padded: np.ndarray, budget: Budget,
                  batch_overhead_frames: float) -> list[np.ndarray]:
    """Cut ``order`` into consecutive batches minimising ``computed frames + overhead * batches``.

    Dynamic programme over suffixes: ``best[i] = min_k (k * M(i, k) +
    batch_overhead_frames + best[i + k])`` where ``M(i, k)`` is the longest
    padded clip among ``order[i:i + k]`` and ``k`` ranges over the batch
    sizes that fit the budget (at most ``max_batch``).  Ties go to the larger
    batch.  O(n * max_batch) time, O(n) memory.
    """
    lengths = padded[order].tolist()
    n = len(lengths)
    k_max = budget.max_batch
    best = [0.0] * (n + 1)
    choice = [0] * (n + 1)
    for i in range(n - 1, -1, -1):
        best_cost = float("inf")
        best_k = 0
        longest = 0
        for k in range(1, min(k_max, n - i) + 1):
            length = lengths[i + k - 1]
            if length > longest:
                longest = length
            if not budget.fits(k, longest):
                break  # B * max only grows with B: larger batches do not fit either
            total = k * longest + batch_overhead_frames + best[i + k]
            if total <= best_cost:
                best_cost, best_k = total, k
        if best_k == 0:  # cannot happen for clips that fit alone; kept as a hard guard
            raise PlanError(f"clip {int(order[i])} does not fit the budget alone")
        best[i] = best_cost
        choice[i] = best_k
    batches: list[np.ndarray] = []
    i = 0
    while i < n:
        batches.append(order[i : i + choice[i]].copy())
        i += choice[i]
    return batches


def _check_overhead(batch_overhead_frames: float) -> None:
    if not batch_overhead_frames >= 0:
        raise PlanError(f"batch_overhead_frames must be >= 0, got {batch_overhead_frames!r}")


def split_fitting(lengths: np.ndarray, budget: Budget,
                  pad_to: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(padded lengths, ids that fit a batch of one, ids too long for one, longest first).

    A clip's padded length is its length, or ``pad_to`` when that is longer,
    rounded up to the budget's alignment: what it costs in any batch.
    """
    if pad_to is not None and pad_to < 1:
        raise PlanError(f"pad_to must be >= 1 frame, got {pad_to}")
    padded = budget.align(lengths if pad_to is None else np.maximum(lengths, pad_to))
    fits = np.asarray(budget.fits(1, padded))
    too_long = np.flatnonzero(~fits)
    too_long = too_long[np.argsort(-lengths[too_long], kind="stable")]
    return padded, np.flatnonzero(fits), too_long


def plan_batches(lengths: np.ndarray, budget: Budget, *,
                 batch_overhead_frames: float = DEFAULT_BATCH_OVERHEAD_FRAMES, pad_to: int | None = None) -> Plan:
    """Inference plan: sort by length (longest first), cut into batches by a DP.

    ``lengths``: frames per clip (ids are positions); ``budget``: the cost
    rule and limits (:class:`~specstore.infer.batching.budget.Budget`);
    ``batch_overhead_frames``: what one more batch costs, in padded frames
    (a batch is split only where that saves more padding than this);
    ``pad_to``: batches are padded to this many frames (:class:`Plan`).  Every
    batch fits the budget and holds at most ``budget.max_batch`` clips;
    batches run longest first (an out-of-memory shows up at once).  Raises
    :class:`PlanError` on bad input.
    """
    lengths = check_lengths(lengths)
    _check_overhead(batch_overhead_frames)
    padded, fit_ids, too_long = split_fitting(lengths, budget, pad_to)
    order = fit_ids[np.argsort(-lengths[fit_ids], kind="stable")]
    batches = _dp_partition(order, padded, budget, batch_overhead_frames)
    return Plan(lengths, batches, too_long, budget, name="sorted plan", pad_to=pad_to)


def shuffled_training_plan(
    lengths: np.ndarray,
    budget: Budget,
    *,
    seed: int = 0,
    epoch: int = 0,
    jitter: float = 0.04,
    batch_overhead_frames: float = TRAINING_BATCH_OVERHEAD_FRAMES,
    pad_to: int | None = None,
) -> Plan:
    """Training plan: new batches every epoch, padding still small.

    Each clip's sort key is its length times ``1 + u``, ``u`` uniform in
    ``[-jitter, jitter]``, drawn from a generator seeded by ``(seed, epoch)``;
    the key order is cut into batches as in :func:`plan_batches` (budget and
    padding use each batch's true longest clip), and the batch order is
    shuffled.  Same ``(seed, epoch)``, same plan.  ``jitter`` trades batch
    variety for padding; ``batch_overhead_frames`` defaults higher than for
    inference (a training step costs more per batch, and steady batch sizes
    suit SGD).  Measured with the defaults (jitter 0.04, 4096 frames):
    efficiency >= 96% on uniform and log-normal corpora, with at most ~7%
    more batches than the fewest possible; 0 jitter is the sorted plan in a
    random batch order.  ``pad_to``: as in :func:`plan_batches`.
    """
    lengths = check_lengths(lengths)
    if not 0.0 <= jitter < 1.0:
        raise PlanError(f"jitter must be in [0, 1), got {jitter!r}")
    if seed < 0 or epoch < 0:
        raise PlanError("seed and epoch must be >= 0")
    _check_overhead(batch_overhead_frames)
    rng = np.random.default_rng((_RNG_SALT, int(seed), int(epoch)))
    padded, fit_ids, too_long = split_fitting(lengths, budget, pad_to)
    keys = lengths[fit_ids] * (1.0 + rng.uniform(-jitter, jitter, size=len(fit_ids)))
    # Random tie-break: a random permutation, then a stable sort on the keys.
    perm = rng.permutation(len(fit_ids))
    order = fit_ids[perm][np.argsort(-keys[perm], kind="stable")]
    batches = _dp_partition(order, padded, budget, batch_overhead_frames)
    batches = [batches[i] for i in rng.permutation(len(batches))]
    return Plan(lengths, batches, too_long, budget, name=f"training plan (seed {seed}, epoch {epoch})",
                pad_to=pad_to)


def training_plan(lengths: np.ndarray, budget: Budget, *, seed: int, epoch: int,
                  min_efficiency: float = MIN_TRAINING_EFFICIENCY, pad_to: int | None = None) -> Plan:
    """One epoch's shuffled batches (:func:`shuffled_training_plan`) with padding efficiency >= the target.

    The planner's default price of a batch (1024 padded frames) suits
    inference over long clips; on short clips it keeps batches full at the
    cost of padding.  Here the price is halved until the plan's padding
    efficiency reaches ``min_efficiency`` (real / computed frames, computed
    frames rounded up to the budget's alignment), so batches stay as large
    as that target allows.  If even a zero price misses it (alignment padding
    of very short clips), the most efficient plan is returned and a warning
    logged.  ``pad_to``: as in :func:`plan_batches`.
    """
    best: Plan | None = None
    overhead = DEFAULT_BATCH_OVERHEAD_FRAMES
    while True:
        plan = shuffled_training_plan(lengths, budget, seed=seed, epoch=epoch, batch_overhead_frames=overhead,
                                      pad_to=pad_to)
        if best is None or plan.efficiency > best.efficiency:
            best = plan
        if plan.efficiency >= min_efficiency or overhead == 0.0 or pad_to is not None:
            break  # (with pad_to every batch pads alike: no partition pads less)
        overhead = overhead / 2 if overhead > 1.0 else 0.0
    if best.efficiency < min_efficiency and pad_to is None:
        log.warning("epoch %d: training plan padding efficiency %.3f is below %.2f (clips shorter than a few "
                    "multiples of the model's time stride, %d frames)", epoch + 1, best.efficiency, min_efficiency,
                    budget.frame_align)
    return best
