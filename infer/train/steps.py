"""One optimiser step's mechanics: parameter groups, class weights, mixup, the weight average, forward/backward.

Pure pieces of the training loop (:mod:`.loop`), each testable alone.
Every random draw is seeded from ``(seed, epoch, stream)`` (:func:`epoch_seed`),
so a resumed run follows the uninterrupted run's path.
"""

from __future__ import annotations

import copy
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from specstore.infer.engine.runtime import Engine

__all__ = ["Mix", "Step", "WeightAverage", "class_weights", "epoch_seed", "forward_backward", "mixup", "param_groups"]

log = logging.getLogger("specstore.infer.train")


def epoch_seed(seed: int, epoch: int, stream: int) -> int:
    """A 63-bit seed for one random stream of one epoch."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW groups: weight decay on matrices and kernels, none on biases and norms; frozen parameters left out."""
    decay: list[Tensor] = []
    no_decay: list[Tensor] = []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim > 1 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def class_weights(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Inverse class frequency (mean 1 over the classes present; 1 for absent ones)."""
    counts = np.bincount(labels, minlength=n_classes).astype(np.float64)
    present = counts > 0
    w = np.ones(n_classes, dtype=np.float64)
    w[present] = counts[present].sum() / (present.sum() * counts[present])
    return w


@dataclass
class Step:
    """One batch's figures: mean loss (weighted with class weights), correct predictions, OOM splits."""

    loss: float
    correct: int
    oom_splits: int


@dataclass(frozen=True)
class Mix:
    """A batch mixed with itself: ``lam * x + (1 - lam) * x[perm]``, targets likewise (mixup)."""

    lam: float
    perm: Tensor


def mixup(x: Tensor, lengths: Tensor, y: Tensor, alpha: float, generator: torch.Generator
          ) -> tuple[Tensor, Tensor, Tensor, Mix | None]:
    """Mix the batch (dB values) with a shuffled copy of itself; lengths become the shorter of each pair.

    The mixing weight is drawn from Beta(alpha, alpha) and folded to >= 0.5,
    so the first clip dominates (its label counts for the accuracy).
    """
    if alpha <= 0 or len(y) < 2:
        return x, lengths, y, None
    draw = int(torch.randint(0, 2**62, (1,), generator=generator))
    lam = float(np.random.default_rng(draw).beta(alpha, alpha))
    lam = max(lam, 1.0 - lam)
    perm = torch.randperm(len(y), generator=generator).to(y.device)
    mixed = x * lam + x[perm] * (1.0 - lam)
    return mixed, torch.minimum(lengths, lengths[perm]), y, Mix(lam, perm)


class WeightAverage:
    """An exponential moving average of a model's weights and buffers, updated after every optimiser step.

    ``decay`` per step, warmed up as ``min(decay, (1 + t) / (10 + t))`` so the
    first steps do not drag the random initial weights along.  BatchNorm
    running statistics are averaged alike (``num_batches_tracked`` is copied).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.decay = decay
        self.steps = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.steps += 1
        keep = min(self.decay, (1.0 + self.steps) / (10.0 + self.steps))
        mine = self.model.state_dict()
        for name, value in model.state_dict().items():
            if value.dtype.is_floating_point:
                mine[name].lerp_(value, 1.0 - keep)
            else:
                mine[name].copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.model.load_state_dict(state["model"])


def forward_backward(model: nn.Module, engine: Engine, x: Tensor, lengths: Tensor, y: Tensor, *,
                     weights: Tensor | None, label_smoothing: float, scaler: torch.amp.GradScaler,
                     mix: Mix | None = None, split_on_oom: bool = True) -> Step:
    """Forward and backward of one batch, gradients accumulated into the parameters.

    On a CUDA out-of-memory the batch is split in halves, each contributing
    its share of the batch's loss, so the gradient is the whole batch's
    (only the BatchNorm statistics then come from the halves).  ``mix``: the
    batch was mixed (:func:`mixup`); the loss is the same mix of the two
    targets' losses.  ``split_on_oom=False`` (a distributed run) lets the out-of-memory error through instead: a
    split on one rank alone would give it more backward passes, hence more gradient all-reduces, than the others.
    """
    x = engine.layout(x)
    denom = weights[y].sum() if weights is not None else torch.tensor(float(len(y)), device=y.device)
    y_other = y[mix.perm] if mix is not None else None

    def run(xs: Tensor, ls: Tensor, ys: Tensor, others: Tensor | None = None) -> tuple[float, int, int]:
        try:
            with engine.amp():
                logits = model(xs, ls)
            per_clip = F.cross_entropy(logits.float(), ys, weight=weights, label_smoothing=label_smoothing,
                                       reduction="none")
            if mix is not None and others is not None:
                per_clip = mix.lam * per_clip + (1.0 - mix.lam) * F.cross_entropy(
                    logits.float(), others, weight=weights, label_smoothing=label_smoothing, reduction="none")
            part = per_clip.sum() / denom
            scaler.scale(part).backward()
            return float(part.detach()), int((logits.detach().argmax(1) == ys).sum()), 0
        except torch.cuda.OutOfMemoryError:
            if len(ys) == 1 or not split_on_oom:
                raise
            torch.cuda.empty_cache()
            log.warning("CUDA out of memory on a training batch of %d x %d frames; splitting it", len(ys),
                        xs.shape[-1])
            half = len(ys) // 2
            a = run(xs[:half], ls[:half], ys[:half], None if others is None else others[:half])
            b = run(xs[half:], ls[half:], ys[half:], None if others is None else others[half:])
            return a[0] + b[0], a[1] + b[1], a[2] + b[2] + 1

    loss, correct, splits = run(x, lengths, y, y_other)
    return Step(loss, correct, splits)
