"""Deterministic synthetic music corpus: the default corpus of ``make features`` and ``make demo``.

The corpus imitates a small genre data set (GTZAN-style, one folder per label)
without shipping any audio: ``OUT_DIR/<style>/<style>_<nnn>.<ext>``.  Seven styles
(ambient, classical, hiphop, jazz, reggae, rock, techno) are synthesised from the
things that tell genres apart on a spectrogram:

* rhythm: four-on-the-floor kick (techno), rock backbeat, jazz swing ride or
  brushes, reggae one drop / rockers / steppers with off-beat skank, boom-bap
  (hip-hop), no beat at all (classical, most ambient);
* instruments and timbre: pads, distorted power chords, FM bells and electric
  piano, Karplus-Strong plucked strings, additive brass / strings / piano /
  organ, sub, acid and 808 bass, drums from filtered noise and pitch-swept sines;
* harmony: major / minor / modal progressions, seventh chords in jazz;
* texture: dense or sparse, dry or smeared by a long noise-tail reverb.

Like real genres, neighbouring styles overlap, so the corpus is learnable but
not trivially separable (``make demo``'s CNN scores about 0.85-0.95 on the
held-out split, not 1.0):

* shared instruments and feels (:mod:`~specstore.democorpus.parts`): jazz, hip-hop and
  reggae share piano, electric piano, organ, upright bass, horn lines and swung
  hats (hip-hop samples jazz; jazz ballads have brushes or no drums); ambient,
  classical and techno share pads (classical adagios, ambient's piano and harp,
  techno breakdowns); rock and techno share drive (techno's distorted bass and
  backbeat snare, rock's four-on-the-floor and synth pads); some ambient has a
  soft techno pulse; tempo ranges overlap;
* song form (:mod:`~specstore.democorpus.form`): a file is an excerpt of a song whose
  sections (intro, breakdown, groove, solo, full band) mute stems by role and
  change the level, so a short file may hold no drums, or drums alone;
* recordings (:mod:`~specstore.democorpus.recording`): shelf EQ, compression, clipping,
  hum, hiss and the medium (clean, low bitrate, tape, cheap speaker, AM radio,
  telephone) vary independently of the style.

Inside a style every file differs: key, tempo (drawn from the style's range),
progression, arrangement (which optional instruments play, and which variant:
e.g. orchestra / string group / solo piano), section order and dynamics, stem
balance (each stem +-4 dB around the recipe's range), detuning, reverb (room
and +-6 dB of wet level), noise and loudness (-25..-8 dBFS RMS).  Durations
follow a log-normal law (median 16 s) truncated to ``[min_seconds,
max_seconds]`` (default 5 s .. 4 min), sampled by stratified quantiles so every
style gets the same spread.  Formats cycle through wav / flac / ogg / mp3 and
sample rates (22 050 / 44 100 Hz) and channel counts (mono / stereo) cycle too,
independently of the label.

Everything is a pure function of ``(seed, style, index)``: a file does not
depend on how many files are generated or in which process, and the same seed
gives byte-identical files for every format (libsndfile picks a random Ogg
stream serial number; it is rewritten to a value derived from the file name).

Synthesis is vectorised numpy at 22 050 Hz (notes are rendered as whole arrays,
drums are one-hit samples placed by slices or FFT convolution, plucks are
Karplus-Strong computed period-wise in the frequency domain; 44.1 kHz files are
upsampled).  The default corpus (7 styles x 40 files, 2.0 h of audio) costs about
160 CPU-seconds, over a third of it in libsndfile's MP3 encoder (about 30x realtime
for 44.1 kHz stereo), so about a minute and a half on 2 idle cores.

Modules, in the order a file is made:

* :mod:`~specstore.democorpus.plan`: styles, formats, durations, one :class:`ClipPlan` per file;
* :mod:`~specstore.democorpus.dsp`, :mod:`~specstore.democorpus.instruments`, :mod:`~specstore.democorpus.drums`,
  :mod:`~specstore.democorpus.score`: signal primitives, pitched instruments, drum kit, notes;
* :mod:`~specstore.democorpus.parts`: instruments and parts several styles share;
* :mod:`~specstore.democorpus.styles`: the seven recipes, each returning an
  :class:`~specstore.democorpus.arrangement.Arrangement` of stems (with roles) and its song
  form (:mod:`~specstore.democorpus.form`);
* :mod:`~specstore.democorpus.render`: form, balance, pan, reverb, the recording chain
  (:mod:`~specstore.democorpus.recording`), resample, master (:func:`render_clip`);
* :mod:`~specstore.democorpus.encode`: file bytes (:func:`encode_clip`);
* :mod:`~specstore.democorpus.generate`: the folder and the worker processes (:func:`generate_corpus`);
* :mod:`~specstore.democorpus.cli`: ``python -m specstore demo-corpus`` / ``specstore-demo-corpus``.

The package depends on ``specstore.store`` only for the project's error classes and CLI
error handler; nothing else in the project imports it except tests and examples.
"""

if __name__ != "specstore.democorpus":  # one name per module: the folder is imported through specstore/
    raise ImportError(f"specstore's democorpus/ is the package specstore.democorpus; import it by that name, not as "
                      f"{__name__!r}")

from .cli import main
from .encode import encode_clip
from .errors import DemoCorpusError
from .generate import CorpusSummary, generate_corpus
from .plan import FORMATS, MAX_SECONDS, MEDIAN_SECONDS, MIN_SECONDS, SAMPLE_RATES, STYLES, ClipPlan, plan_corpus
from .recording import MEDIA
from .render import LOUDNESS_DBFS, render_clip

__all__ = [
    "STYLES",
    "FORMATS",
    "SAMPLE_RATES",
    "MIN_SECONDS",
    "MAX_SECONDS",
    "MEDIAN_SECONDS",
    "LOUDNESS_DBFS",
    "MEDIA",
    "ClipPlan",
    "CorpusSummary",
    "DemoCorpusError",
    "plan_corpus",
    "render_clip",
    "encode_clip",
    "generate_corpus",
    "main",
]
