"""specstore's offline stage: audio corpus -> feature store.

``pipeline.extract(corpus, store, features=("mel", "cqt"), jobs=None, backend="loky", scheduler=None)``
decodes every file once, computes the features and commits them into the store.
"""

from .corpus import CorpusError, scan_corpus
from .extract import ExtractError, ExtractSummary, extract

__all__ = ["CorpusError", "ExtractError", "ExtractSummary", "extract", "scan_corpus"]
