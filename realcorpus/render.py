"""Rendering one clip: instrumentation (:mod:`specstore.realcorpus.instruments`), a Standard MIDI File, FluidSynth, then
room, EQ, noise, level, encoding.

What varies from clip to clip (all drawn from a generator seeded by the clip id):

* the SoundFont (balanced per class by the plan) and the General-MIDI programs:
  an *ensemble* is drawn from the class's palette (palettes overlap: voices,
  organ, viols and recorders serve three vocal styles; fiddle, whistle,
  accordion and guitar serve both folk classes), then each part a program from
  the ensemble's pool for its register; folk tunes may get a doubling
  instrument or a drone;
* tempo (see :mod:`specstore.realcorpus.score`), transposition (-3..+2 semitones) and
  tuning (-40..+20 cents, i.e. A = 430..445 Hz), timing and velocity jitter,
  articulation;
* mixing: part levels, stereo placement and width, reverb send, chorus;
  FluidSynth's room (size, damping, width, level);
* after synthesis: shelving EQ, sometimes a low-pass (dull recordings) or a
  rumble high-pass, light pink noise (35-65 dB below the music), loudness
  (-30..-14 dBFS RMS) with a soft limiter, and the excerpt's fades;
* container, sample rate and channels (balanced per class by the plan).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import signal

from .catalogue import Clip, rng_for
from .errors import RealCorpusError
from .instruments import Channel, instrument
from .score import Note, Score

__all__ = ["SOUNDFONTS", "SoundFont", "fluidsynth_path", "check_renderer", "excerpt_notes", "render_clip", "encode"]


@dataclass(frozen=True)
class SoundFont:
    name: str
    path: str
    package: str
    licence: str


SOUNDFONTS: dict[str, SoundFont] = {
    "fluidr3": SoundFont("fluidr3", "/usr/share/sounds/sf2/FluidR3_GM.sf2", "fluid-soundfont-gm", "MIT"),
    "musescore": SoundFont("musescore", "/usr/share/sounds/sf3/MuseScore_General_Lite.sf3",
                           "musescore-general-soundfont-small", "MIT (parts public domain / CC0)"),
    "timgm6mb": SoundFont("timgm6mb", "/usr/share/sounds/sf2/TimGM6mb.sf2", "timgm6mb-soundfont", "GPL-2"),
    "csoundgm": SoundFont("csoundgm", "/usr/share/sounds/sf2/sf_GMbank.sf2", "csound-soundfont", "public domain"),
}
"""SoundFonts by name: file, the Debian package that installs it, its licence."""

APT_PACKAGES = ("fluidsynth",) + tuple(sf.package for sf in SOUNDFONTS.values())


def fluidsynth_path() -> str | None:
    return shutil.which("fluidsynth")


def check_renderer(soundfonts: tuple[str, ...]) -> None:
    """Raise RealCorpusError naming the Debian packages to install when something is missing."""
    missing = [] if fluidsynth_path() else ["fluidsynth"]
    missing += [SOUNDFONTS[s].package for s in soundfonts if not os.path.exists(SOUNDFONTS[s].path)]
    if missing:
        raise RealCorpusError(f"missing {', '.join(missing)}: run `make realcorpus-deps` "
                              f"(or apt-get install {' '.join(missing)})")


_LEGATO = {"medieval": (0.85, 1.0), "renaissance": (0.9, 1.0), "baroque": (0.85, 1.0), "classical": (0.75, 0.98),
           "folksong": (0.85, 1.0), "fiddle": (0.7, 0.95)}
"""Per class, the range a clip's articulation is drawn from: notes longer than 0.25 s sound for that share of their
written length (shorter ones for at least 0.85 of it)."""


# ---- the excerpt -----------------------------------------------------------------------------


def excerpt_window(score: Score, clip: Clip, rng: np.random.Generator) -> tuple[float, float, int]:
    """(start s, length s, plays): where the excerpt lies in the piece (repeated ``plays`` times)."""
    length = clip.seconds
    total = score.seconds
    plays = 1
    if total < length and clip.label in ("folksong", "fiddle"):
        plays = int(np.ceil(length / total))  # verses / repeats of a short tune
        total *= plays
    if total <= length:
        return 0.0, total, plays
    k, n = clip.excerpt, max(clip.piece.excerpts, 1)
    span = total - length
    u = float(rng.uniform(0.05, 0.95)) if n > 1 else float(rng.uniform(0.0, 1.0))
    # Excerpts past the piece's planned ones (a training work's extras) start at a seeded point anywhere.
    start = span * (k + u) / n if k < n else span * float(rng.uniform(0.0, 1.0))
    return float(start), float(length), plays


def excerpt_notes(notes: tuple[Note, ...], start: float, length: float, plays: int, period: float) -> tuple[Note, ...]:
    """The notes sounding in [start, start + length) of the piece played ``plays`` times, shifted to 0."""
    out = []
    end = start + length
    for r in range(plays):
        off = r * period
        for n in notes:
            on, off_t = n.onset + off, n.onset + off + n.duration
            if on < end and off_t > start:
                a = max(on, start) - start
                b = min(off_t, end) - start
                if b - a > 0.02:
                    out.append(Note(a, b - a, n.pitch, n.velocity))
    return tuple(out)


# ---- Standard MIDI File ----------------------------------------------------------------------

_TPS = 960
"""MIDI ticks per second (480 per quarter at a fixed 120 quarters per minute): times are ours, not the score's."""


