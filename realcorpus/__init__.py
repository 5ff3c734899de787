"""A realistic development corpus: real compositions from music21's corpus rendered with GM SoundFonts.

``make realcorpus`` (or ``specstore-realcorpus OUT``) renders it; ``docs/realcorpus.md``
describes the classes, sources, licences and how rendering varies.
"""

if __name__ != "specstore.realcorpus":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's realcorpus/ is the package specstore.realcorpus; import it by that name, not as "
                      f"{__name__!r}")

from .catalogue import CLASSES, SIZES, Clip, Piece, Work, list_works, plan_corpus
from .errors import RealCorpusError
from .generate import Summary, generate, main

__all__ = ["CLASSES", "SIZES", "Clip", "Piece", "RealCorpusError", "Summary", "Work", "generate", "list_works", "main",
           "plan_corpus"]
