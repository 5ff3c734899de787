"""Techno: four-on-the-floor kick, off-beat open hat, clap or backbeat snare, acid, sub or distorted bass,
chord stabs or a pad, synth arpeggio; breakdowns without drums."""

from __future__ import annotations

import numpy as np

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Ctx, env_decay, filt, norm, overdrive, random_gain, voice
from ..form import song_form
from ..instruments import DARK, power_chord, saw, square
from ..parts import pad, pad_amps
from ..score import Note, chord_midi, into_range, key, render_notes, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One techno file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng = ctx.rng
    beat, bar = tempo(rng, 116.0, 142.0)
    _, scale, root = key(rng, ["minor", "phrygian", "dorian"], 36)
    n_bars = int(ctx.seconds / bar) + 1
    stems: list[Stem] = [_drums(ctx, bar), _bass(ctx, n_bars, beat, bar, root)]
    # Minor chord stabs (short, reverb-drenched) or a slow filtered pad; some tracks have neither.
    chord = into_range(chord_midi(root + 12, scale, 0, int(rng.choice([3, 4]))), 55, 72)
    for extra in (_harmony(ctx, chord, scale, root, beat, bar), _arpeggio(ctx, chord, n_bars, beat, bar)):
        if extra is not None:
            stems.append(extra)
    weights = {"full": 0.42, "nolead": 0.25, "groove": 0.15, "beat": 0.08, "breakdown": 0.1}
    form = song_form(ctx, bar, weights, lengths=(4, 8, 16))
    return Arrangement(stems, rng.uniform(0.8, 2.5), rng.uniform(0.12, 0.35), (30.0, 60.0), form)


def _drums(ctx: Ctx, bar: float) -> Stem:
    """The drum kit's stem: four on the floor, hats, clap or snare (bars of ``bar`` seconds)."""
    rng = ctx.rng
    # Four-on-the-floor kick, off-beat open hat, sixteenth closed hats, clap or snare on 2 and 4.
    k_t, k_v = drums.events(ctx, "X...X...X...X...", bar, jitter=0.001, vel_jitter=0.02)
    kick = drums.kick(
        ctx, f_hi=rng.uniform(110, 200), f_lo=rng.uniform(42, 58), decay=rng.uniform(0.12, 0.3), click=0.4
    )
    kit = drums.track(ctx, kick, k_t, k_v)
    oh_t, oh_v = drums.events(ctx, "..x...x...x...x.", bar, jitter=0.001)
    kit += drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.05, 0.2)), oh_t, oh_v) * random_gain(-12, -5, rng)
    if rng.random() < 0.8:
        ch_t, ch_v = drums.events(
            ctx, str(rng.choice(["xgogxgogxgogxgog", "x.g.x.g.x.g.x.g.", "gxggoxggoxggoxgg"])), bar, jitter=0.001
        )
        kit += drums.track(ctx, drums.hat(ctx, decay=0.025, cutoff=7000.0), ch_t, ch_v) * random_gain(-16, -8, rng)
    back = str(rng.choice(["clap", "snare", "none"], p=[0.65, 0.12, 0.23]))
    if back != "none":
        cl_t, cl_v = drums.events(ctx, "....x.......x...", bar, jitter=0.001)
        hit = drums.clap(ctx) if back == "clap" else drums.snare(ctx, tone=rng.uniform(170, 240), decay=0.15)
        kit += drums.track(ctx, hit, cl_t, cl_v) * random_gain(-10, -3, rng)
    return Stem(norm(kit, random_gain(-1, 0, rng)), 0.0, 0.15, "drums")


