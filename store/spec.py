"""Feature specifications: what a stored feature is, written into the store.

A :class:`FeatureSpec` is plain metadata (numbers and names).  The store keeps
it in its group attributes so that a reader, a notebook or a checkpoint can
tell exactly how the values were computed; ``specstore.store`` itself never computes
audio features.  The pipeline turns a spec into numbers, the inference side
compares a checkpoint's spec with a store's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from specstore.common.errors import ConfigError
from specstore.common.limits import bounded, check_fields
from specstore.common.records import from_record

from .kinds import DEFAULT_KINDS, FeatureKind, feature_kind, kind_names

__all__ = ["COMPUTE_VERSION", "MAX_BINS", "MAX_FRAME_RATE", "MAX_SAMPLE_RATE", "FeatureSpec", "default_specs",
           "spec_differences"]

#: Version of the computation that turns a spec into values (``specstore.pipeline``'s mel and CQT code), recorded in
#: every spec a store or checkpoint holds.  1: the computation before issue 34 (a spec recorded without the
#: field is version 1); 2: the cheaper one of issue 34.  Bump it when a change to the computation could
#: move a stored value, and say below whether the new values still equal the old within the 0.05 dB
#: equality promise (docs/features.md).
COMPUTE_VERSION = 2

#: Groups of compute versions whose values are equal within the equality promise (tested in
#: tests/test_features.py): a store written by one can be resumed, grown or read by a checkpoint of another.
_SAME_VALUES: tuple[frozenset[int], ...] = (frozenset({1, 2}),)

MAX_SAMPLE_RATE = 192_000
"""Highest sample rate (Hz) a spec may ask for: the highest a file the server decodes may declare by default
(``specstore.serving.config.DEFAULT_MAX_SAMPLE_RATE``, the same figure); studio recordings top out at 192 kHz."""
MAX_BINS = 1024
"""Most rows (bins) one feature's frame may have: mel and CQT use 16-256; 1024 float32 rows are 4 KiB a frame."""
MAX_FRAME_RATE = 1000
"""Most frames per second (``sample_rate / hop_length``) a spec may ask for: the defaults give 43, musicnn 62.5;
at 1000 a 10-minute file is 600 000 frames, every decode's and every model input's length scales with it."""


