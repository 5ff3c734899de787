"""Masked CNN classifiers for variable-length spectrogram clips.

A batch is ``x: (B, 1, n_bins, T)`` zero-padded in time to its longest clip,
plus ``lengths: (B,)`` (real frames per clip).  The models here are written so
that **a clip's logits in a padded batch equal its logits run alone** (eval
mode, up to float rounding).  How that is guaranteed:

* Input normalisation is a fixed affine map ``(x - input_mean) / input_std``
  taken from the config (dB in, roughly unit scale out), or per frequency bin
  ``(x - bin_mean[f]) / bin_std[f]`` when the config holds ``bin_mean`` /
  ``bin_std``.  It is per value, so
  it does not depend on padding or on where a long clip is cut into windows;
  a trainer fits these on a store's real frames and
  saves them in the config.  ``input_time_pool = p > 1`` then averages
  every ``p`` frames into one: frames beyond a clip's length are zeros, so the
  window straddling its end averages the same values in a batch as alone,
  and lengths become ``ceil(L / p)``.  After it the input is re-masked (zeros beyond each
  length) and zero-padded in time up to a multiple of the model's total time
  stride, so every time-strided op below sees an even length.
* Every op that mixes time steps (a conv with time kernel > 1, a time-strided
  conv, time pooling) reads only zeros beyond a clip's length: the activations
  are re-masked after every conv stage (conv -> BN -> zero the frames
  ``>= length`` -> [pool] -> ReLU, or conv -> BN -> ReLU -> zero).  For a conv of kernel ``k`` (odd),
  padding ``k // 2`` and
  stride ``s``, output frame ``j < ceil(L / s)`` reads input frames up to
  ``j * s + k // 2 <= L - 1 + k // 2``; those ``>= L`` are zeros in the batch
  (masked) and zeros alone (the conv's own padding), so the values agree and
  the new length is ``ceil(L / s)``.  A 2x2 max pool (stride 2) after
  masking, followed by ReLU, gives ``max(relu(real), 0) = max(relu(real))``
  for the window straddling the end of an odd-length clip, in the batch and
  alone alike, and frames ``>= ceil(L / 2)`` pool only zeros, so they stay
  zero (no re-mask needed).  Lengths therefore
  follow ``L -> ceil(L / stride)`` and never reach 0: any clip of >= 1 frame
  is supported (:data:`MIN_FRAMES`).
* BatchNorm in eval mode is a per-channel affine map (folded into the conv
  weights at run time, which saves a pass over the largest activations).  In training,
  :class:`MaskedBatchNorm2d` computes the batch mean/variance over real frames
  only, so padding changes neither the normalisation nor the running stats.
* Pooling is a masked global average (MaskedGAP): mean over frequency, sum
  over real frames, divided by the real frame count at the final resolution.
  :meth:`MaskedClassifier.pooled_sum` exposes the (sums, counts) pair so a
  clip cut into windows combines as ``classify(sum(sums), sum(counts))``.
  ``pooling="meanstd"`` also sums the squares (the head sees each channel's
  mean and standard deviation over real frames); ``pooling="attention"``
  weighs each real frame by ``exp(a_t)`` with a learnt, bounded score
  ``a_t = 5 tanh(w . h_t / 5)`` of that frame alone, and its "counts" are the
  weights' sum.  All three are sums over real frames, so batched == alone
  and exact windowing hold for them alike.

With ``pool_window`` the pooling and the head run on each window of that
many frames, counted from the clip's first frame (so the same windows in a
batch as alone), and the clip's logits are the windows' logits averaged with
their real frames as weights: the pooled "sums" are the weighted logits and
the "counts" the real frames.  A window is owned whole by one of the
windows a long clip is cut into when they start on multiples of it
(:attr:`MaskedClassifier.window_align`), so exact windowing holds too.

The optional statistics head (``stats_head``) is a linear classifier on
three statistics of every input bin over the clip's real frames (after the
input normalisation): mean, standard deviation and mean absolute
frame-to-frame change.  They too are sums over real frames (of values,
squares, absolute differences, and the frame counts), appended to the pooled
sums, so batched == alone and exact windowing hold for them as well.  The
head's weights are fitted in closed form (a logistic regression,
:mod:`infer.train.stats_head`) before the CNN trains; in training mode the
model is the CNN alone, in eval mode its logits are
``cnn + stats_weight * stats``: the product of two experts' probabilities.

Masks multiply by a ``(B, 1, 1, T)`` tensor, which works for contiguous and
channels-last activations alike and under bf16 autocast (pooled sums are
accumulated in float32).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from .model_config import (
    ARCHS,
    BAND_STATS,
    FREQ_POOLINGS,
    MAX_PARAMETERS,
    MAX_TIME_STRIDE,
    MIN_FRAMES,
    POOLINGS,
    ModelConfig,
    ModelConfigError,
    _halved,
)

__all__ = [
    "ARCHS",
    "BAND_STATS",
    "MIN_FRAMES",
    "MaskedBatchNorm2d",
    "MaskedClassifier",
    "ModelConfig",
    "FREQ_POOLINGS",
    "MAX_PARAMETERS",
    "MAX_TIME_STRIDE",
    "POOLINGS",
    "ModelConfigError",
    "SpectrogramCNN",
    "SpectrogramResNet",
    "build_model",
    "count_parameters",
    "time_mask",
]

ATTENTION_BOUND = 5.0
"""Attention pooling scores lie in ``[-5, 5]``: frame weights within ``e**±5``, no overflow in any sum."""


def time_mask(lengths: Tensor, n_frames: int, dtype: torch.dtype) -> Tensor:
    """``(B, 1, 1, n_frames)`` mask: 1 for frames ``< lengths[b]``, else 0."""
    steps = torch.arange(n_frames, device=lengths.device)
    return (steps[None, :] < lengths[:, None]).to(dtype)[:, None, None, :]


def _all_real(x: Tensor, lengths: Tensor) -> bool:
    """True when ``x`` (on the CPU) has no padded frame: every length reaches its time size.

    Equal-length training crops are the common case; masking them is a no-op,
    so it is skipped.  Not checked on accelerators (it would synchronise).
    """
    return x.device.type == "cpu" and bool(lengths.numel()) and int(lengths.min()) >= x.shape[-1]


def _remask(x: Tensor, lengths: Tensor) -> Tensor:
    """Zero every frame at or beyond each clip's length (in place when no grad is tracked)."""
    if _all_real(x, lengths):
        return x
    mask = time_mask(lengths, x.shape[-1], x.dtype)
    if torch.is_grad_enabled() and x.requires_grad:
        return x * mask
    return x.mul_(mask)


