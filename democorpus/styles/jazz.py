"""Jazz: swing ride (sticks) or brushes on a triplet grid, or a straight bossa feel, or no drums at all;
walking upright bass; piano, organ or guitar comping; horn lines.  Ballads to up-tempo."""

from __future__ import annotations

from .. import drums
from ..arrangement import Arrangement, Stem
from ..dsp import Ctx, filt, norm, random_gain
from ..form import song_form
from ..parts import comping, e_piano, horn, horn_amps, horn_line, organ, piano, upright, walking_bass
from ..score import Note, chord_midi, chord_times, into_range, key, render_notes, scale_midi, tempo

__all__ = ["arrange"]


def arrange(ctx: Ctx) -> Arrangement:
    """One jazz file's stems and room, all drawn from ``ctx.rng`` (``ctx.n`` samples at ``ctx.sr`` Hz)."""
    rng, sr = ctx.rng, ctx.sr
    feel = str(rng.choice(["swing", "ballad", "bossa"], p=[0.6, 0.25, 0.15]))
    lo, hi = {"swing": (110.0, 240.0), "ballad": (60.0, 100.0), "bossa": (100.0, 150.0)}[feel]
    beat, bar = tempo(rng, lo, hi)
    _, scale, root = key(rng, ["major", "major", "dorian", "minor"], 46)
    progs = [[1, 4, 0, 5], [1, 4, 0, 0], [0, 5, 1, 4], [2, 5, 1, 4], [0, 3, 1, 4]]
    prog = progs[int(rng.integers(0, len(progs)))]
    per_chord = bar if beat < 0.4 else bar / 2
    chords = chord_times(ctx, prog, per_chord)
    swing = 0.0 if feel == "bossa" else 1.0 / 3.0
    stems: list[Stem] = []

    kit = _drums(ctx, feel, bar)
    if kit is not None:
        stems.append(kit)

    # Bass: walking quarter notes, or roots and fifths (two-feel, bossa).
    if feel == "bossa" or rng.random() < 0.2:
        bass: list[Note] = []
        for t, d in chords:
            m = into_range([scale_midi(root, scale, d)], 36, 50)[0]
            bass.append((t, beat * 1.4, m, 0.9))
            bass.append((t + 2 * beat, beat * 1.4, m + 7 if m + 7 <= 52 else m - 5, 0.8))
    else:
        bass = walking_bass(ctx, chords, prog, beat, per_chord, root, scale)
    sig = render_notes(ctx, bass, upright(ctx, rng.uniform(0.8, 1.6), rng.uniform(0.15, 0.35)), 0.05)
    stems.append(Stem(norm(filt(sig, "lowpass", 1500.0, sr), random_gain(-4, 0, rng)), rng.uniform(-0.2, 0.2), 0.3,
                      "bass"))

    stems.append(_comping(ctx, feel, chords, beat, per_chord, root, scale))

    # Horn (sax / trumpet) lines in swung or straight eighths, half the files.
    if rng.random() < 0.55:
        line = horn_line(ctx, root, scale, beat, swing, 60, 80)
        sig = render_notes(ctx, line, horn(ctx, horn_amps(rng), (rng.uniform(4.5, 6.0), 0.004)), 0.06)
        stems.append(Stem(norm(sig, random_gain(-6, -1, rng)), rng.uniform(0.0, 0.4), 0.7, "lead"))

    weights = {"full": 0.5, "nolead": 0.2, "solo": 0.15, "nodrums": 0.08, "intro": 0.07}
    form = song_form(ctx, per_chord * len(prog), weights, lengths=(1, 2))
    return Arrangement(stems, rng.uniform(0.8, 2.2), rng.uniform(0.15, 0.35), (28.0, 50.0), form)


