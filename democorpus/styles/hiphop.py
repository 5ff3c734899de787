"""Hiphop: boom-bap drums (snare or clap, swung hats or a jazz ride), 808 sub, upright or round bass, a looped
sample of keys (electric piano, piano, organ, strings), sometimes a horn phrase, vinyl crackle."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_decay, filt, norm, random_gain, voice
from ..form import song_form
from ..instruments import strings
from ..parts import e_piano, horn, horn_amps, horn_line, organ, pad, piano, upright, vinyl
from ..score import Instrument, Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One hiphop file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng = ctx.rng
    beat, bar = tempo(rng, 70.0, 100.0)
    swing = rng.uniform(0.0, 0.33)
    _, scale, root = key(rng, ["minor", "dorian", "major"], 36)
    prog = [[0, 5], [0, 3], [0, 5, 2, 6], [0, 0, 3, 4], [1, 4, 0, 0]][int(rng.integers(0, 5))]
    stems: list[Stem] = [_drums(ctx, bar, swing), _bass(ctx, prog, root, scale, beat, bar),
                         _keys_loop(ctx, prog, root, scale, beat, bar)]
    horn_stem = _horn(ctx, root, scale, beat, swing)
    if horn_stem is not None:
        stems.append(horn_stem)

    # Vinyl: hiss plus sparse crackle, most files.
    if rng.random() < 0.7:
        stems.append(Stem(norm(vinyl(ctx), random_gain(-28, -18, rng)), 0.0, 0.0, "texture"))
    form = song_form(ctx, bar, {"full": 0.5, "nolead": 0.25, "intro": 0.07, "groove": 0.1, "beat": 0.08})
    return Arrangement(stems, rng.uniform(0.4, 1.2), rng.uniform(0.08, 0.25), (28.0, 50.0), form)


def _drums(ctx: Ctx, bar: float, swing: float) -> Stem:
    """The boom-bap kit's stem (bars of ``bar`` seconds, hats swung by ``swing``, as drums.events takes it)."""
    rng, sr = ctx.rng, ctx.sr
    # Boom-bap: syncopated kick, hard snare (or clap) on 2 and 4, swung hats or a ride.
    kick_pat = str(rng.choice(["X......x..X.....", "X.........X..x..", "X..x......X.....", "X......X.xX....."]))
    k_t, k_v = drums.events(ctx, kick_pat, bar, swing=swing, jitter=0.004)
    s_t, s_v = drums.events(ctx, "....X.......X...", bar, jitter=0.004)
    kick = drums.kick(ctx, f_hi=rng.uniform(90, 140), f_lo=rng.uniform(45, 60), decay=rng.uniform(0.15, 0.3), click=0.3)
    if rng.random() < 0.25:
        snare = drums.clap(ctx)
    else:
        snare = drums.snare(ctx, tone=rng.uniform(160, 230), decay=rng.uniform(0.1, 0.25),
                            band=(rng.uniform(700.0, 1500.0), rng.uniform(5000.0, 7000.0)))
    kit = drums.track(ctx, kick, k_t, k_v) + drums.track(ctx, snare, s_t, s_v) * random_gain(-2, 1, rng)
    if rng.random() < 0.15:
        r_t, r_v = drums.events(ctx, "X..x.oX..x.o", bar, jitter=0.006)
        kit += drums.track(ctx, drums.ride(ctx, decay=rng.uniform(0.6, 1.2)), r_t, r_v) * random_gain(-14, -8, rng)
    else:
        hat_pat = str(rng.choice(["x.o.x.o.x.o.x.o.", "xgoxxgoxxgoxxgox", "xgxgxgxgxgxgxgxg", "x.x.x.x.x.x.x.x."]))
        h_t, h_v = drums.events(ctx, hat_pat, bar, swing=swing, jitter=0.006, vel_jitter=0.25)
        kit += drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.02, 0.06), cutoff=5000.0), h_t, h_v) * random_gain(
            -14, -7, rng
        )
    kit = filt(kit, "lowpass", rng.uniform(5000.0, 9000.0), sr)
    return Stem(norm(kit, random_gain(-1, 0, rng)), 0.0, 0.2, "drums")


