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

Each piece has its own module; this one gathers them under one import:

* :class:`StoreDataset` (:mod:`specstore.infer.store_dataset`): a store's clips
  through its zero-copy mmap views, random crops and SpecAugment masks
  seeded by ``(seed, epoch, index)``;
* :class:`ArrayDataset`, :class:`ClipSource`, :class:`Item`
  (:mod:`specstore.infer.clip_source`): what the engine runs on, clips in memory;
* :class:`BudgetBatchSampler` (:mod:`specstore.infer.sampler`): the planner
  (:mod:`specstore.infer.planner`) as a ``Sampler``, split over DDP replicas,
  resumable mid-epoch;
* :class:`PadCollate` (:mod:`specstore.infer.collate`): pads a batch to its own
  longest clip, rounded up to the model's time stride, into a
  :class:`~specstore.infer.collate.Batch` with mask, lengths and labels;
* :func:`prefetch` (:mod:`specstore.infer.readahead`): the loader the built-in
  commands use, a reader thread collating batches ahead of the model.
"""

from __future__ import annotations

from specstore.store import stack_parts

from .augment import SpecAugment
from .clip_source import ArrayDataset, ClipSource, Item
from .collate import PadCollate, pad_collate
from .readahead import prefetch
from .sampler import BudgetBatchSampler
from .store_dataset import StoreDataset, feature_specs

__all__ = [
    "ArrayDataset", "BudgetBatchSampler", "ClipSource", "Item", "PadCollate", "SpecAugment", "StoreDataset",
    "feature_specs", "pad_collate", "prefetch", "stack_parts",
]
