"""Ambient: usually no beat; a pad (synth or strings) in slow chords, root drone, sparse bells, piano or harp,
wind; a long reverb.  Some files have a soft four-on-the-floor pulse (ambient techno)."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_decay, filt, norm, pink, random_gain, voice
from ..form import song_form
from ..instruments import fm_bell, pluck
from ..parts import pad, pad_amps, piano
from ..score import Note, chord_midi, into_range, key, render_notes, tempo, walk

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One ambient file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    beat, bar = tempo(rng, 60.0, 124.0)
    _, scale, root = key(rng, ["major", "lydian", "dorian", "minor", "mixolydian"], 45)
    stems: list[Stem] = []

    # Pad (saw or strings), slow chords (4-10 s), low-passed.
    amps = pad_amps(rng)
    attack, release = rng.uniform(0.8, 3.0), rng.uniform(1.5, 4.0)
    detune = rng.uniform(0.04, 0.14)
    size = int(rng.choice([3, 4]))
    notes: list[Note] = []
    t = -rng.uniform(0.0, 3.0)
    deg = 0
    step = walk(ctx, 0, -3, 6, [-3, -2, 2, 3, 4], [0.2, 0.2, 0.2, 0.2, 0.2])
    while t < ctx.seconds:
        dur = rng.uniform(4.0, 10.0)
        notes.extend((t, dur, m, 0.5) for m in into_range(chord_midi(root, scale, deg, size), 50, 76))
        deg = step()
        t += dur
    pad_sig = render_notes(ctx, notes, pad(ctx, amps, attack, release, detune), release)
    pad_sig = filt(pad_sig, "lowpass", rng.uniform(600.0, 3000.0), sr)
    stems.append(Stem(norm(pad_sig, random_gain(-3, 0, rng)), rng.uniform(-0.2, 0.2), 1.0, "chords"))

    # Drone on the root with a slow swell, most files.
    if rng.random() < 0.75:
        lfo = 0.6 + 0.4 * voice(ctx, [1.0], 1.0 / rng.uniform(8.0, 20.0), ctx.n)
        drone = voice(ctx, [1.0, 0.3], ctx.hz(root - 12), ctx.n) * lfo
        stems.append(Stem(norm(drone, random_gain(-14, -5, rng)), 0.0, 0.6, "bass"))

    sparse = _sparse(ctx, root, scale)
    if sparse is not None:
        stems.append(sparse)

    # Wind: band-passed pink noise with a slow swell.
    if rng.random() < 0.4:
        lo = rng.uniform(300.0, 900.0)
        wind = filt(pink(rng, ctx.n), "bandpass", (lo, lo * rng.uniform(2.0, 5.0)), sr)
        wind *= 0.5 + 0.5 * voice(ctx, [1.0], 1.0 / rng.uniform(6.0, 15.0), ctx.n) ** 2
        stems.append(Stem(norm(wind, random_gain(-22, -12, rng)), rng.uniform(-0.3, 0.3), 0.5, "texture"))

    stems += _pulse(ctx, root, beat, bar)
    form = song_form(ctx, 4 * bar, {"full": 0.55, "breakdown": 0.25, "intro": 0.2}, lengths=(2, 4), dynamics_db=4.0)
    return Arrangement(stems, rng.uniform(2.0, 6.0), rng.uniform(0.35, 0.75), (28.0, 55.0), form)


def _sparse(ctx: Ctx, root: int, scale: tuple[int, ...]) -> Stem | None:
    """Sparse pentatonic notes' stem (FM bells, piano or harp), or None (some files)."""
    rng = ctx.rng
    # Sparse notes from the pentatonic subset of the scale: FM bells, piano or harp.
    lead = str(rng.choice(["bells", "piano", "harp", "none"], p=[0.45, 0.25, 0.15, 0.15]))
    if lead != "none":
        rate = rng.uniform(0.1, 0.6)
        count = rng.poisson(rate * ctx.seconds) + 1
        times = np.sort(rng.uniform(0.0, ctx.seconds, count))
        penta = [scale[i] for i in (0, 1, 2, 4, 5)]
        decay = rng.uniform(1.5, 4.0)
        octave = 24 if lead == "bells" else 12
        sparse: list[Note] = []
        for tt in times:
            pitch = root + octave + 12 * int(rng.integers(0, 2)) + int(rng.choice(penta))
            sparse.append((float(tt), 0.1, pitch, rng.uniform(0.4, 1.0)))
        if lead == "bells":
            ratio, index = rng.uniform(2.5, 4.1), rng.uniform(1.0, 3.0)
            sig = render_notes(
                ctx, sparse, lambda f, n, h: fm_bell(ctx, f, n, decay=decay, ratio=ratio, index=index), 2.5 * decay
            )
        elif lead == "piano":
            sig = render_notes(ctx, [(t, decay, m, v) for t, _d, m, v in sparse], piano(ctx, decay), 0.3)
        else:
            bright = rng.uniform(0.3, 0.7)
            sig = render_notes(ctx, sparse, lambda f, n, h: pluck(ctx, f, n, n, decay=decay, bright=bright), decay)
        return Stem(norm(sig, random_gain(-12, -4, rng)), rng.uniform(-0.6, 0.6), 1.0, "lead")
    return None


def _pulse(ctx: Ctx, root: int, beat: float, bar: float) -> list[Stem]:
    """A muffled kick (and off-beat sub) pulse's two stems, or none (most files)."""
    rng, sr = ctx.rng, ctx.sr
    # A soft, muffled pulse: kick on every beat, off-beat sub (ambient techno), some files.
    if rng.random() < 0.15:
        k_t, k_v = drums.events(ctx, "X...X...X...X...", bar, jitter=0.002, vel_jitter=0.05)
        kick = drums.kick(ctx, f_hi=rng.uniform(90, 140), f_lo=rng.uniform(42, 55), decay=rng.uniform(0.2, 0.4),
                          click=0.1)
        pulse = filt(drums.track(ctx, kick, k_t, k_v), "lowpass", rng.uniform(300.0, 1200.0), sr)
        if rng.random() < 0.5:
            h_t, h_v = drums.events(ctx, "..x...x...x...x.", bar, jitter=0.003)
            hats = drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.05, 0.15)), h_t, h_v)
            pulse += hats * random_gain(-24, -14, rng)
        kit = Stem(norm(pulse, random_gain(-10, -4, rng)), 0.0, 0.4, "drums")

        def sub(f: float, n: int, hold: int) -> Audio:
            return voice(ctx, [1.0, 0.2], f, n) * env_decay(n, sr, 0.3, hold / sr, 0.05, attack=0.01)

        subs = [(t + beat / 2, beat * 0.4, root - 12, 0.8) for t in np.arange(0.0, ctx.seconds, beat)]
        return [kit, Stem(norm(render_notes(ctx, subs, sub, 0.05), random_gain(-12, -6, rng)), 0.0, 0.2, "bass")]
    return []
