"""Song form: a file is an excerpt of a song whose sections (intro, breakdown, groove, solo, full band)
mute and unmute stems by role and change the level.

A style gives the weights of the section kinds it uses (:data:`SECTION_KINDS`);
:func:`song_form` draws the sections, :func:`stem_gains` turns them into one
gain curve per stem (linear ramps of 40 ms at the boundaries).  Times are in
seconds, levels in dB.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from .arrangement import ROLES, Section, Stem
from .dsp import Audio, Ctx

__all__ = ["SECTION_KINDS", "song_form", "stem_gains"]


SECTION_KINDS: dict[str, frozenset[str]] = {
    "full": frozenset(ROLES),
    "nolead": frozenset({"drums", "bass", "chords", "texture"}),
    "solo": frozenset({"drums", "bass", "lead", "texture"}),
    "groove": frozenset({"drums", "bass", "texture"}),
    "beat": frozenset({"drums", "texture"}),
    "breakdown": frozenset({"chords", "lead", "texture"}),
    "intro": frozenset({"chords", "texture"}),
    "nodrums": frozenset({"bass", "chords", "lead", "texture"}),
}
"""Section kind -> the roles that play in it."""


def song_form(
    ctx: Ctx,
    unit_s: float,
    weights: Mapping[str, float],
    *,
    lengths: Sequence[int] = (4, 8),
    dynamics_db: float = 3.0,
) -> list[Section]:
    """Sections of ``lengths`` units of ``unit_s`` seconds (a bar, say), kinds drawn from ``weights``
    (kind -> weight), each at a level drawn uniformly within +-``dynamics_db`` dB.

    The file starts anywhere inside its first section (it is an excerpt of a longer song).
    """
    rng = ctx.rng
    kinds = list(weights)
    p = np.array([weights[k] for k in kinds], dtype=np.float64)
    p /= p.sum()
    t = -float(rng.uniform(0.0, max(lengths) * unit_s))
    out: list[Section] = []
    while t < ctx.seconds:
        kind = kinds[int(rng.choice(len(kinds), p=p))]
        length = unit_s * int(rng.choice(list(lengths)))
        if t + length > 0.0:
            out.append(Section(max(t, 0.0), SECTION_KINDS[kind], float(rng.uniform(-dynamics_db, dynamics_db))))
        t += length
    return out


def stem_gains(form: Sequence[Section], stems: Sequence[Stem], n: int, sr: int,
               ramp_s: float = 0.04) -> list[Audio | None]:
    """One gain curve (``n`` samples at ``sr`` Hz) per stem; None where a stem plays throughout at 0 dB.

    A section in which none of the stems that sound would play lets every stem play (no file is
    silent for a whole section because an optional instrument was left out or has not come in yet).
    """
    if not form:
        return [None] * len(stems)
    present = {s.role for s in stems if np.any(s.audio)}
    bounds = [min(n, int(round(s.start_s * sr))) for s in form[1:]]
    counts = np.diff([0, *bounds, n])
    ramp = max(1, int(ramp_s * sr))
    curves: dict[str, Audio | None] = {}
    for role in {s.role for s in stems}:
        levels = np.array(
            [10.0 ** (s.gain_db / 20.0) if role in (s.roles if s.roles & present else present) else 0.0 for s in form]
        )
        if np.all(levels == 1.0):
            curves[role] = None
            continue
        step = np.repeat(levels, counts)
        if ramp > 1 and len(form) > 1:
            c = np.concatenate([np.zeros(1), np.cumsum(np.concatenate([np.full(ramp - 1, step[0]), step]))])
            step = (c[ramp:] - c[:-ramp]) / ramp
        curves[role] = step
    return [curves[s.role] for s in stems]
