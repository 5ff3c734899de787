"""Classical: no drums; bowed strings, bass line, violin / flute / horn melody, harp arpeggios; phrase swells."""

from __future__ import annotations

import numpy as np

from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_asr, filt, norm, random_gain, voice
from ..instruments import DARK, FLUTE, brass, pluck, strings
from ..score import Instrument, Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo, walk

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One classical file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    meter = int(rng.choice([3, 4]))
    beat, bar = tempo(rng, 60.0, 126.0, meter)
    _, scale, root = key(rng, ["harmonic_minor" if rng.random() < 0.45 else "major"], 48)
    progs = [[0, 3, 4, 0], [0, 5, 3, 4], [0, 4, 5, 3, 0, 1, 4, 0], [0, 3, 0, 4]]
    prog = progs[int(rng.integers(0, len(progs)))]
    chords = chord_times(ctx, prog, bar)
    vib = (rng.uniform(5.0, 6.5), rng.uniform(0.002, 0.005))
    stems: list[Stem] = []

    # Dynamics: phrase-long swells shared by all instruments.
    t_all = np.arange(ctx.n) / sr
    swell = 0.65 + 0.35 * np.sin(2 * np.pi * t_all / (bar * rng.choice([4, 8])) + rng.random() * 6.28)

    def bowed(amps: Audio, attack: float) -> Instrument:
        def inst(f: float, n: int, hold: int) -> Audio:
            v = voice(ctx, amps, f, n, vib=vib) + voice(ctx, amps, f * 1.003, n, vib=vib)
            return v * env_asr(n, sr, attack, hold / sr, 0.25)

        return inst

    # String section: sustained chords (most files).
    if rng.random() < 0.8:
        sec = [(t, bar, m, 0.5) for t, d in chords for m in into_range(chord_midi(root, scale, d), 55, 74)]
        sig = filt(render_notes(ctx, sec, bowed(strings(20), rng.uniform(0.15, 0.4)), 0.25), "lowpass", 5000.0, sr)
        stems.append(Stem(norm(sig * swell, random_gain(-6, -1, rng)), rng.uniform(-0.3, 0.3), 1.0))

    # Bass line (cello / double bass): roots in half or whole bars.
    bass_notes: list[Note] = []
    div = int(rng.choice([1, 2])) if meter == 4 else 1
    for t, d in chords:
        m = into_range([scale_midi(root, scale, d)], 36, 50)[0]
        for k in range(div):
            bass_notes.append((t + k * bar / div, bar / div * 0.95, m if k == 0 else m + 7 * (rng.random() < 0.5), 0.8))
    sig = render_notes(ctx, bass_notes, bowed(strings(16), 0.08), 0.25)
    stems.append(Stem(norm(sig * swell, random_gain(-6, -2, rng)), rng.uniform(-0.2, 0.2), 0.8))

    # Melody: violin, flute or horn; stepwise, chord tones on downbeats.
    kind = int(rng.integers(0, 3))
    mel_amps = [strings(24), FLUTE, brass(16)][kind]
    mel_lo = [67, 72, 55][kind]
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
                deg = step()
                mel.append(
                    (
                        t + pos * beat,
                        dur * beat * 0.98,
                        into_range([scale_midi(root, scale, deg)], mel_lo, mel_lo + 20)[0],
                        rng.uniform(0.6, 1.0),
                    )
                )
                pos += dur

    def melody(f: float, n: int, hold: int) -> Audio:
        v = voice(ctx, mel_amps, f, n, vib=vib, dark=DARK if kind == 2 else None, bright_tau=0.3)
        return v * env_asr(n, sr, 0.06, hold / sr, 0.15)

    sig = filt(render_notes(ctx, mel, melody, 0.15), "lowpass", 6000.0, sr)
    stems.append(Stem(norm(sig * swell, random_gain(-4, 0, rng)), rng.uniform(-0.3, 0.3), 0.9))

    # Harp / pizzicato arpeggio in eighths or sixteenths.
    if rng.random() < 0.55:
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
        sig = render_notes(ctx, arp, lambda f, n, h: pluck(ctx, f, n, n, decay=decay, bright=bright), 0.6)
        stems.append(Stem(norm(sig * swell, random_gain(-8, -2, rng)), rng.uniform(-0.5, 0.5), 1.0))
    return Arrangement(stems, rng.uniform(1.6, 3.0), rng.uniform(0.25, 0.45), (35.0, 60.0))
