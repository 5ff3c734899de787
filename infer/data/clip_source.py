"""Clips the engine runs on, by index: the :class:`ClipSource` protocol, one :class:`Item`, clips in memory.

:meth:`specstore.infer.engine.runtime.Engine.clip_logits` runs any :class:`ClipSource`: a
store's :class:`~specstore.infer.data.store_dataset.StoreDataset` or the
:class:`ArrayDataset` of clips that never went into a store
(``specstore classify``, the server's queued uploads).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from torch.utils.data import Dataset

from specstore.common import ConfigError

__all__ = ["ArrayDataset", "ClipSource", "Item"]


@dataclass
class Item:
    """One dataset item: ``features`` ``(n_bins, n_frames)`` float32, ``label`` (-1 = none), ``index``, ``row``."""

    features: np.ndarray
    label: int
    index: int
    row: int


class ClipSource(Protocol):
    """What :meth:`specstore.infer.engine.runtime.Engine.clip_logits` runs on: whole clips by index.

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