def _vlq(n: int) -> bytes:
    out = [n & 0x7F]
    n >>= 7
    while n:
        out.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(out))


def midi_bytes(
    channels: list[Channel],
    seconds: float,
    transpose: int,
    cents: float,
    rng: np.random.Generator,
    legato: tuple[float, float],
) -> bytes:
    """A format-0 SMF playing ``channels``; ends (End of Track) at ``seconds``."""
    events: list[tuple[int, int, bytes]] = []  # (tick, order, data); order: setup 0, note-off 1, note-on 2
    bend = int(np.clip(8192 + cents / 200.0 * 8192, 0, 16383))
    free = [c for c in range(16) if c != 9]
    art = float(rng.uniform(*legato))
    vel_scale = float(rng.uniform(0.8, 1.1))
    for i, ch in enumerate(channels[: len(free)]):
        c = free[i]
        events += [
            (0, 0, bytes([0xB0 | c, 0, 0])),
            (0, 0, bytes([0xC0 | c, ch.program])),
            (0, 0, bytes([0xB0 | c, 7, ch.volume])),
            (0, 0, bytes([0xB0 | c, 10, ch.pan])),
            (0, 0, bytes([0xB0 | c, 91, ch.reverb])),
            (0, 0, bytes([0xB0 | c, 93, ch.chorus])),
            (0, 0, bytes([0xE0 | c, bend & 0x7F, bend >> 7])),
        ]
        # Same pitch on one channel: end each note before the next one starts.
        by_pitch: dict[int, list[tuple[int, int, int]]] = {}
        jit = rng.normal(0.0, 0.008, len(ch.notes))
        vj = rng.integers(-6, 7, len(ch.notes))
        for n, j, v in zip(ch.notes, jit, vj, strict=False):
            p = n.pitch + transpose
            if not 0 <= p <= 127:
                continue
            on = max(0, int(round((n.onset + (j if n.onset > 0 else 0.0)) * _TPS)))
            dur = n.duration * art if n.duration > 0.25 else n.duration * max(art, 0.85)
            off = max(on + 12, int(round((n.onset + dur) * _TPS)))
            vel = int(np.clip(round(n.velocity * vel_scale + v), 1, 127))
            by_pitch.setdefault(p, []).append((on, off, vel))
        for p, lst in by_pitch.items():
            lst.sort()
            for k, (on, off, vel) in enumerate(lst):
                if k + 1 < len(lst):
                    off = min(off, max(on + 1, lst[k + 1][0] - 1))
                events.append((on, 2, bytes([0x90 | c, p, vel])))
                events.append((off, 1, bytes([0x80 | c, p, 0])))
    events.sort(key=lambda e: (e[0], e[1], e[2]))
    end_tick = max(int(round(seconds * _TPS)), events[-1][0] if events else 0)
    track = bytearray(b"\x00\xff\x51\x03" + (500000).to_bytes(3, "big"))
    last = 0
    for tick, _, data in events:
        track += _vlq(tick - last) + data
        last = tick
    track += _vlq(end_tick - last) + b"\xff\x2f\x00"
    return b"MThd" + struct.pack(">IHHH", 6, 0, 1, 480) + b"MTrk" + struct.pack(">I", len(track)) + bytes(track)


