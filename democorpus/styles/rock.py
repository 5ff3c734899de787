"""Rock: backbeat (or four-on-the-floor) drums, distorted double-tracked power chords or clean arpeggiated
guitar, driven or plucked bass, organ or synth pad, pentatonic lead."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Audio, Ctx, env_asr, env_decay, filt, norm, overdrive, random_gain, voice
from ..form import song_form
from ..instruments import pluck, power_chord, saw
from ..parts import organ, pad, upright
from ..score import Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One rock file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng = ctx.rng
    beat, bar = tempo(rng, 80.0, 170.0)
    mode, scale, root = key(rng, ["major", "mixolydian", "minor", "dorian"], 40)
    progs = [[0, 4, 5, 3], [0, 3, 4, 3], [0, 5, 6, 0], [0, 6, 3, 0], [0, 3, 0, 4]]
    prog = progs[int(rng.integers(0, len(progs)))]
    per_chord = bar * int(rng.choice([1, 2]))
    chords = chord_times(ctx, prog, per_chord)
    stems: list[Stem] = [_drums(ctx, bar)]
    stems += _guitars(ctx, chords, beat, per_chord, root, scale)
    stems.append(_bass(ctx, chords, beat, per_chord, root, scale))
    held = _keys(ctx, chords, per_chord, root, scale)
    if held is not None:
        stems.append(held)
    lead = _lead(ctx, mode, root, beat, bar)
    if lead is not None:
        stems.append(lead)
    form = song_form(ctx, bar, {"full": 0.5, "nolead": 0.32, "intro": 0.08, "groove": 0.07, "beat": 0.03})
    return Arrangement(stems, rng.uniform(0.6, 1.8), rng.uniform(0.1, 0.3), (30.0, 55.0), form)


def _drums(ctx: Ctx, bar: float) -> Stem:
    """The drum kit's stem (backbeat or four on the floor) for bars of ``bar`` seconds."""
    rng = ctx.rng
    # Drums: backbeat.  Kick 1 & 3 (+ variations, or every beat), snare 2 & 4, eighth hats or ride,
    # fill and crash every 8 bars.
    kick_pats = ["X.......X.......", "X.......X.X.....", "X......xX.......", "X.x.....X.x.....", "X...X...X...X..."]
    kick_pat = kick_pats[int(rng.choice(5, p=[0.27, 0.21, 0.21, 0.21, 0.1]))]
    hat_pat = str(rng.choice(["x.o.x.o.x.o.x.o.", "x.x.x.x.x.x.x.x.", "xoxoxoxoxoxoxoxo", "..x...x...x...x."]))
    k_t, k_v = drums.events(ctx, kick_pat, bar)
    s_t, s_v = drums.events(ctx, "....X.......X...", bar)
    f_t, f_v = drums.events(ctx, "............xxxx", 8 * bar, t0=7 * bar)
    h_t, h_v = drums.events(ctx, hat_pat, bar)
    c_t, c_v = drums.events(ctx, "X", 8 * bar, jitter=0.002)
    kick = drums.kick(
        ctx, f_hi=rng.uniform(100, 170), f_lo=rng.uniform(45, 62), decay=rng.uniform(0.12, 0.25), click=0.5
    )
    snare = drums.snare(ctx, tone=rng.uniform(160, 240), decay=rng.uniform(0.1, 0.22),
                        band=(rng.uniform(900.0, 1600.0), rng.uniform(5000.0, 7500.0)))
    if rng.random() < 0.2:
        cymbal = drums.ride(ctx, decay=rng.uniform(0.5, 1.0))
    else:
        cymbal = drums.hat(ctx, decay=rng.uniform(0.03, 0.1))
    kit = (
        drums.track(ctx, kick, k_t, k_v) * random_gain(-2, 0, rng)
        + drums.track(ctx, snare, np.concatenate([s_t, f_t]), np.concatenate([s_v, 0.7 * f_v]))
        * random_gain(-3, 0, rng)
        + drums.track(ctx, cymbal, h_t, h_v) * random_gain(-12, -6, rng)
        + drums.track(ctx, drums.ride(ctx, decay=1.2), c_t, c_v) * random_gain(-10, -4, rng)
    )
    return Stem(norm(kit, random_gain(-3, 0, rng)), 0.0, 0.4, "drums")



