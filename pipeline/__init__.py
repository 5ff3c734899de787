"""specstore's offline stage: audio corpus -> feature store.

``pipeline.extract(corpus, store, features=("mel", "cqt"), jobs=None, backend="loky", scheduler=None)``
decodes every file once, computes the features and commits them into the store.
``pipeline.stored_features(path, specs)`` gives one file's features as a store would hold them, in memory.

The names below are imported on first use (:mod:`store.lazy`), so ``specstore-features --help`` and a
mistyped corpus path answer before librosa and zarr are imported.
"""

from typing import TYPE_CHECKING

from store.lazy import lazy_package

__all__ = lazy_package(__name__, {
    "corpus": ("CorpusError", "scan_corpus"),
    "extract": ("ExtractError", "ExtractSummary", "extract"),
    "features": ("stored_features",),
})

if TYPE_CHECKING:
    from .corpus import CorpusError, scan_corpus
    from .extract import ExtractError, ExtractSummary, extract
    from .features import stored_features
