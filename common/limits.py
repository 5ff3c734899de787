"""Bounds on settings, stated once beside the field that holds them.

A dataclass field made with :func:`bounded` carries a :class:`Limit` in its
metadata: the range of values it accepts, their kind (integer or finite
number), and the reason for the bound.  The dataclass checks its fields when
it is made (:func:`check_fields`), so a value out of range (from a command
line, a config file or a checkpoint) is refused with one line naming the
field, the value, the bound and why, before anything is sized by it.
:class:`~specstore.infer.models.ModelConfig` and :class:`~specstore.infer.engine.runtime.RunOptions`
use it; a setting copied elsewhere (the training config's copies of them) is
checked against the same :class:`Limit` with :func:`field_limit`.  It lives
in ``specstore.store``, the floor every package shares, so the feature specs, the
pipeline's and the server's options are bounded by the same rule.  Pure:
stdlib only.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError

__all__ = ["Limit", "bounded", "check_fields", "field_limit", "usable_cores"]


def usable_cores() -> int:
    """CPU cores this process may run on: its affinity mask (``os.cpu_count()`` where there is none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _number(x: float) -> str:
    """``x`` for a message: whole numbers in full (1048576, not 1.04858e+06), others as ``%g``."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def _shown(value: Any) -> str:
    """``value`` for a one-line message: a huge integer as ``%.4g``, any other repr cut to 60 characters."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool) and abs(int(value)) >= 10**15:
        return f"{float(value):.4g}" if abs(int(value)) < 10**308 else "a number of more than 300 digits"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class Limit:
    """The values one numeric setting may take, and why: a range, the kind, oddness, whether None is allowed.

    ``kind``: ``int`` (an integer, not a bool) or ``float`` (any finite real
    number); ``low``/``high``: the bounds, inclusive unless ``low_open`` /
    ``high_open``; ``high`` may be a function (a bound of this machine,
    e.g. :func:`usable_cores`), asked at each check; ``odd``: odd integers
    only (kernel sizes); ``optional``: None (the default chosen elsewhere)
    is allowed; ``why``: the reason, shown in the error; ``spelled``: how
    commands spell the setting (e.g. ``BUDGET_MB, --budget-mb``), named
    after the field in the error.
    """

    low: float
    high: float | Callable[[], float]
    why: str
    kind: type = int
    low_open: bool = False
    high_open: bool = False
    odd: bool = False
    optional: bool = False
    spelled: str = ""

    @property
    def upper(self) -> float:
        """The upper bound now (``high``, or what its function says)."""
        return self.high() if callable(self.high) else self.high

    def describe(self) -> str:
        """The rule in words, e.g. ``an odd integer in [1, 255]``."""
        what = ("an odd integer" if self.odd else "an integer") if self.kind is int else "a finite number"
        return (f"{what} in {'(' if self.low_open else '['}{_number(self.low)}, {_number(self.upper)}"
                f"{')' if self.high_open else ']'}{' (or unset)' if self.optional else ''}")

    def allows(self, value: Any) -> bool:
        """Whether ``value`` is of the kind, finite, within the range (and odd, where asked)."""
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return False
        if self.kind is int and not isinstance(value, numbers.Integral):
            return False
        if not isinstance(value, numbers.Integral) and not math.isfinite(value):  # (an int of any size is finite)
            return False
        x: Any = value  # a real number now (numbers.Real does not declare the comparisons)
        high = self.upper
        above = x > self.low if self.low_open else x >= self.low
        below = x < high if self.high_open else x <= high
        return bool(above and below and (not self.odd or int(x) % 2 == 1))

    def refusal(self, name: str, value: Any) -> str:
        """The one line that refuses ``value`` for setting ``name``: the setting (and how commands spell it),
        the value, the bound and why."""
        spelled = f" ({self.spelled})" if self.spelled else ""
        return f"{name}{spelled} must be {self.describe()}, got {_shown(value)} ({self.why})"

    def check(self, name: str, value: Any, error: type[ConfigError] = ConfigError) -> None:
        """Raise ``error`` (one line: the setting, the value, the bound and why) unless :meth:`allows`."""
        if not self.allows(value):
            raise error(self.refusal(name, value))


def bounded(default: Any, low: float, high: float | Callable[[], float], why: str, *,
            kind: type | None = None, **rule: Any) -> Any:
    """A dataclass field with a :class:`Limit` (``kind``: int or float, from the default's type unless given)."""
    if kind is None:
        kind = int if isinstance(default, int) and not isinstance(default, bool) else float
    return dataclasses.field(default=default, metadata={"limit": Limit(low, high, why, kind, **rule)})


def field_limit(cls: type, name: str) -> Limit:
    """The :class:`Limit` of field ``name`` of dataclass ``cls`` (``KeyError`` if it has none)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            limit: Limit = f.metadata["limit"]
            return limit
    raise KeyError(name)


def check_fields(obj: Any, error: type[ConfigError] = ConfigError) -> None:
    """Check every bounded field of dataclass instance ``obj`` (:meth:`Limit.check`); ``error`` on the first
    value out of bounds."""
    for f in dataclasses.fields(obj):
        limit: Limit | None = f.metadata.get("limit")
        if limit is not None:
            limit.check(f.name, getattr(obj, f.name), error)
