"""Clips in windows: every way the engine cuts a clip into windows, and how it combines their results.

Three strategies, each named for what it does:

* :func:`run_windowed` (pooled sums over owned spans): a clip too long for
  any batch, on a model that exposes ``pooled_sum``; exact (below);
* :func:`mean_of_windows` (disjoint windows, logits averaged): a clip too
  long for any batch, on a model that masks padding but has no
  ``pooled_sum``; approximate;
* :class:`TiledClips` (equal tiles of every clip, logits averaged per
  clip): every clip, on a model that does not mask padding and so only
  ever sees inputs of its fixed ``window_frames`` (:mod:`specstore.infer.models.contract`).

All three cut their spans with :func:`windows_for`.

Pooled sums: a clip longer than the planner's ``max_window`` (frames) runs as several
windows.  Each window yields MaskedGAP's numerator and denominator over the
part of the clip it *owns*; the clip's logits are
``classify(sum of sums, sum of counts)``, i.e. the masked average over all
frames, as if the clip had run whole.

Windows start at multiples of ``hop`` and may overlap by ``max_window - hop``
frames (2 x ``context``).  Ownership splits each overlap in the middle, so
the owned spans partition ``[0, length)`` exactly (no frame dropped or counted
twice), and every owned frame has at least ``context`` frames of real
neighbours on each side inside its window (except at the clip's own ends,
where the full clip has none either).  All boundaries are multiples of the
model's time stride, so a window's pooling grid matches the full clip's.
Consequences, for a model in eval mode:

* with ``context >= model.receptive_field``, windowed logits equal full-clip
  logits up to float rounding (the default context);
* with ``context = 0`` (disjoint windows) they differ only through the few
  output frames whose receptive field crosses a seam;
* a model with a one-frame receptive field in time is exact for any windows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict, Unpack

import numpy as np
import torch
from torch import Tensor

from specstore.infer.batching.budget import align_frames
from specstore.infer.data.clip_source import ClipSource, Item
from specstore.infer.data.collate import collate
from specstore.infer.engine.device import amp
from specstore.infer.errors import WindowError
from specstore.infer.models import MaskedClassifier
from specstore.infer.models.contract import window_align

__all__ = [
    "TiledClips", "WindowError", "WindowOptions", "default_context", "mean_of_windows", "owned_spans", "run_windowed",
    "tile_spans", "windowed_pooled_sum", "windows_for",
]


def windows_for(length: int, max_window: int, *, hop: int | None = None, align: int = 1) -> list[tuple[int, int]]:
    """``(start, stop)`` frame ranges covering ``[0, length)`` with no gap.

    ``max_window`` is rounded down to a multiple of ``align`` (the model's
    time stride), ``hop`` (default: the window, i.e. disjoint windows) too;
    windows start at ``k * hop`` and the last one is cut at ``length``.
    Raises :class:`WindowError` if the rounded window or hop is below
    ``align`` or the hop exceeds the window (that would leave gaps).
    """
    if length < 1:
        raise WindowError(f"clip length must be >= 1 frame, got {length}")
    if align < 1:
        raise WindowError(f"align must be >= 1, got {align}")
    window = max_window // align * align
    if window < align:
        raise WindowError(f"max_window={max_window} frames is shorter than the alignment ({align} frames)")
    step = window if hop is None else hop // align * align
    if step < align or step > window:
        raise WindowError(f"hop must be between {align} and {window} frames (a multiple of {align}), got {hop}")
    spans: list[tuple[int, int]] = []
    start = 0
    while True:
        stop = min(start + window, length)
        spans.append((start, stop))
        if stop == length:
            return spans
        start += step


def tile_spans(length: int, window: int) -> list[tuple[int, int]]:
    """``(start, stop)`` tiles of exactly ``window`` frames covering ``[0, length)``.

    The disjoint windows of :func:`windows_for`, except that the last one
    ends at the clip's end (overlapping the one before) so every tile is
    whole; a clip shorter than ``window`` is one tile of its own length
    (padded to ``window`` by the collate).
    """
    spans = windows_for(length, window)
    if len(spans) > 1 and spans[-1][1] - spans[-1][0] < window:
        spans[-1] = (length - window, length)
    return spans


def owned_spans(windows: list[tuple[int, int]], *, align: int = 1) -> list[tuple[int, int]]:
    """The part of each window that counts: overlaps split in the middle (on ``align``).

    For windows from :func:`windows_for`, the result partitions
    ``[0, windows[-1][1])``.
    """
    owned: list[tuple[int, int]] = []
    lo = windows[0][0]
    for (_, stop), (next_start, _) in zip(windows, windows[1:], strict=False):
        overlap = stop - next_start
        boundary = next_start + overlap // (2 * align) * align
        owned.append((lo, boundary))
        lo = boundary
    owned.append((lo, windows[-1][1]))
    return owned


def default_context(model: MaskedClassifier, max_window: int) -> int:
    """Context frames per side: the receptive field rounded up to the model's window alignment (its time
    stride, or its pooling window), capped at a quarter window."""
    stride = window_align(model)
    wanted = int(align_frames(model.receptive_field, stride))
    cap = (max_window // stride * stride) // 4 // stride * stride
    return min(wanted, cap)


class WindowOptions(TypedDict, total=False):
    """How :func:`windowed_pooled_sum` and :func:`run_windowed` run a clip's windows (their keyword options; the
    defaults are :func:`windowed_pooled_sum`'s)."""

    context: int | None  # frames of overlap on each side of an owned span
    device: torch.device | str | None  # where the windows run (default: the model's)
    dtype: torch.dtype  # the batches' float type
    autocast: torch.dtype | None  # mixed precision's float type, or None for none


