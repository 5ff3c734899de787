"""Reggae: one drop or steppers drums, off-beat skank with dub echo, organ bubble, deep syncopated bass."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Ctx, env_asr, env_decay, filt, norm, random_gain, voice
from ..instruments import ORGAN, saw
from ..score import Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One reggae file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    beat, bar = tempo(rng, 66.0, 90.0)
    _, scale, root = key(rng, ["major", "minor", "dorian"], 40)
    prog = [[0, 3], [0, 4], [0, 3, 4, 3], [0, 6], [0, 5, 3, 4]][int(rng.integers(0, 5))]
    chords = chord_times(ctx, prog, bar)
    stems: list[Stem] = []

    # One drop (kick and rim on 3) or steppers (kick every beat); shuffled hats.
    steppers = rng.random() < 0.25
    k_t, k_v = drums.events(ctx, "X...X...X...X..." if steppers else "........X.......", bar)
    r_t, r_v = drums.events(ctx, "........X.......", bar)
    h_t, h_v = drums.events(
        ctx,
        str(rng.choice(["x.g.x.g.x.g.x.g.", "x.x.x.x.x.x.x.x.", "xggxggxggxggxggx"])),
        bar,
        swing=rng.uniform(0.0, 0.3),
    )
    kick = drums.kick(
        ctx, f_hi=rng.uniform(90, 130), f_lo=rng.uniform(45, 60), decay=rng.uniform(0.15, 0.25), click=0.2
    )
    kit = (
        drums.track(ctx, kick, k_t, k_v)
        + drums.track(ctx, drums.rim(ctx) if rng.random() < 0.6 else drums.snare(ctx, tone=250.0, decay=0.1), r_t, r_v)
        * random_gain(-3, 0, rng)
        + drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.03, 0.06)), h_t, h_v) * random_gain(-14, -8, rng)
    )
    stems.append(Stem(norm(kit, random_gain(-3, 0, rng)), 0.0, 0.3))

    # Skank: short bright chord chops on every off-beat, high-passed; optional dub echo.
    skank_amps = saw(30) * (1.0 + 0.5 * (np.arange(30) % 2))
    sk: list[Note] = []
    for t, d in chords:
        for k in range(4):
            for m in into_range(chord_midi(root + 12, scale, d), 60, 76):
                sk.append((t + (k + 0.5) * beat + rng.normal(0, 0.004), rng.uniform(0.06, 0.12), m, 0.8))
    sig = render_notes(
        ctx, sk, lambda f, n, h: voice(ctx, skank_amps, f, n) * env_decay(n, sr, 0.08, h / sr, 0.02), 0.02
    )
    sig = filt(filt(sig, "highpass", rng.uniform(350.0, 700.0), sr), "lowpass", 5000.0, sr)
    if rng.random() < 0.4:
        d = int(0.75 * beat * sr)
        echo = np.zeros_like(sig)
        echo[d:] = 0.45 * sig[:-d]
        echo[2 * d :] += 0.2 * sig[: -2 * d]
        sig = sig + echo
    stems.append(Stem(norm(sig, random_gain(-6, -2, rng)), rng.uniform(0.2, 0.6), 0.5))

    # Organ bubble: sixteenth-note organ figure, some files.
    if rng.random() < 0.5:
        bub: list[Note] = []
        for t, d in chords:
            ch = into_range(chord_midi(root + 12, scale, d), 55, 70)
            for k in range(4):
                bub.append((t + k * beat + beat / 4, beat / 4, ch[0], 0.5))
                for m in ch[1:]:
                    bub.append((t + k * beat + beat / 2, beat / 4, m, 0.6))
        sig = render_notes(
            ctx, bub, lambda f, n, h: voice(ctx, ORGAN, f, n) * env_asr(n, sr, 0.005, h / sr, 0.02), 0.02
        )
        stems.append(Stem(norm(sig, random_gain(-12, -6, rng)), rng.uniform(-0.6, -0.2), 0.3))

    # Deep, round, syncopated bass: the loudest part.
    bass_rhythms = [[0.0, 1.5, 2.0, 3.0], [0.0, 0.75, 1.5, 2.5, 3.25], [0.5, 1.0, 2.0, 2.75]]
    br = bass_rhythms[int(rng.integers(0, len(bass_rhythms)))]
    bass: list[Note] = []
    for t, d in chords:
        tones = chord_midi(root, scale, d) + [scale_midi(root, scale, d + 1)]
        for j, p in enumerate(br):
            m = into_range([tones[0] if j == 0 else int(rng.choice(tones))], 31, 45)[0]
            bass.append((t + p * beat, beat * 0.6, m, rng.uniform(0.8, 1.0)))
    sig = render_notes(
        ctx,
        bass,
        lambda f, n, h: voice(ctx, [1.0, 0.35, 0.12], f, n) * env_decay(n, sr, 0.6, h / sr, 0.04, attack=0.01),
        0.04,
    )
    stems.append(Stem(norm(filt(sig, "lowpass", 700.0, sr), random_gain(-2, 1, rng)), 0.0, 0.05))
    return Arrangement(stems, rng.uniform(0.6, 1.5), rng.uniform(0.12, 0.25), (30.0, 50.0))