@dataclass(frozen=True)
class FeatureSpec:
    """How one feature (a 2-D time/frequency array per clip) is computed.

    Units: ``sample_rate`` in Hz, ``n_fft`` and ``hop_length`` in samples,
    ``fmin``/``fmax`` in Hz, ``db_ref`` and ``amin`` in the feature's linear
    unit (power for mel, magnitude for CQT).  Values are stored in decibels
    against the fixed ``db_ref`` (no per-clip maximum, no ``top_db``
    clipping), so a file streamed in blocks gives the whole-file values.
    ``compute_version`` names the computation that made the values
    (:data:`COMPUTE_VERSION`); specs that differ only in compatible versions
    are the same feature (:func:`spec_differences`).

    Every number is bounded (its :class:`~specstore.common.limits.Limit` beside the
    field, with the reason), ``fmin``/``fmax`` lie below half the sample
    rate and a spec gives at most :data:`MAX_FRAME_RATE` frames per second:
    a spec is checked when it is made, so one read from a store, a
    checkpoint or a command line cannot make a decode or a model's input
    larger than that (one line naming the field, the value and the bound).
    """

    kind: str
    sample_rate: int = bounded(22050, 1000, MAX_SAMPLE_RATE, "Hz; at most the highest rate the server decodes "
                                                              "by default (--max-sample-rate)")
    hop_length: int = bounded(512, 1, 2**16, "samples between frames; 65 536 is 3 s at 22 050 Hz")
    n_bins: int = bounded(128, 1, MAX_BINS, "rows of every frame; mel and CQT use 16-256, and a model's input "
                                            "stacks every feature's")
    n_fft: int | None = bounded(2048, 2, 2**16, "samples per FFT window; 65 536 is 3 s at 22 050 Hz, and "
                                                "every decode holds a few windows of it", optional=True)
    fmin: float = bounded(0.0, 0.0, MAX_SAMPLE_RATE / 2, "Hz, at most half the sample rate (checked with it)")
    fmax: float | None = bounded(8000.0, 0.0, MAX_SAMPLE_RATE / 2, "Hz, above fmin and at most half the sample "
                                                                   "rate (checked with them); unset: half the "
                                                                   "sample rate", optional=True)
    bins_per_octave: int | None = bounded(None, 1, 120, "log-frequency bins per octave; 12 are semitones, "
                                                        "120 are 10-cent steps", kind=int, optional=True)
    power: float = bounded(2.0, 0.0, 4.0, "exponent of the magnitude: 1 (magnitude) or 2 (power)",
                           low_open=True)
    db_ref: float = bounded(1.0, 1e-20, 1e20, "the linear value of 0 dB; beyond 1e+-20 every stored value "
                                              "moves by more than 200 dB")
    amin: float = bounded(1e-10, 1e-30, 1.0, "floor of the linear value before the log (1e-10 is -100 dB); "
                                             "float32 holds down to 1e-38")
    dtype: str = "float16"
    compute_version: int = bounded(COMPUTE_VERSION, 1, 10**6, "a version number of the computation")

    def __post_init__(self) -> None:
        feature_kind(self.kind)  # ConfigError naming the registered kinds (store.kinds)
        check_fields(self, ConfigError)
        if self.dtype not in ("float16", "float32"):
            raise ConfigError(f"dtype must be float16 or float32, not {self.dtype!r}")
        nyquist = self.sample_rate / 2
        if self.fmin >= nyquist:
            raise ConfigError(f"fmin ({self.fmin:g} Hz) must be below half the sample rate ({nyquist:g} Hz)")
        if self.fmax is not None and not self.fmin < self.fmax <= nyquist:
            raise ConfigError(f"fmax ({self.fmax:g} Hz) must be above fmin ({self.fmin:g} Hz) and at most half the "
                              f"sample rate ({nyquist:g} Hz; an unset fmax is that)")
        if self.sample_rate > MAX_FRAME_RATE * self.hop_length:
            raise ConfigError(f"a hop of {self.hop_length} samples at {self.sample_rate} Hz is "
                              f"{self.sample_rate / self.hop_length:g} frames/s, above the bound of {MAX_FRAME_RATE} "
                              "(a 10-minute file would hold over 600 000 frames); raise hop_length")

    @property
    def kind_info(self) -> FeatureKind:
        """This spec's kind's registry entry (:mod:`specstore.store.kinds`): display limits, axis, facts."""
        return feature_kind(self.kind)

    @property
    def frame_seconds(self) -> float:
        """Seconds of audio per frame (the hop)."""
        return self.hop_length / self.sample_rate

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what the store and checkpoints hold)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FeatureSpec:
        """Inverse of :meth:`to_dict`; unknown keys are an error, not ignored.

        A record without ``compute_version`` (stores and checkpoints written
        before it existed) was computed by version 1.
        """
        return from_record(cls, {"compute_version": 1, **d}, "feature spec")

    @classmethod
    def mel(cls, **overrides: Any) -> FeatureSpec:
        """Log-mel defaults: 22 050 Hz, n_fft 2048, hop 512, 128 mels, 0-8000 Hz, power dB."""
        return cls.of_kind("mel", **overrides)

    @classmethod
    def cqt(cls, **overrides: Any) -> FeatureSpec:
        """CQT defaults: 22 050 Hz, hop 512, 84 bins (7 octaves from C1), magnitude dB."""
        return cls.of_kind("cqt", **overrides)

    @classmethod
    def of_kind(cls, kind: str, **overrides: Any) -> FeatureSpec:
        """The registered defaults of ``kind`` (:mod:`specstore.store.kinds`), then ``overrides``."""
        return cls(**{"kind": kind, **feature_kind(kind).defaults, **overrides})


def default_specs(names: tuple[str, ...] | list[str] = DEFAULT_KINDS) -> dict[str, FeatureSpec]:
    """The default spec for each named feature: a feature is named by its kind (``mel``, ``cqt``)."""
    out: dict[str, FeatureSpec] = {}
    for n in names:
        try:
            entry = feature_kind(n)
        except ConfigError:
            raise ConfigError(f"unknown feature {n!r}; choose from {sorted(kind_names())}") from None
        out[n] = FeatureSpec.of_kind(entry.name)
    return out


def same_values(a: int, b: int) -> bool:
    """Whether compute versions ``a`` and ``b`` give equal values within the equality promise."""
    return a == b or any(a in g and b in g for g in _SAME_VALUES)


def spec_differences(a: FeatureSpec, b: FeatureSpec) -> list[str]:
    """Human-readable ``field: a != b`` lines for every field that differs.

    Compute versions that give the same values (within 0.05 dB) are no
    difference; others are one line naming both versions.
    """
    da, db = a.to_dict(), b.to_dict()
    out = [f"{k}: {da[k]!r} != {db[k]!r}" for k in da if da[k] != db[k] and k != "compute_version"]
    if not same_values(a.compute_version, b.compute_version):
        out.append(f"compute_version: {a.compute_version} != {b.compute_version} (values computed differently "
                   f"beyond the 0.05 dB equality promise; this specstore computes version {COMPUTE_VERSION})")
    return out