def _bass(ctx: Ctx, n_bars: int, beat: float, bar: float, root: int) -> Stem:
    """The bass stem: acid, sub or driven, over ``n_bars`` bars."""
    rng, sr = ctx.rng, ctx.sr
    # Bass: acid sixteenths (bright-to-dark saw), rolling off-beat sub, or distorted eighths.
    bass_kind = str(rng.choice(["acid", "sub", "drive"], p=[0.48, 0.4, 0.12]))
    if bass_kind == "acid":
        steps = rng.random(16) < rng.uniform(0.5, 0.85)
        offs = rng.choice([0, 0, 0, 12, 7, 3, -2], 16)
        accent = rng.random(16) < 0.3
        pat_notes: list[Note] = [
            (b * bar + s * beat / 4, beat / 4 * 0.8, root + int(offs[s]), 1.0 if accent[s] else 0.6)
            for b in range(n_bars)
            for s in range(16)
            if steps[s]
        ]
        tau = rng.uniform(0.03, 0.12)
        amps = saw(40) if rng.random() < 0.5 else square(40)
        sig = render_notes(
            ctx,
            pat_notes,
            lambda f, n, h: voice(ctx, amps, f, n, dark=DARK, bright_tau=tau) * env_decay(n, sr, 0.3, h / sr, 0.01),
            0.01,
        )
        sig = overdrive(sig, rng.uniform(1.5, 4.0))
    elif bass_kind == "sub":
        sub = [(b * bar + k * beat + beat / 2, beat * 0.4, root, 1.0) for b in range(n_bars) for k in range(4)]
        sig = render_notes(
            ctx, sub, lambda f, n, h: voice(ctx, [1.0, 0.3, 0.1], f, n) * env_decay(n, sr, 0.2, h / sr, 0.01), 0.01
        )
    else:
        riff = [(b * bar + k * beat / 2, beat / 2 * 0.85, root + 12, 1.0 if k % 2 else 0.7)
                for b in range(n_bars) for k in range(8)]
        amps = power_chord(30)
        sig = render_notes(
            ctx, riff, lambda f, n, h: voice(ctx, amps, f / 2, n) * env_decay(n, sr, 0.2, h / sr, 0.01), 0.01
        )
        sig = filt(overdrive(sig, rng.uniform(4.0, 15.0)), "lowpass", rng.uniform(2000.0, 5000.0), sr, order=4)
    return Stem(norm(sig, random_gain(-5, -1, rng)), 0.0, 0.15, "bass")


def _harmony(ctx: Ctx, chord: list[int], scale: tuple[int, ...], root: int, beat: float, bar: float) -> Stem | None:
    """Chord stabs or a pad on ``chord`` (MIDI notes), or None."""
    rng, sr = ctx.rng, ctx.sr
    harmony = str(rng.choice(["stabs", "pad", "none"], p=[0.5, 0.35, 0.15]))
    if harmony == "stabs":
        pos = sorted(rng.choice(16, size=int(rng.integers(1, 4)), replace=False))
        pat = "".join("x" if s in pos else "." for s in range(16))
        st_t, _ = drums.events(ctx, pat, 2 * bar, jitter=0.0, vel_jitter=0.0)
        stab_notes = [(float(t), beat / 4, m, 0.8) for t in st_t for m in chord]
        sig = render_notes(
            ctx, stab_notes, lambda f, n, h: voice(ctx, saw(30), f, n) * env_decay(n, sr, 0.12, h / sr, 0.05), 0.05
        )
        sig = filt(sig, "lowpass", rng.uniform(1500.0, 4000.0), sr)
        return Stem(norm(sig, random_gain(-9, -3, rng)), rng.uniform(-0.4, 0.4), 1.0, "chords")
    elif harmony == "pad":
        second = into_range(chord_midi(root + 12, scale, int(rng.choice([3, 5, 6])), 3), 55, 72)
        pad_notes = [
            (t, 4 * bar, m, 0.5)
            for i, t in enumerate(np.arange(0.0, ctx.seconds, 4 * bar))
            for m in (chord if i % 2 == 0 else second)
        ]
        sig = render_notes(ctx, pad_notes, pad(ctx, pad_amps(rng), 1.5, 1.0, rng.uniform(0.04, 0.12)), 1.0)
        sig = filt(sig, "lowpass", rng.uniform(600.0, 2500.0), sr)
        return Stem(norm(sig, random_gain(-12, -5, rng)), 0.0, 1.0, "chords")
    return None


def _arpeggio(ctx: Ctx, chord: list[int], n_bars: int, beat: float, bar: float) -> Stem | None:
    """A sixteenth-note arpeggio over ``chord`` (MIDI notes), or None (most files)."""
    rng, sr = ctx.rng, ctx.sr
    # Synth arpeggio in sixteenths over the chord, some files.
    if rng.random() < 0.3:
        seq = chord + [m + 12 for m in chord]
        arp = [
            (b * bar + s * beat / 4, beat / 4 * 0.6, seq[s % len(seq)] + 12, 0.7)
            for b in range(n_bars)
            for s in range(16)
        ]
        amps = square(20)
        sig = render_notes(
            ctx, arp, lambda f, n, h: voice(ctx, amps, f, n) * env_decay(n, sr, 0.08, h / sr, 0.02), 0.02
        )
        sig = filt(sig, "lowpass", rng.uniform(1500.0, 5000.0), sr)
        return Stem(norm(sig, random_gain(-12, -5, rng)), rng.uniform(-0.5, 0.5), 0.8, "lead")
    return None