# ---- synthesis and post-processing -----------------------------------------------------------


def fluidsynth(midi: bytes, soundfont: str, sample_rate: int, rng: np.random.Generator) -> np.ndarray:
    """Render SMF bytes with the fluidsynth CLI: (n, 2) float32 at ``sample_rate``."""
    exe = fluidsynth_path()
    if exe is None:
        raise RealCorpusError("fluidsynth is not installed: run `make realcorpus-deps` (apt-get install fluidsynth)")
    sf = SOUNDFONTS[soundfont].path
    room = [
        ("synth.reverb.room-size", rng.uniform(0.1, 0.9)),
        ("synth.reverb.damp", rng.uniform(0.0, 0.7)),
        ("synth.reverb.width", rng.uniform(0.3, 1.0)),
        ("synth.reverb.level", rng.uniform(0.2, 0.9)),
        ("synth.chorus.level", rng.uniform(0.0, 2.0)),
        ("synth.chorus.depth", rng.uniform(2.0, 10.0)),
    ]
    with tempfile.TemporaryDirectory(prefix="realcorpus-") as tmp:
        mid = Path(tmp, "in.mid")
        raw = Path(tmp, "out.raw")
        mid.write_bytes(midi)
        cmd = [
            exe,
            "-n",
            "-i",
            "-q",
            "-F",
            str(raw),
            "-T",
            "raw",
            "-O",
            "float",
            "-E",
            "little",
            "-r",
            str(sample_rate),
            "-g",
            "0.3",
            "-o",
            "synth.cpu-cores=1",
            "-o",
            "synth.polyphony=512",
            "-o",
            "synth.dynamic-sample-loading=1",
        ]
        for k, v in room:
            cmd += ["-o", f"{k}={v:.3f}"]
        cmd += [sf, str(mid)]
        r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
        if r.returncode != 0 or not raw.exists():
            raise RealCorpusError(f"fluidsynth failed ({r.returncode}): {(r.stderr or r.stdout).strip()[:200]}")
        data = np.fromfile(raw, dtype="<f4")
    return data.reshape(-1, 2)


def _biquad_shelf(kind: str, f0: float, gain_db: float, sr: int) -> np.ndarray:
    """RBJ cookbook shelving filter (slope 1) as one SOS row."""
    a = 10 ** (gain_db / 40)
    w0 = 2 * np.pi * f0 / sr
    alpha = np.sin(w0) / 2 * np.sqrt(2)
    c = np.cos(w0)
    s = 2 * np.sqrt(a) * alpha
    if kind == "low":
        b = [a * ((a + 1) - (a - 1) * c + s), 2 * a * ((a - 1) - (a + 1) * c), a * ((a + 1) - (a - 1) * c - s)]
        d = [(a + 1) + (a - 1) * c + s, -2 * ((a - 1) + (a + 1) * c), (a + 1) + (a - 1) * c - s]
    else:
        b = [a * ((a + 1) + (a - 1) * c + s), -2 * a * ((a - 1) + (a + 1) * c), a * ((a + 1) + (a - 1) * c - s)]
        d = [(a + 1) - (a - 1) * c + s, 2 * ((a - 1) - (a + 1) * c), (a + 1) - (a - 1) * c - s]
    return np.array([b[0] / d[0], b[1] / d[0], b[2] / d[0], 1.0, d[1] / d[0], d[2] / d[0]])


def _pink(n: int, rng: np.random.Generator) -> np.ndarray:
    """Pink-ish noise (Paul Kellet's economy filter), unit RMS."""
    w = rng.standard_normal(n)
    y = signal.lfilter(
        [0.049922035, -0.095993537, 0.050612699, -0.004408786], [1, -2.494956002, 2.017265875, -0.522189400], w
    )
    return y / (np.sqrt(np.mean(y**2)) + 1e-12)


