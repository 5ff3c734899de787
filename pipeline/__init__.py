"""specstore's offline stage: audio corpus -> feature store.

``specstore.pipeline.extract(corpus, store, options)`` decodes every file once, computes the features and commits
them into the store; :class:`ExtractOptions` says how (``features=("mel", "cqt"), jobs=None, backend="loky",
scheduler=None, ...``; its fields may be given to ``extract`` as keywords instead).
``specstore.pipeline.stored_features(path, specs)`` gives one file's features as a store would hold them, in memory.

The names below are imported on first use (:mod:`specstore.common.lazy`), so ``specstore-features --help`` and a
mistyped corpus path answer before librosa and zarr are imported.
"""

if __name__ != "specstore.pipeline":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's pipeline/ is the package specstore.pipeline; import it by that name, not as "
                      f"{__name__!r}")

from typing import TYPE_CHECKING

from specstore.common.lazy import lazy_package

__all__ = lazy_package(__name__)

if TYPE_CHECKING:  # the exports, each imported on first use (specstore.common.lazy)
    from .corpus import scan_corpus
    from .errors import CorpusError, ExtractError
    from .extract import ExtractSummary, extract
    from .extract_options import ExtractOptions
    from .features import stored_features
