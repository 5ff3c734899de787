"""What one pooling covers: the whole clip, or each window of ``pool_window`` frames judged on its own.

With ``pool_window`` (:attr:`~specstore.infer.models.config.ModelConfig.pool_window`)
the pooling and the head run on each window of that many input frames,
counted from the clip's first frame (so the same windows in a batch as
alone), and the clip's logits are the windows' logits averaged with their
real frames as weights: the pooled "sums" are the weighted logits and the
"counts" the real frames.  A window is owned whole by one of the windows a
long clip is cut into when they start on multiples of it
(:attr:`~specstore.infer.models.classifier.MaskedClassifier.window_align`), so exact
windowing holds too.  A long clip is then judged as the training crops of
that length were.
"""

from __future__ import annotations

from collections.abc import Callable

import torch.nn.functional as F
from torch import Tensor

from .pooling import TimePooling

__all__ = ["HeadLogits", "PoolSpan", "Whole", "Windows", "pool_span"]

HeadLogits = Callable[[Tensor, Tensor], Tensor]
"""The head on pooled sums and counts: ``(sums (N, C), counts (N,)) -> logits (N, n_classes)``."""


class PoolSpan:
    """The interface: additive sums and counts of a batch's clips, and the logits from their totals."""

    def width(self, head_inputs: int, n_classes: int) -> int:
        """Columns of :meth:`sums`."""
        raise NotImplementedError

    def sums(self, per_frame: Tensor, weights: Tensor, real: Tensor, pooling: TimePooling,
             head: HeadLogits) -> tuple[Tensor, Tensor]:
        """``(sums (B, width), counts (B,))`` of ``per_frame (B, C, T')`` under the frame ``weights (B, T')``
        (``real``: 1 for the real frames this call owns)."""
        raise NotImplementedError

    def logits(self, sums: Tensor, counts: Tensor, pooling: TimePooling, head: HeadLogits) -> Tensor:
        """Logits ``(B, n_classes)`` from (summed) :meth:`sums` and counts."""
        raise NotImplementedError


class Whole(PoolSpan):
    """One pooling over all of a clip's real frames, then the head."""

    def width(self, head_inputs: int, n_classes: int) -> int:
        return head_inputs

    def sums(self, per_frame: Tensor, weights: Tensor, real: Tensor, pooling: TimePooling,
             head: HeadLogits) -> tuple[Tensor, Tensor]:
        return pooling.sums(per_frame, weights), weights.sum(dim=-1)

    def logits(self, sums: Tensor, counts: Tensor, pooling: TimePooling, head: HeadLogits) -> Tensor:
        return head(sums, counts)


class Windows(PoolSpan):
    """Each window of ``frames`` output frames pooled and classified alone; logits averaged by real frames."""

    def __init__(self, frames: int) -> None:
        self.frames = frames

    def width(self, head_inputs: int, n_classes: int) -> int:
        return n_classes

    def sums(self, per_frame: Tensor, weights: Tensor, real: Tensor, pooling: TimePooling,
             head: HeadLogits) -> tuple[Tensor, Tensor]:
        """Each window's logits times its real frames, summed ``(B, n_classes)``, and the real frames ``(B,)``;
        windows without a real frame count for nothing."""
        size = self.frames
        b, c, t = per_frame.shape
        n = (t + size - 1) // size  # not -(-t // size): ONNX divides integers toward zero, Python floors
        pad = n * size - t
        frames = F.pad(per_frame, (0, pad)).reshape(b, c, n, size).transpose(1, 2)  # (B, J, C, size)
        w = F.pad(weights, (0, pad)).reshape(b, n, size)
        real_frames = F.pad(real, (0, pad)).reshape(b, n, size).sum(dim=-1)  # (B, J)
        logits = head(pooling.sums(frames, w).flatten(0, 1), w.sum(dim=-1).flatten())
        logits = logits.float().reshape(b, n, -1) * real_frames[..., None]
        return logits.sum(dim=1), real_frames.sum(dim=1)

    def logits(self, sums: Tensor, counts: Tensor, pooling: TimePooling, head: HeadLogits) -> Tensor:
        return sums / counts.clamp(min=1.0)[:, None]


def pool_span(pool_window: int, time_stride: int) -> PoolSpan:
    """The span a config's ``pool_window`` (input frames, a multiple of ``time_stride``; 0: the whole clip)
    gives."""
    return Windows(pool_window // time_stride) if pool_window else Whole()
