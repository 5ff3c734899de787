"""The batch cost rule, in one place: what a padded batch costs and what a budget allows.

A batch of ``B`` clips padded to ``T`` frames (``T`` rounded up to the
model's time stride, ``frame_align``) is charged

    ``B * T * cost_per_frame + fixed_overhead``  bytes.

:class:`CostModel` holds the two numbers measured for a model
(:func:`specstore.infer.engine.cost.measure_cost_per_frame`); :class:`Budget` adds the bytes
one batch may use, the largest batch size and the alignment, and answers
every question the rest of the package asks: a batch's bytes, whether it
fits, the longest window one clip may run in, the padded length of a clip.
The planner, training (crop limits), windowing and the engine all ask it;
nothing else computes batch bytes.  Pure: numpy and arithmetic, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from specstore.infer.errors import PlanError
from specstore.infer.options.defaults import CPU_BATCH_OVERHEAD_FRAMES, DEFAULT_BATCH_OVERHEAD_FRAMES, MAX_BATCH

__all__ = ["CPU_BATCH_OVERHEAD_FRAMES", "DEFAULT_BATCH_OVERHEAD_FRAMES", "MAX_FRAMES",
           "TRAINING_BATCH_OVERHEAD_FRAMES", "Budget", "CostModel", "PlanError", "align_frames"]

_MIB = 1 << 20
MAX_FRAMES = 2**62
"""The longest window :attr:`Budget.max_window` reports (frames), whatever the budget and cost: frame counts
stay within int64, numpy's type for lengths and padded frames."""

TRAINING_BATCH_OVERHEAD_FRAMES = 4096.0
"""The price of one more batch in a shuffled training plan
(:func:`specstore.infer.batching.planner.shuffled_training_plan`), padded frames."""


def align_frames(frames: Any, multiple: int) -> Any:
    """``frames`` rounded up to a multiple of ``multiple`` (the model's time stride): the padding rule.

    Frames (an int or an int array) in, frames out.  Batches pad to their
    longest clip rounded up this way, the planner charges for it, windows
    align their context to it; this is its one home.
    """
    return -(-frames // multiple) * multiple


@dataclass(frozen=True)
class CostModel:
    """Bytes a batch needs: ``fixed_bytes + bytes_per_frame * batch_size * frames``.

    ``method`` says how it was measured (``"cuda-peak"`` or
    ``"cpu-live-tensors"``); ``training`` whether backward was included;
    ``grad_checkpoint`` whether it was measured with gradient checkpointing.
    """

    bytes_per_frame: float
    fixed_bytes: int
    method: str = "cpu-live-tensors"
    training: bool = False
    grad_checkpoint: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"bytes_per_frame": self.bytes_per_frame, "fixed_bytes": self.fixed_bytes, "method": self.method,
                "training": self.training, "grad_checkpoint": self.grad_checkpoint}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CostModel:
        return cls(bytes_per_frame=float(data["bytes_per_frame"]), fixed_bytes=int(data["fixed_bytes"]),
                   method=str(data.get("method", "cpu-live-tensors")), training=bool(data.get("training", False)),
                   grad_checkpoint=bool(data.get("grad_checkpoint", False)))


