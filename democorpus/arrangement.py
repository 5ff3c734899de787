"""What a style recipe returns: stems (signal, pan, reverb send) and the room and noise around them."""

from __future__ import annotations

from dataclasses import dataclass

from .dsp import Audio

__all__ = ["Arrangement", "Stem"]


@dataclass
class Stem:
    """One instrument's mono signal, its stereo position (-1 left .. 1 right) and reverb send (linear)."""

    audio: Audio
    pan: float
    send: float


@dataclass
class Arrangement:
    """A style's stems, its room (reverb ``rt60`` s, ``wet`` level, linear) and the range (dB) of
    the signal-to-noise ratio of the noise floor added when mastering."""

    stems: list[Stem]
    rt60: float
    wet: float
    snr_db: tuple[float, float]
