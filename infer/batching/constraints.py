"""What may share a batch: the :class:`BatchConstraint` interface, and :class:`FixedBatch`, its simplest kind.

The planner's callers (the engine, the online batcher's policy) ask a
constraint two questions and never which kind it is, the way lhotse's
samplers take a ``SamplingConstraint``:

* :meth:`BatchConstraint.plan`: these clips (frames each, in arrival
  order) as batches in run order, with the clips too long for any batch
  left for windows (:class:`~specstore.infer.batching.planner.Plan`);
* :meth:`BatchConstraint.full`: whether a batch being filled can take no
  further clip of its length (the online batcher closes it at once).

Two kinds implement it: :class:`BudgetBatches`, which adapts a memory
:class:`~specstore.infer.batching.budget.Budget` to the planner (its length-sorted
batches that never exceed the budget), and
:class:`FixedBatch` (``size`` clips in arrival order whatever their
lengths: the baseline the planner is measured against, what
``DataLoader(batch_size=size)`` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from specstore.infer.batching.budget import Budget
from specstore.infer.batching.planner import Plan, check_lengths, plan_batches, split_fitting
from specstore.infer.errors import PlanError

__all__ = ["BatchConstraint", "BudgetBatches", "FixedBatch"]


@runtime_checkable
class BatchConstraint(Protocol):
    """A rule for cutting clips into batches; :class:`BudgetBatches` and :class:`FixedBatch` are two."""

    def plan(self, lengths: np.ndarray, *, batch_overhead_frames: float | None = None,
             pad_to: int | None = None) -> Plan:
        """Batches of ids of ``lengths`` (frames per clip, in arrival order), in run order; the clips too long
        for any batch in ``Plan.too_long``.

        ``batch_overhead_frames``: the planner's price of one more batch in
        padded frames (None: the constraint's default), for a constraint
        that trades batches against padding; ``pad_to``: every batch is
        padded to this many frames.
        """
        ...

    def full(self, size: int, padded_frames: int) -> bool:
        """Whether a batch of ``size`` clips padded to ``padded_frames`` can take no further clip of that length."""
        ...


@dataclass(frozen=True)
class BudgetBatches:
    """The planner's length-sorted batches under ``budget`` (a :class:`BatchConstraint`): what adapts a memory
    budget to the planner, so that neither imports the other's user."""

    budget: Budget

    def plan(self, lengths: np.ndarray, *, batch_overhead_frames: float | None = None,
             pad_to: int | None = None) -> Plan:
        """:func:`~specstore.infer.batching.planner.plan_batches` of ``lengths`` under the budget
        (``batch_overhead_frames`` None: the planner's default)."""
        more = {} if batch_overhead_frames is None else {"batch_overhead_frames": batch_overhead_frames}
        return plan_batches(lengths, self.budget, pad_to=pad_to, **more)

    def full(self, size: int, padded_frames: int) -> bool:
        """Whether a batch of ``size`` clips padded to ``padded_frames`` can take no further clip of its length."""
        return bool(size >= self.budget.max_batch or not self.budget.fits(size + 1, padded_frames))


@dataclass(frozen=True)
class FixedBatch:
    """``size`` clips a batch, in arrival order, whatever their lengths (a :class:`BatchConstraint`).

    ``budget``: with one, a clip too long for a batch of one under it is
    left out of the batches (``Plan.too_long``: the engine runs it in
    windows); the batches themselves are not checked against it, as a
    plain fixed-size loader would not.  Raises :class:`~specstore.infer.batching.budget.PlanError`
    for a size below 1.
    """

    size: int
    budget: Budget | None = None

    def __post_init__(self) -> None:
        if self.size < 1:
            raise PlanError(f"batch_size must be >= 1, got {self.size}")

    def plan(self, lengths: np.ndarray, *, batch_overhead_frames: float | None = None,
             pad_to: int | None = None) -> Plan:
        """Consecutive groups of :attr:`size` clips in the given order (``batch_overhead_frames`` is unused)."""
        lengths = check_lengths(lengths)
        if self.budget is None:
            ids, too_long = np.arange(len(lengths), dtype=np.int64), np.zeros(0, dtype=np.int64)
        else:
            _, ids, too_long = split_fitting(lengths, self.budget, pad_to)
        batches = [ids[i: i + self.size] for i in range(0, len(ids), self.size)]
        return Plan(lengths, batches, too_long, self.budget, name=f"fixed batches of {self.size}", pad_to=pad_to)

    def full(self, size: int, padded_frames: int) -> bool:
        """Whether ``size`` clips fill a batch (their lengths do not matter)."""
        return size >= self.size
