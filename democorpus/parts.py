"""Instruments and parts that several styles share, as neighbouring genres do.

Jazz, hip-hop and reggae share pianos, electric pianos, organs, upright bass
and horn lines; ambient, classical and techno share pads; any style may be
heard through vinyl.  Instruments are :data:`~specstore.democorpus.score.Instrument`
factories; parts return notes (:data:`~specstore.democorpus.score.Note`) or a stem's
samples.  Times are in seconds, pitches MIDI numbers, frequencies Hz.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .dsp import Audio, Ctx, env_asr, env_decay, filt, voice
from .instruments import DARK, ORGAN, brass, fm_bell, pluck, saw, square, strings
from .score import Instrument, Note, chord_midi, into_range, scale_midi, walk

__all__ = [
    "comping", "e_piano", "horn", "horn_amps", "horn_line", "organ", "pad", "pad_amps", "piano", "upright", "vinyl",
    "walking_bass",
]


def piano(ctx: Ctx, tau: float) -> Instrument:
    """Piano-like tone: bright attack fading to a dark sustain, decay ``tau`` s."""
    amps = 1.0 / np.arange(1, 17) ** 1.3

    def inst(f: float, n: int, hold: int) -> Audio:
        return voice(ctx, amps, f, n, dark=DARK, bright_tau=0.12) * env_decay(n, ctx.sr, tau, hold / ctx.sr, 0.08)

    return inst


def e_piano(ctx: Ctx, tau: float) -> Instrument:
    """Electric piano: a soft FM tone, decay ``tau`` s."""

    def inst(f: float, n: int, hold: int) -> Audio:
        return fm_bell(ctx, f, n, decay=tau, ratio=1.0, index=1.2) * env_decay(n, ctx.sr, 10.0, hold / ctx.sr, 0.1)

    return inst


def organ(ctx: Ctx) -> Instrument:
    """Drawbar organ, instant attack, 20 ms release."""

    def inst(f: float, n: int, hold: int) -> Audio:
        return voice(ctx, ORGAN, f, n) * env_asr(n, ctx.sr, 0.005, hold / ctx.sr, 0.02)

    return inst


def upright(ctx: Ctx, decay: float, bright: float) -> Instrument:
    """Plucked upright / electric bass (Karplus-Strong), T60 ``decay`` s."""
    return lambda f, n, h: pluck(ctx, f, n, h, decay=decay, bright=bright)


def horn_amps(rng: np.random.Generator) -> Audio:
    """Trumpet-like (pure brass) or sax-like (brass over a square wave) spectrum."""
    return brass(20) if rng.random() < 0.5 else square(15) * 0.7 + brass(15) * 0.3


def horn(ctx: Ctx, amps: Audio, vib: tuple[float, float]) -> Instrument:
    """Horn: ``amps`` brightening on the attack, vibrato ``vib`` (rate Hz, depth)."""

    def inst(f: float, n: int, hold: int) -> Audio:
        v = voice(ctx, amps, f, n, vib=vib, dark=DARK, bright_tau=0.25)
        return v * env_asr(n, ctx.sr, 0.03, hold / ctx.sr, 0.06)

    return inst


def pad_amps(rng: np.random.Generator) -> Audio:
    """A pad's spectrum: synth saw or string section."""
    return saw(24) if rng.random() < 0.6 else strings(20)


def pad(ctx: Ctx, amps: Audio, attack: float, release: float, detune: float) -> Instrument:
    """Two voices detuned by +-``detune`` semitones, slow attack and release (s)."""
    ratio = 2.0 ** (detune / 12.0)

    def inst(f: float, n: int, hold: int) -> Audio:
        v = voice(ctx, amps, f * ratio, n) + voice(ctx, amps, f / ratio, n)
        return v * env_asr(n, ctx.sr, attack, hold / ctx.sr, release)

    return inst


def walking_bass(ctx: Ctx, chords: Sequence[tuple[float, int]], prog: Sequence[int], beat: float, per_chord: float,
                 root: int, scale: Sequence[int]) -> list[Note]:
    """Quarter notes through each chord: root first, chord tones, a step into the next chord."""
    rng = ctx.rng
    notes: list[Note] = []
    n_beats = max(1, int(round(per_chord / beat)))
    for i, (t, d) in enumerate(chords):
        tones = chord_midi(root, scale, d, 4)
        nxt = scale_midi(root, scale, prog[(i + 1) % len(prog)])
        for k in range(n_beats):
            if k == 0:
                m = tones[0]
            elif k == n_beats - 1:
                m = nxt + int(rng.choice([-1, 1, 2, -2]))
            else:
                m = int(rng.choice(tones + [tones[0] + 2, tones[0] + 5]))
            m = into_range([m], 36, 52)[0]
            notes.append((t + k * beat + rng.normal(0, 0.005), beat * 0.95, m, rng.uniform(0.7, 1.0)))
    return notes


def comping(ctx: Ctx, chords: Sequence[tuple[float, int]], beat: float, per_chord: float, root: int,
            scale: Sequence[int], positions: Sequence[float], p: float) -> list[Note]:
    """Rootless seventh-chord voicings struck at ``positions`` (beats into the chord), each with probability ``p``."""
    rng = ctx.rng
    notes: list[Note] = []
    beats = per_chord / beat
    for t, d in chords:
        voicing = into_range(chord_midi(root, scale, d, 4)[1:] + [scale_midi(root, scale, d + 8)], 55, 74)
        for pos in positions:
            if pos < beats and rng.random() < p:
                dur = rng.uniform(0.2, 0.6) * beat
                onset = t + pos * beat + rng.normal(0, 0.006)
                notes.extend((onset, dur, m, rng.uniform(0.3, 0.6)) for m in voicing)
    return notes


def horn_line(ctx: Ctx, root: int, scale: Sequence[int], beat: float, swing: float, lo: int, hi: int) -> list[Note]:
    """Phrases of 4-11 eighth notes (long-short by ``swing``: 0 straight, 1/3 triplet) between rests."""
    rng = ctx.rng
    step = walk(ctx, 4, 0, 12, [-2, -1, 1, 2], [0.2, 0.3, 0.3, 0.2])
    line: list[Note] = []
    t = float(rng.uniform(0.0, 4.0)) * beat
    playing = True
    while t < ctx.seconds:
        if playing:
            count = int(rng.integers(4, 12))
            for k in range(count):
                off = (0.5 + swing / 2 if k % 2 else 0.0) * beat
                dur = ((0.5 + swing / 2) if k % 2 == 0 else (0.5 - swing / 2)) * beat
                m = into_range([scale_midi(root, scale, step()) + int(rng.random() < 0.1)], lo, hi)[0]
                line.append((t + (k // 2) * beat + off, dur, m, rng.uniform(0.6, 1.0)))
            t += (count // 2 + 1) * beat
        else:
            t += int(rng.integers(2, 6)) * beat
        playing = not playing
    return line


def vinyl(ctx: Ctx) -> Audio:
    """Record surface: sparse crackle plus band-passed hiss."""
    rng = ctx.rng
    crackle = np.zeros(ctx.n)
    pops = rng.integers(0, ctx.n, int(ctx.seconds * rng.uniform(5.0, 30.0)))
    crackle[pops] = rng.uniform(-1.0, 1.0, len(pops))
    hiss = filt(rng.standard_normal(ctx.n), "bandpass", (2000.0, 8000.0), ctx.sr)
    return filt(crackle, "bandpass", (1000.0, 6000.0), ctx.sr) * 8.0 + 0.3 * hiss
