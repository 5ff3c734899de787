"""When the online batcher closes a batch: pure functions over the queue, the budget and the clock.

The offline planner (:func:`specstore.infer.batching.planner.plan_batches`) sees every clip at
once.  Online, clips arrive one by one, so the only new decision is *when*
to close a batch; *which* clips go together is still the planner's:

* ``"budget"`` (the default): plan the waiting clips with
  :func:`~specstore.infer.batching.planner.plan_batches` under the memory budget.  A planned
  batch is closed as soon as it is full (``max_batch`` clips, or the next
  clip of its length would break the budget); every batch is closed once
  the oldest waiting clip has waited ``max_delay`` seconds.  A clip too
  long for any batch goes at once, alone (the engine runs it in windows).
* ``"fixed"``: the fixed batch of the article's baseline: the oldest
  ``fixed_size`` clips in arrival order, whatever their lengths, closed
  when that many wait or the oldest has waited ``max_delay``.

Ready batches are returned oldest first (the batch holding the clip that
has waited longest leads), so no clip waits behind newer ones for long.
Each comes with its plan (:class:`Closed`): the batch as the policy
planned it, which the engine runs as it is, so a batch is planned once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specstore.common import ConfigError
from specstore.infer.batching.budget import Budget
from specstore.infer.batching.constraints import BatchConstraint, BudgetBatches, FixedBatch
from specstore.infer.batching.planner import DEFAULT_BATCH_OVERHEAD_FRAMES, Plan

__all__ = ["BATCHING", "BatchPolicy", "Closed", "Waiting", "ready_batches"]

BATCHING = ("budget", "fixed")


@dataclass(frozen=True)
class BatchPolicy:
    """How the online batcher closes batches.

    ``batching``: ``"budget"`` or ``"fixed"`` (see the module docstring);
    ``max_delay``: seconds the oldest waiting clip may wait for its batch
    to fill; ``fixed_size``: clips per batch for ``"fixed"``.
    """

    batching: str = "budget"
    max_delay: float = 0.05
    fixed_size: int = 4

    def __post_init__(self) -> None:
        if self.batching not in BATCHING:
            raise ConfigError(f"batching must be one of {', '.join(BATCHING)}, not {self.batching!r}")
        if not self.max_delay >= 0:
            raise ConfigError(f"max_delay must be >= 0 seconds, got {self.max_delay!r}")
        if self.fixed_size < 1:
            raise ConfigError(f"fixed_size must be >= 1, got {self.fixed_size}")

    def constraint(self, budget: Budget) -> BatchConstraint:
        """What cuts the waiting clips into batches under ``budget`` (:mod:`specstore.infer.batching.constraints`)."""
        return FixedBatch(self.fixed_size, budget) if self.batching == "fixed" else BudgetBatches(budget)


@dataclass(frozen=True)
class Waiting:
    """A queued clip: ``key`` (the batcher's id), ``frames`` (its length), ``since`` (monotonic s it joined)."""

    key: int
    frames: int
    since: float


@dataclass(frozen=True, eq=False)
class Closed:
    """A batch to run now: the queue's ``keys`` in run order, and ``plan``, those clips (in that order) as the
    policy planned them: one batch, or one clip too long for any batch, left for windows."""

    keys: list[int]
    plan: Plan


def _closed(plan: Plan, ids: np.ndarray, by_age: Sequence[Waiting], *, windowed: bool) -> Closed:
    """The clips ``ids`` of ``plan`` as a plan of their own: one batch of them all, or (``windowed``) one clip
    left for windows."""
    none = np.zeros(0, dtype=np.int64)
    own = np.arange(len(ids), dtype=np.int64)
    part = Plan(plan.lengths[ids], [] if windowed else [own], own if windowed else none, plan.budget,
                name=plan.name, pad_to=plan.pad_to)
    return Closed([by_age[i].key for i in ids.tolist()], part)


def ready_batches(waiting: Sequence[Waiting], budget: Budget, policy: BatchPolicy, now: float, *,
                  batch_overhead_frames: float = DEFAULT_BATCH_OVERHEAD_FRAMES) -> list[Closed]:
    """The batches to run now, oldest first, each with its plan (:class:`Closed`); empty when every batch may
    still fill.

    ``now`` is on the clock of the ``since`` values; ``batch_overhead_frames``
    is the planner's price of one more batch (padded frames).  Pure: the
    same queue, budget and time give the same batches.
    """
    if not waiting:
        return []
    due = min(w.since for w in waiting) + policy.max_delay <= now
    constraint = policy.constraint(budget)
    by_age = sorted(waiting, key=lambda w: (w.since, w.key))
    plan = constraint.plan(np.array([w.frames for w in by_age], dtype=np.int64),
                           batch_overhead_frames=batch_overhead_frames)
    since = np.array([w.since for w in by_age])
    chosen = [(float(since[ids].min()), _closed(plan, ids, by_age, windowed=False)) for ids in plan.batches
              if due or constraint.full(len(ids), plan.padded_length(ids))]
    chosen += [(float(since[i]), _closed(plan, np.array([i]), by_age, windowed=True)) for i in plan.too_long.tolist()]
    chosen.sort(key=lambda c: c[0])
    return [closed for _, closed in chosen]
