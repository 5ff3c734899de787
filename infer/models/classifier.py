"""The masked classifier: input handling, a backbone of masked blocks, a pooling, the head(s).

A batch is ``x: (B, 1, n_bins, T)`` zero-padded in time to its longest clip,
plus ``lengths: (B,)`` (real frames per clip); a clip's logits in a padded
batch equal its logits run alone (:mod:`specstore.infer.models.masking` says how the
blocks guarantee it).

Input normalisation is a fixed affine map ``(x - input_mean) / input_std``
taken from the config (dB in, roughly unit scale out), or per frequency bin
``(x - bin_mean[f]) / bin_std[f]`` when the config holds ``bin_mean`` /
``bin_std``.  It is per value, so it does not depend on padding or on where a
long clip is cut into windows; a trainer fits these on a store's real frames
and saves them in the config.  ``input_time_pool = p > 1`` then averages
every ``p`` frames into one: frames beyond a clip's length are zeros, so the
window straddling its end averages the same values in a batch as alone, and
lengths become ``ceil(L / p)``.  After it the input is re-masked (zeros beyond
each length) and zero-padded in time up to a multiple of the model's total
time stride, so every time-strided op sees an even length.

The parts are chosen by name from the registries
(:mod:`specstore.infer.models.registry`): the frequency and time poolings
(:mod:`specstore.infer.models.pooling`), what one pooling covers
(:mod:`specstore.infer.models.pool_window`) and the optional statistics head
(:mod:`specstore.infer.models.stats_head`).  :meth:`MaskedClassifier.pooled` returns
their sums as a :class:`Pooled`; :meth:`~MaskedClassifier.pooled_sum` and
:meth:`~MaskedClassifier.classify` are the same as flat tensors, the engine's
contract (:mod:`specstore.infer.models.contract`) for windowing a long clip exactly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from specstore.infer.errors import ModelConfigError
from specstore.infer.models.config import MIN_FRAMES, ModelConfig

from .masking import exporting, recompute_context, remask, strided_lengths
from .pool_window import PoolSpan, Whole, pool_span
from .pooling import FreqPooling, TimePooling
from .registry import FREQ_POOLING_REGISTRY, POOLING_REGISTRY
from .stats_head import StatsHead, StatsSums, stats_sums, stats_width

__all__ = ["MaskedClassifier", "Pooled"]


class Pooled(NamedTuple):
    """A batch's pooled sums, each additive over the windows of a long clip.

    ``sums (B, width)``: the time pooling's sums (or, with ``pool_window``, the
    windows' logits times their real frames); ``counts (B,)``: the weights'
    totals (real frames); ``stats``: the statistics head's sums (eval mode with
    a statistics head), else None.
    """

    sums: Tensor
    counts: Tensor
    stats: StatsSums | None = None


class MaskedClassifier(nn.Module):
    """Base for the masked models: input handling, the pooling and the head.

    Subclasses build ``self.blocks`` (each ``block(x, lengths) -> (x,
    lengths)``) and then call :meth:`set_geometry` with the total time
    stride and the receptive field.  ``out_channels`` and ``out_rows``: the
    last block's channels and frequency rows.
    """

    def __init__(self, config: ModelConfig, out_channels: int, out_rows: int = 1) -> None:
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList()
        self.dropout = nn.Dropout(config.dropout)
        self.freq_pooling: FreqPooling = FREQ_POOLING_REGISTRY.build(config.freq_pooling)
        features = out_channels * FREQ_POOLING_REGISTRY.get(config.freq_pooling).kept_rows(out_rows)
        self.head = nn.Linear(POOLING_REGISTRY.get(config.pooling).head_inputs(features), config.n_classes)
        # held under its name: an attention pooling's parameters are "attention.weight" and "attention.bias"
        self.add_module(config.pooling, POOLING_REGISTRY.build(config.pooling, features))
        self.bin_shift: Tensor | None
        self.bin_scale: Tensor | None
        if config.bin_mean is not None and config.bin_std is not None:
            # Not in the state dict: the config holds them (checkpoints stay loadable without them).
            self.register_buffer("bin_shift", torch.tensor(config.bin_mean)[None, None, :, None], persistent=False)
            self.register_buffer("bin_scale", 1.0 / torch.tensor(config.bin_std)[None, None, :, None],
                                 persistent=False)
        else:
            self.bin_shift = self.bin_scale = None
        self.stats_linear: StatsHead | None = None
        self.stats_shift: Tensor
        self.stats_scale: Tensor
        if config.stats_head:
            self.stats_linear = StatsHead(config.n_bins, config.n_classes)
            # Standardisation of the statistics, fitted with the head (saved in the state dict).
            self.register_buffer("stats_shift", torch.zeros(self.stats_linear.in_features))
            self.register_buffer("stats_scale", torch.ones(self.stats_linear.in_features))
        self._time_stride = 1
        self._receptive_field = 1
        self._span: PoolSpan = Whole()
        self.grad_checkpoint = False
        """Gradient checkpointing: in training, each block's activations are recomputed in backward instead
        of kept, trading compute for memory (the cost probe accounts for it)."""

    @property
    def pooling(self) -> TimePooling:
        """The time pooling (:mod:`specstore.infer.models.pooling`), held under its registry name."""
        pooling = self._modules[self.config.pooling]
        assert isinstance(pooling, TimePooling)
        return pooling

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
        """Frames a long clip's windows (:mod:`specstore.infer.engine.windows`) start and split on: the pooling window,
        or the time stride when the whole clip is pooled at once."""
        return self.config.pool_window or self._time_stride

    def set_geometry(self, time_stride: int, receptive_field: int) -> None:
        """The blocks' total time stride and receptive field (input frames), and so the pooling window."""
        self._time_stride = time_stride
        self._receptive_field = receptive_field
        if self.config.pool_window % time_stride:
            raise ModelConfigError(f"pool_window ({self.config.pool_window} frames) must be a multiple of the "
                                   f"model's time stride ({time_stride})")
        self._span = pool_span(self.config.pool_window, time_stride)

    def _prepare(self, x: Tensor, lengths: Tensor | Any) -> tuple[Tensor, Tensor]:
        """Validate, normalise, mask and pad ``x`` to a multiple of the time stride."""
        if x.ndim != 4 or x.shape[1] != 1 or x.shape[2] != self.config.n_bins:
            raise ValueError(f"expected input (B, 1, {self.config.n_bins}, T), got {tuple(x.shape)}")
        lengths = torch.as_tensor(lengths, device=x.device).long()
        if lengths.shape != (x.shape[0],):
            raise ValueError(f"lengths must have shape ({x.shape[0]},), got {tuple(lengths.shape)}")
        if not exporting() and lengths.numel() and (int(lengths.min()) < MIN_FRAMES
                                                    or int(lengths.max()) > x.shape[-1]):
            raise ValueError(f"lengths must lie in [{MIN_FRAMES}, {x.shape[-1]}] frames")
        if self.bin_shift is not None and self.bin_scale is not None:
            h = (x - self.bin_shift.to(x.dtype)) * self.bin_scale.to(x.dtype)
        else:
            h = (x - self.config.input_mean) * (1.0 / self.config.input_std)
        h = remask(h, lengths)
        frames = x.shape[-1]
        # infer.budget.align_frames' rule, spelled with positive integers only: ONNX divides integers toward
        # zero, so -(-frames // stride) would export as the wrong size (infer/engine/export.py)
        padded = (frames + self.time_stride - 1) // self.time_stride * self.time_stride
        if exporting() or padded != frames:  # exported: the pad is part of the graph, whatever the frames
            h = F.pad(h, (0, padded - frames))
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
            lengths = strided_lengths(lengths, pool)
        recompute = self.grad_checkpoint and self.training and torch.is_grad_enabled()
        for block in self.blocks:
            if recompute:
                h, lengths = checkpoint(block, h, lengths, use_reentrant=False, context_fn=recompute_context(block))
            else:
                h, lengths = block(h, lengths)
        return h, lengths

    def _owned(self, out_lengths: Tensor, n_frames: int, pool_start: Tensor | None,
               pool_stop: Tensor | None) -> Tensor:
        """``(B, T')`` bool: the output frames that are real and cover input frames in ``[pool_start,
        pool_stop)`` (the start a multiple of the time stride)."""
        steps = torch.arange(n_frames, device=out_lengths.device)[None, :]
        keep = steps < out_lengths[:, None]
        if pool_start is not None:
            start = torch.as_tensor(pool_start, device=out_lengths.device).long()
            keep = keep & (steps >= torch.div(start, self.time_stride, rounding_mode="floor")[:, None])
        if pool_stop is not None:
            stop = strided_lengths(torch.as_tensor(pool_stop, device=out_lengths.device).long(), self.time_stride)
            keep = keep & (steps < stop[:, None])
        return keep

    def pooled(self, x: Tensor, lengths: Tensor | Any, pool_start: Tensor | None = None,
               pool_stop: Tensor | None = None) -> Pooled:
        """The batch's pooled sums (:class:`Pooled`); with ``pool_start``/``pool_stop`` (input frames,
        ``(B,)``) only the frames covering ``[pool_start, pool_stop)`` count, which lets overlapping windows of
        a long clip each contribute only the part they own."""
        prepared, lengths = self._prepare(x, lengths)
        stats = (stats_sums(prepared, lengths, pool_start, pool_stop)
                 if self.stats_linear is not None and not self.training else None)
        h, out_lengths = self._backbone(prepared, lengths)
        per_frame = self.freq_pooling(h)  # (B, features, T')
        real = self._owned(out_lengths, per_frame.shape[-1], pool_start, pool_stop).to(per_frame.dtype)
        weights = self.pooling.weights(per_frame, real)
        sums, counts = self._span.sums(per_frame, weights, real, self.pooling, self.head_logits)
        return Pooled(sums, counts, stats)

    def pooled_sum(self, x: Tensor, lengths: Tensor | Any, pool_start: Tensor | None = None,
                   pool_stop: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """:meth:`pooled` as ``(sums (B, width) float32, counts (B,) float32)``: the pooling's sums, then (eval
        mode, statistics head) the statistics' sums (:meth:`StatsSums.flat`)."""
        pooled = self.pooled(x, lengths, pool_start, pool_stop)
        if pooled.stats is None:
            return pooled.sums, pooled.counts
        return torch.cat([pooled.sums, pooled.stats.flat()], dim=1), pooled.counts

    def classify(self, sums: Tensor, counts: Tensor) -> Tensor:
        """Logits ``(B, n_classes)`` from :meth:`pooled_sum`'s sums and counts (summed over windows), taken
        in the same mode: eval mode with a statistics head carries the statistics' sums."""
        width = self._span.width(self.head.in_features, self.head.out_features)
        carries = self.stats_linear is not None and not self.training
        expected = width + (stats_width(self.config.n_bins) if carries else 0)
        if sums.shape[1] != expected:
            raise ValueError(f"sums have {sums.shape[1]} columns; this model pools {expected} in "
                             f"{'eval' if carries else 'this'} mode")
        stats = StatsSums.from_flat(sums[:, width:]) if carries else None
        return self.classify_pooled(Pooled(sums[:, :width], counts, stats))

    def classify_pooled(self, pooled: Pooled) -> Tensor:
        """Logits ``(B, n_classes)`` of (summed) pooled sums: the head's, plus ``stats_weight`` times the
        statistics head's when ``pooled`` carries its sums."""
        logits = self._span.logits(pooled.sums, pooled.counts, self.pooling, self.head_logits)
        if pooled.stats is not None and self.config.stats_weight:
            logits = logits + self.config.stats_weight * self.stats_logits(pooled.stats.band_statistics())
        return logits

    def head_logits(self, sums: Tensor, counts: Tensor) -> Tensor:
        """The CNN head's logits from one pooling's sums and counts."""
        pooled = self.pooling.pooled(sums, counts)
        return self.head(self.dropout(pooled.to(self.head.weight.dtype)))

    @torch.no_grad()
    def clip_statistics(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """``(B, 3 * n_bins)`` float32 statistics of whole clips, as the statistics head sees them."""
        h, lengths = self._prepare(x, lengths)
        return stats_sums(h, lengths).band_statistics()

    def stats_logits(self, statistics: Tensor) -> Tensor:
        """The statistics head's logits ``(B, n_classes)`` from :meth:`clip_statistics`' values."""
        assert self.stats_linear is not None
        return self.stats_linear.logits(statistics, self.stats_shift, self.stats_scale)

    @property
    def embedding_dim(self) -> int:
        """Width of :meth:`embed`'s clip embedding: the head's input."""
        return int(self.head.in_features)

    def embed(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """``(B, embedding_dim)`` clip embeddings: the time pooling's output over each clip's real frames, what
        the head reads (so any built-in model can be a frozen backbone for a transfer head,
        :mod:`specstore.infer.transfer`).  Needs ``pool_window=0`` (a windowed model's sums are logits)."""
        if not isinstance(self._span, Whole):
            raise ModelConfigError("embed needs a model that pools the whole clip (pool_window=0)")
        pooled = self.pooled(x, lengths)
        return self.pooling.pooled(pooled.sums, pooled.counts)

    def forward(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """Logits ``(B, n_classes)`` for ``x (B, 1, n_bins, T)`` with real ``lengths (B,)``."""
        return self.classify_pooled(self.pooled(x, lengths))
