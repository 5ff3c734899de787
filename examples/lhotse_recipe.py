"""lhotse on a specstore store: a ``CutSet`` whose features are read from the store, no copy made.

    . .venv/bin/activate      # once per shell, after make install (the README's set-up)
    python examples/lhotse_recipe.py data/demo.zarr --budget-mb 512 --epochs 1

Importing this module registers a lhotse *features reader* for the storage type
``"specstore"`` (lhotse's ``register_reader``/``FeaturesReader`` mechanism, the one its
``numpy_files`` and ``lilcom_chunky`` storages use).  :func:`cuts_from_store` then describes
every clip as a ``MonoCut`` whose ``Features`` say ``storage_type="specstore"``,
``storage_path=<the store's URL>``, ``storage_key="<feature>:<clip path>"``; lhotse loads them
through the reader, which reads the frames from the store's memory-mapped shards.  Everything
of lhotse's that works on cuts with features then works on a store: ``DynamicBucketingSampler``,
``collate_features``, manifests written with ``to_file`` and read back with ``CutSet.from_file``
(any process that imports this module can load their features), DataLoader workers.

Conventions: lhotse features are ``(frames, bins)`` with a ``frame_shift`` in seconds
(``hop_length / sample_rate``); a cut lasts exactly ``n_frames * frame_shift`` seconds, so
lhotse's frame count of each cut is the store's.  A clip's label is in ``cut.custom["label"]``
(its index in the store's label names; -1 = none) and ``cut.custom["label_name"]``.

Copy this file into your project (it needs ``pip install lhotse``; specstore itself does not).
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from lhotse import CutSet, MonoCut
from lhotse.dataset.collation import collate_features
from lhotse.features import Features
from lhotse.features.io import FeaturesReader, register_reader

from specstore.common import ConfigError
from specstore.infer.batching.budget import Budget
from specstore.store import Store, open_store

__all__ = ["STORAGE_TYPE", "GenreCutDataset", "SpecstoreReader", "cuts_from_store", "max_duration_for"]

STORAGE_TYPE = "specstore"
"""The ``storage_type`` of every ``Features`` this module writes."""

_OPEN: dict[tuple[int, str], tuple[Store, dict[str, int]]] = {}


def _opened(storage_path: str) -> tuple[Store, dict[str, int]]:
    """The store at ``storage_path`` and its path -> row map, opened once per process.

    lhotse makes a new reader for every load, so the open store is cached here; the key holds
    the process id, so a forked DataLoader worker opens its own (nothing open is shared).
    """
    key = (os.getpid(), storage_path)
    hit = _OPEN.get(key)
    if hit is None:
        s = open_store(storage_path)
        hit = _OPEN[key] = (s, {p: i for i, p in enumerate(s.paths)})
    return hit


@register_reader
class SpecstoreReader(FeaturesReader):
    """lhotse ``FeaturesReader`` for storage type ``"specstore"``: frames of one clip of a store.

    ``storage_path``: the store's URL or path; ``storage_key``: ``"<feature>:<clip path>"``.
    :meth:`read` returns ``(frames, bins)`` float32 (lhotse's layout), frames
    ``[left_offset_frames, right_offset_frames)`` only.
    """

    name = STORAGE_TYPE

    def __init__(self, storage_path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.store, self.rows = _opened(str(storage_path))

    def read(self, key: str, left_offset_frames: int = 0, right_offset_frames: int | None = None) -> np.ndarray:
        feature, sep, path = str(key).partition(":")
        row = self.rows.get(path)
        if not sep or row is None:
            raise ConfigError(f"no clip {key!r} in the store at {self.store.location} (storage keys are "
                              "'<feature>:<clip path>')")
        frames = self.store.feature(feature).frames(row)
        return np.array(frames[left_offset_frames:right_offset_frames], dtype=np.float32)


def cuts_from_store(store: str | Store, feature: str | None = None, *, rows: Sequence[int] | None = None,
                    labelled_only: bool = False) -> CutSet:
    """A lhotse ``CutSet``: one ``MonoCut`` per store clip (``rows``, default all), features in the store.

    The cut's id is the clip's path; its duration ``n_frames * hop / sample_rate`` seconds.
    """
    s = store if isinstance(store, Store) else open_store(store)
    feature = feature or s.default_feature
    if feature not in s.specs:
        raise ConfigError(f"store has no feature {feature!r}; it has {', '.join(s.specs)}")
    spec = s.specs[feature]
    shift = spec.hop_length / spec.sample_rate
    chosen = np.arange(len(s)) if rows is None else np.asarray(rows, dtype=np.int64)
    if labelled_only:
        chosen = chosen[s.labels[chosen] >= 0]
    where = str(s.location)
    cuts = []
    for row in chosen.tolist():
        path, n, label = s.paths[row], int(s.lengths[row]), int(s.labels[row])
        duration = n * shift
        feats = Features(type=f"specstore-{feature}", num_frames=n, num_features=spec.n_bins, frame_shift=shift,
                         sampling_rate=spec.sample_rate, start=0.0, duration=duration, storage_type=STORAGE_TYPE,
                         storage_path=where, storage_key=f"{feature}:{path}", recording_id=path, channels=0)
        cuts.append(MonoCut(id=path, start=0.0, duration=duration, channel=0, features=feats, custom={
            "label": label, "label_name": s.label_names[label] if label >= 0 else None, "row": row}))
    return CutSet.from_cuts(cuts)


def max_duration_for(budget: Budget, frame_shift: float) -> float:
    """lhotse's ``max_duration`` (seconds of padded audio per batch: cuts x longest) for a specstore budget.

    The budget charges ``B * T * cost_per_frame + fixed_overhead`` bytes; lhotse's sampler caps
    ``B * longest duration``, so the same memory is ``(budget - fixed) / cost_per_frame`` frames
    of padded audio.  (lhotse does not round lengths up to the model's time stride, and lets a
    batch go over when a longer cut arrives; the bench measures how often.)
    """
    frames = (budget.budget_bytes - budget.fixed_overhead) / budget.cost_per_frame
    return math.floor(frames) * frame_shift


class GenreCutDataset(torch.utils.data.Dataset):
    """A lhotse-style dataset: the sampler hands it a ``CutSet`` (one batch), it returns the batch.

    ``features``: ``(B, T, bins)`` float32 from ``collate_features`` (lhotse pads with its own
    log-energy floor); ``x``: the same as ``(B, 1, bins, T)``, zero beyond each length, the
    layout specstore models take; ``lengths`` int64 frames; ``labels`` int64; ``cut_ids``.
    Use it as ``DataLoader(GenreCutDataset(), sampler=DynamicBucketingSampler(...), batch_size=None)``.
    """

    def __getitem__(self, cuts: CutSet) -> dict[str, Any]:
        features, lengths = collate_features(cuts)
        lengths = lengths.to(torch.int64)
        keep = torch.arange(features.shape[1])[None, :] < lengths[:, None]
        x = (features * keep[:, :, None]).transpose(1, 2).unsqueeze(1).contiguous()
        labels = torch.tensor([c.custom["label"] for c in cuts], dtype=torch.int64)
        return {"features": features, "x": x, "lengths": lengths, "labels": labels, "cut_ids": [c.id for c in cuts]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Bucket a store's labelled clips with lhotse's ``DynamicBucketingSampler``; print what the batches cost."""
    from lhotse.dataset import DynamicBucketingSampler
    from torch.utils.data import DataLoader

    from specstore.infer.batching.budget import Budget

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--feature", default=None)
    p.add_argument("--budget-mb", type=float, default=512.0, help="memory one batch may use, MiB")
    p.add_argument("--cost-kib", type=float, default=33.0, help="a model's KiB per padded clip-frame")
    p.add_argument("--buckets", type=int, default=10,
                   help="lhotse buckets (fewer when the store has fewer labelled clips)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--workers", type=int, default=0)
    args = p.parse_args(argv)
    cuts = cuts_from_store(args.store, args.feature, labelled_only=True)
    shift = next(iter(cuts)).frame_shift
    budget = Budget(int(args.budget_mb * 2**20), args.cost_kib * 1024)
    max_duration = max_duration_for(budget, shift)
    sampler = DynamicBucketingSampler(cuts, max_duration=max_duration, num_buckets=min(args.buckets, len(cuts)),
                                      shuffle=True)  # lhotse needs a cut per bucket
    loader = DataLoader(GenreCutDataset(), sampler=sampler, batch_size=None, num_workers=args.workers)
    real = computed = batches = over = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for batch in loader:
            n, t = batch["features"].shape[:2]
            real += int(batch["lengths"].sum())
            computed += n * t
            batches += 1
            over += int(not budget.fits(n, t))
    print(f"{len(cuts)} cuts, max_duration {max_duration:.1f} s: {batches} batches, padding efficiency "
          f"{real / max(computed, 1):.3f}, {over} over the budget")
    return {"cuts": len(cuts), "batches": batches, "efficiency": real / max(computed, 1), "over_budget": over,
            "max_duration": max_duration}


if __name__ == "__main__":
    main()
