"""Masking: the ops that keep padded frames from changing any real frame's value.

A batch is ``x: (B, 1, n_bins, T)`` zero-padded in time to its longest clip,
plus ``lengths: (B,)`` (real frames per clip).  The models are written so
that **a clip's logits in a padded batch equal its logits run alone** (eval
mode, up to float rounding).  The parts here guarantee it:

* Every op that mixes time steps (a conv with time kernel > 1, a time-strided
  conv, time pooling) reads only zeros beyond a clip's length: the activations
  are re-masked (:func:`remask`) after every conv stage (conv -> BN -> zero the frames
  ``>= length`` -> [pool] -> ReLU, or conv -> BN -> ReLU -> zero).  For a conv of kernel ``k`` (odd),
  padding ``k // 2`` and
  stride ``s``, output frame ``j < ceil(L / s)`` reads input frames up to
  ``j * s + k // 2 <= L - 1 + k // 2``; those ``>= L`` are zeros in the batch
  (masked) and zeros alone (the conv's own padding), so the values agree and
  the new length is ``ceil(L / s)`` (:func:`strided_lengths`).  A 2x2 max pool (stride 2) after
  masking, followed by ReLU, gives ``max(relu(real), 0) = max(relu(real))``
  for the window straddling the end of an odd-length clip, in the batch and
  alone alike, and frames ``>= ceil(L / 2)`` pool only zeros, so they stay
  zero (no re-mask needed).  Lengths therefore
  follow ``L -> ceil(L / stride)`` and never reach 0: any clip of >= 1 frame
  is supported (:data:`~specstore.infer.models.config.MIN_FRAMES`).
* BatchNorm in eval mode is a per-channel affine map (folded into the conv
  weights at run time, :func:`conv_bn`, which saves a pass over the largest activations).  In training,
  :class:`MaskedBatchNorm2d` computes the batch mean/variance over real frames
  only, so padding changes neither the normalisation nor the running stats.

Masks multiply by a ``(B, 1, 1, T)`` tensor, which works for contiguous and
channels-last activations alike and under bf16 autocast.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MaskedBatchNorm2d", "all_real", "conv_bn", "exporting", "max_pool", "recompute_context", "relu",
           "remask", "strided_lengths", "time_mask"]


def time_mask(lengths: Tensor, n_frames: int, dtype: torch.dtype) -> Tensor:
    """``(B, 1, 1, n_frames)`` mask: 1 for frames ``< lengths[b]``, else 0."""
    steps = torch.arange(n_frames, device=lengths.device)
    return (steps[None, :] < lengths[:, None]).to(dtype)[:, None, None, :]


def all_real(x: Tensor, lengths: Tensor) -> bool:
    """True when ``x`` (on the CPU) has no padded frame: every length reaches its time size.

    Equal-length training crops are the common case; masking them is a no-op,
    so it is skipped.  Not checked on accelerators (it would synchronise).
    """
    if exporting():
        return False
    return x.device.type == "cpu" and bool(lengths.numel()) and int(lengths.min()) >= x.shape[-1]


def exporting() -> bool:
    """True while the model is traced or exported (``torch.jit.trace``, ``torch.export``, the ONNX exporter):
    no shortcut or check may then read the lengths' values, which would fix them in the exported graph."""
    is_exporting = getattr(torch.compiler, "is_exporting", None)  # torch >= 2.5
    return torch.jit.is_tracing() or bool(is_exporting is not None and is_exporting())