def _strided_lengths(lengths: Tensor, stride: int) -> Tensor:
    """Lengths after a time stride: ``ceil(L / stride)`` (see the module docstring)."""
    if stride == 1:
        return lengths
    return torch.div(lengths + (stride - 1), stride, rounding_mode="floor")


def _max_pool(x: Tensor, time_stride: int) -> Tensor:
    """2 x ``time_stride`` max pool, stride = kernel, as elementwise maxima of strided views.

    Several times faster than ``max_pool2d`` on contiguous CPU tensors.  An
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


def _relu(x: Tensor) -> Tensor:
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
        if _all_real(x, lengths):  # no padding: the fused kernel computes the same statistics
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


def _recompute_context(block: nn.Module) -> Callable[[], tuple[Any, Any]]:
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


def _conv_bn(conv: nn.Conv2d, bn: MaskedBatchNorm2d, x: Tensor, lengths: Tensor) -> Tensor:
    """``bn(conv(x))``: masked batch statistics in training, BN folded into the conv in eval."""
    if bn.training or not bn.track_running_stats:
        return bn(conv(x), lengths)
    weight, bias = bn.folded(conv.weight)
    return F.conv2d(x, weight, bias, conv.stride, conv.padding)


class MaskedClassifier(nn.Module):
    """Base for the masked models: input handling, MaskedGAP pooling and the head.

    Subclasses build ``self.blocks`` (each ``block(x, lengths) -> (x, lengths)``)
    and set ``self._time_stride`` (total time stride) and
    ``self._receptive_field`` (frames of input one output frame depends on).
    """

    def __init__(self, config: ModelConfig, out_channels: int, out_rows: int = 1) -> None:
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList()
        self.dropout = nn.Dropout(config.dropout)
        features = out_channels * (out_rows if config.freq_pooling == "keep" else 1)
        self.head = nn.Linear(features * (2 if config.pooling == "meanstd" else 1), config.n_classes)
        self.attention: nn.Linear | None = nn.Linear(features, 1) if config.pooling == "attention" else None
        self.bin_shift: Tensor | None
        self.bin_scale: Tensor | None
        if config.bin_mean is not None and config.bin_std is not None:
            # Not in the state dict: the config holds them (checkpoints stay loadable without them).
            self.register_buffer("bin_shift", torch.tensor(config.bin_mean)[None, None, :, None], persistent=False)
            self.register_buffer("bin_scale", 1.0 / torch.tensor(config.bin_std)[None, None, :, None],
                                 persistent=False)
        else:
            self.bin_shift = self.bin_scale = None
        self.stats_linear: nn.Linear | None = None
        self.stats_shift: Tensor
        self.stats_scale: Tensor
        if config.stats_head:
            n_stats = len(BAND_STATS) * config.n_bins
            self.stats_linear = nn.Linear(n_stats, config.n_classes)
            nn.init.zeros_(self.stats_linear.weight)
            nn.init.zeros_(self.stats_linear.bias)
            self.stats_linear.requires_grad_(False)  # fitted in closed form (infer.train.stats_head), never by SGD
            # Standardisation of the statistics, fitted with the head (saved in the state dict).
            self.register_buffer("stats_shift", torch.zeros(n_stats))
            self.register_buffer("stats_scale", torch.ones(n_stats))
        self._time_stride = 1
        self._receptive_field = 1
        self.grad_checkpoint = False
        """Gradient checkpointing: in training, each block's activations are recomputed in backward instead
        of kept, trading compute for memory (the cost probe accounts for it)."""

    @property
    def time_stride(self) -> int:
        """Total stride in time (input frames per output frame); batches align to it."""
        return self._time_stride

    @property
    def receptive_field(self) -> int:
        """Input frames (in time) that one output frame depends on."""
        return self._receptive_field

    @property
    def window_align(self) -> int:
        """Frames a long clip's windows (:mod:`infer.windows`) start and split on: the pooling window, or the
        time stride when the whole clip is pooled at once."""
        return self.config.pool_window or self._time_stride

    def _check_pool_window(self) -> None:
        if self.config.pool_window % self._time_stride:
            raise ModelConfigError(f"pool_window ({self.config.pool_window} frames) must be a multiple of the "
                                   f"model's time stride ({self._time_stride})")

    def _prepare(self, x: Tensor, lengths: Tensor | Any) -> tuple[Tensor, Tensor]:
        """Validate, normalise, mask and pad ``x`` to a multiple of the time stride."""
        if x.ndim != 4 or x.shape[1] != 1 or x.shape[2] != self.config.n_bins:
            raise ValueError(f"expected input (B, 1, {self.config.n_bins}, T), got {tuple(x.shape)}")
        lengths = torch.as_tensor(lengths, device=x.device).long()
        if lengths.shape != (x.shape[0],):
            raise ValueError(f"lengths must have shape ({x.shape[0]},), got {tuple(lengths.shape)}")
        if lengths.numel() and (int(lengths.min()) < MIN_FRAMES or int(lengths.max()) > x.shape[-1]):
            raise ValueError(f"lengths must lie in [{MIN_FRAMES}, {x.shape[-1]}] frames")
        if self.bin_shift is not None and self.bin_scale is not None:
            h = (x - self.bin_shift.to(x.dtype)) * self.bin_scale.to(x.dtype)
        else:
            h = (x - self.config.input_mean) * (1.0 / self.config.input_std)
        h = _remask(h, lengths)
        extra = -x.shape[-1] % self.time_stride
        if extra:
            h = F.pad(h, (0, extra))
        return h, lengths

    def checkpoint_segments(self) -> list[nn.Module]:
        """The parts gradient checkpointing recomputes one at a time (the blocks)."""
        return list(self.blocks)

    def features(self, x: Tensor, lengths: Tensor | Any) -> tuple[Tensor, Tensor]:
        """Backbone: ``(B, C, F', T')`` masked activations and their lengths ``(B,)``."""
        return self._backbone(*self._prepare(x, lengths))

    def _backbone(self, h: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        """The blocks on a prepared input (:meth:`_prepare`)."""
        pool = self.config.input_time_pool
        if pool > 1:  # frames beyond a length are zeros: the straddling window averages as it does alone
            h = F.avg_pool2d(h, (1, pool))
            lengths = _strided_lengths(lengths, pool)
        recompute = self.grad_checkpoint and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                h, lengths = checkpoint(
                    block,
                    h,
                    lengths,
                    use_reentrant=False,
                    context_fn=_recompute_context(block),
                )
            else:
                h, lengths = block(h, lengths)
        return h, lengths

    def pooled_sum(
        self,
        x: Tensor,
        lengths: Tensor | Any,
        pool_start: Tensor | None = None,
        pool_stop: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """MaskedGAP numerator and denominator: ``(sums (B, C) float32, counts (B,) float32)``.

        ``sums`` is the sum over real output frames of the frequency-mean
        activations, ``counts`` the number of those frames (``"meanstd"``
        pooling appends the sums of squares: ``(B, 2C)``; ``"attention"``
        weighs each frame and counts the weights).  With
        ``pool_start``/``pool_stop`` (input frames, ``(B,)``; the start a
        multiple of :attr:`time_stride`) only output frames covering
        ``[pool_start, pool_stop)`` are pooled, which lets overlapping windows
        of a long clip each contribute only the part they own.
        """
        prepared, lengths = self._prepare(x, lengths)
        stats = (self._stats_sums(prepared, lengths, pool_start, pool_stop)
                 if self.stats_linear is not None and not self.training else None)
        h, out_lengths = self._backbone(prepared, lengths)
        # (B, C, T'): the mean over frequency, or every (channel, frequency row) as a feature of its own
        per_frame = h.float().flatten(1, 2) if self.config.freq_pooling == "keep" else h.float().mean(dim=2)
        steps = torch.arange(per_frame.shape[-1], device=per_frame.device)[None, :]
        keep = steps < out_lengths[:, None]
        if pool_start is not None:
            start = torch.as_tensor(pool_start, device=h.device).long()
            keep = keep & (steps >= torch.div(start, self.time_stride, rounding_mode="floor")[:, None])
        if pool_stop is not None:
            stop = _strided_lengths(torch.as_tensor(pool_stop, device=h.device).long(), self.time_stride)
            keep = keep & (steps < stop[:, None])
        weights = keep.to(per_frame.dtype)
        if self.attention is not None:
            score = self.attention(per_frame.transpose(1, 2))[..., 0].float()  # (B, T'), each frame alone
            weights = weights * torch.exp(ATTENTION_BOUND * torch.tanh(score / ATTENTION_BOUND))
        if self.config.pool_window:
            sums, counts = self._window_logits(per_frame, weights, keep.to(per_frame.dtype))
        else:
            sums, counts = self._frame_sums(per_frame, weights), weights.sum(dim=-1)
        if stats is not None:
            sums = torch.cat([sums, stats], dim=1)
        return sums, counts

    def _frame_sums(self, per_frame: Tensor, weights: Tensor) -> Tensor:
        """Sums over frames of ``per_frame (..., C, T)`` weighted by ``weights (..., T)`` (and of the squares,
        for ``meanstd``): the pooling's statistics, ``(..., C)`` or ``(..., 2C)``."""
        sums = (per_frame * weights[..., None, :]).sum(dim=-1)
        if self.config.pooling == "meanstd":
            sums = torch.cat([sums, (per_frame.square() * weights[..., None, :]).sum(dim=-1)], dim=-1)
        return sums

    def _window_logits(self, per_frame: Tensor, weights: Tensor, real: Tensor) -> tuple[Tensor, Tensor]:
        """``pool_window``: each window's logits times its real frames, summed ``(B, n_classes)``, and the real
        frames ``(B,)``; windows without a real frame count for nothing."""
        size = self.config.pool_window // self._time_stride
        b, c, t = per_frame.shape
        n = -(-t // size)
        pad = n * size - t
        frames = F.pad(per_frame, (0, pad)).reshape(b, c, n, size).transpose(1, 2)  # (B, J, C, size)
        w = F.pad(weights, (0, pad)).reshape(b, n, size)
        real_frames = F.pad(real, (0, pad)).reshape(b, n, size).sum(dim=-1)  # (B, J)
        logits = self._classify_cnn(self._frame_sums(frames, w).flatten(0, 1), w.sum(dim=-1).flatten())
        logits = logits.float().reshape(b, n, -1) * real_frames[..., None]
        return logits.sum(dim=1), real_frames.sum(dim=1)

    def _stats_sums(self, h: Tensor, lengths: Tensor, pool_start: Tensor | None = None,
                    pool_stop: Tensor | None = None) -> Tensor:
        """``(B, 3 * n_bins + 2)`` float32: per bin the sums of values, squares and absolute frame-to-frame
        changes over the real input frames in ``[pool_start, pool_stop)``, then the two frame counts.

        ``h``: the prepared input (normalised, masked).  A change counts at frame
        ``t >= 1`` (it reads frame ``t - 1``, which a window owning ``t`` holds as context).
        """
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
        return torch.cat([(v * w[:, None]).sum(-1), (v.square() * w[:, None]).sum(-1),
                          (change * w_change[:, None]).sum(-1), w.sum(-1, keepdim=True),
                          w_change.sum(-1, keepdim=True)], dim=1)

    @staticmethod
    def band_statistics(stats_sums: Tensor) -> Tensor:
        """``(B, 3 * n_bins)``: per-bin mean, standard deviation, mean absolute change (:data:`BAND_STATS`)
        from :meth:`_stats_sums`' sums (a clip of one frame has no change: 0)."""
        n_bins = (stats_sums.shape[1] - 2) // 3
        s1, s2, sd = stats_sums[:, :n_bins], stats_sums[:, n_bins:2 * n_bins], stats_sums[:, 2 * n_bins:3 * n_bins]
        n = stats_sums[:, -2:-1].clamp(min=1.0)
        mean = s1 / n
        std = torch.sqrt((s2 / n - mean.square()).clamp(min=0.0))
        return torch.cat([mean, std, sd / stats_sums[:, -1:].clamp(min=1.0)], dim=1)

    @torch.no_grad()
    def clip_statistics(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """``(B, 3 * n_bins)`` float32 statistics of whole clips, as the statistics head sees them."""
        h, lengths = self._prepare(x, lengths)
        return self.band_statistics(self._stats_sums(h, lengths))

    def stats_logits(self, statistics: Tensor) -> Tensor:
        """The statistics head's logits ``(B, n_classes)`` from :meth:`clip_statistics`' values."""
        assert self.stats_linear is not None
        z = (statistics - self.stats_shift) * self.stats_scale
        return self.stats_linear(z.to(self.stats_linear.weight.dtype))

    def classify(self, sums: Tensor, counts: Tensor) -> Tensor:
        """Logits ``(B, n_classes)`` from pooled sums and counts (the pooling's statistics, then the head).

        With the statistics head, sums that carry its part (eval mode) add
        ``stats_weight`` times its logits.
        """
        extra = None
        n_stats = len(BAND_STATS) * self.config.n_bins + 2
        width = self.head.out_features if self.config.pool_window else self.head.in_features
        if self.stats_linear is not None and sums.shape[1] == width + n_stats:
            sums, extra = sums[:, :-n_stats], sums[:, -n_stats:]
        if self.config.pool_window:  # the windows' logits, weighted by their real frames
            logits = sums / counts.clamp(min=1.0)[:, None]
        else:
            logits = self._classify_cnn(sums, counts)
        if extra is not None and self.config.stats_weight:
            logits = logits + self.config.stats_weight * self.stats_logits(self.band_statistics(extra.float()))
        return logits

    def _classify_cnn(self, sums: Tensor, counts: Tensor) -> Tensor:
        if self.config.pooling == "attention":
            pooled = sums / counts.clamp(min=1e-30)[:, None]
        else:
            pooled = sums / counts.clamp(min=1.0)[:, None]
        if self.config.pooling == "meanstd":
            mean, square = pooled.chunk(2, dim=1)
            std = torch.sqrt((square - mean.square()).clamp(min=0.0) + 1e-6)
            pooled = torch.cat([mean, std], dim=1)
        return self.head(self.dropout(pooled.to(self.head.weight.dtype)))

    def forward(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """Logits ``(B, n_classes)`` for ``x (B, 1, n_bins, T)`` with real ``lengths (B,)``."""
        sums, counts = self.pooled_sum(x, lengths)
        return self.classify(sums, counts)


class ConvBlock(nn.Module):
    """conv(3 x time_kernel)-MaskedBN, mask, 2x2 max pool (freq and time), ReLU.

    ReLU after the pool equals ReLU before it (max and ReLU commute), at a
    quarter of the cost.  Masking before the pool zeroes padded frames, so the
    pool window straddling a clip's end (odd length) sees the real frame and
    a zero, as the clip alone does (its own padding to the stride is zero
    too): ``relu(max(x, 0)) == max(relu(x), relu(0))``.  Windows wholly in the
    padding pool zeros, so the output is already masked for the new lengths
    ``ceil(L / 2)``.
    """

    def __init__(self, c_in: int, c_out: int, config: ModelConfig, freq_kernel: int = 3) -> None:
        super().__init__()
        kt = config.time_kernel
        self.conv = nn.Conv2d(c_in, c_out, (freq_kernel, kt), padding=(freq_kernel // 2, kt // 2), bias=False)
        self.bn = MaskedBatchNorm2d(c_out, eps=config.bn_eps, momentum=config.bn_momentum)
        self.stride = 2 if config.time_pool else 1

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        h = _remask(_conv_bn(self.conv, self.bn, x, lengths), lengths)
        return _relu(_max_pool(h, self.stride)), _strided_lengths(lengths, self.stride)


class SpectrogramCNN(MaskedClassifier):
    """Compact CNN: ``depth`` ConvBlocks, MaskedGAP, dropout, linear head.

    Default (width 32, depth 4): channels 32-64-128-256, about 390k
    parameters, time stride 16.
    """

    def __init__(self, config: ModelConfig) -> None:
        channels = config.channels
        super().__init__(config, channels[-1], _halved(config.n_bins, config.depth))
        c_in = 1
        rf = jump = config.input_time_pool
        for c_out in channels:
            block = ConvBlock(c_in, c_out, config, config.stem_freq_kernel if c_in == 1 else 3)
            self.blocks.append(block)
            rf += (config.time_kernel - 1) * jump
            rf += (block.stride - 1) * jump
            jump *= block.stride
            c_in = c_out
        self._time_stride = jump
        self._receptive_field = rf
        self._check_pool_window()


class Stem(nn.Module):
    """ResNet stem: conv(3 x time_kernel)-MaskedBN-ReLU, re-mask, 2x2 max pool."""

    def __init__(self, c_out: int, config: ModelConfig) -> None:
        super().__init__()
        self.block = ConvBlock(1, c_out, config, config.stem_freq_kernel)
        self.stride = self.block.stride

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        return self.block(x, lengths)


class ResidualBlock(nn.Module):
    """Basic residual block with masked BN; re-masks after each conv stage.

    ``conv(stride) -> BN -> ReLU -> mask -> conv -> BN``, plus the shortcut
    (identity, or 1x1 conv(stride) + BN), then ReLU and mask.  A stride-2 conv
    (kernel k, padding k // 2) on an even, zero-masked input gives output
    lengths ``ceil(L / 2)`` with values independent of padding.
    """

    def __init__(self, c_in: int, c_out: int, stride: int, config: ModelConfig) -> None:
        super().__init__()
        kt = config.time_kernel
        self.stride = stride if config.time_pool else 1
        strides = (stride, self.stride)
        self.conv1 = nn.Conv2d(c_in, c_out, (3, kt), stride=strides, padding=(1, kt // 2), bias=False)
        self.bn1 = MaskedBatchNorm2d(c_out, eps=config.bn_eps, momentum=config.bn_momentum)
        self.conv2 = nn.Conv2d(c_out, c_out, (3, kt), padding=(1, kt // 2), bias=False)
        self.bn2 = MaskedBatchNorm2d(c_out, eps=config.bn_eps, momentum=config.bn_momentum)
        self.shortcut_conv: nn.Conv2d | None = None
        self.shortcut_bn: MaskedBatchNorm2d | None = None
        if stride != 1 or c_in != c_out:
            self.shortcut_conv = nn.Conv2d(c_in, c_out, 1, stride=strides, bias=False)
            self.shortcut_bn = MaskedBatchNorm2d(c_out, eps=config.bn_eps, momentum=config.bn_momentum)

    def forward(self, x: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor]:
        out_lengths = _strided_lengths(lengths, self.stride)
        h = _remask(_relu(_conv_bn(self.conv1, self.bn1, x, out_lengths)), out_lengths)
        h = _conv_bn(self.conv2, self.bn2, h, out_lengths)
        if self.shortcut_conv is not None and self.shortcut_bn is not None:
            skip = _conv_bn(self.shortcut_conv, self.shortcut_bn, x, out_lengths)
        else:
            skip = x
        h = _relu(h + skip)
        return _remask(h, out_lengths), out_lengths


class SpectrogramResNet(MaskedClassifier):
    """Residual family for GPU users: stem + ``depth`` stages of ``blocks_per_stage`` blocks.

    Default (width 32, depth 4, 2 blocks per stage): channels 32-64-128-256,
    about 2.8M parameters, time stride 16.
    """

    def __init__(self, config: ModelConfig) -> None:
        channels = config.channels
        super().__init__(config, channels[-1], _halved(config.n_bins, config.depth))
        kt = config.time_kernel
        stem = Stem(channels[0], config)
        self.blocks.append(stem)
        p = config.input_time_pool
        rf = p + (kt - 1) * p + (stem.stride - 1) * p
        jump = stem.stride * p
        c_in = channels[0]
        for i, c_out in enumerate(channels):
            for j in range(config.blocks_per_stage):
                stride = 2 if (i > 0 and j == 0) else 1
                block = ResidualBlock(c_in, c_out, stride, config)
                self.blocks.append(block)
                rf += (kt - 1) * jump
                jump *= block.stride
                rf += (kt - 1) * jump
                c_in = c_out
        self._time_stride = jump
        self._receptive_field = rf
        self._check_pool_window()




def build_model(config: ModelConfig) -> MaskedClassifier:
    """The model a config describes (fresh weights)."""
    if config.arch == "cnn":
        return SpectrogramCNN(config)
    if config.arch == "resnet":
        return SpectrogramResNet(config)
    raise ModelConfigError(f"unknown arch {config.arch!r}")  # unreachable: config validates


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
