"""Ambient: no beat; detuned saw pad in slow chords, root drone, sparse FM bells, wind noise; long reverb."""

from __future__ import annotations

import numpy as np

from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_asr, filt, norm, pink, random_gain, voice
from ..instruments import fm_bell, saw
from ..score import Note, chord_midi, into_range, key, render_notes, walk

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One ambient file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    _, scale, root = key(rng, ["major", "lydian", "dorian", "minor"], 48)
    stems: list[Stem] = []

    # Detuned saw pad, slow chords (4-10 s), low-passed.
    pad_amps = saw(24)
    attack, release = rng.uniform(1.0, 3.0), rng.uniform(2.0, 4.0)
    detune = rng.uniform(4.0, 14.0) / 100.0
    size = int(rng.choice([3, 4]))
    notes: list[Note] = []
    t = -rng.uniform(0.0, 3.0)
    deg = 0
    step = walk(ctx, 0, -3, 6, [-3, -2, 2, 3, 4], [0.2, 0.2, 0.2, 0.2, 0.2])
    while t < ctx.seconds:
        dur = rng.uniform(4.0, 10.0)
        for m in into_range(chord_midi(root, scale, deg, size), 50, 76):
            notes.append((t, dur, m - detune, 0.5))
            notes.append((t, dur, m + detune, 0.5))
        deg = step()
        t += dur

    def pad(f: float, n: int, hold: int) -> Audio:
        return voice(ctx, pad_amps, f, n) * env_asr(n, sr, attack, hold / sr, release)

    pad_sig = filt(render_notes(ctx, notes, pad, release), "lowpass", rng.uniform(700.0, 2500.0), sr)
    stems.append(Stem(norm(pad_sig, random_gain(-3, 0, rng)), rng.uniform(-0.2, 0.2), 1.0))

    # Drone on the root with a slow swell.
    lfo = 0.6 + 0.4 * voice(ctx, [1.0], 1.0 / rng.uniform(8.0, 20.0), ctx.n)
    drone = voice(ctx, [1.0, 0.3], ctx.hz(root - 12), ctx.n) * lfo
    stems.append(Stem(norm(drone, random_gain(-14, -5, rng)), 0.0, 0.6))

    # Sparse FM bells from the pentatonic subset of the scale.
    if rng.random() < 0.8:
        rate = rng.uniform(0.1, 0.5)
        count = rng.poisson(rate * ctx.seconds) + 1
        times = np.sort(rng.uniform(0.0, ctx.seconds, count))
        penta = [scale[i] for i in (0, 1, 2, 4, 5)]
        ratio, index, decay = rng.uniform(2.5, 4.1), rng.uniform(1.0, 3.0), rng.uniform(1.5, 4.0)
        bells = [
            (float(tt), 0.1, root + 24 + 12 * int(rng.integers(0, 2)) + int(rng.choice(penta)), rng.uniform(0.4, 1.0))
            for tt in times
        ]
        bell_sig = render_notes(
            ctx, bells, lambda f, n, h: fm_bell(ctx, f, n, decay=decay, ratio=ratio, index=index), 2.5 * decay
        )
        stems.append(Stem(norm(bell_sig, random_gain(-12, -4, rng)), rng.uniform(-0.6, 0.6), 1.0))

    # Wind: band-passed pink noise with a slow swell.
    if rng.random() < 0.4:
        lo = rng.uniform(300.0, 900.0)
        wind = filt(pink(rng, ctx.n), "bandpass", (lo, lo * rng.uniform(2.0, 5.0)), sr)
        wind *= 0.5 + 0.5 * voice(ctx, [1.0], 1.0 / rng.uniform(6.0, 15.0), ctx.n) ** 2
        stems.append(Stem(norm(wind, random_gain(-22, -12, rng)), rng.uniform(-0.3, 0.3), 0.5))
    return Arrangement(stems, rng.uniform(3.0, 6.0), rng.uniform(0.45, 0.75), (30.0, 55.0))