def remask(x: Tensor, lengths: Tensor) -> Tensor:
    """Zero every frame at or beyond each clip's length (in place when no grad is tracked)."""
    if all_real(x, lengths):
        return x
    mask = time_mask(lengths, x.shape[-1], x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        return x * mask
    return x.mul_(mask)


def strided_lengths(lengths: Tensor, stride: int) -> Tensor:
    """Lengths after a time stride: ``ceil(L / stride)`` (see :mod:`specstore.infer.models.masking`)."""
    if stride == 1:
        return lengths
    return torch.div(lengths + (stride - 1), stride, rounding_mode="floor")


def max_pool(x: Tensor, time_stride: int) -> Tensor:
    """2 x ``time_stride`` max pool, stride = kernel, as elementwise maxima of strided views.

    Faster than ``max_pool2d`` on contiguous CPU tensors (``docs/architectures.md``).  An
    odd frequency size keeps its last row alone (ceil mode: -inf padding);
    the time size is always a multiple of the stride here.
    """
    if torch.is_grad_enabled() and x.requires_grad:  # training: max_pool2d's backward is far cheaper
        return F.max_pool2d(x, (2, time_stride), ceil_mode=True)
    if x.shape[2] % 2:
        x = F.pad(x, (0, 0, 0, 1), value=float("-inf"))
    h = torch.maximum(x[:, :, 0::2], x[:, :, 1::2])
    if time_stride == 2:
        h = torch.maximum(h[..., 0::2], h[..., 1::2])
    return h


def relu(x: Tensor) -> Tensor:
    """ReLU, in place when no gradient is tracked."""
    return torch.relu(x) if torch.is_grad_enabled() and x.requires_grad else x.relu_()


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """BatchNorm2d whose training statistics cover real frames only.

    ``forward(x, lengths)``: in training, the per-channel mean and (biased)
    variance are taken over the batch, all frequency rows and the frames
    ``t < lengths[b]``; the running stats are updated with them (unbiased
    variance, like :class:`torch.nn.BatchNorm2d`).  Padded positions come out
    with arbitrary values; callers re-mask.  In eval mode (or with
    ``lengths=None``) it is the ordinary BatchNorm2d.  Statistics are computed
    in float32 even under autocast.  While ``recomputing`` (gradient
    checkpointing re-running a block in backward) the running statistics are
    left alone: the first pass already counted the batch.
    """

    recomputing: bool = False
    """True while gradient checkpointing re-runs the forward: the running statistics were already updated."""

    def folded(self, conv_weight: Tensor) -> tuple[Tensor, Tensor]:
        """Eval-mode BN folded into the preceding bias-free conv: ``(weight, bias)``."""
        assert self.running_mean is not None and self.running_var is not None
        scale = torch.rsqrt(self.running_var + self.eps)
        shift = -self.running_mean * scale
        if self.affine:
            scale = scale * self.weight
            shift = shift * self.weight + self.bias
        return conv_weight * scale.to(conv_weight.dtype)[:, None, None, None], shift.to(conv_weight.dtype)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        if not self.training or lengths is None:
            return super().forward(x)
        if all_real(x, lengths):  # no padding: the fused kernel computes the same statistics
            return self._unmasked(x)
        xf = x.float()
        mask = time_mask(lengths, x.shape[-1], torch.float32)
        count = mask.sum() * x.shape[2]
        mean = (xf * mask).sum(dim=(0, 2, 3)) / count
        centred = xf - mean[None, :, None, None]
        var = (centred.square() * mask).sum(dim=(0, 2, 3)) / count
        if (
            self.track_running_stats
            and self.running_mean is not None
            and self.running_var is not None
            and not self.recomputing
        ):
            with torch.no_grad():
                tracked: Tensor = self.num_batches_tracked  # type: ignore[assignment]
                tracked.add_(1)
                momentum = self.momentum if self.momentum is not None else 1.0 / float(tracked)
                unbiased = var * (count / torch.clamp(count - 1, min=1.0))
                self.running_mean.lerp_(mean.to(self.running_mean.dtype), momentum)
                self.running_var.lerp_(unbiased.to(self.running_var.dtype), momentum)
        scale = torch.rsqrt(var + self.eps)
        if self.affine:
            scale = scale * self.weight
        y = centred * scale[None, :, None, None]
        if self.affine:
            y = y + self.bias[None, :, None, None]
        return y.to(x.dtype)
    def _unmasked(self, x: Tensor) -> Tensor:
        """Training-mode batch norm of a batch without padding (running stats as in :meth:`forward`)."""
        update = self.track_running_stats and self.running_mean is not None and not self.recomputing
        momentum = 0.0
        if update:
            tracked: Tensor = self.num_batches_tracked  # type: ignore[assignment]
            tracked.add_(1)
            momentum = self.momentum if self.momentum is not None else 1.0 / float(tracked)
        # The buffers are passed even when not updated (momentum 0 leaves them as they are), so a
        # gradient-checkpointing recompute saves the same tensors as the first pass.
        y = F.batch_norm(x.float(), self.running_mean, self.running_var, self.weight, self.bias, True, momentum,
                         self.eps)
        return y.to(x.dtype)


def recompute_context(block: nn.Module) -> Callable[[], tuple[Any, Any]]:
    """``checkpoint``'s ``context_fn``: nothing special in the forward, :class:`_Recomputing` in the recompute."""
    return lambda: (contextlib.nullcontext(), _Recomputing(block))


class _Recomputing:
    """While gradient checkpointing re-runs ``block``, its masked BatchNorms leave their running stats alone."""

    def __init__(self, block: nn.Module) -> None:
        self.norms = [m for m in block.modules() if isinstance(m, MaskedBatchNorm2d)]

    def __enter__(self) -> None:
        for m in self.norms:
            m.recomputing = True

    def __exit__(self, *exc: object) -> None:
        for m in self.norms:
            m.recomputing = False


def conv_bn(conv: nn.Conv2d, bn: MaskedBatchNorm2d, x: Tensor, lengths: Tensor) -> Tensor:
    """``bn(conv(x))``: masked batch statistics in training, BN folded into the conv in eval."""
    if bn.training or not bn.track_running_stats:
        return bn(conv(x), lengths)
    weight, bias = bn.folded(conv.weight)
    return F.conv2d(x, weight, bias, conv.stride, conv.padding)
