"""The offline stage's errors, gathered in one module: each a :class:`specstore.common.errors.SpecstoreError`,
so every command prints it as one line (:func:`specstore.common.cli.run_cli`).

* :class:`AudioError`, :class:`Unrecognised`: a file that cannot be decoded (:mod:`specstore.pipeline.audio`);
* :class:`SourceChanged`: a file that changed while it was read (:mod:`specstore.pipeline.hashing`);
* :class:`CorpusError`: an unusable corpus (:mod:`specstore.pipeline.corpus`);
* :class:`ExtractError`: a run that had to stop (:mod:`specstore.pipeline.extract`).

The modules that raise them import them from here (and export them under their old names too).
"""

from __future__ import annotations

import os

from specstore.common.errors import SpecstoreError

__all__ = ["AudioError", "CorpusError", "ExtractError", "SourceChanged", "Unrecognised"]


class AudioError(SpecstoreError):
    """A file that cannot be turned into audio samples.

    ``reason`` is a short one-line explanation ("empty file", "zero-length
    audio", "decode failed at frame 4096: ..."); ``path`` is the offending
    file when known.  ``str(err)`` is ``"<path>: <reason>"``.
    """

    def __init__(self, reason: str, path: str | os.PathLike[str] | None = None) -> None:
        self.reason = " ".join(str(reason).split())  # always one line
        self.path = None if path is None else os.fspath(path)
        super().__init__(self.reason if self.path is None else f"{self.path}: {self.reason}")


class Unrecognised(AudioError):
    """FFmpeg found no audio format it reads in the file: it could not open it, or what it opened has no
    sample rate or channels (a text file named ``.flac`` "opens" that way, through the name's hint).  The
    caller answers with soundfile's reason instead, which depends on the bytes alone, so a file that is
    not audio gets one reason whatever its name (:func:`specstore.pipeline.audio.probe`)."""


class SourceChanged(SpecstoreError, OSError):
    """The file changed while it was being read (its stamp moved)."""


class CorpusError(SpecstoreError):
    """The corpus itself is unusable (missing, empty, malformed manifest); one-line message."""


class ExtractError(SpecstoreError):
    """The run had to stop (the store stays at its last commit); one-line message."""
