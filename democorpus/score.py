"""Musical material: scales, chords, progressions, tempo and key draws, random walks, rendering notes.

Pitches are MIDI note numbers (69 = A4, 440 Hz times the file's tuning), times
are in seconds.  A :data:`Note` is (onset s, held duration s, MIDI pitch,
velocity 0..1); an :data:`Instrument` turns (frequency Hz, total samples, held
samples) into samples.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .dsp import Audio, Ctx, add_at

__all__ = [
    "SCALES", "Instrument", "Note", "chord_midi", "chord_times", "into_range", "key", "render_notes", "scale_midi",
    "tempo", "walk",
]


SCALES: dict[str, tuple[int, ...]] = {
    "major": (0, 2, 4, 5, 7, 9, 11),
    "minor": (0, 2, 3, 5, 7, 8, 10),
    "dorian": (0, 2, 3, 5, 7, 9, 10),
    "mixolydian": (0, 2, 4, 5, 7, 9, 10),
    "lydian": (0, 2, 4, 6, 7, 9, 11),
    "phrygian": (0, 1, 3, 5, 7, 8, 10),
    "harmonic_minor": (0, 2, 3, 5, 7, 8, 11),
}
"""Mode name -> semitones above the root of its seven degrees."""

Note = tuple[float, float, float, float]
"""(onset s, held duration s, MIDI pitch, velocity 0..1)."""
Instrument = Callable[[float, int, int], Audio]
"""(frequency Hz, total samples incl. release, held samples) -> samples."""


def tempo(rng: np.random.Generator, lo_bpm: float, hi_bpm: float, beats_per_bar: int = 4) -> tuple[float, float]:
    """Seconds per beat and per bar at a tempo drawn uniformly from [lo_bpm, hi_bpm) beats per minute."""
    beat = 60.0 / rng.uniform(lo_bpm, hi_bpm)
    return beat, beats_per_bar * beat


def key(rng: np.random.Generator, modes: Sequence[str], lowest: int) -> tuple[str, tuple[int, ...], int]:
    """Mode name, its scale and a root MIDI note: the mode drawn from ``modes`` (no draw for one),
    then the root from the octave ``lowest .. lowest + 11``."""
    mode = modes[0] if len(modes) == 1 else str(rng.choice(list(modes)))
    return mode, SCALES[mode], lowest + int(rng.integers(0, 12))


def scale_midi(root: int, scale: Sequence[int], degree: int) -> int:
    """MIDI pitch of scale ``degree`` (0-based; negative or past 6 moves by octaves) above ``root``."""
    octave, step = divmod(degree, len(scale))
    return root + 12 * octave + scale[step]


def chord_midi(root: int, scale: Sequence[int], degree: int, size: int = 3) -> list[int]:
    """Chord stacked in thirds on scale ``degree`` (0-based); size 4 gives seventh chords."""
    return [scale_midi(root, scale, degree + 2 * j) for j in range(size)]


def into_range(notes: Sequence[int], lo: int, hi: int) -> list[int]:
    """Move each note by octaves into [lo, hi] (hi - lo >= 12)."""
    out = []
    for m in notes:
        while m < lo:
            m += 12
        while m > hi:
            m -= 12
        out.append(m)
    return sorted(out)


def chord_times(ctx: Ctx, prog: Sequence[int], chord_s: float, t0: float = 0.0) -> list[tuple[float, int]]:
    """(start s, scale degree) of a progression repeated over the file."""
    out = []
    t = t0
    i = 0
    while t < ctx.seconds:
        out.append((t, prog[i % len(prog)]))
        t += chord_s
        i += 1
    return out


def walk(ctx: Ctx, start: int, lo: int, hi: int, steps: Sequence[int], p: Sequence[float]) -> Callable[[], int]:
    """Random walk over scale degrees within [lo, hi]; returns a 'next degree' function."""
    state = [start]

    def step() -> int:
        d = state[0] + int(ctx.rng.choice(steps, p=p))
        if d < lo or d > hi:
            d = state[0] - (d - state[0])
        state[0] = int(np.clip(d, lo, hi))
        return state[0]

    return step


def render_notes(ctx: Ctx, notes: Sequence[Note], inst: Instrument, tail: float) -> Audio:
    """Render ``notes`` with ``inst`` into one stem; each note rings ``tail`` s after release."""
    out = ctx.zeros()
    sr = ctx.sr
    for t, dur, midi, vel in notes:
        start = int(round(t * sr))
        if start >= ctx.n or vel <= 0.0:
            continue
        hold = max(1, int(dur * sr))
        total = min(hold + int(tail * sr), ctx.n - start)
        if start + total <= 0:
            continue
        add_at(out, start, vel * inst(ctx.hz(midi), total, hold))
    return out
