"""Masked classifiers for variable-length spectrogram clips, built from registered parts.

* :mod:`infer.models.registry` (no torch): the architectures, time poolings
  and frequency poolings by name, with their parameter counts; what the
  command lines, :class:`ModelConfig`, the checkpoint loader and the
  documents read.  ``docs/architectures.md`` shows a new architecture
  registered from user code.
* :mod:`infer.models.masking`: the ops that keep padding invisible (a
  clip's logits in a padded batch equal its logits alone).
* :mod:`infer.models.classifier`: :class:`MaskedClassifier`, the input
  handling, backbone loop, pooling and head every architecture shares.
* :mod:`infer.models.pooling`, :mod:`infer.models.pool_window`,
  :mod:`infer.models.stats_head`: the parts a config chooses.
* :mod:`infer.models.cnn`, :mod:`infer.models.resnet`: the built-in
  architectures; :func:`build_model` builds any registered one.

Exports load lazily (:mod:`store.lazy`), so importing the registry costs no
torch.
"""

from typing import TYPE_CHECKING

from store.lazy import lazy_package

__all__ = lazy_package(__name__, {
    "..model_config": ("ARCHS", "BAND_STATS", "FREQ_POOLINGS", "MAX_PARAMETERS", "MAX_TIME_STRIDE", "MIN_FRAMES",
                       "POOLINGS", "ModelConfig", "ModelConfigError"),
    "build": ("build_model", "count_parameters"),
    "classifier": ("MaskedClassifier", "Pooled"),
    "cnn": ("ConvBlock", "SpectrogramCNN"),
    "masking": ("MaskedBatchNorm2d", "time_mask"),
    "pooling": ("AttentionPooling", "FreqPooling", "TimePooling"),
    "registry": ("Arch", "FreqPoolingEntry", "PoolingEntry", "register_arch", "register_freq_pooling",
                 "register_pooling"),
    "resnet": ("SpectrogramResNet",),
    "stats_head": ("StatsSums",),
})

if TYPE_CHECKING:  # what the lazy exports are, for type checkers (noqa: the names are exported, not used)
    from ..model_config import ARCHS, BAND_STATS, FREQ_POOLINGS, MAX_PARAMETERS, MAX_TIME_STRIDE  # noqa: F401
    from ..model_config import MIN_FRAMES, POOLINGS, ModelConfig, ModelConfigError  # noqa: F401
    from .build import build_model, count_parameters  # noqa: F401
    from .classifier import MaskedClassifier, Pooled  # noqa: F401
    from .cnn import ConvBlock, SpectrogramCNN  # noqa: F401
    from .masking import MaskedBatchNorm2d, time_mask  # noqa: F401
    from .pooling import AttentionPooling, FreqPooling, TimePooling  # noqa: F401
    from .registry import Arch, FreqPoolingEntry, PoolingEntry, register_arch  # noqa: F401
    from .registry import register_freq_pooling, register_pooling  # noqa: F401
    from .resnet import SpectrogramResNet  # noqa: F401
    from .stats_head import StatsSums  # noqa: F401
