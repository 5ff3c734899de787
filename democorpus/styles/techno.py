"""Techno: four-on-the-floor kick, off-beat open hat, clap, acid or sub bass, chord stabs or pad."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Ctx, env_asr, env_decay, filt, norm, overdrive, random_gain, voice
from ..instruments import DARK, saw, square
from ..score import Note, chord_midi, into_range, key, render_notes, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One techno file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    beat, bar = tempo(rng, 122.0, 140.0)
    _, scale, root = key(rng, ["minor", "phrygian", "dorian"], 36)
    stems: list[Stem] = []

    # Four-on-the-floor kick, off-beat open hat, sixteenth closed hats, clap on 2 and 4.
    k_t, k_v = drums.events(ctx, "X...X...X...X...", bar, jitter=0.001, vel_jitter=0.02)
    kick = drums.kick(
        ctx, f_hi=rng.uniform(130, 200), f_lo=rng.uniform(42, 55), decay=rng.uniform(0.15, 0.3), click=0.4
    )
    stems.append(Stem(norm(drums.track(ctx, kick, k_t, k_v), random_gain(-1, 0, rng)), 0.0, 0.1))
    oh_t, oh_v = drums.events(ctx, "..x...x...x...x.", bar, jitter=0.001)
    stems.append(
        Stem(
            norm(drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.08, 0.2)), oh_t, oh_v), random_gain(-10, -5, rng)),
            0.2,
            0.3,
        )
    )
    if rng.random() < 0.8:
        ch_t, ch_v = drums.events(
            ctx, str(rng.choice(["xgogxgogxgogxgog", "x.g.x.g.x.g.x.g.", "gxggoxggoxggoxgg"])), bar, jitter=0.001
        )
        stems.append(
            Stem(
                norm(
                    drums.track(ctx, drums.hat(ctx, decay=0.025, cutoff=7000.0), ch_t, ch_v), random_gain(-14, -8, rng)
                ),
                -0.3,
                0.2,
            )
        )
    if rng.random() < 0.7:
        cl_t, cl_v = drums.events(ctx, "....x.......x...", bar, jitter=0.001)
        stems.append(Stem(norm(drums.track(ctx, drums.clap(ctx), cl_t, cl_v), random_gain(-10, -4, rng)), 0.0, 0.6))

    # Bass: acid sixteenths (bright-to-dark saw) or rolling off-beat sub.
    if rng.random() < 0.55:
        steps = rng.random(16) < rng.uniform(0.5, 0.85)
        offs = rng.choice([0, 0, 0, 12, 7, 3, -2], 16)
        accent = rng.random(16) < 0.3
        pat_notes: list[Note] = []
        n_bars = int(ctx.seconds / bar) + 1
        for b in range(n_bars):
            for s in range(16):
                if steps[s]:
                    pat_notes.append(
                        (b * bar + s * beat / 4, beat / 4 * 0.8, root + int(offs[s]), 1.0 if accent[s] else 0.6)
                    )
        tau = rng.uniform(0.03, 0.12)
        amps = saw(40) if rng.random() < 0.5 else square(40)
        sig = render_notes(
            ctx,
            pat_notes,
            lambda f, n, h: voice(ctx, amps, f, n, dark=DARK, bright_tau=tau) * env_decay(n, sr, 0.3, h / sr, 0.01),
            0.01,
        )
        sig = overdrive(sig, 2.5)
    else:
        sub = [
            (b * bar + k * beat + beat / 2, beat * 0.4, root, 1.0)
            for b in range(int(ctx.seconds / bar) + 1)
            for k in range(4)
        ]
        sig = render_notes(
            ctx, sub, lambda f, n, h: voice(ctx, [1.0, 0.3, 0.1], f, n) * env_decay(n, sr, 0.2, h / sr, 0.01), 0.01
        )
    stems.append(Stem(norm(sig, random_gain(-5, -1, rng)), 0.0, 0.15))

    # Minor chord stabs (short, reverb-drenched) or a slow filtered pad.
    chord = into_range(chord_midi(root + 12, scale, 0, int(rng.choice([3, 4]))), 55, 72)
    if rng.random() < 0.65:
        pos = sorted(rng.choice(16, size=int(rng.integers(1, 4)), replace=False))
        pat = "".join("x" if s in pos else "." for s in range(16))
        st_t, _ = drums.events(ctx, pat, 2 * bar, jitter=0.0, vel_jitter=0.0)
        stab_notes = [(float(t), beat / 4, m, 0.8) for t in st_t for m in chord]
        sig = render_notes(
            ctx, stab_notes, lambda f, n, h: voice(ctx, saw(30), f, n) * env_decay(n, sr, 0.12, h / sr, 0.05), 0.05
        )
        sig = filt(sig, "lowpass", rng.uniform(1500.0, 4000.0), sr)
        stems.append(Stem(norm(sig, random_gain(-9, -3, rng)), rng.uniform(-0.4, 0.4), 1.0))
    else:
        pad_notes = [(t, 4 * bar, m, 0.5) for t in np.arange(0.0, ctx.seconds, 4 * bar) for m in chord]
        sig = render_notes(
            ctx, pad_notes, lambda f, n, h: voice(ctx, saw(20), f, n) * env_asr(n, sr, 1.5, h / sr, 1.0), 1.0
        )
        sig = filt(sig, "lowpass", rng.uniform(600.0, 1800.0), sr)
        stems.append(Stem(norm(sig, random_gain(-12, -6, rng)), 0.0, 1.0))
    return Arrangement(stems, rng.uniform(0.8, 2.0), rng.uniform(0.12, 0.3), (35.0, 60.0))
