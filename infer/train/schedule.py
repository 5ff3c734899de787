"""The learning-rate schedule: linear warm-up, then cosine decay (a pure function of progress)."""

from __future__ import annotations

import math

from .config import TrainConfig

__all__ = ["lr_at"]


def lr_at(progress: float, config: TrainConfig) -> float:
    """Learning rate at ``progress`` epochs into training (a float; 0 = start).

    Linear warm-up from ``lr / 25`` to ``lr`` over ``warmup_fraction * epochs``
    epochs, then a cosine decay to ``lr * final_lr_ratio`` at ``epochs``.
    """
    total = float(config.epochs)
    warm = config.warmup_fraction * total
    peak = config.lr
    if progress < warm:
        return peak * (0.04 + 0.96 * progress / warm)
    span = max(total - warm, 1e-9)
    t = min(max((progress - warm) / span, 0.0), 1.0)
    low = peak * config.final_lr_ratio
    return low + 0.5 * (peak - low) * (1.0 + math.cos(math.pi * t))
