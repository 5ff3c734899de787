"""The statistics head: a linear classifier on three statistics of every input bin, beside the CNN.

The statistics of a clip are, per input bin over its real frames (after the
input normalisation): mean, standard deviation and mean absolute
frame-to-frame change (:data:`~specstore.infer.models.config.BAND_STATS`).  They come
from sums over real frames (:class:`StatsSums`: of values, squares, absolute
differences, and the frame counts), so a clip batched equals the clip alone
and the windows of a long clip add up exactly, as the CNN's pooled sums do.
The head's weights are fitted in closed form (a logistic regression,
:mod:`specstore.infer.train.stats_head`) before the CNN trains; in training mode the
model is the CNN alone, in eval mode its logits are ``cnn + stats_weight *
stats``: the product of two experts' probabilities.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor, nn

from specstore.infer.models.config import BAND_STATS

__all__ = ["StatsHead", "StatsSums", "stats_sums", "stats_width"]


def stats_width(n_bins: int) -> int:
    """Columns of :meth:`StatsSums.flat`: three sums per bin and two frame counts."""
    return len(BAND_STATS) * n_bins + 2


class StatsSums(NamedTuple):
    """Float32 sums over a batch's real input frames (each ``(B, n_bins)``, the counts ``(B, 1)``)."""

    values: Tensor
    squares: Tensor
    changes: Tensor
    """Absolute frame-to-frame changes, counted at frames ``t >= 1``."""
    frames: Tensor
    change_frames: Tensor

    def flat(self) -> Tensor:
        """``(B, 3 * n_bins + 2)``: the sums side by side, then the two counts (what the engine adds up)."""
        return torch.cat(list(self), dim=1)

    @classmethod
    def from_flat(cls, flat: Tensor) -> StatsSums:
        """Inverse of :meth:`flat` (as float32)."""
        flat = flat.float()
        n_bins = (flat.shape[1] - 2) // 3
        return cls(flat[:, :n_bins], flat[:, n_bins:2 * n_bins], flat[:, 2 * n_bins:3 * n_bins], flat[:, -2:-1],
                   flat[:, -1:])

    def band_statistics(self) -> Tensor:
        """``(B, 3 * n_bins)``: per-bin mean, standard deviation, mean absolute change (a clip of one frame has
        no change: 0)."""
        n = self.frames.clamp(min=1.0)
        mean = self.values / n
        std = torch.sqrt((self.squares / n - mean.square()).clamp(min=0.0))
        return torch.cat([mean, std, self.changes / self.change_frames.clamp(min=1.0)], dim=1)


def stats_sums(h: Tensor, lengths: Tensor, pool_start: Tensor | None = None,
               pool_stop: Tensor | None = None) -> StatsSums:
    """The sums over the real input frames in ``[pool_start, pool_stop)`` of the prepared input ``h (B, 1,
    n_bins, T)`` (normalised, masked).  A change counts at frame ``t >= 1`` (it reads frame ``t - 1``, which a
    window owning ``t`` holds as context)."""
    v = h[:, 0].float()  # (B, F, T)
    steps = torch.arange(v.shape[-1], device=v.device)[None, :]
    keep = steps < lengths[:, None]
    if pool_start is not None:
        keep = keep & (steps >= torch.as_tensor(pool_start, device=v.device).long()[:, None])
    if pool_stop is not None:
        keep = keep & (steps < torch.as_tensor(pool_stop, device=v.device).long()[:, None])
    w = keep.to(v.dtype)
    w_change = w[:, 1:]  # frame t >= 1 owned and real
    change = (v[..., 1:] - v[..., :-1]).abs()
    return StatsSums((v * w[:, None]).sum(-1), (v.square() * w[:, None]).sum(-1),
                     (change * w_change[:, None]).sum(-1), w.sum(-1, keepdim=True), w_change.sum(-1, keepdim=True))


class StatsHead(nn.Linear):
    """The head's linear map, ``3 * n_bins`` statistics -> ``n_classes`` logits: zero until fitted, and never
    trained by SGD (fitted in closed form by :mod:`specstore.infer.train.stats_head`).

    The statistics' standardisation (``shift``, ``scale``, fitted with it) is
    held by the classifier as ``stats_shift`` / ``stats_scale``, the
    state-dict names checkpoints have always used.
    """

    def __init__(self, n_bins: int, n_classes: int) -> None:
        super().__init__(len(BAND_STATS) * n_bins, n_classes)
        nn.init.zeros_(self.weight)
        nn.init.zeros_(self.bias)
        self.requires_grad_(False)

    def logits(self, statistics: Tensor, shift: Tensor, scale: Tensor) -> Tensor:
        """Logits ``(B, n_classes)`` of ``statistics (B, 3 * n_bins)`` standardised by ``shift`` and ``scale``."""
        z = (statistics - shift) * scale
        return super().forward(z.to(self.weight.dtype))
