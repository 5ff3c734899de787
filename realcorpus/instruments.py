"""Instrumentation of one clip: the General-MIDI ensembles, the class palettes drawn from, and the MIDI channels
(program, level, pan, reverb, chorus) of a score's parts, doublings and drones.

Palettes overlap on purpose (voices, organ, viols and recorders serve three vocal
styles; fiddle, whistle, accordion and guitar serve both folk classes), so that
timbre alone does not give the label away.  Every choice is drawn from the
clip's generator, in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .score import Note

__all__ = ["ENSEMBLES", "PALETTES", "Channel", "instrument"]


# General MIDI programs (0-based) per register: (top voice, inner voices, bass).  A pool with
# one list ("all") gives every part the same program, as one instrument plays them all.
ENSEMBLES: dict[str, dict[str, list[int]]] = {
    "choir": {"top": [52, 53], "mid": [52, 53], "bot": [52, 53]},
    "choir_continuo": {"top": [52, 53], "mid": [52, 53], "bot": [52], "double": [19, 42, 32, 70]},
    "organ": {"all": [19, 20, 16]},
    "viols": {"top": [40, 41], "mid": [41, 42], "bot": [42, 43]},
    "strings": {"all": [48, 49]},
    "recorders": {"top": [74, 73, 75], "mid": [74, 71], "bot": [70, 74]},
    "shawms": {"top": [68, 56], "mid": [69, 57], "bot": [57, 58]},
    "keyboard": {"all": [0, 6, 1]},
    "plucked": {"top": [24, 46], "mid": [24, 46], "bot": [24, 32]},
    "quartet": {"top": [40], "mid": [40, 41], "bot": [42]},
    "winds": {"top": [73, 68], "mid": [71, 68, 69], "bot": [70]},
    # one melody line
    "fiddle": {"all": [40, 110]},
    "whistle": {"all": [78, 73, 74, 75, 79]},
    "squeezebox": {"all": [21, 23, 22]},
    "plucked_melody": {"all": [105, 24, 25, 46]},
    "pipes": {"all": [109]},
    "piano_melody": {"all": [0, 1, 6]},
    "voice": {"all": [53, 52, 54]},
    "reed": {"all": [71, 68]},
}

PALETTES: dict[str, dict[str, float]] = {
    "medieval": {"choir": 3, "viols": 2, "recorders": 2, "plucked": 2, "organ": 1, "shawms": 1, "strings": 1},
    "renaissance": {"choir": 4, "viols": 2, "shawms": 1.5, "recorders": 1, "organ": 1, "strings": 1, "plucked": 0.5,
                    "keyboard": 0.5},
    "baroque": {"choir": 2.5, "choir_continuo": 2, "organ": 2, "strings": 2, "keyboard": 1.5, "winds": 1, "viols": 0.5,
                "shawms": 0.5},
    "classical": {"quartet": 5, "strings": 2, "keyboard": 1.5, "winds": 1},
    "folksong": {"voice": 3, "whistle": 2, "squeezebox": 1.5, "plucked_melody": 1.5, "fiddle": 1, "piano_melody": 1,
                 "reed": 1},
    "fiddle": {"fiddle": 4, "whistle": 2, "squeezebox": 1.5, "plucked_melody": 1, "pipes": 0.5, "piano_melody": 0.5,
               "reed": 0.3},
}
"""Ensemble weights per class: overlapping on purpose, so that timbre alone does not give the label away."""


@dataclass(frozen=True)
class Channel:
    """One MIDI channel of a clip: a General-MIDI program (0-based), its notes, and volume, pan, reverb send and
    chorus send (MIDI controller values, 0-127)."""

    program: int
    notes: tuple[Note, ...]
    volume: int
    pan: int
    reverb: int
    chorus: int


def _pick(rng: np.random.Generator, weights: dict[str, float]) -> str:
    names = sorted(weights)
    w = np.array([weights[n] for n in names], dtype=float)
    return names[int(rng.choice(len(names), p=w / w.sum()))]


def _programs(ensemble: str, n_parts: int, rng: np.random.Generator) -> list[int]:
    pools = ENSEMBLES[ensemble]
    if "all" in pools:
        return [int(rng.choice(pools["all"]))] * n_parts
    out = []
    for i in range(n_parts):
        reg = "top" if i == 0 else ("bot" if i == n_parts - 1 and n_parts > 1 else "mid")
        out.append(int(rng.choice(pools[reg])))
    return out


def instrument(score_parts: tuple[tuple[Note, ...], ...], label: str,
               rng: np.random.Generator) -> tuple[str, list[Channel]]:
    """The ensemble drawn for this clip and one MIDI channel per part (plus doublings, drones)."""
    ensemble = _pick(rng, PALETTES[label])
    parts = list(score_parts)
    progs = _programs(ensemble, len(parts), rng)
    width = float(rng.uniform(0.2, 1.0))
    positions = rng.permutation(len(parts))
    channels = []
    for i, (notes, prog) in enumerate(zip(parts, progs, strict=False)):
        pos = (positions[i] / max(1, len(parts) - 1) - 0.5) * 2 if len(parts) > 1 else 0.0
        pan = int(np.clip(64 + 60 * width * pos + rng.normal(0, 4), 0, 127))
        channels.append(
            Channel(prog, notes, int(rng.integers(88, 122)), pan, int(rng.integers(20, 110)), int(rng.integers(0, 50)))
        )
    bass = parts[-1]
    if "double" in ENSEMBLES[ensemble] and len(parts) > 1:  # basso continuo
        channels.append(
            Channel(
                int(rng.choice(ENSEMBLES[ensemble]["double"])),
                bass,
                int(rng.integers(70, 100)),
                int(rng.integers(44, 84)),
                int(rng.integers(20, 90)),
                0,
            )
        )
    if len(parts) == 1 and label in ("folksong", "fiddle"):
        if rng.random() < 0.35:  # a second instrument doubles the tune (an octave down for some)
            other = _pick(rng, {k: v for k, v in PALETTES[label].items() if k != ensemble})
            shift = -12 if rng.random() < 0.3 else 0
            dbl = tuple(Note(n.onset, n.duration, n.pitch + shift, max(20, n.velocity - 10)) for n in parts[0])
            channels.append(
                Channel(
                    _programs(other, 1, rng)[0],
                    dbl,
                    int(rng.integers(70, 105)),
                    int(rng.integers(24, 104)),
                    int(rng.integers(20, 90)),
                    int(rng.integers(0, 40)),
                )
            )
        if rng.random() < 0.2:  # a drone on the final's pitch class (pipes, harmonium, hurdy-gurdy)
            final = parts[0][-1].pitch % 12
            drone_p = 36 + final + (12 if final < 7 else 0)
            end = max(n.onset + n.duration for n in parts[0])
            drone = (Note(0.0, end, drone_p, 60), Note(0.0, end, drone_p + 7, 54))
            channels.append(
                Channel(
                    int(rng.choice([109, 20, 21, 48])),
                    drone,
                    int(rng.integers(50, 80)),
                    64,
                    int(rng.integers(30, 90)),
                    0,
                )
            )
    return ensemble, channels
