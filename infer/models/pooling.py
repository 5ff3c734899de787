"""Poolings: how a clip's last activations become the features its head reads.

Two small parts, each behind one interface and registered by name
(:mod:`specstore.infer.models.registry`):

* a :class:`FreqPooling` turns ``(B, C, F', T')`` activations into per-frame
  features ``(B, features, T')``: :class:`FreqMean` averages over frequency,
  :class:`FreqKeep` keeps every (channel, frequency row) pair as a feature
  of its own (the head then sees where in the spectrum, e.g. which register,
  a pattern occurs);
* a :class:`TimePooling` weighs the real frames, sums the per-frame features
  over them and turns those sums and the weights' total into the head's
  input.  :class:`MeanPooling` is the masked global average (MaskedGAP);
  :class:`MeanStdPooling` also sums the squares (the head sees each feature's
  mean and standard deviation over real frames); :class:`AttentionPooling`
  weighs each real frame by ``exp(a_t)`` with a learnt, bounded score
  ``a_t = 5 tanh(w . h_t / 5)`` of that frame alone, and its "counts" are the
  weights' sum.

All of them are sums over real frames, so a clip batched equals the clip
alone and a long clip cut into windows combines exactly (sum the windows'
sums and counts, then :meth:`TimePooling.pooled`).  Sums are accumulated in
float32 (also under bf16 autocast).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ATTENTION_BOUND", "AttentionPooling", "FreqKeep", "FreqMean", "FreqPooling", "MeanPooling",
           "MeanStdPooling", "TimePooling"]

ATTENTION_BOUND = 5.0
"""Attention pooling scores lie in ``[-5, 5]``: frame weights within ``e**±5``, no overflow in any sum."""


class FreqPooling:
    """``(B, C, F', T')`` activations -> ``(B, features, T')`` float32 per-frame features."""

    def __call__(self, h: Tensor) -> Tensor:
        raise NotImplementedError


class FreqMean(FreqPooling):
    """The mean over frequency: ``C`` features."""

    def __call__(self, h: Tensor) -> Tensor:
        return h.float().mean(dim=2)


class FreqKeep(FreqPooling):
    """Every (channel, frequency row) pair as a feature of its own: ``C x F'`` features."""

    def __call__(self, h: Tensor) -> Tensor:
        return h.float().flatten(1, 2)


class TimePooling(nn.Module):
    """Frames -> one vector per clip, as sums over real frames (additive over windows) and their count.

    Built with the number of per-frame features; a classifier holds it under
    its registry name, which is the prefix of its parameters in the state
    dict (``attention.weight``).
    """

    def __init__(self, features: int) -> None:
        super().__init__()
        self.n_features = features

    def weights(self, per_frame: Tensor, keep: Tensor) -> Tensor:
        """Each frame's weight ``(B, T')`` given ``keep`` (1 for a real frame the call owns, else 0)."""
        return keep

    def sums(self, per_frame: Tensor, weights: Tensor) -> Tensor:
        """Sums over frames of ``per_frame (..., C, T)`` weighted by ``weights (..., T)``: ``(..., C)``."""
        return (per_frame * weights[..., None, :]).sum(dim=-1)

    def pooled(self, sums: Tensor, counts: Tensor) -> Tensor:
        """The head's input ``(B, head inputs)`` from the summed :meth:`sums` and the summed weights ``(B,)``."""
        return sums / counts.clamp(min=1.0)[:, None]


class MeanPooling(TimePooling):
    """The mean over real frames (MaskedGAP)."""


class MeanStdPooling(TimePooling):
    """The mean and the standard deviation over real frames: sums of values and of squares, ``2C`` inputs."""

    def sums(self, per_frame: Tensor, weights: Tensor) -> Tensor:
        w = weights[..., None, :]
        return torch.cat([(per_frame * w).sum(dim=-1), (per_frame.square() * w).sum(dim=-1)], dim=-1)

    def pooled(self, sums: Tensor, counts: Tensor) -> Tensor:
        mean, square = super().pooled(sums, counts).chunk(2, dim=1)
        std = torch.sqrt((square - mean.square()).clamp(min=0.0) + 1e-6)
        return torch.cat([mean, std], dim=1)


class AttentionPooling(TimePooling):
    """A weighted mean: each real frame weighs ``exp(a_t)``, ``a_t`` a bounded linear score of that frame.

    ``weight (1, C)`` and ``bias (1,)`` are the score's (initialised as
    ``nn.Linear(C, 1)`` is).
    """

    def __init__(self, features: int) -> None:
        super().__init__(features)
        score = nn.Linear(features, 1)
        self.weight = score.weight
        self.bias = score.bias

    def weights(self, per_frame: Tensor, keep: Tensor) -> Tensor:
        score = F.linear(per_frame.transpose(1, 2), self.weight, self.bias)[..., 0].float()  # (B, T'), each frame
        return keep * torch.exp(ATTENTION_BOUND * torch.tanh(score / ATTENTION_BOUND))

    def pooled(self, sums: Tensor, counts: Tensor) -> Tensor:
        return sums / counts.clamp(min=1e-30)[:, None]
