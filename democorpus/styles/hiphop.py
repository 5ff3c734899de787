"""Hiphop: boom-bap drums with swung hats, 808 sub, a lo-fi keys loop, vinyl crackle."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_decay, filt, norm, random_gain, voice
from ..instruments import DARK, fm_bell
from ..score import Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One hiphop file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    beat, bar = tempo(rng, 78.0, 98.0)
    swing = rng.uniform(0.0, 0.25)
    _, scale, root = key(rng, ["minor", "dorian"], 36)
    prog = [[0, 5], [0, 3], [0, 5, 2, 6], [0, 0, 3, 4]][int(rng.integers(0, 4))]
    stems: list[Stem] = []

    # Boom-bap: syncopated kick, hard snare on 2 and 4, swung hats.
    kick_pat = str(rng.choice(["X......x..X.....", "X.........X..x..", "X..x......X.....", "X......X.xX....."]))
    k_t, k_v = drums.events(ctx, kick_pat, bar, swing=swing, jitter=0.004)
    s_t, s_v = drums.events(ctx, "....X.......X...", bar, jitter=0.004)
    h_t, h_v = drums.events(
        ctx,
        str(rng.choice(["x.o.x.o.x.o.x.o.", "xgoxxgoxxgoxxgox", "xgxgxgxgxgxgxgxg"])),
        bar,
        swing=swing,
        jitter=0.006,
        vel_jitter=0.25,
    )
    kick = drums.kick(ctx, f_hi=rng.uniform(90, 130), f_lo=rng.uniform(45, 60), decay=rng.uniform(0.15, 0.3), click=0.3)
    snare = drums.snare(ctx, tone=rng.uniform(160, 220), decay=rng.uniform(0.12, 0.25), band=(800.0, 5000.0))
    kit = (
        drums.track(ctx, kick, k_t, k_v)
        + drums.track(ctx, snare, s_t, s_v) * random_gain(-2, 1, rng)
        + drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.02, 0.05), cutoff=5000.0), h_t, h_v)
        * random_gain(-14, -7, rng)
    )
    stems.append(Stem(norm(filt(kit, "lowpass", rng.uniform(6000.0, 9000.0), sr), random_gain(-1, 0, rng)), 0.0, 0.2))

    # 808 sub: long sine notes on the chord roots with a pitch drop at the start.
    chords = chord_times(ctx, prog, 2 * bar if len(prog) == 2 else bar)
    subs: list[Note] = []
    for t, d in chords:
        m = into_range([scale_midi(root, scale, d)], 30, 42)[0]
        subs.append((t, bar * 0.9 if len(prog) > 2 else bar * 1.8, m, 1.0))
        if rng.random() < 0.5:
            subs.append((t + 2.5 * beat, beat, m, 0.8))

    def sub808(f: float, n: int, hold: int) -> Audio:
        t = np.arange(n) / sr
        ph = 2 * np.pi * np.cumsum(f * (1.0 + 0.5 * np.exp(-t / 0.03))) / sr
        return np.tanh(1.8 * np.sin(ph)) * env_decay(n, sr, 1.5, hold / sr, 0.05)

    sig = render_notes(ctx, subs, sub808, 0.05)
    stems.append(Stem(norm(sig, random_gain(-5, -1, rng)), 0.0, 0.0))

    # Lo-fi keys loop: 7th chords on EP (FM) or piano, rendered once and repeated.
    loop_bars = len(prog) if len(prog) > 2 else 4
    loop_len = int(round(loop_bars * bar * sr))
    loop_ctx = Ctx(rng, sr, loop_len + int(2.0 * beat * sr), ctx.tuning)
    chord_s = loop_bars * bar / len(prog)
    keys: list[Note] = []
    rhythms = [[0.0], [0.0, 1.5], [0.0, 2.5, 3.0], [0.5, 2.0]]
    rhythm = rhythms[int(rng.integers(0, len(rhythms)))]
    for i, d in enumerate(prog):
        for r in rhythm:
            for m in into_range(chord_midi(root + 12, scale, d, 4), 55, 74):
                keys.append((i * chord_s + r * beat, beat * rng.uniform(0.8, 1.8), m, rng.uniform(0.4, 0.7)))
    use_ep = rng.random() < 0.5
    tau = rng.uniform(0.6, 1.5)

    def keys_inst(f: float, n: int, hold: int) -> Audio:
        if use_ep:
            return fm_bell(loop_ctx, f, n, decay=tau, ratio=1.0, index=1.2) * env_decay(n, sr, 10.0, hold / sr, 0.1)
        return voice(loop_ctx, 1.0 / np.arange(1, 13) ** 1.4, f, n, dark=DARK, bright_tau=0.1) * env_decay(
            n, sr, tau, hold / sr, 0.1
        )

    loop = render_notes(loop_ctx, keys, keys_inst, 0.1)
    loop[: loop_ctx.n - loop_len] += loop[loop_len:]  # ringing past the loop end wraps to its start
    loop = filt(filt(loop[:loop_len], "lowpass", rng.uniform(1800.0, 3500.0), sr), "highpass", 150.0, sr)
    reps = -(-ctx.n // len(loop))
    stems.append(Stem(norm(np.tile(loop, reps)[: ctx.n], random_gain(-8, -3, rng)), rng.uniform(-0.3, 0.3), 0.5))

    # Vinyl: hiss plus sparse crackle.
    crackle = np.zeros(ctx.n)
    pops = rng.integers(0, ctx.n, int(ctx.seconds * rng.uniform(5.0, 30.0)))
    crackle[pops] = rng.uniform(-1.0, 1.0, len(pops))
    vinyl = filt(crackle, "bandpass", (1000.0, 6000.0), sr) * 8.0 + 0.3 * filt(
        ctx.rng.standard_normal(ctx.n), "bandpass", (2000.0, 8000.0), sr
    )
    stems.append(Stem(norm(vinyl, random_gain(-28, -18, rng)), 0.0, 0.0))
    return Arrangement(stems, rng.uniform(0.4, 1.0), rng.uniform(0.08, 0.2), (30.0, 50.0))