def post_process(
    x: np.ndarray, sr: int, n_out: int, fade_in: bool, fade_out: bool, rng: np.random.Generator
) -> np.ndarray:
    """EQ, noise, level, fades on (n, 2) float audio; returns exactly ``n_out`` frames, float32."""
    x = x.astype(np.float64)
    if len(x) < n_out:
        x = np.concatenate([x, np.zeros((n_out - len(x), 2))])
    x = x[:n_out]
    sos = [
        _biquad_shelf("low", rng.uniform(80, 250), rng.uniform(-6, 4), sr),
        _biquad_shelf("high", rng.uniform(2500, 6000), rng.uniform(-10, 3), sr),
    ]
    if rng.random() < 0.3:  # a dull recording
        sos.append(signal.butter(2, min(rng.uniform(4500, 11000), 0.45 * sr), "low", fs=sr, output="sos")[0])
    if rng.random() < 0.5:  # rumble filter
        sos.append(signal.butter(2, rng.uniform(30, 90), "high", fs=sr, output="sos")[0])
    x = signal.sosfilt(np.array(sos), x, axis=0)
    rms = float(np.sqrt(np.mean(x**2))) + 1e-12
    if rng.random() < 0.75:  # light noise: hiss / room tone
        snr = rng.uniform(35, 65)
        noise = np.stack([_pink(len(x), rng), _pink(len(x), rng)], axis=1)
        x = x + noise * rms * 10 ** (-snr / 20)
    if fade_in:
        k = min(len(x), int(0.02 * sr))
        x[:k] *= np.linspace(0, 1, k)[:, None]
    if fade_out:
        k = min(len(x), int(rng.uniform(0.5, 2.0) * sr))
        x[len(x) - k :] *= np.linspace(1, 0, k)[:, None] ** 2
    target = 10 ** (rng.uniform(-30, -14) / 20)
    x *= target / (float(np.sqrt(np.mean(x**2))) + 1e-12)
    peak = float(np.max(np.abs(x)))
    if peak > 0.95:  # soft limiter
        x = 0.95 * np.tanh(x / 0.95)
    return x.astype(np.float32)


def render_clip(score: Score, clip: Clip) -> tuple[np.ndarray, dict[str, object]]:
    """The clip's audio as (n, channels) float32 at its sample rate, and what was chosen for it."""
    rng = rng_for(clip.seed, "render", clip.id)
    start, length, plays = excerpt_window(score, clip, rng)
    ensemble, channels = instrument(score.parts, clip.label, rng)
    period = score.seconds
    channels = [
        Channel(c.program, excerpt_notes(c.notes, start, length, plays, period), c.volume, c.pan, c.reverb, c.chorus)
        for c in channels
    ]
    channels = [c for c in channels if c.notes]
    if not channels:
        raise RealCorpusError(f"{clip.id}: the excerpt at {start:.1f} s holds no notes")
    transpose = int(rng.integers(-3, 3))
    cents = float(rng.uniform(-40, 20))
    ends_early = start + length < score.seconds * plays - 0.5
    tail = 0.0 if ends_early else float(rng.uniform(1.0, 2.5))
    seconds = length + tail
    midi = midi_bytes(channels, seconds + 0.5, transpose, cents, rng, _LEGATO[clip.label])
    audio = fluidsynth(midi, clip.soundfont, clip.sample_rate, rng)
    n_out = int(round(seconds * clip.sample_rate))
    audio = post_process(audio, clip.sample_rate, n_out, start > 0, ends_early, rng)
    if clip.channels == 1:
        audio = audio.mean(axis=1, keepdims=True, dtype=np.float32)
    info = {
        "ensemble": ensemble,
        "programs": [c.program for c in channels],
        "start_s": round(start, 2),
        "plays": plays,
        "transpose": transpose,
        "cents": round(cents, 1),
        "qpm": round(score.qpm, 1),
    }
    return audio, info


def encode(audio: np.ndarray, clip: Clip) -> bytes:
    """File bytes (the demo corpus encoder, democorpus.encode_clip: 16-bit PCM wav/flac, Vorbis with a fixed
    serial, MP3)."""
    from specstore.democorpus import encode_clip

    return encode_clip(audio, clip.sample_rate, clip.ext, serial=zlib.crc32(clip.relpath.encode("utf-8")))
