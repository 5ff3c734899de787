"""Building a model from its config: the architecture registry's builder, imported on first use."""

from __future__ import annotations

from typing import cast

from torch import nn

from specstore.infer.models.config import ModelConfig

from .classifier import MaskedClassifier
from .registry import ARCH_REGISTRY

__all__ = ["build_model", "count_parameters"]


def build_model(config: ModelConfig) -> MaskedClassifier:
    """The model a config describes (fresh weights), built by its architecture's registered builder.

    Code the caller registered is code the caller runs: no trust check here;
    a model a file names is checked by :class:`specstore.infer.models.contract.ModelSpec`.
    """
    return cast(MaskedClassifier, ARCH_REGISTRY.build(config.arch, config))


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
