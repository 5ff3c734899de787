"""What a style recipe returns: stems (signal, pan, reverb send, role), the song form, the room and noise."""

from __future__ import annotations

from dataclasses import dataclass, field

from .dsp import Audio

__all__ = ["ROLES", "Arrangement", "Section", "Stem"]


ROLES: tuple[str, ...] = ("drums", "bass", "chords", "lead", "texture")
"""What a stem does in the band; the song form mutes and unmutes stems by role."""


@dataclass
class Stem:
    """One instrument's mono signal, its stereo position (-1 left .. 1 right), reverb send (linear)
    and role (one of :data:`ROLES`)."""

    audio: Audio
    pan: float
    send: float
    role: str


@dataclass(frozen=True)
class Section:
    """A part of the song from ``start_s`` (s) on: the roles that play and the level (dB) they play at."""

    start_s: float
    roles: frozenset[str]
    gain_db: float


@dataclass
class Arrangement:
    """A style's stems, its room (reverb ``rt60`` s, ``wet`` level, linear), the range (dB) of the
    signal-to-noise ratio of the noise floor added when mastering, and its form: sections in time
    order (empty: every stem plays throughout at one level)."""

    stems: list[Stem]
    rt60: float
    wet: float
    snr_db: tuple[float, float]
    form: list[Section] = field(default_factory=list)