def _guitars(ctx: Ctx, chords: list[tuple[float, int]], beat: float, per_chord: float, root: int,
             scale: tuple[int, ...]) -> list[Stem]:
    """The two guitar stems, left and right, over ``chords`` (start s, degree)."""
    rng, sr = ctx.rng, ctx.sr
    # Guitars.  Distorted power chords (root, fifth, octave), eighths or held, double-tracked left/right:
    # a power chord is periodic at half the root frequency (harmonics 2, 3, 4), so it is one wavetable
    # voice an octave down; the second track is the first delayed by 12-25 ms.  Or (some files) a clean
    # guitar picking the chord tones in eighths.
    if rng.random() < 0.72:
        gtr_amps = power_chord(40)
        drive = rng.uniform(3.0, 20.0)
        mute = rng.uniform(0.04, 0.12)
        sustained = rng.random() < 0.3
        notes: list[Note] = []
        for t, d in chords:
            r = into_range([scale_midi(root, scale, d)], 40, 52)[0] - 12
            if sustained:
                notes.append((t, per_chord * 0.97, r, 0.8))
            else:
                for k in range(int(round(per_chord / (beat / 2)))):
                    onset = t + k * beat / 2 + rng.normal(0, 0.003)
                    notes.append((onset, beat / 2 * 0.9, r, 1.0 if k % 2 == 0 else 0.75))

        def gtr(f: float, n: int, hold: int) -> Audio:
            tau = 5.0 if sustained else mute + 0.15
            return (voice(ctx, gtr_amps, f * 0.998, n) + voice(ctx, gtr_amps, f * 1.002, n)) * env_decay(
                n, sr, tau, hold / sr, 0.02
            )

        raw = render_notes(ctx, notes, gtr, 0.02)
        dist = overdrive(raw, drive)
        dist = norm(filt(filt(dist, "lowpass", rng.uniform(2500.0, 5500.0), sr, order=4), "highpass", 90.0, sr))
    else:
        picks: list[Note] = []
        for t, d in chords:
            tones = into_range(chord_midi(root, scale, d), 52, 67)
            seq = tones + [tones[0] + 12] + tones[1:][::-1]
            for k in range(int(round(per_chord / (beat / 2)))):
                picks.append((t + k * beat / 2 + rng.normal(0, 0.003), beat, seq[k % len(seq)], rng.uniform(0.6, 1.0)))
        decay, bright = rng.uniform(1.0, 2.5), rng.uniform(0.4, 0.8)
        sig = render_notes(ctx, picks, lambda f, n, h: pluck(ctx, f, n, n, decay=decay, bright=bright), 0.5)
        dist = norm(overdrive(sig, rng.uniform(1.0, 3.0)))
    lag = int(rng.uniform(0.012, 0.025) * sr)
    double = np.concatenate([np.zeros(lag), dist[: ctx.n - lag]])[: ctx.n]
    spread = rng.uniform(0.5, 0.9)
    left = Stem(dist * random_gain(-3, 0, rng), -spread, 0.3, "chords")
    return [left, Stem(double * random_gain(-3, 0, rng), spread, 0.3, "chords")]



def _bass(ctx: Ctx, chords: list[tuple[float, int]], beat: float, per_chord: float, root: int,
          scale: tuple[int, ...]) -> Stem:
    """The bass stem on the chord roots."""
    rng, sr = ctx.rng, ctx.sr
    # Bass: roots in eighths, slightly driven, or plucked.
    bass = [
        (t + k * beat / 2, beat / 2 * 0.9, into_range([scale_midi(root, scale, d)], 28, 40)[0], 0.9)
        for t, d in chords
        for k in range(int(round(per_chord / (beat / 2))))
    ]
    if rng.random() < 0.7:
        b_amps = np.array([1.0, 0.6, 0.35, 0.2, 0.1])
        sig = render_notes(
            ctx, bass, lambda f, n, h: np.tanh(2.0 * voice(ctx, b_amps, f, n)) * env_decay(n, sr, 0.4, h / sr), 0.03
        )
    else:
        sig = render_notes(ctx, bass, upright(ctx, rng.uniform(0.8, 1.5), rng.uniform(0.3, 0.6)), 0.03)
    return Stem(norm(sig, random_gain(-6, -2, rng)), 0.0, 0.1, "bass")



def _keys(ctx: Ctx, chords: list[tuple[float, int]], per_chord: float, root: int,
          scale: tuple[int, ...]) -> Stem | None:
    """Held chords on an organ or a pad, or None (most files)."""
    rng, sr = ctx.rng, ctx.sr
    # Held chords on an organ or a synth pad, some files.
    keys = str(rng.choice(["organ", "pad", "none"], p=[0.15, 0.1, 0.75]))
    if keys != "none":
        held = [(t, per_chord * 0.98, m, 0.5) for t, d in chords
                for m in into_range(chord_midi(root, scale, d), 55, 72)]
        inst = organ(ctx) if keys == "organ" else pad(ctx, saw(20), 0.3, 0.5, 0.08)
        sig = filt(render_notes(ctx, held, inst, 0.3), "lowpass", rng.uniform(1500.0, 4000.0), sr)
        return Stem(norm(sig, random_gain(-12, -5, rng)), rng.uniform(-0.3, 0.3), 0.5, "chords")
    return None



def _lead(ctx: Ctx, mode: str, root: int, beat: float, bar: float) -> Stem | None:
    """A pentatonic lead guitar stem, or None (most files)."""
    rng, sr = ctx.rng, ctx.sr
    # Lead guitar: pentatonic phrases with vibrato, some files.
    if rng.random() < 0.4:
        penta = (0, 3, 5, 7, 10) if mode in ("minor", "dorian") else (0, 2, 4, 7, 9)
        lead: list[Note] = []
        t = 2 * bar
        while t < ctx.seconds:
            for _ in range(int(rng.integers(3, 8))):
                dur = beat * float(rng.choice([0.5, 1.0, 1.5]))
                m = root + 24 + penta[int(rng.integers(0, 5))] + 12 * int(rng.random() < 0.3)
                lead.append((t, dur, m, 0.9))
                t += dur
            t += bar * rng.uniform(0.5, 2.0)
        vib = (rng.uniform(5.0, 7.0), 0.006)
        sig = render_notes(
            ctx, lead, lambda f, n, h: voice(ctx, saw(30), f, n, vib=vib) * env_asr(n, sr, 0.01, h / sr, 0.1), 0.1
        )
        sig = filt(overdrive(sig, rng.uniform(3.0, 10.0)), "lowpass", 5000.0, sr)
        return Stem(norm(sig, random_gain(-6, -2, rng)), rng.uniform(-0.3, 0.3), 0.6, "lead")
    return None
