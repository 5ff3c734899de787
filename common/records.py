"""Dataclasses written as JSON records (store metadata, checkpoints, configs), read back strictly.

:func:`from_record` rebuilds a dataclass from a dict and refuses unknown
keys with one clear error rather than ignoring them, so a typo in a config
file or a record from a newer version never passes silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from .errors import ConfigError

__all__ = ["from_record"]

T = TypeVar("T")


def from_record(cls: type[T], data: Mapping[str, Any], what: str, error: type[ConfigError] = ConfigError) -> T:
    """``cls(**data)`` after checking every key is a field of ``cls``; ``error`` names ``what`` otherwise."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        raise error(f"unknown {what} field(s): {', '.join(unknown)}")
    try:
        return cls(**data)
    except TypeError as e:
        raise error(f"bad {what}: {e}") from None