def windowed_pooled_sum(
    model: MaskedClassifier,
    array: np.ndarray,
    max_window: int,
    *,
    context: int | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    autocast: torch.dtype | None = None,
) -> tuple[Tensor, Tensor, int]:
    """Pooled ``(sums (C,), count ())`` of a ``(n_bins, n_frames)`` clip run in windows, and the window count.

    ``max_window``: longest window in frames (e.g. ``Plan.max_window``);
    ``context``: frames of overlap on each side of an owned span (default
    :func:`default_context`; 0 for disjoint windows).  Each window is one
    batch of one clip.  Runs without gradients; the caller picks train/eval
    mode (eval for prediction).
    """
    if array.ndim != 2:
        raise WindowError(f"expected a (n_bins, n_frames) array, got shape {array.shape}")
    stride = window_align(model)  # windows start and split on it, so each pooling window is owned whole
    window = max_window // stride * stride
    if context is None:
        context = default_context(model, max_window)
    context = int(align_frames(context, stride))
    if context < 0 or window - 2 * context < stride:
        raise WindowError(f"context={context} frames leaves no owned span in a {window}-frame window")
    spans = windows_for(int(array.shape[1]), window, hop=window - 2 * context, align=stride)
    owned = owned_spans(spans, align=stride)
    if device is None:
        device = next(model.parameters()).device
    total_sums: Tensor | None = None
    total_count = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for (start, stop), (lo, hi) in zip(spans, owned, strict=True):
            batch = collate([array[:, start:stop]], dtype=dtype).to(device)
            with amp(torch.device(device).type, autocast):
                sums, counts = model.pooled_sum(
                    batch.x,
                    batch.lengths,
                    pool_start=torch.tensor([lo - start], device=device),
                    pool_stop=torch.tensor([hi - start], device=device),
                )
            sums64 = sums[0].double().cpu()
            total_sums = sums64 if total_sums is None else total_sums + sums64
            total_count += counts[0].double().cpu()
    assert total_sums is not None  # windows_for returns at least one window
    return total_sums, total_count, len(spans)


def run_windowed(model: MaskedClassifier, array: np.ndarray, max_window: int,
                 **options: Unpack[WindowOptions]) -> Tensor:
    """Logits ``(n_classes,)`` of one long clip run in windows of at most ``max_window`` frames.

    Combines pooled sums across windows (sum of sums / sum of counts) and
    applies the model's head; ``options`` are :func:`windowed_pooled_sum`'s.
    """
    sums, count, _ = windowed_pooled_sum(model, array, max_window, **options)
    head_device = next(model.parameters()).device
    with torch.no_grad():
        logits = model.classify(sums.float()[None].to(head_device), count.float()[None].to(head_device))
    return logits[0]


def mean_of_windows(forward: Callable[[Tensor, Tensor], Tensor], array: np.ndarray, window: int, *, align: int,
                    device: torch.device | str) -> Tensor:
    """Mean logits over disjoint windows of at most ``window`` frames of one clip, each run alone.

    ``forward(x, lengths)``: the model's logits for a batch (the engine's,
    which splits a batch on a CUDA out-of-memory); ``align``: the model's
    time stride (windows start on it and are padded up to it).
    """
    outs = []
    for start, stop in windows_for(int(array.shape[1]), window, align=align):
        b = collate([array[:, start:stop]], multiple_of=align).to(device)
        outs.append(forward(b.x, b.lengths)[0])
    return torch.stack(outs).mean(dim=0)


class TiledClips:
    """Every clip of a :class:`~specstore.infer.data.clip_source.ClipSource` cut into tiles of ``window`` frames, as a
    dataset of tiles (for a model that does not mask padding; see :func:`tile_spans`).

    ``owner[k]`` is tile ``k``'s clip, ``last[k]`` whether it is its clip's
    last tile; an item's ``index`` is the tile's.
    """

    def __init__(self, dataset: ClipSource, window: int) -> None:
        self.dataset = dataset
        self.window = window
        spans: list[tuple[int, int]] = []
        owner: list[int] = []
        last: list[bool] = []
        for i, n in enumerate(dataset.lengths.tolist()):
            tiles = tile_spans(n, window)
            spans += tiles
            owner += [i] * len(tiles)
            last += [False] * (len(tiles) - 1) + [True]
        self.spans = spans
        self.owner = np.array(owner, dtype=np.int64)
        self.last = np.array(last, dtype=bool)

    def __len__(self) -> int:
        return len(self.spans)

    def __getitem__(self, k: int) -> Item:
        start, stop = self.spans[k]
        i = int(self.owner[k])
        return Item(self.dataset.window(i, start, stop), int(self.dataset.labels[i]), k, int(self.dataset.rows[i]))
