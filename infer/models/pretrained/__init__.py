"""Pretrained models shipped as data: musicnn's weights (``infer/models/pretrained/musicnn/``), loaded without
TensorFlow.

:func:`load_musicnn` (``"musicnn-msd"``, ``"musicnn-mtt"``) returns the model in eval
mode, its tag vocabulary and the :class:`~specstore.store.FeatureSpec` of its input (the
``musicnn`` feature kind).  The tensors were converted once from musicnn 0.1.0's
TensorFlow checkpoints by ``tools/musicnn_convert.py``; their sha256 is recorded in
``musicnn/models.json`` and checked at every load.  Licence (ISC) and attribution:
``musicnn/LICENSE.md``, ``musicnn/ATTRIBUTION.md``; docs/model.md, "Pretrained musicnn".
"""

from specstore.infer.errors import PretrainedError
from specstore.infer.models.pretrained.loader import MUSICNN_MODELS, PRETRAINED_DIR, load_musicnn, musicnn_info

__all__ = ["MUSICNN_MODELS", "PRETRAINED_DIR", "PretrainedError", "load_musicnn", "musicnn_info"]
