"""specstore: music-genre classification at corpus scale, in one import namespace.

An audio corpus is decoded once into a chunked zarr v3 feature store
(:mod:`specstore.store`, written by :mod:`specstore.pipeline`); classifiers
train, predict and evaluate from it in length-binned batches sized to a
memory budget (:mod:`specstore.infer`); :mod:`specstore.serving` classifies
uploads.  The repository keeps the design's folders (``store/``,
``pipeline/``, ``infer/``, ...) at its top level; this package names them
(``specstore/store`` links to ``store/``), and the wheel installs this one
package.

The names below are the face a notebook or a user's own training loop
needs; each is imported on first use (:mod:`specstore.common.lazy`), so
``import specstore`` loads no torch, librosa or zarr::

    import specstore
    store = specstore.open_store("data/demo.zarr")
    sampler = specstore.BudgetBatchSampler(store.lengths, specstore.Budget(...))
"""

import os
from typing import TYPE_CHECKING

if not os.path.isdir(os.path.join(os.path.dirname(__file__), "common")):  # pragma: no cover (a copy without links)
    # A copy of the repository that dropped specstore/'s links (an archive, a tool that copies files only):
    # its folders are found beside this one, under the same names.  An installed wheel holds real folders.
    __path__.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from .common.lazy import lazy_package  # noqa: E402

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
    from .infer import Budget, BudgetBatchSampler, PadCollate, StoreDataset, evaluate, pad_collate, predict, train
    from .infer.models import register_arch, register_freq_pooling, register_pooling
    from .pipeline import extract
    from .serving.classify import classify
    from .store import open_store
