"""The planner as a ``torch`` BatchSampler: :class:`BudgetBatchSampler`, with its split over replicas.

Length-binned batches that never exceed the memory budget, reshuffled
every epoch (``set_epoch``), split over ``num_replicas`` ranks for
DistributedDataParallel (disjoint, the same number of batches on every
rank, no clip lost or duplicated), with ``state_dict``/``load_state_dict``
to resume mid-epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from specstore.common import ConfigError

from specstore.infer.batching.budget import Budget, CostModel
from specstore.infer.options.defaults import MAX_BATCH
from specstore.infer.batching.planner import DEFAULT_BATCH_OVERHEAD_FRAMES, Plan, plan_batches, training_plan
from specstore.infer.data.store_dataset import StoreDataset

__all__ = ["BudgetBatchSampler"]

_MIB = 1 << 20


class BudgetBatchSampler(Sampler[list[int]]):
    """The planner's budgeted, length-binned batches of dataset indices as a ``BatchSampler``.

    ``source``: a :class:`StoreDataset` (its ``lengths``, after cropping) or
    an array of frames per index.  The budget is ``budget`` (a
    :class:`~specstore.infer.batching.budget.Budget`) or built from ``budget_mb`` (MiB),
    ``cost`` (a model's :class:`~specstore.infer.batching.budget.CostModel`, e.g.
    :func:`specstore.infer.engine.cost.measure_cost_per_frame`), ``max_batch`` and
    ``frame_align`` (the model's time stride).  ``shuffle``: new batches
    every epoch with padding efficiency >= 0.95
    (:func:`specstore.infer.batching.planner.training_plan`); otherwise the sorted inference
    plan (:func:`specstore.infer.batching.planner.plan_batches`).  ``num_replicas``/``rank``:
    this rank's share for DistributedDataParallel.  ``batch_overhead_frames``:
    the sorted plan's price of one more batch, in padded frames
    (:func:`~specstore.infer.batching.planner.plan_batches`).  ``too_long``: what to do
    with clips that exceed the budget alone: ``"raise"`` (default; crop
    them, or raise the budget) or ``"leave"`` (left out of the batches and
    listed in :attr:`too_long_indices`, for a caller that runs them in
    windows).  ``pad_to``: every batch will be padded to this many frames
    (equal windows, :class:`PadCollate` ``pad_to``), so the plan charges
    that.  ``epoch_items``: with ``shuffle``, each epoch plans a fresh random
    subset of this many indices (seeded by ``(seed, epoch)``) instead of all
    of them (all of them when there are no more): a dataset holding several random crops of every clip then
    trains a fixed number of crops an epoch, each clip's share varying from
    epoch to epoch.  :attr:`plan` is the current epoch's
    :class:`~specstore.infer.batching.planner.Plan` of this rank's batches (its ``efficiency``
    is the padding figure the commands report).
    """

    def __init__(self, source: StoreDataset | np.ndarray | Sequence[int], budget: Budget | None = None, *,
                 budget_mb: float | None = None, cost: CostModel | None = None, max_batch: int = MAX_BATCH,
                 frame_align: int = 1, shuffle: bool = False, seed: int = 0, num_replicas: int = 1,
                 rank: int = 0, too_long: str = "raise", pad_to: int | None = None,
                 batch_overhead_frames: float = DEFAULT_BATCH_OVERHEAD_FRAMES,
                 epoch_items: int | None = None) -> None:
        self.dataset = source if isinstance(source, StoreDataset) else None
        self.lengths = np.asarray(source.lengths if isinstance(source, StoreDataset) else source, dtype=np.int64)
        if budget is None:
            if budget_mb is None or cost is None:
                raise ConfigError("give a Budget, or budget_mb and the model's cost")
            if not (budget_mb > 0 and math.isfinite(budget_mb)):
                raise ConfigError(f"budget_mb must be a positive, finite number of MiB, got {budget_mb!r}")
            budget = Budget.for_cost(int(budget_mb * _MIB), cost, max_batch=max_batch, frame_align=frame_align,
                                     source="budget_mb")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ConfigError(f"rank must lie in [0, num_replicas), got rank {rank} of {num_replicas}")
        if epoch_items is not None and (epoch_items < 1 or not shuffle):
            raise ConfigError(f"epoch_items must be >= 1 and needs shuffle=True, got {epoch_items!r}")
        if too_long not in ("raise", "leave"):
            raise ConfigError(f"too_long must be 'raise' or 'leave', not {too_long!r}")
        self.budget = budget
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.too_long = too_long
        self.pad_to = pad_to
        self.batch_overhead_frames = float(batch_overhead_frames)
        self.epoch_items = epoch_items
        self.epoch = 0
        self._skip = 0  # batches of this epoch already done (a resumed run starts after them)
        self._yielded = 0
        self._plan_cache: tuple[int, Plan, list[list[int]]] | None = None
        self.too_long_indices = np.zeros(0, dtype=np.int64)
        self.epoch_batches()  # plan epoch 0 now: bad budgets and too-long clips fail at construction

    # -- planning --------------------------------------------------------------------------------
    def _plan(self) -> Plan:
        if self.shuffle and self.epoch_items is not None and self.epoch_items < len(self.lengths):
            rng = np.random.default_rng([self.seed, self.epoch, 2])  # stream 2: apart from the plan's own draws
            kept = np.sort(rng.choice(len(self.lengths), self.epoch_items, replace=False))
            sub = training_plan(self.lengths[kept], self.budget, seed=self.seed, epoch=self.epoch,
                                pad_to=self.pad_to)
            return Plan(self.lengths, [kept[b] for b in sub.batches], kept[sub.too_long], sub.budget,
                        name=f"{sub.name}, {self.epoch_items} of {len(self.lengths)} items", pad_to=sub.pad_to)
        if self.shuffle:
            return training_plan(self.lengths, self.budget, seed=self.seed, epoch=self.epoch, pad_to=self.pad_to)
        return plan_batches(self.lengths, self.budget, pad_to=self.pad_to,
                            batch_overhead_frames=self.batch_overhead_frames)

    def _planned(self) -> tuple[Plan, list[list[int]]]:
        """This rank's plan and batches of the current epoch (planned once per epoch)."""
        if self._plan_cache is not None and self._plan_cache[0] == self.epoch:
            return self._plan_cache[1], self._plan_cache[2]
        plan = self._plan()
        self.too_long_indices = plan.too_long
        if len(plan.too_long) and self.too_long == "raise":
            longest = int(self.lengths[plan.too_long].max())
            raise ConfigError(f"{len(plan.too_long)} clip(s) are too long for one batch under the budget "
                              f"(longest {longest} frames, at most {self.budget.max_window} fit); crop them "
                              "(crop_seconds) or raise the budget")
        batches = [b.tolist() for b in plan.batches]
        if self.num_replicas > 1:
            batches = _split_for_replicas(batches, self.num_replicas, self.lengths)[self.rank::self.num_replicas]
            plan = Plan(plan.lengths, [np.asarray(b, dtype=np.int64) for b in batches], plan.too_long, plan.budget,
                        name=f"{plan.name}, rank {self.rank} of {self.num_replicas}", pad_to=plan.pad_to)
        self._plan_cache = (self.epoch, plan, batches)
        return plan, batches

    @property
    def plan(self) -> Plan:
        """The current epoch's :class:`~specstore.infer.batching.planner.Plan` of this rank's batches (in run order)."""
        return self._planned()[0]

    def epoch_batches(self) -> list[list[int]]:
        """This rank's batches of the current epoch (planned once per epoch), as lists of indices."""
        return self._planned()[1]

    # -- the Sampler protocol -----------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Plan epoch ``epoch`` (and set the dataset's epoch, for its crops and masks)."""
        if int(epoch) != self.epoch:
            self._skip = 0
        self.epoch = int(epoch)
        if self.dataset is not None:
            self.dataset.set_epoch(self.epoch)

    def __len__(self) -> int:
        return len(self.epoch_batches()) - self._skip

    def __iter__(self) -> Iterator[list[int]]:
        batches = self.epoch_batches()
        skip, self._skip = self._skip, 0
        self._yielded = skip
        for batch in batches[skip:]:
            self._yielded += 1
            yield batch

    # -- resuming ---------------------------------------------------------------------------------
    def state_dict(self, batches_done: int | None = None) -> dict[str, Any]:
        """Where this rank stands: the epoch and how many of its batches are done.

        ``batches_done`` defaults to the batches this sampler has handed out
        in the epoch.  With DataLoader workers, which fetch ahead, pass the
        number of batches your loop has finished instead.
        """
        done = self._yielded if batches_done is None else int(batches_done)
        return {"epoch": self.epoch, "batches_done": done, "seed": self.seed, "num_replicas": self.num_replicas,
                "rank": self.rank, "shuffle": self.shuffle}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`: the next iteration yields the epoch's remaining batches."""
        for key in ("seed", "num_replicas", "rank", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ConfigError(f"the sampler state was saved with {key}={state[key]!r}, this sampler has "
                                  f"{getattr(self, key)!r}")
        self.set_epoch(int(state["epoch"]))
        total = len(self.epoch_batches())
        done = int(state["batches_done"])
        if not 0 <= done <= total:
            raise ConfigError(f"batches_done={done} is outside this epoch's {total} batches")
        self._skip = done
        self._yielded = done


def _split_for_replicas(batches: list[list[int]], replicas: int, lengths: np.ndarray) -> list[list[int]]:
    """Make the batch count a multiple of ``replicas`` by splitting the largest batches in two.

    Splitting keeps every batch within the budget and every clip exactly
    once; batch order is kept (a split batch's halves stay in place).
    Raises when there are fewer clips than replicas.
    """
    if replicas == 1 or not batches:
        return batches
    n_clips = sum(len(b) for b in batches)
    if n_clips < replicas:
        raise ConfigError(f"{n_clips} clip(s) cannot give each of {replicas} ranks a batch")
    out = [list(b) for b in batches]
    while len(out) % replicas:
        k = max(range(len(out)), key=lambda i: (len(out[i]), -i))
        big = out[k]
        if len(big) < 2:
            raise ConfigError(f"{n_clips} clip(s) cannot be split into a multiple of {replicas} batches")
        order = sorted(big, key=lambda i: -int(lengths[i]))
        out[k:k + 1] = [order[0::2], order[1::2]]
    return out