@dataclass(frozen=True)
class Budget:
    """What one batch may cost, and the rule that charges it
    (:class:`~specstore.infer.batching.constraints.BudgetBatches` makes it a
    :class:`~specstore.infer.batching.constraints.BatchConstraint`: the planner's batches under it).

    ``budget_bytes``: bytes one batch may use; ``cost_per_frame``: bytes per
    padded clip-frame; ``fixed_overhead``: bytes per batch whatever its size;
    ``max_batch``: most clips in one batch; ``frame_align``: padded lengths
    are multiples of it (the model's time stride); ``source``: where the
    byte figure came from (for messages).  Raises :class:`PlanError` for
    values that cannot plan anything, including a budget below one aligned
    frame.
    """

    budget_bytes: int
    cost_per_frame: float
    fixed_overhead: int = 0
    max_batch: int = MAX_BATCH
    frame_align: int = 1
    source: str = "given"

    def __post_init__(self) -> None:
        if not (isinstance(self.budget_bytes, (int, np.integer)) or math.isfinite(self.budget_bytes)):
            raise PlanError(f"the memory budget must be a finite number of bytes, got {self.budget_bytes!r}")
        object.__setattr__(self, "budget_bytes", int(self.budget_bytes))
        if not self.cost_per_frame > 0 or not math.isfinite(self.cost_per_frame):
            raise PlanError(f"cost_per_frame must be a positive number of bytes, got {self.cost_per_frame!r}")
        if self.fixed_overhead < 0:
            raise PlanError(f"fixed_overhead must be >= 0 bytes, got {self.fixed_overhead}")
        if self.max_batch < 1:
            raise PlanError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.frame_align < 1:
            raise PlanError(f"frame_align must be >= 1, got {self.frame_align}")
        if self.max_window < self.frame_align:
            need = self.bytes(1, self.frame_align)
            raise PlanError(f"a budget of {self.budget_bytes / _MIB:.1f} MiB ({self.source}) is below one batch of "
                            f"{self.frame_align} frame(s) ({need / _MIB:.1f} MiB at "
                            f"{self.cost_per_frame / 1024:.1f} KiB per frame); raise the budget")

    @classmethod
    def for_cost(cls, budget_bytes: int, cost: CostModel, *, max_batch: int = MAX_BATCH, frame_align: int = 1,
                 source: str = "given") -> Budget:
        """The budget of ``budget_bytes`` for a model whose measured cost is ``cost``."""
        return cls(budget_bytes, cost.bytes_per_frame, cost.fixed_bytes, max_batch, frame_align, source)

    def bytes(self, batch_size: int | np.ndarray, padded_frames: int | np.ndarray) -> Any:
        """Bytes of a batch of ``batch_size`` clips padded to ``padded_frames`` (scalars or arrays)."""
        return batch_size * padded_frames * self.cost_per_frame + self.fixed_overhead

    def fits(self, batch_size: int | np.ndarray, padded_frames: int | np.ndarray) -> Any:
        """Whether such a batch stays within the budget (a bool, or a bool array)."""
        return self.bytes(batch_size, padded_frames) <= self.budget_bytes

    def align(self, frames: int | np.ndarray) -> Any:
        """Frames rounded up to a multiple of ``frame_align`` (:func:`align_frames`)."""
        return align_frames(frames, self.frame_align)

    @cached_property
    def max_window(self) -> int:
        """Longest aligned length (frames) one clip may have in a batch of one (0 if none fits; at most
        :data:`MAX_FRAMES`).

        The largest ``k * frame_align`` that :meth:`fits`, found by bisection
        from the division's estimate: ``fits(1, k * frame_align)`` only turns
        false as ``k`` grows (float rounding keeps the product monotone), so
        it ends after about ``2 * log2(k)`` tests whatever the figures.  (The
        walk in steps of ``frame_align`` it replaces took up to
        ``ulp(estimate) / frame_align`` steps, as long as adding a frame did
        not change the float product: for ever at a budget of 1e30 MiB.)
        """
        align = self.frame_align
        cap = MAX_FRAMES // align
        if self.fits(1, cap * align):
            return cap * align
        room = max((self.budget_bytes - self.fixed_overhead) / self.cost_per_frame, 0.0)  # inf for a tiny cost
        low, high = 0, min(max(int(min(room, float(MAX_FRAMES))) // align, 1), cap)
        while self.fits(1, high * align):  # fits(1, low * align) holds unless low == 0; fits at cap does not
            low, high = high, min(high * 2, cap)
        while high - low > 1:
            mid = (low + high) // 2
            low, high = (mid, high) if self.fits(1, mid * align) else (low, mid)
        return low * align

    def describe(self) -> str:
        """One line: the budget, its source and the cost rule."""
        return (f"budget {self.budget_bytes / _MIB:.0f} MiB ({self.source}), {self.cost_per_frame / 1024:.2f} KiB "
                f"per padded clip-frame + {self.fixed_overhead / _MIB:.1f} MiB per batch, at most {self.max_batch} "
                f"clips, lengths aligned to {self.frame_align} frames")
