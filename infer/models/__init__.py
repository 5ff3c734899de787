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

Exports load lazily (:mod:`specstore.common.lazy`), so importing the registry costs no
torch.
"""

from typing import TYPE_CHECKING

from specstore.common.lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
    from ..errors import ModelConfigError
    from .build import build_model, count_parameters
    from .classifier import MaskedClassifier, Pooled
    from .cnn import ConvBlock, SpectrogramCNN
    from .config import (
        ARCHS,
        BAND_STATS,
        FREQ_POOLINGS,
        MAX_PARAMETERS,
        MAX_TIME_STRIDE,
        MIN_FRAMES,
        POOLINGS,
        ModelConfig,
        check_parameter_count,
    )
    from .masking import MaskedBatchNorm2d, time_mask
    from .pooling import AttentionPooling, FreqPooling, TimePooling
    from .registry import Arch, FreqPoolingEntry, PoolingEntry, register_arch, register_freq_pooling, register_pooling
    from .resnet import SpectrogramResNet
    from .stats_head import StatsSums
