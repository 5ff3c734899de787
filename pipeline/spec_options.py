"""Feature parameters from the command line: ``--sample-rate``, ``--n-mels``, ... or one ``--spec FILE.toml``.

Every option is generated from a kind's parameters dataclass (:mod:`specstore.store.kinds`): a field whose
metadata says ``help`` is an option (its ``flag``, ``metavar``, default and bound come from the field;
``none`` says what the word ``none`` means for it).  ``--sample-rate`` and ``--hop`` are the grid's, shared by
every kind (:attr:`specstore.store.FeatureSpec.GRID`); the others are each kind's own (``--n-mels``,
``--n-fft``, ``--fmax`` of the mel, ``--cqt-bins`` of the CQT).  :func:`add_spec_options` adds them to a
parser and :func:`specs_from_args` reads them back; :func:`specs_from_options` turns what ``specstore
features`` (``make features ARGS=...``) was given into the :class:`specstore.store.FeatureSpec` of each
feature, the same specs ``specstore.pipeline.extract(specs=...)`` takes; the store records them as it always
does (an existing store made with other specs is refused).

Precedence, lowest first: the defaults (:func:`specstore.store.default_specs`), a
``--spec`` TOML file, the single-value flags.  The file holds one table per
feature, keyed by the field names of its kind's parameters::

    [mel]
    sample_rate = 16000   # Hz
    hop_length = 256      # samples
    n_bins = 64           # mel bands
    fmax = 7600.0         # Hz; "none" = half the sample rate

    [cqt]
    n_bins = 72           # 6 octaves of 12 bins

The features are ``--features`` when given, else the file's tables, else
``mel,cqt``.  Every feature shares one frame grid, so ``--sample-rate`` and
``--hop`` apply to all of them, and so do ``sample_rate``/``hop_length``
given in any table of the file (two tables giving different ones are refused).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specstore.common import ConfigError
from specstore.common.limits import Limit
from specstore.common.options import bounded_argument, flag_of, option_fields, shown_default
from specstore.store import FeatureSpec, default_specs
from specstore.store.kinds import DEFAULT_KINDS, feature_kind, kind_names

__all__ = ["DEFAULT_FEATURES", "SpecOption", "add_spec_options", "parse_fmax", "read_spec_file", "spec_options",
           "specs_from_args", "specs_from_options"]

DEFAULT_FEATURES = DEFAULT_KINDS
"""The features extracted when neither ``--features`` nor a spec file names any
(:data:`specstore.store.kinds.DEFAULT_KINDS`)."""

_NONE_WORDS = ("none", "nyquist")
"""What an option that takes ``none`` reads as None (``--fmax none``)."""
_NOT_GIVEN = "default"
"""An option's value that means it was not given (for an option whose None is a value: ``fmax="default"``)."""


def parse_fmax(text: str) -> float | None:
    """``--fmax``: a frequency in Hz, or ``none`` for half the sample rate."""
    return _none_or(float)(text)


