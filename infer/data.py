"""Feeding a store to a model: a map-style Dataset, the budgeted BatchSampler, a padding collate, a loader.

The three pieces plug into a standard ``torch.utils.data.DataLoader``::

    ds = StoreDataset("data/gtzan.zarr", feature="mel", crop_seconds=10, labelled_only=True)
    sampler = BudgetBatchSampler(ds, budget_mb=2048, cost=measure_cost_per_frame(model, ds.n_bins, training=True),
                                 shuffle=True, seed=0, frame_align=time_stride(model))
    loader = DataLoader(ds, batch_sampler=sampler, collate_fn=PadCollate(time_stride(model)), num_workers=4)
    for epoch in range(30):
        sampler.set_epoch(epoch)          # also sets the dataset's epoch (its crops)
        for batch in loader:              # batch.x (B, 1, F, T), .lengths, .mask, .labels, .ids
            ...

* :class:`StoreDataset` reads clips through the store's zero-copy mmap views;
  nothing open is pickled (each worker reopens the store lazily, fork or
  spawn alike, and refuses a store that changed since), random crops are
  seeded by ``(seed, epoch, index)``, SpecAugment masks stay inside real
  frames, and its :attr:`~StoreDataset.lengths` (frames after cropping) are
  what the sampler plans on without reading any feature data.
* :class:`BudgetBatchSampler` is the planner (:mod:`infer.planner`) as a
  ``Sampler``: length-binned batches that never exceed the memory budget,
  reshuffled every epoch (``set_epoch``), split over ``num_replicas`` ranks
  for DistributedDataParallel (disjoint, the same number of batches on every
  rank, no clip lost or duplicated), with ``state_dict``/``load_state_dict``
  to resume mid-epoch.
* :class:`PadCollate` pads a batch to its own longest clip, rounded up to the
  model's time stride, and returns a :class:`~infer.collate.Batch` with the
  mask, lengths and labels (``pin_memory`` aware).
* :func:`prefetch` is the loader the built-in commands use: a reader thread
  collating batches ahead of the model (measured faster than DataLoader
  worker processes for mmap-backed stores on a 2-core machine; see ``make
  bench``), with the same iteration contract as a ``DataLoader``.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler

from store import ConfigError, FeatureSpec, Store, open_store, stack_parts

from .augment import Augment, SpecAugment
from .budget import Budget, CostModel
from .collate import Batch, collate
from .defaults import MAX_BATCH
from .planner import DEFAULT_BATCH_OVERHEAD_FRAMES, Plan, plan_batches, training_plan

__all__ = [
    "ArrayDataset", "BudgetBatchSampler", "ClipSource", "Item", "PadCollate", "SpecAugment", "StoreDataset",
    "feature_specs", "pad_collate", "prefetch", "stack_parts",
]

log = logging.getLogger(__name__)

_MIB = 1 << 20
_CROP_STREAM = 0xC209
_MASK_STREAM = 0x5A5C


def feature_specs(store: Store, feature: str | None = None) -> dict[str, FeatureSpec]:
    """The stored features a feature name stands for, in order: ``"mel"``, or ``"mel+cqt"`` for several
    stacked along the bin axis (they share the store's frame grid).  Default: the store's default feature."""
    name = feature or store.default_feature
    parts = [p.strip() for p in name.split("+")]
    missing = [p for p in parts if p not in store.specs]
    if missing or not all(parts) or len(set(parts)) != len(parts):
        raise ConfigError(f"feature {name!r} is not one of the store's features ({', '.join(store.specs)}) or "
                          "a '+'-joined list of them, each once")
    return {p: store.specs[p] for p in parts}


def _rng(seed: int, epoch: int, index: int, stream: int) -> np.random.Generator:
    """A generator for one item of one epoch: independent of worker, process and order."""
    return np.random.default_rng((stream, int(seed), int(epoch), int(index)))


@dataclass
class Item:
    """One dataset item: ``features`` ``(n_bins, n_frames)`` float32, ``label`` (-1 = none), ``index``, ``row``."""

    features: np.ndarray
    label: int
    index: int
    row: int


class StoreDataset(Dataset[Item]):
    """A map-style dataset over a store's clips; see the module docstring.

    ``store``: a path/URL or an open :class:`~store.Store`; ``feature``: which
    feature (default: the store's default; ``"mel+cqt"`` stacks several along
    the bin axis, frame by frame, see :func:`feature_specs`); ``rows``: the store rows to use
    (default all, or the labelled ones with ``labelled_only``);
    ``crop_seconds``/``crop_frames``: a random window of at most that length
    per item and epoch (None: whole clips); ``spec_augment``: masks per item
    and epoch (or an :class:`~infer.augment.Augment`: gain, pitch roll and masks); ``seed``: with the epoch
    and the index, every random draw.
    """

    def __init__(self, store: str | os.PathLike[str] | Store, feature: str | None = None, *,
                 rows: Sequence[int] | np.ndarray | None = None, labelled_only: bool = False,
                 crop_seconds: float | None = None, crop_frames: int | None = None,
                 spec_augment: SpecAugment | Augment | None = None, seed: int = 0) -> None:
        s = store if isinstance(store, Store) else open_store(store)
        self._where = s.location
        self._generation = s.generation
        self._store: Store | None = s
        self.specs = feature_specs(s, feature)
        self.feature = "+".join(self.specs)
        self.spec = next(iter(self.specs.values()))  # the frame grid all parts share
        if rows is None:
            chosen = np.flatnonzero(s.labels >= 0) if labelled_only else np.arange(len(s))
        else:
            chosen = np.asarray(rows, dtype=np.int64)
            if len(chosen) and (chosen.min() < 0 or chosen.max() >= len(s)):
                raise ConfigError(f"rows must lie in [0, {len(s)}) for a store of {len(s)} clips")
            if labelled_only:
                chosen = chosen[s.labels[chosen] >= 0]
        self.rows = chosen.astype(np.int64)
        self.labels = s.labels[self.rows].astype(np.int64)
        self.full_lengths = s.lengths[self.rows].astype(np.int64)
        if crop_seconds is not None and crop_frames is not None:
            raise ConfigError("give crop_seconds or crop_frames, not both")
        if crop_seconds is not None:
            if not (crop_seconds > 0 and math.isfinite(crop_seconds)):
                raise ConfigError(f"crop_seconds must be positive, got {crop_seconds!r}")
            crop_frames = max(1, int(round(crop_seconds / self.spec.frame_seconds)))
        if crop_frames is not None and crop_frames < 1:
            raise ConfigError(f"crop_frames must be >= 1, got {crop_frames}")
        self.crop_frames = crop_frames
        self.spec_augment = spec_augment
        self.seed = int(seed)
        self.epoch = 0

    # -- pickling: nothing open crosses a process boundary ------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_store"] = None
        return state

    def _open(self) -> Store:
        if self._store is None:
            s = open_store(self._where)
            if s.generation != self._generation:
                raise ConfigError(f"the store at {self._where} changed since this dataset was made (commit "
                                  f"{self._generation} -> {s.generation}); make the dataset again")
            self._store = s
        return self._store

    # -- the Dataset protocol ---------------------------------------------------------------------
    @property
    def n_bins(self) -> int:
        """Rows of each item's features (mel and/or CQT bins)."""
        return sum(spec.n_bins for spec in self.specs.values())

    @property
    def lengths(self) -> np.ndarray:
        """Frames of each item as served (after cropping): what :class:`BudgetBatchSampler` plans on."""
        if self.crop_frames is None:
            return self.full_lengths
        return np.minimum(self.full_lengths, self.crop_frames)

    def set_epoch(self, epoch: int) -> None:
        """Draw this epoch's crops and masks (the sampler's ``set_epoch`` calls it)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.rows)

    def window(self, index: int, start: int, stop: int) -> np.ndarray:
        """Frames ``[start, stop)`` of item ``index`` as a ``(n_bins, stop - start)`` float32 copy."""
        s, row = self._open(), int(self.rows[index])
        return stack_parts([s.feature(name).frames(row)[start:stop] for name in self.specs])

    def __getitem__(self, index: int) -> Item:
        index = int(index)
        if not 0 <= index < len(self.rows):
            raise IndexError(f"item {index} out of range for a dataset of {len(self.rows)} items")
        full = int(self.full_lengths[index])
        start, stop = 0, full
        if self.crop_frames is not None and full > self.crop_frames:
            rng = _rng(self.seed, self.epoch, index, _CROP_STREAM)
            start = int(rng.integers(0, full - self.crop_frames + 1))
            stop = start + self.crop_frames
        x = self.window(index, start, stop)
        if self.spec_augment is not None:
            self.spec_augment(x, _rng(self.seed, self.epoch, index, _MASK_STREAM))
        return Item(x, int(self.labels[index]), index, int(self.rows[index]))

    def __repr__(self) -> str:
        crop = "whole clips" if self.crop_frames is None else f"crops of {self.crop_frames} frames"
        return f"<StoreDataset {len(self)} clips of {self.feature}({self.n_bins}) at {self._where}, {crop}>"


class ClipSource(Protocol):
    """What :meth:`infer.runtime.Engine.clip_logits` runs on: whole clips by index.

    :class:`StoreDataset` (clips in a store) and :class:`ArrayDataset`
    (clips in memory) both are one.  ``lengths``: frames per clip (int64);
    ``rows``: an id per clip (store rows, or positions); ``labels``: -1 for
    none; ``n_bins``: rows of every clip; ``window(i, start, stop)``: frames
    ``[start, stop)`` of clip ``i`` as ``(n_bins, stop - start)`` float32.
    """

    rows: np.ndarray
    labels: np.ndarray

    @property
    def lengths(self) -> np.ndarray: ...

    @property
    def n_bins(self) -> int: ...

    def window(self, index: int, start: int, stop: int) -> np.ndarray: ...

    def __getitem__(self, index: int) -> Item: ...

    def __len__(self) -> int: ...


class ArrayDataset(Dataset[Item]):
    """Whole clips held in memory, as a :class:`ClipSource`: ``(n_bins, n_frames)`` float32 arrays.

    For clips that never went into a store (``specstore classify``, the
    server's queued uploads).  ``labels``: one per clip (-1 = none, the
    default).  The arrays are used as given, not copied; every clip must
    have the same ``n_bins`` and at least one frame.
    """

    def __init__(self, arrays: Sequence[np.ndarray], labels: Sequence[int] | None = None) -> None:
        self.arrays = list(arrays)
        bins = {int(a.shape[0]) for a in self.arrays if a.ndim == 2}
        if any(a.ndim != 2 or a.shape[1] < 1 for a in self.arrays) or len(bins) > 1:
            raise ConfigError("clips must be (n_bins, n_frames) arrays with the same n_bins and >= 1 frame")
        self._n_bins = bins.pop() if bins else 0
        self.rows = np.arange(len(self.arrays), dtype=np.int64)
        self.labels = (np.full(len(self.arrays), -1, dtype=np.int64) if labels is None
                       else np.asarray(labels, dtype=np.int64))
        if len(self.labels) != len(self.arrays):
            raise ConfigError(f"{len(self.labels)} labels for {len(self.arrays)} clips")
        self._lengths = np.array([a.shape[1] for a in self.arrays], dtype=np.int64)

    @property
    def lengths(self) -> np.ndarray:
        """Frames of each clip."""
        return self._lengths

    @property
    def n_bins(self) -> int:
        """Rows of each clip."""
        return self._n_bins

    def __len__(self) -> int:
        return len(self.arrays)

    def window(self, index: int, start: int, stop: int) -> np.ndarray:
        """Frames ``[start, stop)`` of clip ``index`` as a ``(n_bins, stop - start)`` float32 array."""
        return np.asarray(self.arrays[index][:, start:stop], dtype=np.float32)

    def __getitem__(self, index: int) -> Item:
        index = int(index)
        if not 0 <= index < len(self.arrays):
            raise IndexError(f"item {index} out of range for a dataset of {len(self.arrays)} clips")
        return Item(self.window(index, 0, int(self._lengths[index])), int(self.labels[index]), index, index)


class PadCollate:
    """``collate_fn``: items to a :class:`~infer.collate.Batch` padded to the batch's longest clip.

    ``multiple_of``: round the padded length up to it (the model's time
    stride); ``pad_to``: pad every batch to exactly this many frames (equal
    windows for models that ignore ``lengths``).  Labels and item indices
    come along (``batch.labels``, ``batch.ids``).  Picklable, so it works
    with DataLoader workers; ``DataLoader(pin_memory=True)`` pins the batch.
    """

    def __init__(self, multiple_of: int = 1, *, pad_to: int | None = None) -> None:
        self.multiple_of = int(multiple_of)
        self.pad_to = pad_to

    def __call__(self, items: Sequence[Item]) -> Batch:
        batch = collate([it.features for it in items], multiple_of=self.multiple_of, pad_to=self.pad_to,
                        ids=[it.index for it in items])
        batch.labels = torch.tensor([it.label for it in items], dtype=torch.int64)
        return batch


pad_collate = PadCollate()
"""``collate_fn`` padding to the batch's longest clip (no stride rounding); see :class:`PadCollate`."""


class BudgetBatchSampler(Sampler[list[int]]):
    """The planner's budgeted, length-binned batches of dataset indices as a ``BatchSampler``.

    ``source``: a :class:`StoreDataset` (its ``lengths``, after cropping) or
    an array of frames per index.  The budget is ``budget`` (a
    :class:`~infer.budget.Budget`) or built from ``budget_mb`` (MiB),
    ``cost`` (a model's :class:`~infer.budget.CostModel`, e.g.
    :func:`infer.cost.measure_cost_per_frame`), ``max_batch`` and
    ``frame_align`` (the model's time stride).  ``shuffle``: new batches
    every epoch with padding efficiency >= 0.95
    (:func:`infer.planner.training_plan`); otherwise the sorted inference
    plan (:func:`infer.planner.plan_batches`).  ``num_replicas``/``rank``:
    this rank's share for DistributedDataParallel.  ``batch_overhead_frames``:
    the sorted plan's price of one more batch, in padded frames
    (:func:`~infer.planner.plan_batches`).  ``too_long``: what to do
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
    :class:`~infer.planner.Plan` of this rank's batches (its ``efficiency``
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
        """The current epoch's :class:`~infer.planner.Plan` of this rank's batches (in run order)."""
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


_DONE = object()


def prefetch(dataset: Any, batches: Iterable[Sequence[int]] | Iterable[np.ndarray], collate_fn: Any, *,
             ahead: int = 2, pin: bool = False) -> Iterator[Batch]:
    """Yield ``collate_fn([dataset[i] for i in batch])`` for each batch, read ``ahead`` batches early.

    One reader thread (reads from mmap views release the GIL in their
    copies); errors in it are re-raised here; closing the generator stops it.
    ``pin``: pin each batch's memory for asynchronous copies to CUDA.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=max(1, ahead))
    stop = threading.Event()

    def put(item: Any) -> None:
        """Hand ``item`` over; give up once the consumer has gone (a blocking put would hang the close)."""
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def produce() -> None:
        try:
            for ids in batches:
                if stop.is_set():
                    return
                batch = collate_fn([dataset[int(i)] for i in ids])
                if pin and torch.cuda.is_available():
                    batch = batch.pin_memory()
                put(batch)
        except BaseException as e:  # handed to the consumer
            put(e)
            return
        put(_DONE)

    thread = threading.Thread(target=produce, name="specstore-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)

