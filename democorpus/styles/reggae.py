"""Reggae: one drop, rockers or steppers drums; off-beat skank (guitar or piano) with dub echo; organ bubble;
horn section lines; deep syncopated bass."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_decay, filt, norm, random_gain, voice
from ..form import song_form
from ..instruments import saw
from ..parts import horn, horn_amps, horn_line, organ, piano, vinyl
from ..score import Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One reggae file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng = ctx.rng
    beat, bar = tempo(rng, 60.0, 96.0)
    _, scale, root = key(rng, ["major", "minor", "dorian"], 40)
    prog = [[0, 3], [0, 4], [0, 3, 4, 3], [0, 6], [0, 5, 3, 4]][int(rng.integers(0, 5))]
    chords = chord_times(ctx, prog, bar)
    swing = rng.uniform(0.0, 0.33)
    stems: list[Stem] = [_drums(ctx, bar, swing), _skank(ctx, chords, root, scale, beat)]
    for extra in (_bubble(ctx, chords, root, scale, beat), _horns(ctx, root, scale, beat)):
        if extra is not None:
            stems.append(extra)
    stems.append(_bass(ctx, chords, root, scale, beat))

    if rng.random() < 0.2:
        stems.append(Stem(norm(vinyl(ctx), random_gain(-30, -20, rng)), 0.0, 0.0, "texture"))
    form = song_form(ctx, bar, {"full": 0.5, "nolead": 0.2, "groove": 0.15, "breakdown": 0.1, "beat": 0.05})
    return Arrangement(stems, rng.uniform(0.6, 2.0), rng.uniform(0.12, 0.3), (28.0, 50.0), form)


def _drums(ctx: Ctx, bar: float, swing: float) -> Stem:
    """The kit's stem: one drop, rockers or steppers (bars of ``bar`` seconds, hats swung by ``swing``)."""
    rng = ctx.rng
    # One drop (kick and rim on 3), rockers (kick on 1 and 3) or steppers (kick every beat); shuffled hats.
    beat_kind = str(rng.choice(["one drop", "rockers", "steppers"], p=[0.55, 0.2, 0.25]))
    kick_pat = {"one drop": "........X.......", "rockers": "X.......X.......", "steppers": "X...X...X...X..."}
    k_t, k_v = drums.events(ctx, kick_pat[beat_kind], bar)
    r_t, r_v = drums.events(ctx, "........X.......", bar)
    h_t, h_v = drums.events(
        ctx,
        str(rng.choice(["x.g.x.g.x.g.x.g.", "x.x.x.x.x.x.x.x.", "xggxggxggxggxggx", "..x...x...x...x."])),
        bar,
        swing=swing,
    )
    kick = drums.kick(
        ctx, f_hi=rng.uniform(90, 140), f_lo=rng.uniform(45, 60), decay=rng.uniform(0.15, 0.3), click=0.2
    )
    if rng.random() < 0.6:
        back = drums.rim(ctx)
    else:
        back = drums.snare(ctx, tone=rng.uniform(180, 260), decay=rng.uniform(0.08, 0.2))
    kit = (
        drums.track(ctx, kick, k_t, k_v)
        + drums.track(ctx, back, r_t, r_v) * random_gain(-3, 0, rng)
        + drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.03, 0.08)), h_t, h_v) * random_gain(-14, -8, rng)
    )
    return Stem(norm(kit, random_gain(-3, 0, rng)), 0.0, 0.3, "drums")


