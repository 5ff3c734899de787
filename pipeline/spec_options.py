"""Feature parameters from the command line: ``--sample-rate``, ``--n-mels``, ... or one ``--spec FILE.toml``.

:func:`specs_from_options` turns what ``specstore-features`` (``make features
ARGS=...``) was given into the :class:`specstore.store.FeatureSpec` of each feature,
the same specs ``specstore.pipeline.extract(specs=...)`` takes; the store records them
as it always does (an existing store made with other specs is refused).

Precedence, lowest first: the defaults (:func:`specstore.store.default_specs`), a
``--spec`` TOML file, the single-value flags.  The file holds one table per
feature, keyed by :class:`~specstore.store.FeatureSpec` field names::

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

import dataclasses
import os
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specstore.common import ConfigError
from specstore.common.limits import field_limit
from specstore.store import FeatureSpec, default_specs
from specstore.store.kinds import DEFAULT_KINDS, feature_kind, kind_names

__all__ = ["DEFAULT_FEATURES", "parse_fmax", "read_spec_file", "specs_from_options"]

DEFAULT_FEATURES = DEFAULT_KINDS
"""The features extracted when neither ``--features`` nor a spec file names any
(:data:`specstore.store.kinds.DEFAULT_KINDS`)."""

_INT_FIELDS = {"sample_rate", "hop_length", "n_bins", "n_fft", "bins_per_octave"}
_FLOAT_FIELDS = {"fmin", "fmax", "power", "db_ref", "amin"}
_OPTIONAL = {"n_fft", "fmax", "bins_per_octave"}


def parse_fmax(text: str) -> float | None:
    """``--fmax``: a frequency in Hz, or ``none`` for half the sample rate."""
    if text.strip().lower() in ("none", "nyquist"):
        return None
    return float(text)


def _field_value(name: str, value: Any, where: str) -> Any:
    """``value`` checked against the type of FeatureSpec field ``name`` (one-line error otherwise)."""
    if name in _OPTIONAL and (value is None or (isinstance(value, str) and value.lower() == "none")):
        return None
    if name in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: {name} must be a whole number, not {value!r}")
        return _bounded(name, value, f"{where}: {name}")
    if name in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {name} must be a number, not {value!r}")
        return _bounded(name, float(value), f"{where}: {name}")
    if name == "dtype" and not isinstance(value, str):
        raise ConfigError(f"{where}: dtype must be float16 or float32, not {value!r}")
    return value


def _bounded(name: str, value: Any, spelled: str) -> Any:
    """``value`` of FeatureSpec field ``name`` checked against the field's bound
    (:class:`~specstore.common.limits.Limit`), the error naming it as the user spelled it (``--n-mels``, ``spec file X
    [mel]: n_bins``)."""
    field_limit(FeatureSpec, name).check(spelled, value)
    return value


def read_spec_file(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """The tables of a spec TOML file: feature name -> FeatureSpec fields (checked, not yet applied)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read the spec file {p}: {e.strerror or e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"spec file {p} is not valid TOML: {e}") from None
    fields = {f.name for f in dataclasses.fields(FeatureSpec)} - {"kind"}
    tables: dict[str, dict[str, Any]] = {}
    for name, table in data.items():
        if name not in kind_names():
            raise ConfigError(f"spec file {p}: [{name}] is not a feature; tables are {', '.join(kind_names())}")
        if not isinstance(table, dict):
            raise ConfigError(f"spec file {p}: {name} must be a table ([{name}]) of spec fields")
        unknown = sorted(set(table) - fields)
        if unknown:
            raise ConfigError(f"spec file {p}: unknown [{name}] field(s) {', '.join(unknown)}; fields are "
                              f"{', '.join(sorted(fields))}")
        tables[name] = {k: _field_value(k, v, f"spec file {p} [{name}]") for k, v in table.items()}
    return tables