def _none_or(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse``, but the word ``none`` is None."""

    def parse_or_none(text: str) -> Any:
        return None if text.strip().lower() in _NONE_WORDS else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")
    return parse_or_none


@dataclass(frozen=True)
class SpecOption:
    """One ``specstore features`` option: the parameters field it sets, and its kind (None: the grid's, which
    sets every feature)."""

    field: dataclasses.Field[Any]
    kind: str | None

    @property
    def flag(self) -> str:
        return flag_of(self.field)

    @property
    def dest(self) -> str:
        """Its name on the parsed namespace and as a :func:`specs_from_options` keyword (``n_mels``)."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def takes_none(self) -> bool:
        """Whether ``none`` is a value of it (``none`` metadata): then None is given, not absent."""
        return "none" in self.field.metadata

    @property
    def limit(self) -> Limit | None:
        limit: Limit | None = self.field.metadata.get("limit")
        return limit

    def given(self, value: Any) -> bool:
        """Whether ``value`` sets the field (None is "not given" unless the option takes ``none``)."""
        return not (isinstance(value, str) and value == _NOT_GIVEN) and (value is not None or self.takes_none)

    def help(self) -> str:
        text = self.field.metadata["help"] + (f", or none for {self.field.metadata['none']}" if self.takes_none
                                              else "")
        return f"{text} ({'every feature; ' if self.kind is None else ''}default {shown_default(self.field)})"


def spec_options() -> list[SpecOption]:
    """Every feature option: the grid's, then each registered kind's own, in registration order."""
    grid = [SpecOption(f, None) for f in option_fields(FeatureSpec)]
    return grid + [SpecOption(f, name) for name in kind_names() for f in feature_kind(name).options]


def add_spec_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """``--spec FILE.toml`` and every option of :func:`spec_options`, each checked as it is parsed against the
    bound of the field it sets (one line naming the option).  An option is None on the namespace unless given;
    one that takes ``none`` is absent instead."""
    tables = " and/or ".join(f"[{k}]" for k in DEFAULT_KINDS)
    parser.add_argument("--spec", default=None, metavar="FILE.toml",
                        help=f"feature specs from a TOML file: a {tables} table of spec fields")
    for option in spec_options():
        f, limit = option.field, option.limit
        parse = f.metadata.get("parse") or (limit.kind if limit is not None else str)
        kwargs: dict[str, Any] = {"default": argparse.SUPPRESS if option.takes_none else None,
                                  "metavar": f.metadata.get("metavar"), "help": option.help().replace("%", "%%")}
        if option.takes_none:
            parse = _none_or(parse)
        if limit is not None:
            bounded_argument(parser, option.flag, limit=limit, parse=parse, **kwargs)
        else:
            parser.add_argument(option.flag, type=parse, **kwargs)


def specs_from_args(features: Sequence[str] | None, args: argparse.Namespace) -> dict[str, FeatureSpec]:
    """:func:`specs_from_options` of what ``args`` (parsed with :func:`add_spec_options`) holds."""
    given = {o.dest: getattr(args, o.dest) for o in spec_options() if hasattr(args, o.dest)}
    return specs_from_options(features, spec_file=getattr(args, "spec", None), **given)


def _field_value(params: type[FeatureSpec], name: str, value: Any, where: str) -> Any:
    """``value`` checked against the type and bound of field ``name`` of ``params`` (one-line error otherwise)."""
    f = params.__dataclass_fields__[name]
    limit: Limit | None = f.metadata.get("limit")
    if limit is not None:
        if limit.optional and (value is None or (isinstance(value, str) and value.lower() == "none")):
            return None
        if limit.kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigError(f"{where}: {name} must be a whole number, not {value!r}")
        if limit.kind is not int:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{where}: {name} must be a number, not {value!r}")
            value = float(value)
        limit.check(f"{where}: {name}", value)
        return value
    choices = f.metadata.get("choices")
    if choices is not None and not isinstance(value, str):
        raise ConfigError(f"{where}: {name} must be {' or '.join(choices)}, not {value!r}")
    return value


def read_spec_file(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The tables of a spec TOML file: feature name -> fields of its kind's parameters (checked, not yet
    applied)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read the spec file {p}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"spec file {p} is not valid TOML: {e}") from None
    tables: dict[str, dict[str, Any]] = {}
    for name, table in data.items():
        if name not in kind_names():
            raise ConfigError(f"spec file {p}: [{name}] is not a feature; tables are {', '.join(kind_names())}")
        if not isinstance(table, dict):
            raise ConfigError(f"spec file {p}: {name} must be a table ([{name}]) of spec fields")
        params = feature_kind(name).params
        fields = set(params.record_fields()) - {"kind"}
        unknown = sorted(set(table) - fields)
        if unknown:
            raise ConfigError(f"spec file {p}: unknown [{name}] field(s) {', '.join(unknown)}; fields are "
                              f"{', '.join(sorted(fields))}")
        tables[name] = {k: _field_value(params, k, v, f"spec file {p} [{name}]") for k, v in table.items()}
    return tables


