"""A store's clips as a map-style ``torch`` Dataset: :class:`StoreDataset`, and the features a name stands for.

Reads clips through the store's zero-copy mmap views; nothing open is
pickled (a spawned worker reopens the store lazily and refuses a store that
changed since; a forked one reads through the parent's snapshot, whose
object-store connection :mod:`specstore.store.location` opens anew in each
process), random crops are seeded by ``(seed, epoch, index)``, SpecAugment
masks stay inside real frames, and its
:attr:`~StoreDataset.lengths` (frames after cropping) are what the sampler
(:mod:`specstore.infer.data.sampler`) plans on without reading any feature data.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from specstore.common import ConfigError
from specstore.store import FeatureSpec, Store, open_store, stack_parts

from specstore.infer.data.augment import Augment, SpecAugment
from specstore.infer.data.clip_source import Item

__all__ = ["StoreDataset", "feature_specs"]

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


class StoreDataset(Dataset[Item]):
    """A map-style dataset over a store's clips; see the module docstring.

    ``specstore.store``: a path/URL or an open :class:`~specstore.store.Store`; ``feature``: which
    feature (default: the store's default; ``"mel+cqt"`` stacks several along
    the bin axis, frame by frame, see :func:`feature_specs`); ``rows``: the store rows to use
    (default all, or the labelled ones with ``labelled_only``);
    ``crop_seconds``/``crop_frames``: a random window of at most that length
    per item and epoch (None: whole clips); ``spec_augment``: masks per item
    and epoch (or an :class:`~specstore.infer.data.augment.Augment`: gain, pitch roll and masks); ``seed``: with the epoch
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