def _drums(ctx: Ctx, feel: str, bar: float) -> Stem | None:
    """The kit's stem for the ``feel`` (swing, ballad or bossa), or None (some files)."""
    rng = ctx.rng
    # Drums (most files).  Swing and ballad: patterns on a 12-step (triplet) grid, which is what swing
    # is: ride "ding, ding-da" (sticks) or a long snare swish (brushes), hat foot on 2 and 4, ghost-note
    # snare comping, feathered kick.  Bossa: rim clave, straight eighth hats, kick on 1 and the and of 2.
    if rng.random() < 0.88:
        if feel == "bossa":
            r_t, r_v = drums.events(ctx, "x..x..x...x..x..", 2 * bar, jitter=0.004)
            h_t, h_v = drums.events(ctx, "x.o.x.o.x.o.x.o.", bar, jitter=0.004, vel_jitter=0.2)
            k_t, k_v = drums.events(ctx, "o.....o.o.....o.", bar, jitter=0.004)
            kit = (
                drums.track(ctx, drums.rim(ctx), r_t, r_v) * random_gain(-8, -2, rng)
                + drums.track(ctx, drums.hat(ctx, decay=rng.uniform(0.02, 0.05)), h_t, h_v) * random_gain(-12, -6, rng)
                + drums.track(ctx, drums.kick(ctx, f_hi=110, f_lo=55, decay=0.15, click=0.1), k_t, k_v)
                * random_gain(-8, -3, rng)
            )
        else:
            brushes = feel == "ballad" and rng.random() < 0.7
            ride_t, ride_v = drums.events(ctx, "X..x.oX..x.o", bar, jitter=0.006)
            if brushes:
                hit = drums.snare(ctx, tone=200.0, decay=rng.uniform(0.15, 0.3), band=(1000.0, 6000.0))
            else:
                hit = drums.ride(ctx, decay=rng.uniform(0.6, 1.4))
            kit = drums.track(ctx, hit, ride_t, ride_v)
            hat_t, hat_v = drums.events(ctx, "...x.....x..", bar, jitter=0.004)
            kit += drums.track(ctx, drums.hat(ctx, decay=0.03), hat_t, hat_v) * random_gain(-12, -6, rng)
            comp = "".join(rng.choice(["g", "o", "."], p=[0.12, 0.05, 0.83]) for _ in range(12 * 8))
            sn_t, sn_v = drums.events(ctx, comp, 8 * bar, jitter=0.006)
            snare = drums.snare(ctx, tone=rng.uniform(170, 230), decay=rng.uniform(0.08, 0.15))
            kit += drums.track(ctx, snare, sn_t, sn_v) * random_gain(-12, -4, rng)
            if rng.random() < 0.6:
                k_t, k_v = drums.events(ctx, "g..g..g..g..", bar, vel_jitter=0.2)
                kick = drums.kick(ctx, f_hi=120, f_lo=55, decay=0.12, click=0.1)
                kit += drums.track(ctx, kick, k_t, k_v) * random_gain(-14, -8, rng)
        return Stem(norm(kit, random_gain(-8, -2, rng)), rng.uniform(-0.3, 0.3), 0.5, "drums")
    return None


def _comping(ctx: Ctx, feel: str, chords: list[tuple[float, int]], beat: float, per_chord: float, root: int,
             scale: tuple[int, ...]) -> Stem:
    """The comping stem: rootless 7th voicings on piano, electric piano, organ or guitar."""
    rng = ctx.rng
    # Comping: rootless 7th voicings on syncopated positions (piano, electric piano, organ or guitar).
    instrument = str(rng.choice(["piano", "ep", "organ", "guitar"], p=[0.6, 0.15, 0.15, 0.1]))
    tau = rng.uniform(0.5, 1.2)
    inst = {
        "piano": piano(ctx, tau),
        "ep": e_piano(ctx, tau),
        "organ": organ(ctx),
        "guitar": upright(ctx, rng.uniform(0.6, 1.2), rng.uniform(0.3, 0.6)),
    }[instrument]
    if feel == "bossa":
        positions = [0.0, 1.5, 2.5, 3.0]
    else:
        positions = [0.0, 1.0 + 2 / 3, 2.0, 3.0 + 2 / 3, 2.0 + 2 / 3, 1.0]
    comps = comping(ctx, chords, beat, per_chord, root, scale, positions, 0.75 if feel == "ballad" else 0.45)
    if feel == "ballad":  # ballads also hold a chord on every change
        comps += [(t, per_chord, m, 0.35) for t, d in chords for m in into_range(chord_midi(root, scale, d, 4), 55, 74)]
    sig = render_notes(ctx, comps, inst, 0.1)
    return Stem(norm(sig, random_gain(-6, -1, rng)), rng.uniform(-0.4, 0.0), 0.6, "chords")
