"""A head on a pretrained backbone: a shipped model's clip embedding, standardised, then a linear layer.

:class:`TransferClassifier` is what ``make train ARCH=musicnn`` saves (:mod:`specstore.infer.train.transfer`): the
backbone is a shipped model (:mod:`specstore.infer.models.shipped`, e.g. ``musicnn-msd``) whose ``embed(x, lengths)``
gives a ``(B, embedding_dim)`` clip embedding; the head reads ``(embedding - shift) * scale`` (the training embeddings'
mean and inverse standard deviation, saved as buffers).  Its checkpoint holds every weight, the backbone's included, so
it runs like any checkpoint (``make infer``, ``specstore classify``); building it reads the shipped backbone's
architecture (its weights are then replaced by the checkpoint's).

``finetune = N`` unfreezes the backbone's top ``N`` layers (its last ``N`` child modules that hold parameters)
for SGD with the head; the other layers keep ``requires_grad=False`` and stay in eval mode (their BatchNorm
statistics frozen) even when the model trains.

Any model with ``embed`` and ``embedding_dim`` can be a backbone: every built-in architecture has them
(:meth:`~specstore.infer.models.MaskedClassifier.embed`), which is how the tests stand in a tiny one for musicnn.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from specstore.common import ConfigError
from specstore.common.limits import Limit
from specstore.infer.models.config import ModelConfig, check_parameter_count

if TYPE_CHECKING:
    from specstore.infer.models.checkpoint import Checkpoint

__all__ = ["MAX_EMBEDDING", "TransferClassifier", "backbone_layers"]


def backbone_layers(backbone: nn.Module) -> list[nn.Module]:
    """The backbone's layers, bottom to top: its ``layers()`` when it defines them, else its child modules that
    hold parameters, but for its own output heads (a :class:`~specstore.infer.models.MaskedClassifier`'s blocks one by
    one), which the embedding does not read."""
    own = getattr(backbone, "layers", None)
    if callable(own):
        return list(own())
    out: list[nn.Module] = []
    for name, child in backbone.named_children():
        if name in ("head", "stats_linear"):
            continue
        parts = list(child) if isinstance(child, nn.ModuleList) else [child]
        out.extend(p for p in parts if any(True for _ in p.parameters()))
    return out


MAX_EMBEDDING = 65_536
"""Widest clip embedding a head may read: musicnn's is 200, large audio encoders' are 512-2048."""


def _shipped(backbone: Any) -> Checkpoint:
    """The shipped model named ``backbone`` (:mod:`specstore.infer.models.shipped`), weights included: a fixed model of
    this install, whatever the file asks."""
    from specstore.infer.models.shipped import SHIPPED, load_shipped

    if not isinstance(backbone, str) or backbone not in SHIPPED:
        raise ConfigError(f"a head's backbone is a shipped model ({', '.join(SHIPPED) or 'none'}), not {backbone!r}")
    return load_shipped(backbone)


def _count(shipped: Checkpoint, n_classes: Any, embedding_dim: Any) -> int:
    """The backbone's weights (its checkpoint's tensors) plus the head's linear layer and standardisation."""
    ModelConfig.check_field("n_classes", n_classes)
    Limit(1, MAX_EMBEDDING, "values per clip embedding; musicnn's is 200").check("embedding_dim", embedding_dim,
                                                                                ConfigError)
    backbone = sum(int(t.numel()) for t in shipped.state_dict.values())
    return backbone + (embedding_dim + 1) * n_classes + 2 * embedding_dim


class TransferClassifier(nn.Module):
    """``backbone`` (a shipped model's name) -> embedding -> standardised -> ``nn.Linear`` to ``n_classes``.

    ``embedding_dim``: the backbone's embedding width (checked); ``finetune``: top layers trained (0: frozen).
    """

    def __init__(self, backbone: str, n_classes: int, embedding_dim: int, finetune: int = 0) -> None:
        shipped = _shipped(backbone)
        check_parameter_count(_count(shipped, n_classes, embedding_dim),
                              f"a head on {backbone!r} with {n_classes} outputs from {embedding_dim} values")
        super().__init__()
        self.backbone = shipped.build()
        if not callable(getattr(self.backbone, "embed", None)):
            raise ConfigError(f"shipped model {backbone!r} has no embed(x, lengths); it cannot be a backbone")
        width = int(getattr(self.backbone, "embedding_dim", embedding_dim))
        if width != embedding_dim:
            raise ConfigError(f"{backbone!r} embeds {width} values per clip, not {embedding_dim}")
        self.shift: Tensor
        self.scale: Tensor
        self.register_buffer("shift", torch.zeros(embedding_dim))
        self.register_buffer("scale", torch.ones(embedding_dim))
        self.head = nn.Linear(embedding_dim, n_classes)
        self.init_kwargs: dict[str, Any] = {"backbone": backbone, "n_classes": n_classes,
                                            "embedding_dim": embedding_dim, "finetune": finetune}
        layers = backbone_layers(self.backbone)
        if not 0 <= finetune <= len(layers):
            raise ConfigError(f"finetune must be 0-{len(layers)} (the backbone's layers), got {finetune}")
        self._frozen = layers[:len(layers) - finetune]
        for layer in self._frozen:
            layer.requires_grad_(False)
        for name in ("time_stride", "masks_padding", "window_frames", "receptive_field"):  # the model contract,
            if hasattr(self.backbone, name):  # as the backbone says
                setattr(self, name, getattr(self.backbone, name))
        self.n_bins = shipped.n_bins
        """Rows of the input: the backbone's feature's bins."""
        if callable(getattr(self.backbone, "embedding_sum", None)):  # exact windows of clips too long for a batch
            self.pooled_sum = self._embedding_sum
            self.classify = self._classify_sums

    @classmethod
    def count_parameters(cls, backbone: str, n_classes: int, embedding_dim: int, finetune: int = 0) -> int:
        """Parameters (and the backbone's buffers) of ``TransferClassifier(backbone, n_classes, embedding_dim)``,
        from its arguments and the shipped backbone's checkpoint, before the head is built."""
        return _count(_shipped(backbone), n_classes, embedding_dim)

    def _embedding_sum(self, x: Tensor, lengths: Tensor | Any, pool_start: Tensor | None = None,
                       pool_stop: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``pooled_sum`` where the backbone has ``embedding_sum``: its embedding's frame-weighted sums over the
        owned span and their counts (:mod:`specstore.infer.engine.windows`)."""
        fn: Any = self.backbone.embedding_sum
        return fn(x, lengths, pool_start, pool_stop)

    def _classify_sums(self, sums: Tensor, counts: Tensor) -> Tensor:
        """``classify``: the head's logits of the summed embedding sums over their counts (the clip's embedding)."""
        return self.head_logits(sums / counts[:, None])

    def train(self, mode: bool = True) -> TransferClassifier:
        """Train mode for the head and the unfrozen layers; frozen layers stay in eval mode."""
        super().train(mode)
        for layer in self._frozen:
            layer.eval()
        return self

    def embed(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """The backbone's ``(B, embedding_dim)`` clip embeddings (float32)."""
        embed: Any = self.backbone.embed
        return embed(x, lengths).float()

    def head_logits(self, embeddings: Tensor) -> Tensor:
        """Logits ``(B, n_classes)`` of clip embeddings."""
        return self.head((embeddings.to(self.shift.dtype) - self.shift) * self.scale)

    def forward(self, x: Tensor, lengths: Tensor | Any) -> Tensor:
        """Logits ``(B, n_classes)`` for ``x (B, 1, n_bins, T)`` with real ``lengths (B,)``."""
        return self.head_logits(self.embed(x, lengths))
