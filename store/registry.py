"""The record of one stored feature (:class:`FeatureSpec`, which every kind's parameters extend) and the registry
of feature kinds (:class:`FeatureKind`) it is read through.

Import these from :mod:`specstore.store.kinds` (the kinds, the registry) or :mod:`specstore.store` (the spec):
those modules register the built-in kinds, and a spec is read by its kind's name.  This module holds what
the built-in kinds and a kind registered from user code both build on, so that they import it and it imports
none of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from specstore.common.errors import ConfigError
from specstore.common.limits import Limit, bounded
from specstore.common.options import described, flag_of, option_fields
from specstore.common.records import from_record

if TYPE_CHECKING:
    from .kinds import CqtSpec, MelSpec

__all__ = ["COMPUTE_VERSION", "DTYPES", "MAX_BINS", "MAX_FRAME_RATE", "MAX_SAMPLE_RATE", "BinFrequencies",
           "FeatureKind", "FeatureSpec", "db_limits", "feature_kind", "field_of", "kind_names", "picture_feature",
           "register_kind", "unregister_kind"]

#: Version of the computation that turns a spec into values (``specstore.pipeline``'s code of each kind), recorded
#: in every spec a store or checkpoint holds.  1: the first computation (a spec recorded without the field is
#: version 1); 2: the cheaper one with the same values.  Bump it when a change to the computation could move a
#: stored value, and say in :mod:`specstore.store.spec` whether the new values still equal the old within the
#: 0.05 dB equality promise (docs/features.md).
COMPUTE_VERSION = 2

MAX_SAMPLE_RATE = 192_000
"""Highest sample rate (Hz) a spec may ask for: the highest a file the server decodes may declare by default
(``specstore.serving.config.DEFAULT_MAX_SAMPLE_RATE``, the same figure); studio recordings top out at 192 kHz."""
MAX_BINS = 1024
"""Most rows (bins) one feature's frame may have: mel and CQT use 16-256; 1024 float32 rows are 4 KiB a frame."""
MAX_FRAME_RATE = 1000
"""Most frames per second (``sample_rate / hop_length``) a spec may ask for: the defaults give 43, musicnn 62.5;
at 1000 a 10-minute file is 600 000 frames, every decode's and every model input's length scales with it."""
DTYPES = ("float16", "float32")
"""How a feature's values may be stored."""


def field_of(cls: type, name: str, default: Any = dataclasses.MISSING, **meta: Any) -> Any:
    """Field ``name`` of dataclass ``cls`` restated for a subclass: its metadata (the bound with its reason, an
    option's help) kept, its ``default`` and metadata (``help``, ``flag``, ...: :mod:`specstore.common.options`)
    replaced where given.  How a kind's parameters give a field they inherit their own default and option."""
    source = next(f for f in dataclasses.fields(cls) if f.name == name)
    value = source.default if default is dataclasses.MISSING else default
    return dataclasses.field(default=value, metadata={**source.metadata, **meta})


