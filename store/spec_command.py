"""The command that extracts features with given specs: what a spec mismatch suggests.

A model trained on other features than a store holds (other bins, another hop, a feature the store lacks)
needs a store extracted with the model's settings.  :func:`extraction_command` writes the ``make features``
line that makes exactly those specs into a new store: ``FEATURES`` names the model's features, ``ARGS`` gives
the ``specstore-features`` options for every field that differs from the defaults (the grid's ``--sample-rate``
and ``--hop``, each kind's own, :attr:`~specstore.store.kinds.FeatureKind.flags`, all generated from the kinds'
parameters), and a field no option sets goes in a ``--spec`` file whose tables the line spells out.  It reads
the specs as ``specstore.pipeline.spec_options`` does (defaults, then the file, then the options; features
beside a fixed-grid kind follow its grid), and ``tests/infer/test_model_bounds.py`` runs what it writes back
through the command line.  Pure: no audio.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

from specstore.common.options import flag_of, option_fields

from .kinds import feature_kind
from .spec import COMPUTE_VERSION, FeatureSpec, default_specs, same_values

__all__ = ["GRID_FLAGS", "SPEC_FILE", "extraction_args", "extraction_command"]

GRID_FLAGS = {f.name: flag_of(f) for f in option_fields(FeatureSpec, FeatureSpec.GRID)}
"""The options that set the frame grid every feature of one extraction shares (``--sample-rate``, ``--hop``:
the options of :attr:`FeatureSpec.GRID`)."""
SPEC_FILE = "model-features.toml"
"""The spec file a suggested command names when a field has no option of its own."""
_NOT_SET = ("kind", "compute_version", *GRID_FLAGS)


def _word(value: Any) -> str:
    """An option's value as a command-line word (None: ``none``, an unset ``--fmax``)."""
    return "none" if value is None else repr(value) if isinstance(value, float) else str(value)


def _toml(value: Any) -> str:
    """A spec file's value: numbers as they are, None as ``"none"``, text quoted."""
    if value is None:
        return '"none"'
    return f'"{value}"' if isinstance(value, str) else repr(value)


def extraction_args(specs: Mapping[str, FeatureSpec]) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """``(options, spec file tables)`` that make ``specs`` (feature name -> spec, one frame grid) from the
    defaults: the options as words (``["--n-mels", "64"]``), the tables for fields that no option sets."""
    names = list(specs)
    base = default_specs(names)
    fixed = [base[n] for n in names if feature_kind(n).fixed_grid]
    first = next(iter(specs.values()))
    args: list[str] = []
    for grid, flag in GRID_FLAGS.items():
        defaults = {getattr(fixed[0] if fixed else base[n], grid) for n in names}
        if defaults != {getattr(first, grid)}:
            args += [flag, _word(getattr(first, grid))]
    tables: dict[str, dict[str, Any]] = {}
    for name, spec in specs.items():
        want, have = spec.to_dict(), base[name].to_dict()
        flags = feature_kind(name).flags
        for key in want:
            if key in _NOT_SET or want[key] == have[key]:
                continue
            if key in flags:
                args += [flags[key], _word(want[key])]
            else:
                tables.setdefault(name, {})[key] = want[key]
    return args, tables


def extraction_command(specs: Mapping[str, FeatureSpec], *, corpus: str | None = None,
                       store: str | None = None) -> str:
    """The ``make features`` line that extracts ``corpus`` into a new ``specstore.store`` with exactly ``specs`` (one
    line; ``...`` for what is not given), or why no extraction by this specstore can."""
    old = [f"{n} (version {s.compute_version})" for n, s in specs.items()
           if not same_values(s.compute_version, COMPUTE_VERSION)]
    if old:
        return (f"no extraction by this specstore makes {', '.join(old)}: it computes version {COMPUTE_VERSION}; "
                "use the specstore the model was trained with, or train the model again")
    args, tables = extraction_args(specs)
    if tables:
        args += ["--spec", SPEC_FILE]
    line = (f"make features FEATURES={','.join(specs)} CORPUS={shlex.quote(corpus) if corpus else '...'} "
            f"STORE={shlex.quote(store) if store else '...'}" + (f' ARGS="{" ".join(args)}"' if args else ""))
    if tables:
        held = "; ".join(f"[{n}] " + ", ".join(f"{k} = {_toml(v)}" for k, v in t.items()) for n, t in tables.items())
        line += f" with {SPEC_FILE} holding {held} (one field a line)"
    return line
