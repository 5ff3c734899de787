"""Feature specifications: what a stored feature is, written into the store.

A :class:`FeatureSpec` is plain metadata (numbers and names).  The store keeps
it in its group attributes so that a reader, a notebook or a checkpoint can
tell exactly how the values were computed; ``specstore.store`` itself never computes
audio features.  The pipeline turns a spec into numbers, the inference side
compares a checkpoint's spec with a store's.  A spec is an instance of its
kind's parameters class (:mod:`specstore.store.kinds`); this module gives the
specs of named features and compares two.
"""

from __future__ import annotations

from typing import Any

from specstore.common.errors import ConfigError

from .kinds import DEFAULT_KINDS, feature_kind, kind_names
from .registry import COMPUTE_VERSION, MAX_BINS, MAX_FRAME_RATE, MAX_SAMPLE_RATE, FeatureSpec

__all__ = ["COMPUTE_VERSION", "MAX_BINS", "MAX_FRAME_RATE", "MAX_SAMPLE_RATE", "FeatureSpec", "default_specs",
           "spec_differences"]

#: Groups of compute versions (:data:`COMPUTE_VERSION`) whose values are equal within the equality promise
#: (tested in tests/pipeline/test_features.py): a store written by one can be resumed, grown or read by a checkpoint of
#: another.  Versions 1 and 2 differ only in how the values are computed, not in what they are.
_SAME_VALUES: tuple[frozenset[int], ...] = (frozenset({1, 2}),)


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
    keys = [*da, *(k for k in db if k not in da)]  # specs of two kinds may record different fields

    def shown(d: dict[str, Any], k: str) -> str:
        return repr(d[k]) if k in d else "(not recorded)"

    out = [f"{k}: {shown(da, k)} != {shown(db, k)}" for k in keys
           if k != "compute_version" and (k not in da or k not in db or da[k] != db[k])]
    if not same_values(a.compute_version, b.compute_version):
        out.append(f"compute_version: {a.compute_version} != {b.compute_version} (values computed differently "
                   f"beyond the 0.05 dB equality promise; this specstore computes version {COMPUTE_VERSION})")
    return out
