"""The registry of feature kinds: what the store, the figures and the upload page know of each kind.

A feature kind (``mel``, ``cqt``) is one :class:`FeatureKind` entry: its
:class:`~specstore.store.FeatureSpec` defaults, its display (fixed dB colour limits
and the frequency axis a spectrogram is labelled with) and the few facts
other layers ask about it.  How a kind is *computed* lives with the audio
code (:mod:`specstore.pipeline.kinds` registers a streaming computation under the same
name), because ``specstore.store`` knows nothing of audio.  Adding a kind is one
:func:`register_kind` here plus one ``specstore.pipeline.kinds.register_computation``;
nothing else switches on a kind's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from specstore.common.errors import ConfigError

if TYPE_CHECKING:
    from .spec import FeatureSpec

__all__ = [
    "CQT",
    "DEFAULT_KINDS",
    "MEL",
    "MUSICNN",
    "FeatureKind",
    "db_limits",
    "feature_kind",
    "kind_names",
    "picture_feature",
    "register_kind",
    "unregister_kind",
]


@dataclass(frozen=True)
class FeatureKind:
    """One kind of feature: everything except its computation.

    ``defaults``: :class:`~specstore.store.FeatureSpec` fields that differ from the
    spec's own field defaults (which are the log-mel's).  ``db_limits``:
    colour limits in dB against the spec's fixed reference, the same for
    every clip so colours compare across clips (figures, the upload page;
    how the built-in ones were chosen: ``docs/features.md``).
    ``axis``: the ``librosa.display.specshow`` frequency-axis arguments for a
    spec of this kind (plain names and numbers; nothing is imported here).
    ``preferred_picture``: the upload page shows a feature of this kind
    when a checkpoint has one.  ``log_frequency``: bins are spaced evenly in
    log frequency, ``bins_per_octave`` (default 12) per octave, so a pitch
    shift is a roll along the bins.  ``fixed_grid``: the kind's sample rate
    and hop are part of what it is (a pretrained model's input), so features
    extracted beside it follow its frame grid unless one is given.
    ``flags``: the ``specstore-features`` options that set a field of this
    kind's spec (``{"n_bins": "--n-mels"}``); any other field is set in a
    ``--spec`` file (:mod:`specstore.store.spec_command` writes either).
    """

    name: str
    db_limits: tuple[float, float]
    axis: Callable[[FeatureSpec], dict[str, Any]]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    preferred_picture: bool = False
    log_frequency: bool = False
    fixed_grid: bool = False
    flags: Mapping[str, str] = field(default_factory=dict)


_REGISTRY: dict[str, FeatureKind] = {}
"""name -> entry, in registration order (the one explicit registry of kinds)."""


def register_kind(kind: FeatureKind) -> FeatureKind:
    """Add ``kind`` to the registry (a name already taken is an error); returns it."""
    if kind.name in _REGISTRY:
        raise ConfigError(f"feature kind {kind.name!r} is already registered")
    lo, hi = kind.db_limits
    if not lo < hi:
        raise ConfigError(f"feature kind {kind.name!r}: db_limits must rise, not {kind.db_limits!r}")
    _REGISTRY[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Remove a kind registered from user or test code (a no-op for a name not registered)."""
    _REGISTRY.pop(name, None)


def feature_kind(name: str) -> FeatureKind:
    """The entry of kind ``name``; :class:`ConfigError` naming the known kinds otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ConfigError(f"unknown feature kind {name!r}; expected one of {kind_names()}") from None


def kind_names() -> tuple[str, ...]:
    """The registered kinds' names, in registration order."""
    return tuple(_REGISTRY)


def picture_feature(specs: Mapping[str, FeatureSpec]) -> str:
    """The feature a clip's picture shows: the first of a ``preferred_picture`` kind, else the first."""
    return next((k for k, s in specs.items() if feature_kind(s.kind).preferred_picture), next(iter(specs)))


class _DbLimits(Mapping[str, tuple[float, float]]):
    """A read-only view: kind name -> its ``db_limits``, always as the registry is now."""

    def __getitem__(self, name: str) -> tuple[float, float]:
        if name not in _REGISTRY:
            raise KeyError(name)
        return _REGISTRY[name].db_limits

    def __iter__(self) -> Iterator[str]:
        return iter(kind_names())

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __repr__(self) -> str:
        return repr(dict(self))


db_limits: Mapping[str, tuple[float, float]] = _DbLimits()
"""Display colour limits (dB) per kind name, read from the registry."""


def _mel_axis(spec: FeatureSpec) -> dict[str, Any]:
    """Mel bins between ``fmin`` and ``fmax`` (Hz; None = sr / 2, as the mel filters were built)."""
    return {"y_axis": "mel", "fmin": spec.fmin,
            "fmax": spec.fmax if spec.fmax is not None else spec.sample_rate / 2}


def _cqt_axis(spec: FeatureSpec) -> dict[str, Any]:
    """CQT bins as note names from ``fmin`` (Hz) with ``bins_per_octave``."""
    return {"y_axis": "cqt_note", "fmin": spec.fmin, "bins_per_octave": spec.bins_per_octave or 12}


MEL = register_kind(FeatureKind(
    name="mel",
    db_limits=(-60.0, 40.0),
    axis=_mel_axis,
    # Log-mel: 22 050 Hz, n_fft 2048, hop 512, 128 mels, 0-8000 Hz, power dB (FeatureSpec's own defaults).
    defaults=MappingProxyType({}),
    preferred_picture=True,
    flags=MappingProxyType({"n_bins": "--n-mels", "n_fft": "--n-fft", "fmax": "--fmax"}),
))

CQT = register_kind(FeatureKind(
    name="cqt",
    db_limits=(-80.0, 20.0),
    axis=_cqt_axis,
    # CQT: 22 050 Hz, hop 512, 84 bins (7 octaves from C1 = 32.7 Hz), magnitude dB.
    defaults=MappingProxyType(dict(n_bins=84, n_fft=None, fmin=32.70319566257483, fmax=None,
                                   bins_per_octave=12, power=1.0, amin=1e-5)),
    log_frequency=True,
    flags=MappingProxyType({"n_bins": "--cqt-bins"}),
))

MUSICNN = register_kind(FeatureKind(
    name="musicnn",
    # Not dB: log10(1 + 10000 * mel power), about 0-5 on music; the limits are in those units.
    db_limits=(0.0, 5.0),
    axis=_mel_axis,
    # musicnn's input (infer.models.musicnn): 16 kHz, n_fft 512, hop 256, 96 mels 0-8000 Hz, mel power
    # compressed as log10(1 + 10000 * power), stored in float32 (float16 moves it by ~1e-3 relative).
    defaults=MappingProxyType(dict(sample_rate=16000, hop_length=256, n_fft=512, n_bins=96, fmin=0.0, fmax=None,
                                   power=2.0, dtype="float32")),
    fixed_grid=True,
))

DEFAULT_KINDS: tuple[str, ...] = (MEL.name, CQT.name)
"""The features extracted when none are named (``make features``, :func:`specstore.store.default_specs`)."""
