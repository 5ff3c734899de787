"""Classical: no drums; an orchestra (strings, bass, violin / flute / horn melody, harp), a string group or a
solo piano; phrase-long swells; adagio to allegro."""

from __future__ import annotations

import numpy as np

from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_asr, filt, norm, random_gain, voice
from ..form import song_form
from ..instruments import DARK, FLUTE, brass, pluck, strings
from ..parts import piano
from ..score import Instrument, Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo, walk

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One classical file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    meter = int(rng.choice([3, 4]))
    beat, bar = tempo(rng, 50.0, 132.0, meter)
    _, scale, root = key(rng, ["harmonic_minor" if rng.random() < 0.45 else "major"], 46)
    progs = [[0, 3, 4, 0], [0, 5, 3, 4], [0, 4, 5, 3, 0, 1, 4, 0], [0, 3, 0, 4], [0, 1, 4, 0]]
    prog = progs[int(rng.integers(0, len(progs)))]
    chords = chord_times(ctx, prog, bar)
    vib = (rng.uniform(5.0, 6.5), rng.uniform(0.002, 0.005))
    ensemble = str(rng.choice(["orchestra", "strings", "piano"], p=[0.5, 0.3, 0.2]))
    stems: list[Stem] = []

    # Dynamics: phrase-long swells shared by all instruments.
    t_all = np.arange(ctx.n) / sr
    swell = 0.65 + 0.35 * np.sin(2 * np.pi * t_all / (bar * rng.choice([4, 8])) + rng.random() * 6.28)

    def bowed(amps: Audio, attack: float) -> Instrument:
        def inst(f: float, n: int, hold: int) -> Audio:
            v = voice(ctx, amps, f, n, vib=vib) + voice(ctx, amps, f * 1.003, n, vib=vib)
            return v * env_asr(n, sr, attack, hold / sr, 0.25)

        return inst

    keys = piano(ctx, rng.uniform(0.8, 2.0))

    # Sustained chords: the string section (most orchestra and string files).
    if ensemble != "piano" and rng.random() < 0.8:
        sec = [(t, bar, m, 0.5) for t, d in chords for m in into_range(chord_midi(root, scale, d), 55, 74)]
        sig = filt(render_notes(ctx, sec, bowed(strings(20), rng.uniform(0.15, 0.6)), 0.25), "lowpass", 5000.0, sr)
        stems.append(Stem(norm(sig * swell, random_gain(-6, -1, rng)), rng.uniform(-0.3, 0.3), 1.0, "chords"))

    # Bass line (cello / double bass, or the piano's left hand): roots in half or whole bars.
    bass_notes: list[Note] = []
    div = int(rng.choice([1, 2])) if meter == 4 else 1
    for t, d in chords:
        m = into_range([scale_midi(root, scale, d)], 36, 50)[0]
        for k in range(div):
            bass_notes.append((t + k * bar / div, bar / div * 0.95, m if k == 0 else m + 7 * (rng.random() < 0.5), 0.8))
    bass_inst = keys if ensemble == "piano" else bowed(strings(16), 0.08)
    sig = render_notes(ctx, bass_notes, bass_inst, 0.25)
    stems.append(Stem(norm(sig * swell, random_gain(-6, -2, rng)), rng.uniform(-0.2, 0.2), 0.8, "bass"))

    stems.append(_melody(ctx, chords, ensemble, keys, vib, swell, root, scale, meter, beat))
    arp = _arpeggio(ctx, chords, ensemble, keys, swell, root, scale, meter, beat)
    if arp is not None:
        stems.append(arp)
    form = song_form(ctx, 4 * bar, {"full": 0.65, "nolead": 0.2, "breakdown": 0.1, "intro": 0.05}, lengths=(1, 2),
                     dynamics_db=5.0)
    return Arrangement(stems, rng.uniform(1.4, 4.0), rng.uniform(0.2, 0.5), (30.0, 60.0), form)


def _melody(ctx: Ctx, chords: list[tuple[float, int]], ensemble: str, keys: Instrument, vib: tuple[float, float],
            swell: Audio, root: int, scale: tuple[int, ...], meter: int, beat: float) -> Stem:
    """The melody's stem (violin, flute, horn or piano), shaped by the shared ``swell``."""
    rng, sr = ctx.rng, ctx.sr
    # Melody: violin, flute, horn or piano; stepwise, chord tones on downbeats.
    kind = 3 if ensemble == "piano" else 0 if ensemble == "strings" else int(rng.integers(0, 3))
    mel_lo = [67, 72, 55, 67][kind]
    rhythms = [[1.0], [0.5, 0.5], [0.75, 0.25], [2.0], [0.5, 0.25, 0.25], [1.5, 0.5]]
    mel: list[Note] = []
    step = walk(ctx, 7, 0, 13, [-2, -1, 1, 2, 0], [0.15, 0.3, 0.3, 0.15, 0.1])
    for t, _d in chords:
        pos = 0.0
        while pos < meter - 1e-6:
            r = rhythms[int(rng.integers(0, len(rhythms)))]
            if pos + sum(r) > meter:
                r = [meter - pos]
            for dur in r:
                pitch = into_range([scale_midi(root, scale, step())], mel_lo, mel_lo + 20)[0]
                mel.append((t + pos * beat, dur * beat * 0.98, pitch, rng.uniform(0.6, 1.0)))
                pos += dur

    mel_amps = [strings(24), FLUTE, brass(16), FLUTE][kind]

    def solo(f: float, n: int, hold: int) -> Audio:
        v = voice(ctx, mel_amps, f, n, vib=vib, dark=DARK if kind == 2 else None, bright_tau=0.3)
        return v * env_asr(n, sr, 0.06, hold / sr, 0.15)

    sig = filt(render_notes(ctx, mel, keys if kind == 3 else solo, 0.15), "lowpass", 6000.0, sr)
    return Stem(norm(sig * swell, random_gain(-4, 0, rng)), rng.uniform(-0.3, 0.3), 0.9, "lead")


def _arpeggio(ctx: Ctx, chords: list[tuple[float, int]], ensemble: str, keys: Instrument, swell: Audio, root: int,
              scale: tuple[int, ...], meter: int, beat: float) -> Stem | None:
    """The arpeggio's stem (harp, pizzicato or the piano's broken chords), or None (some files)."""
    rng = ctx.rng
    # Arpeggio in eighths or sixteenths: harp / pizzicato, or the piano's broken chords.
    if rng.random() < (0.8 if ensemble == "piano" else 0.5):
        sub = int(rng.choice([2, 4])) if beat > 0.6 else 2
        arp: list[Note] = []
        up_down = rng.random() < 0.5
        for t, d in chords:
            tones = into_range(chord_midi(root, scale, d), 55, 67)
            seq = tones + [m + 12 for m in tones]
            if up_down:
                seq = seq + seq[-2:0:-1]
            for k in range(meter * sub):
                arp.append((t + k * beat / sub, beat / sub, seq[k % len(seq)], rng.uniform(0.6, 1.0)))
        decay, bright = rng.uniform(1.0, 2.5), rng.uniform(0.3, 0.7)

        def harp(f: float, n: int, hold: int) -> Audio:
            return pluck(ctx, f, n, n, decay=decay, bright=bright)

        sig = render_notes(ctx, arp, keys if ensemble == "piano" else harp, 0.6)
        return Stem(norm(sig * swell, random_gain(-8, -2, rng)), rng.uniform(-0.5, 0.5), 1.0, "chords")
    return None