def _bass(ctx: Ctx, prog: list[int], root: int, scale: tuple[int, ...], beat: float, bar: float) -> Stem:
    """The bass stem on the roots of ``prog`` (scale degrees): 808, upright or round."""
    rng, sr = ctx.rng, ctx.sr
    # Bass on the chord roots: 808 sub with a pitch drop, plucked upright, or a round synth bass.
    chords = chord_times(ctx, prog, 2 * bar if len(prog) == 2 else bar)
    bass_kind = str(rng.choice(["808", "upright", "round"], p=[0.6, 0.25, 0.15]))
    subs: list[Note] = []
    for t, d in chords:
        m = into_range([scale_midi(root, scale, d)], 30 if bass_kind == "808" else 33, 45)[0]
        subs.append((t, bar * 0.9 if len(prog) > 2 else bar * 1.8, m, 1.0))
        if rng.random() < 0.5:
            subs.append((t + 2.5 * beat, beat, m, 0.8))

    def sub808(f: float, n: int, hold: int) -> Audio:
        t = np.arange(n) / sr
        ph = 2 * np.pi * np.cumsum(f * (1.0 + 0.5 * np.exp(-t / 0.03))) / sr
        return np.tanh(1.8 * np.sin(ph)) * env_decay(n, sr, 1.5, hold / sr, 0.05)

    def round_bass(f: float, n: int, hold: int) -> Audio:
        return voice(ctx, [1.0, 0.35, 0.12], f, n) * env_decay(n, sr, 0.6, hold / sr, 0.04, attack=0.01)

    bass_inst = {"808": sub808, "upright": upright(ctx, rng.uniform(0.8, 1.6), rng.uniform(0.15, 0.35)),
                 "round": round_bass}[bass_kind]
    sig = render_notes(ctx, subs, bass_inst, 0.05)
    return Stem(norm(sig, random_gain(-5, -1, rng)), 0.0, 0.0, "bass")


def _keys_loop(ctx: Ctx, prog: list[int], root: int, scale: tuple[int, ...], beat: float, bar: float) -> Stem:
    """The looped keys sample's stem over ``prog`` (scale degrees)."""
    rng, sr = ctx.rng, ctx.sr
    # Keys loop: a 7th-chord sample rendered once and repeated.
    loop_bars = len(prog) if len(prog) > 2 else 4
    loop_len = int(round(loop_bars * bar * sr))
    loop_ctx = Ctx(rng, sr, loop_len + int(2.0 * beat * sr), ctx.tuning)
    chord_s = loop_bars * bar / len(prog)
    keys: list[Note] = []
    rhythms = [[0.0], [0.0, 1.5], [0.0, 2.5, 3.0], [0.5, 2.0], [0.0, 0.75, 2.0, 2.75]]
    rhythm = rhythms[int(rng.integers(0, len(rhythms)))]
    for i, d in enumerate(prog):
        for r in rhythm:
            for m in into_range(chord_midi(root + 12, scale, d, 4), 55, 74):
                keys.append((i * chord_s + r * beat, beat * rng.uniform(0.8, 1.8), m, rng.uniform(0.4, 0.7)))
    sample = str(rng.choice(["ep", "piano", "organ", "strings"], p=[0.4, 0.3, 0.15, 0.15]))
    tau = rng.uniform(0.6, 1.5)
    keys_inst: Instrument = {
        "ep": e_piano(loop_ctx, tau),
        "piano": piano(loop_ctx, tau),
        "organ": organ(loop_ctx),
        "strings": pad(loop_ctx, strings(20), 0.2, 0.3, 0.05),
    }[sample]
    loop = render_notes(loop_ctx, keys, keys_inst, 0.1)
    loop[: loop_ctx.n - loop_len] += loop[loop_len:]  # ringing past the loop end wraps to its start
    loop = filt(filt(loop[:loop_len], "lowpass", rng.uniform(1800.0, 4500.0), sr), "highpass", 150.0, sr)
    reps = -(-ctx.n // len(loop))
    return Stem(norm(np.tile(loop, reps)[: ctx.n], random_gain(-8, -3, rng)), rng.uniform(-0.3, 0.3), 0.5, "chords")


def _horn(ctx: Ctx, root: int, scale: tuple[int, ...], beat: float, swing: float) -> Stem | None:
    """A horn phrase's stem, or None (most files)."""
    rng, sr = ctx.rng, ctx.sr
    # A horn phrase sampled from a jazz record, some files.
    if rng.random() < 0.3:
        line = horn_line(ctx, root, scale, beat, swing, 60, 80)
        sig = filt(render_notes(ctx, line, horn(ctx, horn_amps(rng), (rng.uniform(4.5, 6.0), 0.004)), 0.06),
                   "lowpass", rng.uniform(2500.0, 5000.0), sr)
        return Stem(norm(sig, random_gain(-9, -3, rng)), rng.uniform(-0.3, 0.3), 0.5, "lead")
    return None
