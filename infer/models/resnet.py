"""The residual family for GPU users: a stem, then ``depth`` stages of masked residual blocks."""

from __future__ import annotations

from torch import Tensor, nn

from specstore.infer.models.config import ModelConfig

from .classifier import MaskedClassifier
from .cnn import ConvBlock
from .masking import MaskedBatchNorm2d, conv_bn, relu, remask, strided_lengths
from .sizes import last_activations

__all__ = ["ResidualBlock", "SpectrogramResNet", "Stem"]


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
        out_lengths = strided_lengths(lengths, self.stride)
        h = remask(relu(conv_bn(self.conv1, self.bn1, x, out_lengths)), out_lengths)
        h = conv_bn(self.conv2, self.bn2, h, out_lengths)
        if self.shortcut_conv is not None and self.shortcut_bn is not None:
            skip = conv_bn(self.shortcut_conv, self.shortcut_bn, x, out_lengths)
        else:
            skip = x
        h = relu(h + skip)
        return remask(h, out_lengths), out_lengths


class SpectrogramResNet(MaskedClassifier):
    """Residual family for GPU users: stem + ``depth`` stages of ``blocks_per_stage`` blocks (sizes of common
    configs: ``docs/architectures.md``)."""

    def __init__(self, config: ModelConfig) -> None:
        channels = config.channels
        super().__init__(config, *last_activations(config))
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
        self.set_geometry(jump, rf)
