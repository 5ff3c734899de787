"""Shapes and parameter counts of the built-in architectures, from a config alone (no torch).

The configuration check (:attr:`specstore.infer.models.config.ModelConfig.n_parameters`)
bounds what a checkpoint can make the loader allocate before any tensor
exists, so each architecture states here, beside its registry entry
(:mod:`specstore.infer.models.registry`), how many parameters its backbone has and the
shape of its last activations; ``tests/infer/test_architectures.py`` checks the
counts against the built models for every registered part.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specstore.infer.models.config import ModelConfig

__all__ = ["MUSICNN_BACKBONE_PARAMETERS", "cnn_parameters", "halved", "last_activations", "musicnn_activations",
           "musicnn_parameters", "resnet_parameters"]


def halved(n: int, times: int) -> int:
    """Frequency rows left after ``times`` halvings (2x2 pools or stride-2 convs): ceil(n / 2) each time."""
    for _ in range(times):
        n = -(-n // 2)
    return n


def last_activations(config: ModelConfig) -> tuple[int, int]:
    """``(channels, frequency rows)`` of the last block's activations (cnn and resnet alike: every block or
    stage halves frequency once)."""
    return config.channels[-1], halved(config.n_bins, config.depth)


def cnn_parameters(config: ModelConfig) -> int:
    """Parameters of the CNN's conv blocks: each conv (no bias) and its BatchNorm's scale and shift."""
    chans, kt = config.channels, config.time_kernel
    c_ins, fks = [1, *chans[:-1]], [config.stem_freq_kernel] + [3] * (config.depth - 1)
    return sum(c_in * c_out * fk * kt + 2 * c_out for c_in, c_out, fk in zip(c_ins, chans, fks, strict=True))


def resnet_parameters(config: ModelConfig) -> int:
    """Parameters of the ResNet's stem and residual blocks (two convs each, a 1x1 shortcut where the shape
    changes), with their BatchNorms."""
    chans, kt = config.channels, config.time_kernel
    n = chans[0] * config.stem_freq_kernel * kt + 2 * chans[0]
    c_in = chans[0]
    for i, c_out in enumerate(chans):
        for j in range(config.blocks_per_stage):
            n += c_in * c_out * 3 * kt + c_out * c_out * 3 * kt + 4 * c_out
            if (i > 0 and j == 0) or c_in != c_out:
                n += c_in * c_out + 2 * c_out
            c_in = c_out
    return n


MUSICNN_BACKBONE_PARAMETERS = 777_109
"""musicnn's trainable parameters below its output layer: input batch norm (2), timbral blocks (7x38 and 7x67
kernels, 204 filters: 54 876 + 96 288), temporal blocks (128, 64, 32 frames, 51 filters: 6 681 + 3 417 + 1 785),
mid end (251 520 + 2 x 28 864), pooled batch norm (3 012), dense 1506 -> 200 (301 400) and its batch norm (400).
With the 50-tag output (10 050) and the batch norms' running statistics (2 x 2 460) it is the checkpoint's
792 079."""


def musicnn_parameters(config: ModelConfig) -> int:
    """musicnn's backbone (fixed: the shipped layout); the registry adds the output layer as the head."""
    return MUSICNN_BACKBONE_PARAMETERS


def musicnn_activations(config: ModelConfig) -> tuple[int, int]:
    """``(channels, frequency rows)`` the head reads: the 200-wide penultimate layer, one row."""
    return 200, 1
