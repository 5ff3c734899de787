"""The compact CNN: ``depth`` masked conv blocks, each halving frequency and (with ``time_pool``) time."""

from __future__ import annotations

from torch import Tensor, nn

from specstore.infer.models.config import ModelConfig

from .classifier import MaskedClassifier
from .masking import MaskedBatchNorm2d, conv_bn, max_pool, relu, remask, strided_lengths
from .sizes import last_activations

__all__ = ["ConvBlock", "SpectrogramCNN"]


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
        h = remask(conv_bn(self.conv, self.bn, x, lengths), lengths)
        return relu(max_pool(h, self.stride)), strided_lengths(lengths, self.stride)


class SpectrogramCNN(MaskedClassifier):
    """Compact CNN: ``depth`` ConvBlocks, then the configured pooling, dropout and linear head (sizes of
    common configs: ``docs/architectures.md``)."""

    def __init__(self, config: ModelConfig) -> None:
        channels = config.channels
        super().__init__(config, *last_activations(config))
        c_in = 1
        rf = jump = config.input_time_pool
        for c_out in channels:
            block = ConvBlock(c_in, c_out, config, config.stem_freq_kernel if c_in == 1 else 3)
            self.blocks.append(block)
            rf += (config.time_kernel - 1) * jump
            rf += (block.stride - 1) * jump
            jump *= block.stride
            c_in = c_out
        self.set_geometry(jump, rf)
