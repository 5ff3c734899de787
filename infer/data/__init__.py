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

Each piece has its own module in this folder; the package gathers them under one import, each imported
on first use:

* :class:`StoreDataset` (:mod:`specstore.infer.data.store_dataset`): a store's clips
  through its zero-copy mmap views, random crops and SpecAugment masks
  seeded by ``(seed, epoch, index)``;
* :class:`ArrayDataset`, :class:`ClipSource`, :class:`Item`
  (:mod:`specstore.infer.data.clip_source`): what the engine runs on, clips in memory;
* :class:`BudgetBatchSampler` (:mod:`specstore.infer.data.sampler`): the planner
  (:mod:`specstore.infer.batching.planner`) as a ``Sampler``, split over DDP replicas,
  resumable mid-epoch;
* :class:`PadCollate` (:mod:`specstore.infer.data.collate`): pads a batch to its own
  longest clip, rounded up to the model's time stride, into a
  :class:`~specstore.infer.data.collate.Batch` with mask, lengths and labels;
* :func:`prefetch` (:mod:`specstore.infer.data.readahead`): the loader the built-in
  commands use, a reader thread collating batches ahead of the model.
"""

from typing import TYPE_CHECKING

from specstore.common.lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
    from ...store import stack_parts
    from .augment import SpecAugment
    from .clip_source import ArrayDataset, ClipSource, Item
    from .collate import PadCollate, pad_collate
    from .readahead import prefetch
    from .sampler import BudgetBatchSampler
    from .store_dataset import StoreDataset, feature_specs
