"""What every decoder shares: :class:`AudioError` (one-line reasons), :class:`AudioInfo` (a header), the extensions.

The file extensions read as audio are listed here, in one place: those
soundfile (libsndfile) reads and those only the optional PyAV backend
reads; a folder search takes both (:data:`specstore.pipeline.corpus.AUDIO_EXTENSIONS`).
Kept apart from :mod:`specstore.pipeline.audio` so the optional PyAV backend
(:mod:`specstore.pipeline.decode_av`) raises and returns the same types without
importing the soundfile path it is a fallback of.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import AudioError

__all__ = ["AV_EXTENSIONS", "SOUNDFILE_EXTENSIONS", "AudioError", "AudioInfo"]

#: Extensions soundfile (libsndfile) reads: WAV, FLAC, Ogg Vorbis/Opus, MP3, AIFF.
SOUNDFILE_EXTENSIONS = frozenset({".wav", ".flac", ".ogg", ".opus", ".mp3", ".aiff", ".aif", ".aifc"})
#: Extensions only PyAV reads (AAC in MP4/M4A or raw ADTS, WMA): decoded when the ``formats`` extra is
#: installed, refused with a line naming it otherwise.  ``.mp4`` is left out of folder searches (mostly
#: video); such a file named on its own, or uploaded, is still decoded through PyAV.
AV_EXTENSIONS = frozenset({".m4a", ".m4b", ".aac", ".wma"})


@dataclass(frozen=True)
class AudioInfo:
    """What a file's header says.

    ``sample_rate`` in Hz, ``n_samples`` in sample frames per channel (for
    MP3 an estimate from the stream headers), ``duration`` in seconds
    (``n_samples / sample_rate``), ``format`` like ``"WAV/PCM_16"``.
    """

    sample_rate: int
    channels: int
    n_samples: int
    duration: float
    format: str
