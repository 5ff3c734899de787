"""Jazz: swing ride on a triplet grid, ghost-note snare, walking bass, rootless piano comping, horn lines."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_asr, env_decay, filt, norm, random_gain, voice
from ..instruments import DARK, brass, pluck, square
from ..score import Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo, walk

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One jazz file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    beat, bar = tempo(rng, 100.0, 240.0)
    _, scale, root = key(rng, ["major"], 48)
    progs = [[1, 4, 0, 5], [1, 4, 0, 0], [0, 5, 1, 4], [2, 5, 1, 4]]
    prog = progs[int(rng.integers(0, len(progs)))]
    per_chord = bar if beat < 0.4 else bar / 2
    chords = chord_times(ctx, prog, per_chord)
    stems: list[Stem] = []

    # Patterns on a 12-step (triplet) grid, which is what swing is.
    # Ride: "ding, ding-da, ding, ding-da"; hat foot on 2 and 4.
    ride_t, ride_v = drums.events(ctx, "X..x.oX..x.o", bar, jitter=0.006)
    ride = drums.track(ctx, drums.ride(ctx, decay=rng.uniform(0.6, 1.4)), ride_t, ride_v)
    stems.append(Stem(norm(ride, random_gain(-10, -4, rng)), rng.uniform(0.2, 0.6), 0.6))
    hat_t, hat_v = drums.events(ctx, "...x.....x..", bar, jitter=0.004)
    stems.append(
        Stem(norm(drums.track(ctx, drums.hat(ctx, decay=0.03), hat_t, hat_v), random_gain(-18, -10, rng)), -0.3, 0.3)
    )
    # Snare comping: random ghost notes on triplet positions; feathered kick.
    comp = "".join(rng.choice(["g", "o", "."], p=[0.12, 0.05, 0.83]) for _ in range(12 * 8))
    sn_t, sn_v = drums.events(ctx, comp, 8 * bar, jitter=0.006)
    snare = drums.snare(ctx, tone=rng.uniform(170, 230), decay=rng.uniform(0.08, 0.15))
    stems.append(Stem(norm(drums.track(ctx, snare, sn_t, sn_v), random_gain(-18, -10, rng)), -0.1, 0.5))
    if rng.random() < 0.6:
        k_t, k_v = drums.events(ctx, "g..g..g..g..", bar, vel_jitter=0.2)
        kick = drums.kick(ctx, f_hi=120, f_lo=55, decay=0.12, click=0.1)
        stems.append(Stem(norm(drums.track(ctx, kick, k_t, k_v), random_gain(-20, -14, rng)), 0.0, 0.3))

    # Walking bass: quarter notes, chord tones with stepwise/chromatic approaches.
    bass: list[Note] = []
    for i, (t, d) in enumerate(chords):
        tones = chord_midi(root, scale, d, 4)
        n_beats = int(round(per_chord / beat))
        nxt = scale_midi(root, scale, prog[(i + 1) % len(prog)])
        for k in range(n_beats):
            if k == 0:
                m = tones[0]
            elif k == n_beats - 1:
                m = nxt + int(rng.choice([-1, 1, 2, -2]))
            else:
                m = int(rng.choice(tones + [tones[0] + 2, tones[0] + 5]))
            m = into_range([m], 36, 52)[0]
            bass.append((t + k * beat + rng.normal(0, 0.005), beat * 0.95, m, rng.uniform(0.7, 1.0)))
    b_decay, b_bright = rng.uniform(0.8, 1.6), rng.uniform(0.15, 0.35)
    sig = render_notes(ctx, bass, lambda f, n, h: pluck(ctx, f, n, h, decay=b_decay, bright=b_bright), 0.05)
    stems.append(Stem(norm(filt(sig, "lowpass", 1500.0, sr), random_gain(-4, 0, rng)), rng.uniform(-0.2, 0.2), 0.3))

    # Piano comping: rootless 7th voicings on syncopated triplet positions.
    piano_amps, tau = 1.0 / np.arange(1, 17) ** 1.3, rng.uniform(0.5, 1.2)

    def piano(f: float, n: int, hold: int) -> Audio:
        return voice(ctx, piano_amps, f, n, dark=DARK, bright_tau=0.12) * env_decay(n, sr, tau, hold / sr, 0.08)

    comps: list[Note] = []
    positions = [0.0, 1.0 + 2 / 3, 2.0, 3.0 + 2 / 3, 2.0 + 2 / 3, 1.0]
    for t, d in chords:
        voicing = into_range(chord_midi(root, scale, d, 4)[1:] + [scale_midi(root, scale, d + 8)], 55, 74)
        beats = per_chord / beat
        for pos in positions:
            if pos < beats and rng.random() < 0.45:
                for m in voicing:
                    comps.append(
                        (t + pos * beat + rng.normal(0, 0.006), rng.uniform(0.2, 0.6) * beat, m, rng.uniform(0.3, 0.6))
                    )
    sig = render_notes(ctx, comps, piano, 0.1)
    stems.append(Stem(norm(sig, random_gain(-6, -1, rng)), rng.uniform(-0.4, 0.0), 0.6))

    # Horn (sax / trumpet) lines in swung eighths, half the files.
    if rng.random() < 0.55:
        h_amps = brass(20) if rng.random() < 0.5 else square(15) * 0.7 + brass(15) * 0.3
        vib = (rng.uniform(4.5, 6.0), 0.004)
        line: list[Note] = []
        step = walk(ctx, 4, 0, 12, [-2, -1, 1, 2], [0.2, 0.3, 0.3, 0.2])
        t = 0.0
        playing = True
        while t < ctx.seconds:
            if playing:
                count = int(rng.integers(4, 12))
                for k in range(count):
                    off = (2 / 3 if k % 2 else 0.0) * beat
                    dur = (2 / 3 if k % 2 == 0 else 1 / 3) * beat
                    m = into_range([scale_midi(root, scale, step()) + int(rng.random() < 0.1)], 60, 80)[0]
                    line.append((t + (k // 2) * beat + off, dur, m, rng.uniform(0.6, 1.0)))
                t += (count // 2 + 1) * beat
            else:
                t += int(rng.integers(2, 6)) * beat
            playing = not playing

        def horn(f: float, n: int, hold: int) -> Audio:
            return voice(ctx, h_amps, f, n, vib=vib, dark=DARK, bright_tau=0.25) * env_asr(n, sr, 0.03, hold / sr, 0.06)

        sig = render_notes(ctx, line, horn, 0.06)
        stems.append(Stem(norm(sig, random_gain(-6, -1, rng)), rng.uniform(0.0, 0.4), 0.7))
    return Arrangement(stems, rng.uniform(0.8, 1.8), rng.uniform(0.15, 0.3), (30.0, 50.0))
