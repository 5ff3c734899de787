"""Masked classifiers for variable-length spectrogram clips, built from registered parts.

* :mod:`specstore.infer.models.registry` (no torch): the architectures, time poolings
  and frequency poolings by name, with their parameter counts; what the
  command lines, :class:`ModelConfig`, the checkpoint loader and the
  documents read.  ``docs/architectures.md`` shows a new architecture
  registered from user code.
* :mod:`specstore.infer.models.masking`: the ops that keep padding invisible (a
  clip's logits in a padded batch equal its logits alone).
* :mod:`specstore.infer.models.classifier`: :class:`MaskedClassifier`, the input
  handling, backbone loop, pooling and head every architecture shares.
* :mod:`specstore.infer.models.pooling`, :mod:`specstore.infer.models.pool_window`,
  :mod:`specstore.infer.models.stats_head`: the parts a config chooses.
* :mod:`specstore.infer.models.cnn`, :mod:`specstore.infer.models.resnet`: the built-in
  architectures; :func:`build_model` builds any registered one.
* :mod:`specstore.infer.models.musicnn`, :mod:`specstore.infer.models.transfer`,
  :mod:`specstore.infer.models.ensemble`: the pretrained musicnn, a head on a
  pretrained backbone, and the sum of models (probabilities averaged).
* :mod:`specstore.infer.models.counts`: the parameters of any model a file may
  build without trust, from its description alone (what a sum's bound
  reads before its first member is built).

Exports load lazily (:mod:`specstore.store.lazy`), so importing the registry costs no
torch.
"""

from typing import TYPE_CHECKING

from specstore.store.lazy import lazy_package

__all__ = lazy_package(__name__, {
    "..model_config": ("ARCHS", "BAND_STATS", "FREQ_POOLINGS", "MAX_PARAMETERS", "MAX_TIME_STRIDE", "MIN_FRAMES",
                       "POOLINGS", "ModelConfig", "ModelConfigError", "check_parameter_count"),
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

if TYPE_CHECKING:  # the lazy exports, for type checkers (``X as X``: a re-export)
    from ..model_config import (
        ARCHS as ARCHS,
        BAND_STATS as BAND_STATS,
        FREQ_POOLINGS as FREQ_POOLINGS,
        MAX_PARAMETERS as MAX_PARAMETERS,
        MAX_TIME_STRIDE as MAX_TIME_STRIDE,
        MIN_FRAMES as MIN_FRAMES,
        POOLINGS as POOLINGS,
        ModelConfig as ModelConfig,
        ModelConfigError as ModelConfigError,
        check_parameter_count as check_parameter_count,
    )
    from .build import (
        build_model as build_model,
        count_parameters as count_parameters,
    )
    from .classifier import (
        MaskedClassifier as MaskedClassifier,
        Pooled as Pooled,
    )
    from .cnn import (
        ConvBlock as ConvBlock,
        SpectrogramCNN as SpectrogramCNN,
    )
    from .masking import (
        MaskedBatchNorm2d as MaskedBatchNorm2d,
        time_mask as time_mask,
    )
    from .pooling import (
        AttentionPooling as AttentionPooling,
        FreqPooling as FreqPooling,
        TimePooling as TimePooling,
    )
    from .registry import (
        Arch as Arch,
        FreqPoolingEntry as FreqPoolingEntry,
        PoolingEntry as PoolingEntry,
        register_arch as register_arch,
        register_freq_pooling as register_freq_pooling,
        register_pooling as register_pooling,
    )
    from .resnet import (
        SpectrogramResNet as SpectrogramResNet,
    )
    from .stats_head import (
        StatsSums as StatsSums,
    )
