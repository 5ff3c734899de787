"""From a music21 score to timed notes: parts, onsets and durations in seconds, velocities.

The tempo is the score's own where it states one (metronome marks, possibly made by
music21 from a tempo word), scaled by a small random factor; otherwise a beat rate is
drawn from the class's range and the beat is the time signature's (or the piece's
tactus: a half note in renaissance music).  Folk songs and fiddle tunes have their
repeats expanded.  Nothing here touches audio.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass

import numpy as np

from .catalogue import Piece, corpus_root
from .errors import RealCorpusError

__all__ = ["Note", "Score", "BEAT_BPM", "load_score"]

logger = logging.getLogger(__name__)

BEAT_BPM: dict[str, tuple[float, float]] = {
    "medieval": (56.0, 84.0),
    "renaissance": (54.0, 76.0),
    "baroque": (58.0, 84.0),
    "classical": (70.0, 120.0),
    "folksong": (60.0, 96.0),
    "fiddle": (92.0, 122.0),
}
"""Beats per minute drawn when a score states no tempo (the beat as the time signature counts it)."""


@dataclass(frozen=True)
class Note:
    onset: float
    """seconds from the start of the piece"""
    duration: float
    """seconds"""
    pitch: int
    """MIDI note number"""
    velocity: int


@dataclass(frozen=True)
class Score:
    """A piece as parts of timed notes, highest part first by mean pitch; ``seconds`` is its length."""

    parts: tuple[tuple[Note, ...], ...]
    seconds: float
    qpm: float
    """the piece's main tempo, quarter notes per minute"""


def _parse(piece: Piece):  # -> music21.stream.Score
    from music21 import converter, stream

    path = corpus_root() / piece.source
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            s = converter.parse(path, number=piece.number, forceSource=True) if piece.number is not None \
                else converter.parse(path, forceSource=True)
        except Exception as e:  # music21 raises many kinds on odd encodings
            raise RealCorpusError(f"music21 could not parse {piece.source} (tune {piece.number}): {e}") from e
    if isinstance(s, stream.Opus):
        scores = list(s.scores)
        if not scores:
            raise RealCorpusError(f"{piece.source} (tune {piece.number}) holds no score")
        s = scores[0]
    return s


def _tempo_map(s, label: str, piece: Piece, rng: np.random.Generator) -> list[tuple[float, float]]:
    """[(offset in quarter notes, quarter notes per minute), ...] sorted, first at 0."""
    from music21 import tempo

    marks = []
    for mm in s.flatten().getElementsByClass(tempo.MetronomeMark):
        try:
            q = mm.getQuarterBPM()
        except Exception:
            q = None
        if q and 20.0 <= q <= 320.0:
            marks.append((float(mm.getOffsetInHierarchy(s)), float(q)))
    if marks and label in ("classical", "medieval", "fiddle", "folksong"):
        factor = float(rng.uniform(0.9, 1.08))
        out: dict[float, float] = {}
        for off, q in sorted(marks):
            out[off] = q * factor
        if 0.0 not in out:
            out[0.0] = sorted(marks)[0][1] * factor
        return sorted(out.items())
    from music21 import meter

    ts = s.recurse().getElementsByClass(meter.TimeSignature).first()
    beat = piece.tactus or (float(ts.beatDuration.quarterLength) if ts is not None else 1.0)
    if not 0.25 <= beat <= 4.0:
        beat = 1.0
    lo, hi = BEAT_BPM[label]
    return [(0.0, float(rng.uniform(lo, hi)) * beat)]


def _seconds_fn(tmap: list[tuple[float, float]]):
    offs = np.array([o for o, _ in tmap])
    qpms = np.array([q for _, q in tmap])
    secs = np.concatenate([[0.0], np.cumsum(np.diff(offs) * 60.0 / qpms[:-1])])

    def to_s(ql: float) -> float:
        i = int(np.searchsorted(offs, ql, side="right") - 1)
        i = max(i, 0)
        return float(secs[i] + (ql - offs[i]) * 60.0 / qpms[i])

    return to_s


def _dynamics(part) -> list[tuple[float, float]]:
    from music21 import dynamics

    out = []
    for d in part.flatten().getElementsByClass(dynamics.Dynamic):
        try:
            v = d.volumeScalar
        except Exception:
            v = None
        if v is not None:
            out.append((float(d.getOffsetInHierarchy(part)), float(v)))
    return sorted(out)


def load_score(piece: Piece, label: str, rng: np.random.Generator) -> Score:
    """Parse ``piece`` and time its notes (tempo drawn from ``rng``)."""
    s = _parse(piece)
    if label in ("folksong", "fiddle"):
        try:
            s = s.expandRepeats()
        except Exception as e:  # unbalanced repeat signs in some ABC tunes: play it as written
            logger.debug("%s: repeats not expanded (%s)", piece.id, e)
    tmap = _tempo_map(s, label, piece, rng)
    to_s = _seconds_fn(tmap)
    parts_src = list(s.parts) if s.hasPartLikeStreams() else [s]
    parts: list[tuple[Note, ...]] = []
    base = int(rng.integers(64, 92))
    for part in parts_src:
        dyn = _dynamics(part)
        dyn_off = np.array([o for o, _ in dyn]) if dyn else None
        # Tied notes are merged here (music21's stripTies is slow on long scores): pitch -> open note.
        open_: dict[int, list[float]] = {}
        merged: list[list[float]] = []  # [onset ql, end ql, pitch, velocity]
        for n in part.flatten().notes:
            off = float(n.offset)
            ql = float(n.quarterLength)
            if dyn_off is not None:
                i = int(np.searchsorted(dyn_off, off, side="right") - 1)
                vel = 24 + 100 * dyn[i][1] if i >= 0 else base
            else:
                vel = base
            members = list(n.notes) if n.isChord else [n]
            for m_ in members:
                m = int(round(m_.pitch.ps))
                if not 12 <= m <= 115:
                    continue
                tie = m_.tie.type if m_.tie is not None else (n.tie.type if n.tie is not None else None)
                if tie in ("continue", "stop") and m in open_:
                    open_[m][1] = off + ql
                    if tie == "stop":
                        del open_[m]
                    continue
                rec = [off, off + ql, m, vel]
                merged.append(rec)
                if tie in ("start", "continue"):
                    open_[m] = rec
                else:
                    open_.pop(m, None)
        notes: list[Note] = []
        for on, end, pitch, vel in merged:
            t0 = to_s(on)
            t1 = to_s(end) if end > on else t0 + 0.07
            notes.append(Note(t0, max(t1 - t0, 0.05), int(pitch), int(np.clip(vel, 20, 124))))
        if notes:
            parts.append(tuple(sorted(notes, key=lambda x: (x.onset, x.pitch))))
    if not parts:
        raise RealCorpusError(f"{piece.source} (tune {piece.number}) has no notes")
    parts.sort(key=lambda ns: -float(np.mean([x.pitch for x in ns])))
    seconds = max(x.onset + x.duration for ns in parts for x in ns)
    return Score(tuple(parts), float(seconds), float(tmap[0][1]))