def _skank(ctx: Ctx, chords: list[tuple[float, int]], root: int, scale: tuple[int, ...], beat: float) -> Stem:
    """The off-beat chord chops' stem (guitar or piano, some with a dub echo)."""
    rng, sr = ctx.rng, ctx.sr
    # Skank: short chord chops on every off-beat, guitar (bright, high-passed) or piano; optional dub echo.
    sk: list[Note] = []
    for t, d in chords:
        for k in range(4):
            for m in into_range(chord_midi(root + 12, scale, d), 60, 76):
                sk.append((t + (k + 0.5) * beat + rng.normal(0, 0.004), rng.uniform(0.06, 0.15), m, 0.8))
    if rng.random() < 0.65:
        skank_amps = saw(30) * (1.0 + 0.5 * (np.arange(30) % 2))
        sig = render_notes(
            ctx, sk, lambda f, n, h: voice(ctx, skank_amps, f, n) * env_decay(n, sr, 0.08, h / sr, 0.02), 0.02
        )
        sig = filt(filt(sig, "highpass", rng.uniform(350.0, 700.0), sr), "lowpass", 5000.0, sr)
    else:
        sig = render_notes(ctx, sk, piano(ctx, rng.uniform(0.3, 0.8)), 0.05)
    if rng.random() < 0.4:
        d = int(0.75 * beat * sr)
        echo = np.zeros_like(sig)
        echo[d:] = 0.45 * sig[:-d]
        echo[2 * d :] += 0.2 * sig[: -2 * d]
        sig = sig + echo
    return Stem(norm(sig, random_gain(-6, -2, rng)), rng.uniform(0.2, 0.6), 0.5, "chords")


def _bubble(ctx: Ctx, chords: list[tuple[float, int]], root: int, scale: tuple[int, ...], beat: float) -> Stem | None:
    """The organ bubble's stem, or None (half the files)."""
    rng = ctx.rng
    # Organ bubble: sixteenth-note organ figure, some files.
    if rng.random() < 0.5:
        bub: list[Note] = []
        for t, d in chords:
            ch = into_range(chord_midi(root + 12, scale, d), 55, 70)
            for k in range(4):
                bub.append((t + k * beat + beat / 4, beat / 4, ch[0], 0.5))
                for m in ch[1:]:
                    bub.append((t + k * beat + beat / 2, beat / 4, m, 0.6))
        sig = render_notes(ctx, bub, organ(ctx), 0.02)
        return Stem(norm(sig, random_gain(-12, -6, rng)), rng.uniform(-0.6, -0.2), 0.3, "chords")
    return None


def _horns(ctx: Ctx, root: int, scale: tuple[int, ...], beat: float) -> Stem | None:
    """The horn section's stem, or None (most files)."""
    rng = ctx.rng
    # Horn section: unison lines, some files.
    if rng.random() < 0.3:
        line = horn_line(ctx, root, scale, beat, rng.uniform(0.0, 0.2), 58, 78)
        sig = render_notes(ctx, line, horn(ctx, horn_amps(rng), (rng.uniform(4.5, 6.0), 0.004)), 0.06)
        return Stem(norm(sig, random_gain(-8, -2, rng)), rng.uniform(-0.4, 0.4), 0.6, "lead")
    return None


def _bass(ctx: Ctx, chords: list[tuple[float, int]], root: int, scale: tuple[int, ...], beat: float) -> Stem:
    """The syncopated bass stem, the loudest part."""
    rng, sr = ctx.rng, ctx.sr
    # Deep, round, syncopated bass: the loudest part.
    bass_rhythms = [[0.0, 1.5, 2.0, 3.0], [0.0, 0.75, 1.5, 2.5, 3.25], [0.5, 1.0, 2.0, 2.75], [0.0, 1.0, 2.0, 3.0]]
    br = bass_rhythms[int(rng.integers(0, len(bass_rhythms)))]
    bass: list[Note] = []
    for t, d in chords:
        tones = chord_midi(root, scale, d) + [scale_midi(root, scale, d + 1)]
        for j, p in enumerate(br):
            m = into_range([tones[0] if j == 0 else int(rng.choice(tones))], 31, 45)[0]
            bass.append((t + p * beat, beat * rng.uniform(0.4, 0.9), m, rng.uniform(0.8, 1.0)))

    def round_bass(f: float, n: int, hold: int) -> Audio:
        return voice(ctx, [1.0, 0.35, 0.12], f, n) * env_decay(n, sr, 0.6, hold / sr, 0.04, attack=0.01)

    sig = filt(render_notes(ctx, bass, round_bass, 0.04), "lowpass", rng.uniform(500.0, 1200.0), sr)
    return Stem(norm(sig, random_gain(-2, 1, rng)), 0.0, 0.05, "bass")