def specs_from_options(
    features: Sequence[str] | None = None,
    *,
    spec_file: str | os.PathLike[str] | None = None,
    sample_rate: int | None = None,
    hop: int | None = None,
    n_mels: int | None = None,
    n_fft: int | None = None,
    fmax: float | None | str = "default",
    cqt_bins: int | None = None,
) -> dict[str, FeatureSpec]:
    """The spec of every feature to extract, from the defaults, ``spec_file`` and the single values.

    Units: ``sample_rate`` Hz, ``hop`` and ``n_fft`` samples, ``fmax`` Hz
    (None: half the sample rate; ``"default"``: leave it), ``n_mels`` and
    ``cqt_bins`` bins.  A value for a feature that is not extracted (e.g.
    ``n_mels`` with ``features=("cqt",)``) is refused rather than ignored.
    Raises :class:`~specstore.common.ConfigError` with one line.
    """
    flags = {"--sample-rate": ("sample_rate", sample_rate), "--hop": ("hop_length", hop),
             "--n-mels": ("n_bins", n_mels), "--n-fft": ("n_fft", n_fft), "--cqt-bins": ("n_bins", cqt_bins),
             "--fmax": ("fmax", None if fmax == "default" else fmax)}
    for flag, (name, value) in flags.items():  # NaN, inf and absurd sizes: one line naming the flag
        if value is not None:
            _bounded(name, value, flag)
    tables = read_spec_file(spec_file) if spec_file is not None else {}
    names = tuple(features) if features else tuple(tables) or DEFAULT_FEATURES
    extra = sorted(set(tables) - set(names))
    if extra:
        raise ConfigError(f"the spec file has [{'], ['.join(extra)}] but --features is {','.join(names)}")
    specs = default_specs(names)
    per_feature: dict[str, dict[str, Any]] = {
        "mel": {"n_bins": n_mels, "n_fft": n_fft, **({} if fmax == "default" else {"fmax": fmax})},
        "cqt": {"n_bins": cqt_bins},
    }
    kind_flags = {"mel": ("--n-mels", "--n-fft", "--fmax"), "cqt": ("--cqt-bins",)}
    for kind, values in per_feature.items():
        given = {k: v for k, v in values.items() if v is not None or k == "fmax"}
        if given and kind not in names:
            raise ConfigError(f"{'/'.join(kind_flags[kind])} set the {kind} feature, which is not extracted "
                              f"(features: {','.join(names)}; add it with --features)")
    shared: dict[str, Any] = {}
    for grid in ("sample_rate", "hop_length"):
        given_grid = {t[grid] for t in tables.values() if grid in t}
        if len(given_grid) > 1:
            raise ConfigError(f"the spec file gives {grid} {sorted(given_grid)}: every feature shares one frame grid")
        if given_grid:
            shared[grid] = given_grid.pop()
    shared.update({k: v for k, v in {"sample_rate": sample_rate, "hop_length": hop}.items() if v is not None})
    fixed = [specs[n] for n in names if feature_kind(n).fixed_grid]
    for grid in ("sample_rate", "hop_length"):  # beside a fixed-grid kind (musicnn), the others follow its grid
        if fixed and shared.setdefault(grid, getattr(fixed[0], grid)) != getattr(fixed[0], grid):
            raise ConfigError(f"the {fixed[0].kind} feature is a pretrained model's input: its {grid} is "
                              f"{getattr(fixed[0], grid)}, not {shared[grid]} (drop --sample-rate/--hop)")
    out: dict[str, FeatureSpec] = {}
    for name, spec in specs.items():
        own = {k: v for k, v in per_feature.get(name, {}).items() if v is not None or k == "fmax"}
        fields = {**spec.to_dict(), **tables.get(name, {}), **shared, **own}
        try:
            out[name] = FeatureSpec.from_dict(fields)
        except ConfigError as e:
            hint = ": give --fmax HZ, or --fmax none" if str(e).startswith("fmax (") else ""
            raise ConfigError(f"{name} spec: {e}{hint}") from None
    return out
