"""Batch collation: ragged ``(n_bins, n_frames)`` arrays -> one padded tensor plus mask.

:func:`collate` pads arrays; :class:`PadCollate` is the same as a
DataLoader ``collate_fn`` over dataset items.

Padding is zeros in time, to the batch's own longest clip (optionally rounded
up to a multiple, e.g. the model's time stride, so the planner's padded length
is exactly what runs).  Values are copied unchanged: input normalisation is
the model's job (a fixed affine dB map in :class:`specstore.infer.models.ModelConfig`,
applied and re-masked inside the model), so a clip's normalised values never
depend on its batch-mates or on padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from specstore.infer.batching.budget import align_frames
from specstore.infer.data.clip_source import Item
from specstore.infer.errors import CollateError

__all__ = ["Batch", "CollateError", "PadCollate", "collate", "pad_collate"]

_NUMPY_DTYPES: dict[torch.dtype, type[np.floating]] = {
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}


@dataclass
class Batch:
    """One padded batch.

    ``x``: ``(B, 1, n_bins, T)`` values, zero beyond each clip's length;
    ``lengths``: ``(B,)`` int64 real frames; ``mask``: ``(B, T)`` bool, True
    on real frames; ``ids``: optional clip ids (e.g. store rows or dataset
    indices) in batch order; ``labels``: optional ``(B,)`` int64 labels (-1 =
    none).
    """

    x: Tensor
    lengths: Tensor
    mask: Tensor
    ids: np.ndarray | None = None
    labels: Tensor | None = None

    def __len__(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_frames(self) -> int:
        """Padded length T (frames)."""
        return int(self.x.shape[-1])

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """The same batch on ``device`` (ids stay on the host)."""
        return Batch(
            x=self.x.to(device, non_blocking=non_blocking),
            lengths=self.lengths.to(device, non_blocking=non_blocking),
            mask=self.mask.to(device, non_blocking=non_blocking),
            ids=self.ids,
            labels=None if self.labels is None else self.labels.to(device, non_blocking=non_blocking),
        )

    def pin_memory(self) -> Batch:
        """The same batch in pinned host memory (``DataLoader(pin_memory=True)`` calls this)."""
        return Batch(self.x.pin_memory(), self.lengths.pin_memory(), self.mask.pin_memory(), self.ids,
                     None if self.labels is None else self.labels.pin_memory())


def collate(
    arrays: Sequence[np.ndarray],
    *,
    pad_to: int | None = None,
    multiple_of: int = 1,
    dtype: torch.dtype = torch.float32,
    pin: bool = False,
    ids: Sequence[int] | np.ndarray | None = None,
) -> Batch:
    """Stack ``(n_bins, n_frames)`` arrays into a zero-padded :class:`Batch`.

    ``T`` is the longest clip's frames, or ``pad_to`` if given (it must be at
    least the longest), then rounded up to a multiple of ``multiple_of``.
    ``pin=True`` pins the host memory for asynchronous copies when CUDA is
    available (a no-op otherwise).  Inputs are not modified (float16 store
    views are converted while copying).
    """
    if len(arrays) == 0:
        raise CollateError("cannot collate an empty list of clips")
    if multiple_of < 1:
        raise CollateError(f"multiple_of must be >= 1, got {multiple_of}")
    for a in arrays:
        if a.ndim != 2:
            raise CollateError(f"each clip must be a 2-D (n_bins, n_frames) array, got shape {a.shape}")
    n_bins = int(arrays[0].shape[0])
    if any(int(a.shape[0]) != n_bins for a in arrays):
        raise CollateError(f"clips have different n_bins: {sorted({int(a.shape[0]) for a in arrays})}")
    lengths = np.array([a.shape[1] for a in arrays], dtype=np.int64)
    longest = int(lengths.max())
    if pad_to is not None:
        if pad_to < longest:
            raise CollateError(f"pad_to={pad_to} frames is shorter than the longest clip ({longest} frames)")
        longest = pad_to
    n_frames = int(align_frames(longest, multiple_of))
    host = np.zeros((len(arrays), 1, n_bins, n_frames), dtype=_NUMPY_DTYPES.get(dtype, np.float32))
    for i, a in enumerate(arrays):
        host[i, 0, :, : a.shape[1]] = a
    x = torch.from_numpy(host)
    if x.dtype != dtype:
        x = x.to(dtype)
    lengths_t = torch.from_numpy(lengths)
    mask = torch.arange(n_frames)[None, :] < lengths_t[:, None]
    if pin and torch.cuda.is_available():
        x, lengths_t, mask = x.pin_memory(), lengths_t.pin_memory(), mask.pin_memory()
    id_array = None if ids is None else np.asarray(ids, dtype=np.int64)
    if id_array is not None and id_array.shape != (len(arrays),):
        raise CollateError(f"ids must have one entry per clip ({len(arrays)}), got shape {id_array.shape}")
    return Batch(x=x, lengths=lengths_t, mask=mask, ids=id_array)


class PadCollate:
    """``collate_fn``: items to a :class:`~specstore.infer.data.collate.Batch` padded to the batch's longest clip.

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
