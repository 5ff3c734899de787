"""Deterministic synthetic music corpus: the default corpus of ``make features`` and ``make demo``.

The corpus imitates a small genre data set (GTZAN-style, one folder per label)
without shipping any audio: ``OUT_DIR/<style>/<style>_<nnn>.<ext>``.  Each style
is synthesised from the things that tell genres apart on a spectrogram:

* rhythm: four-on-the-floor kick (techno), rock backbeat, jazz swing ride,
  reggae one-drop with off-beat skank, boom-bap with swung hats (hip-hop),
  no beat at all (ambient, classical);
* instruments and timbre: detuned saw pads, distorted power chords, FM bells,
  Karplus-Strong plucked strings, additive brass / strings with vibrato,
  sub and acid bass, drums from filtered noise and pitch-swept sines;
* harmony: major / minor / modal progressions, seventh chords in jazz;
* texture: dense or sparse, dry or smeared by a long noise-tail reverb.

Inside a style every file differs: key, tempo (drawn from the style's range),
progression, instrument choice and balance, detuning, reverb, added noise and
loudness (-25..-8 dBFS RMS).  Durations follow a log-normal law (median 16 s)
truncated to ``[min_seconds, max_seconds]`` (default 5 s .. 4 min), sampled by
stratified quantiles so every style gets the same spread.  Formats cycle through
wav / flac / ogg / mp3 and sample rates (22 050 / 44 100 Hz) and channel counts
(mono / stereo) cycle too, independently of the label.

Everything is a pure function of ``(seed, style, index)``: a file does not
depend on how many files are generated or in which process, and the same seed
gives byte-identical files for every format (libsndfile picks a random Ogg
stream serial number; it is rewritten to a value derived from the file name).

Synthesis is vectorised numpy at 22 050 Hz (notes are rendered as whole arrays,
drums are one-hit samples placed by slices or FFT convolution, plucks are
Karplus-Strong computed period-wise in the frequency domain; 44.1 kHz files are
upsampled).  The default corpus (7 styles x 40 files, 2.0 h of audio) costs about
100 CPU-seconds, over half of it in libsndfile's MP3 encoder (about 30x realtime
for 44.1 kHz stereo), so about a minute on 2 idle cores.

Modules, in the order a file is made:

* :mod:`~democorpus.plan`: styles, formats, durations, one :class:`ClipPlan` per file;
* :mod:`~democorpus.dsp`, :mod:`~democorpus.instruments`, :mod:`~democorpus.drums`,
  :mod:`~democorpus.score`: signal primitives, pitched instruments, drum kit, notes;
* :mod:`~democorpus.styles`: the seven recipes, each returning an
  :class:`~democorpus.arrangement.Arrangement` of stems;
* :mod:`~democorpus.render`: mix, reverb, resample, master (:func:`render_clip`);
* :mod:`~democorpus.encode`: file bytes (:func:`encode_clip`);
* :mod:`~democorpus.generate`: the folder and the worker processes (:func:`generate_corpus`);
* :mod:`~democorpus.cli`: ``python -m democorpus`` / ``specstore-demo-corpus``.

The package depends on ``store`` only for the project's error classes and CLI
error handler; nothing else in the project imports it except tests and examples.
"""

from .cli import main
from .encode import encode_clip
from .generate import CorpusSummary, generate_corpus
from .plan import (
    FORMATS,
    MAX_SECONDS,
    MEDIAN_SECONDS,
    MIN_SECONDS,
    SAMPLE_RATES,
    STYLES,
    ClipPlan,
    DemoCorpusError,
    plan_corpus,
)
from .render import LOUDNESS_DBFS, render_clip

__all__ = [
    "STYLES",
    "FORMATS",
    "SAMPLE_RATES",
    "MIN_SECONDS",
    "MAX_SECONDS",
    "MEDIAN_SECONDS",
    "LOUDNESS_DBFS",
    "ClipPlan",
    "CorpusSummary",
    "DemoCorpusError",
    "plan_corpus",
    "render_clip",
    "encode_clip",
    "generate_corpus",
    "main",
]