def _grid(tables: dict[str, dict[str, Any]], given: dict[str, Any], specs: dict[str, FeatureSpec],
          names: tuple[str, ...]) -> dict[str, Any]:
    """The frame grid every feature shares: the file's (one value per field), the options', or a fixed-grid
    kind's (musicnn: the others follow it; another value is refused)."""
    shared: dict[str, Any] = {}
    for grid in FeatureSpec.GRID:
        given_grid = {t[grid] for t in tables.values() if grid in t}
        if len(given_grid) > 1:
            raise ConfigError(f"the spec file gives {grid} {sorted(given_grid)}: every feature shares one frame grid")
        if given_grid:
            shared[grid] = given_grid.pop()
    shared.update(given)
    fixed = [specs[n] for n in names if feature_kind(n).fixed_grid]
    for grid in FeatureSpec.GRID:  # beside a fixed-grid kind (musicnn), the others follow its grid
        if fixed and shared.setdefault(grid, getattr(fixed[0], grid)) != getattr(fixed[0], grid):
            raise ConfigError(f"the {fixed[0].kind} feature is a pretrained model's input: its {grid} is "
                              f"{getattr(fixed[0], grid)}, not {shared[grid]} (drop --sample-rate/--hop)")
    return shared


def specs_from_options(features: Sequence[str] | None = None, *, spec_file: str | os.PathLike[str] | None = None,
                       **options: Any) -> dict[str, FeatureSpec]:
    """The spec of every feature to extract, from the defaults, ``spec_file`` and the options.

    ``options``: by the option's name without dashes (:attr:`SpecOption.dest`: ``sample_rate`` Hz, ``hop``
    samples, ``n_mels``, ``n_fft``, ``fmax`` Hz, ``cqt_bins``, ... of :func:`spec_options`); None is not
    given (for ``fmax``, which takes ``none``, None is half the sample rate and ``"default"`` is not given).
    A value for a feature that is not extracted (e.g. ``n_mels`` with ``features=("cqt",)``) is refused
    rather than ignored.  Raises :class:`~specstore.common.ConfigError` with one line.
    """
    known = {o.dest: o for o in spec_options()}
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise TypeError(f"specs_from_options() got unknown option(s) {', '.join(unknown)}; "
                        f"the options are {', '.join(known)}")
    given = {dest: value for dest, value in options.items() if known[dest].given(value)}
    for dest, value in given.items():  # NaN, inf and absurd sizes: one line naming the flag
        limit = known[dest].limit
        if limit is not None and value is not None:
            limit.check(known[dest].flag, value)
    tables = read_spec_file(spec_file) if spec_file is not None else {}
    names = tuple(features) if features else tuple(tables) or DEFAULT_FEATURES
    extra = sorted(set(tables) - set(names))
    if extra:
        raise ConfigError(f"the spec file has [{'], ['.join(extra)}] but --features is {','.join(names)}")
    specs = default_specs(names)
    own: dict[str, dict[str, Any]] = {}  # kind -> its options' fields
    for dest, value in given.items():
        kind = known[dest].kind
        if kind is not None:
            own.setdefault(kind, {})[known[dest].field.name] = value
    for kind in own:
        if kind not in names:
            flags = "/".join(o.flag for o in known.values() if o.kind == kind)
            raise ConfigError(f"{flags} set the {kind} feature, which is not extracted "
                              f"(features: {','.join(names)}; add it with --features)")
    grid = {known[d].field.name: v for d, v in given.items() if known[d].kind is None}
    shared = _grid(tables, grid, specs, names)
    out: dict[str, FeatureSpec] = {}
    for name, spec in specs.items():
        fields = {**spec.to_dict(), **tables.get(name, {}), **shared, **own.get(name, {})}
        try:
            out[name] = FeatureSpec.from_dict(fields)
        except ConfigError as e:  # a bound across fields an option that takes none can lift (--fmax)
            hint = next((f": give {o.flag} {o.field.metadata.get('metavar', 'X')}, or {o.flag} none"
                         for o in known.values() if o.kind == name and o.takes_none
                         and str(e).startswith(f"{o.field.name} (")), "")
            raise ConfigError(f"{name} spec: {e}{hint}") from None
    return out
