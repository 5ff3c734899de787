"""specstore's offline stage: audio corpus -> feature store.

``pipeline.extract(corpus, store, features=("mel", "cqt"), jobs=None, backend="loky", scheduler=None)``
decodes every file once, computes the features and commits them into the store.
``pipeline.stored_features(path, specs)`` gives one file's features as a store would hold them, in memory.
"""

from .corpus import CorpusError, scan_corpus
from .extract import ExtractError, ExtractSummary, extract
from .features import stored_features

__all__ = ["CorpusError", "ExtractError", "ExtractSummary", "extract", "scan_corpus", "stored_features"]