@dataclass(frozen=True)
class FeatureSpec:
    """How one feature (a 2-D time/frequency array per clip) is computed: the record a store and a checkpoint keep.

    This class holds what every kind shares: ``kind`` (a registered name, :mod:`specstore.store.kinds`), the
    frame grid (``sample_rate`` in Hz, ``hop_length`` in samples), ``n_bins`` (rows of a frame), ``dtype`` (how
    the values are stored) and ``compute_version`` (:data:`COMPUTE_VERSION`; specs that differ only in
    compatible versions are the same feature, :func:`specstore.store.spec_differences`).  A kind's own
    parameters are the fields of its subclass, the kind's :attr:`FeatureKind.params`: ``FeatureSpec(kind=...,
    **fields)``, :meth:`of_kind` and :meth:`from_dict` make an instance of that subclass.  The record
    (:meth:`to_dict`) is ``kind``, the grid, ``n_bins``, the kind's own fields in their order, ``dtype`` and
    ``compute_version``.

    Every number is bounded (its :class:`~specstore.common.limits.Limit` beside the field, with the reason)
    and a spec gives at most :data:`MAX_FRAME_RATE` frames per second; a kind adds the checks across its
    own fields (:meth:`check`).  A spec is checked when it is made, so one read from a store, a checkpoint
    or a command line cannot make a decode or a model's input larger than that (one line naming the field,
    the value and the bound).
    """

    kind: str
    sample_rate: int = described(bounded(22050, 1000, MAX_SAMPLE_RATE, "Hz; at most the highest rate the server "
                                                                        "decodes by default (--max-sample-rate)"),
                                 "decode to this sample rate, Hz", flag="--sample-rate", metavar="HZ")
    hop_length: int = described(bounded(512, 1, 2**16, "samples between frames; 65 536 is 3 s at 22 050 Hz"),
                                "hop between frames, samples", flag="--hop", metavar="SAMPLES")
    n_bins: int = bounded(128, 1, MAX_BINS, "rows of every frame; mel and CQT use 16-256, and a model's input "
                                            "stacks every feature's")
    dtype: str = field(default="float16", metadata={"choices": DTYPES})
    compute_version: int = bounded(COMPUTE_VERSION, 1, 10**6, "a version number of the computation")

    GRID: ClassVar[tuple[str, ...]] = ("sample_rate", "hop_length")
    """The fields every feature of one extraction shares (one frame grid); their options set every feature."""
    _TAIL: ClassVar[tuple[str, ...]] = ("dtype", "compute_version")

    def __new__(cls, *args: Any, **kwargs: Any) -> FeatureSpec:
        if cls is FeatureSpec:  # FeatureSpec(kind=..., ...) is an instance of the kind's parameters class
            kind = kwargs["kind"] if "kind" in kwargs else args[0] if args else None
            if kind is not None:
                cls = feature_kind(kind).params
        return object.__new__(cls)

    def __post_init__(self) -> None:
        params = feature_kind(self.kind).params  # ConfigError naming the registered kinds
        if type(self) is not params:
            raise ConfigError(f"a {self.kind} spec is a {params.__name__}, not a {type(self).__name__}")
        fields = self.__dataclass_fields__
        for name in self.record_fields():
            limit: Limit | None = fields[name].metadata.get("limit")
            if limit is not None:
                limit.check(name, getattr(self, name))
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype must be {' or '.join(DTYPES)}, not {self.dtype!r}")
        self.check()
        if self.sample_rate > MAX_FRAME_RATE * self.hop_length:
            raise ConfigError(f"a hop of {self.hop_length} samples at {self.sample_rate} Hz is "
                              f"{self.sample_rate / self.hop_length:g} frames/s, above the bound of {MAX_FRAME_RATE} "
                              "(a 10-minute file would hold over 600 000 frames); raise hop_length")

    def check(self) -> None:
        """A kind's checks across its own fields (each field's bound is checked already); one-line
        :class:`ConfigError`.  None here."""

    @classmethod
    def record_fields(cls) -> tuple[str, ...]:
        """The record's field names in order: ``kind``, the grid, ``n_bins``, the kind's own, the tail."""
        names = [f.name for f in dataclasses.fields(cls)]
        return (*(n for n in names if n not in cls._TAIL), *cls._TAIL)

    @property
    def kind_info(self) -> FeatureKind[Any]:
        """This spec's kind (:mod:`specstore.store.kinds`): display limits, axis, recipe, facts."""
        return feature_kind(self.kind)

    @property
    def frame_seconds(self) -> float:
        """Seconds of audio per frame (the hop)."""
        return self.hop_length / self.sample_rate

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what the store and checkpoints hold), in :meth:`record_fields` order."""
        return {name: getattr(self, name) for name in self.record_fields()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureSpec:
        """Inverse of :meth:`to_dict`: the spec of the kind ``d`` names; unknown keys are an error, not ignored.

        A record without ``compute_version`` (stores and checkpoints written before it existed) was computed
        by version 1.
        """
        if "kind" not in d:
            raise ConfigError("bad feature spec: it names no kind")
        return from_record(feature_kind(d["kind"]).params, {"compute_version": 1, **d}, "feature spec")

    @classmethod
    def of_kind(cls, kind: str, **overrides: Any) -> FeatureSpec:
        """The defaults of ``kind`` (its parameters class, :mod:`specstore.store.kinds`), then ``overrides``."""
        return feature_kind(kind).spec(**overrides)

    @classmethod
    def mel(cls, **overrides: Any) -> MelSpec:
        """Log-mel defaults: 22 050 Hz, n_fft 2048, hop 512, 128 mels, 0-8000 Hz, power dB."""
        return cast("MelSpec", cls.of_kind("mel", **overrides))

    @classmethod
    def cqt(cls, **overrides: Any) -> CqtSpec:
        """CQT defaults: 22 050 Hz, hop 512, 84 bins (7 octaves from C1), magnitude dB."""
        return cast("CqtSpec", cls.of_kind("cqt", **overrides))


S = TypeVar("S", bound=FeatureSpec)


@dataclass(frozen=True)
class BinFrequencies:
    """Where a feature's rows lie in frequency: each bin's centre (Hz, rising) and the ``warp`` (Hz -> a number)
    on which the centres are evenly spaced, so a frequency between two centres lies at a fraction of a bin."""

    centres: tuple[float, ...]
    warp: Callable[[float], float]


@dataclass(frozen=True)
class FeatureKind(Generic[S]):
    """One kind of feature: its parameters, options, defaults, export recipe and display; all but its computation.

    ``params``: the parameters dataclass, a :class:`FeatureSpec` subclass: its fields are the kind's record
    (with defaults, and bounds with reasons, :func:`specstore.common.limits.bounded`) and those with option
    metadata (``help``, ``flag``, ``metavar``; ``none``: what the word ``none`` means for an optional one) are
    its ``specstore features`` options (:mod:`specstore.pipeline.spec_options`, :mod:`specstore.common.options`).
    ``recipe``: how its values are computed, as a Python expression over ``y = librosa.load(path,
    sr=sample_rate, mono=True)[0]`` and the spec's fields by name (librosa 0.11 defaults otherwise), the text
    an export's sidecar gives; None: the kind's name stands in for it.  ``db_limits``: colour limits in dB
    against the spec's fixed reference, the same for every clip so colours compare across clips (figures,
    the upload page; how the built-in ones were chosen: ``docs/features.md``).  ``axis``: the
    ``librosa.display.specshow`` frequency-axis arguments for a spec (plain names and numbers).
    ``frequencies``: the bins' centre frequencies (:class:`BinFrequencies`) the upload page labels; None: no
    frequency labels.  ``preferred_picture``: the upload page shows a feature of this kind when a checkpoint
    has one.  ``octave_bins``: for bins spaced evenly in log frequency, the bins per octave of a spec (a pitch
    shift of ``s`` semitones is a roll by ``s * octave_bins / 12`` bins); None otherwise.  ``fixed_grid``: the
    kind's sample rate and hop are part of what it is (a pretrained model's input), so features extracted
    beside it follow its frame grid unless one is given.  ``baseline``: band statistics of it (mean, std and
    delta of every bin) feed the baseline classifiers.
    """

    name: str
    params: type[S]
    db_limits: tuple[float, float]
    axis: Callable[[S], dict[str, Any]]
    frequencies: Callable[[S], BinFrequencies] | None = None
    recipe: str | None = None
    preferred_picture: bool = False
    octave_bins: Callable[[S], int] | None = None
    fixed_grid: bool = False
    baseline: bool = False

    def spec(self, **overrides: Any) -> S:
        """A spec of this kind: its defaults, then ``overrides`` (field names)."""
        return self.params(kind=self.name, **overrides)

    @property
    def defaults(self) -> Mapping[str, Any]:
        """The record's fields (but ``kind``) with this kind's defaults."""
        fields = self.params.__dataclass_fields__
        return MappingProxyType({n: fields[n].default for n in self.params.record_fields() if n != "kind"})

    @property
    def options(self) -> tuple[dataclasses.Field[Any], ...]:
        """The fields of this kind's own options, in order (the grid's, :attr:`FeatureSpec.GRID`, set every
        feature and are not among them)."""
        return tuple(f for f in option_fields(self.params) if f.name not in FeatureSpec.GRID)

    @property
    def flags(self) -> Mapping[str, str]:
        """Field name -> the ``specstore features`` option that sets it (``{"n_bins": "--n-mels"}``); any other
        field is set in a ``--spec`` file (:mod:`specstore.store.spec_command` writes either)."""
        return MappingProxyType({f.name: flag_of(f) for f in self.options})

    @property
    def log_frequency(self) -> bool:
        """Whether the bins are spaced evenly in log frequency (:attr:`octave_bins` is given)."""
        return self.octave_bins is not None


_REGISTRY: dict[str, FeatureKind[Any]] = {}
"""name -> kind, in registration order (the one explicit registry of kinds)."""


def _grid_flags() -> set[str]:
    return {flag_of(f) for f in option_fields(FeatureSpec)}


def register_kind(kind: FeatureKind[S]) -> FeatureKind[S]:
    """Add ``kind`` to the registry; returns it.  A name already taken, falling ``db_limits``, parameters that
    are not a :class:`FeatureSpec` dataclass, an option another kind has, or a recipe that is no Python
    expression is an error (one line)."""
    where = f"feature kind {kind.name!r}"
    if kind.name in _REGISTRY:
        raise ConfigError(f"{where} is already registered")
    lo, hi = kind.db_limits
    if not lo < hi:
        raise ConfigError(f"{where}: db_limits must rise, not {kind.db_limits!r}")
    if not (isinstance(kind.params, type) and issubclass(kind.params, FeatureSpec)
            and dataclasses.is_dataclass(kind.params)):
        raise ConfigError(f"{where}: params must be a FeatureSpec dataclass, not {kind.params!r}")
    taken = _grid_flags().union(*(k.flags.values() for k in _REGISTRY.values()))
    clash = sorted(set(kind.flags.values()) & taken)
    if clash:
        raise ConfigError(f"{where}: option(s) {', '.join(clash)} are another kind's or the grid's")
    if kind.recipe is not None:
        try:
            compile(kind.recipe, f"<{kind.name} recipe>", "eval")
        except SyntaxError as e:
            raise ConfigError(f"{where}: the recipe is not a Python expression ({e.msg})") from None
    _REGISTRY[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Remove a kind registered from user or test code (a no-op for a name not registered)."""
    _REGISTRY.pop(name, None)


def feature_kind(name: str) -> FeatureKind[Any]:
    """The kind named ``name``; :class:`ConfigError` naming the known kinds otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
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
