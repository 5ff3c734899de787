"""Lazy package exports: a package names what it exports, and a name's module is imported on first use.

``import store`` (or ``from store import ConfigError``) then costs only the
modules the caller uses, so a command's ``--help``, its usage errors and
its path checks answer before zarr, librosa or torch are imported (PEP 562
module attributes).  Type checkers read the package's ``if TYPE_CHECKING:``
imports instead; ``tests/test_fast_start.py`` checks that both list the
same names.

A package may export a function named like one of its modules
(``specstore.infer.train``, ``specstore.store.validate``): the name stays the function even
after the module is imported, as an eager ``from .train import train``
would leave it.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["lazy_package"]


class _LazyPackage(types.ModuleType):
    """A package module whose exports are imported on first access (see the module docstring)."""

    _lazy_where: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        where = self.__dict__.get("_lazy_where", {})
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        relative = module if module.startswith(".") else f".{module}"
        value = getattr(importlib.import_module(relative, self.__name__), name)
        types.ModuleType.__setattr__(self, name, value)  # later lookups are plain attribute reads
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        where = self.__dict__.get("_lazy_where", {})
        if (isinstance(value, types.ModuleType) and where.get(name) == name
                and value.__name__ == f"{self.__name__}.{name}"):
            return  # the import system binding a submodule over the export of the same name: keep the export
        types.ModuleType.__setattr__(self, name, value)

    def __dir__(self) -> list[str]:
        return sorted(set(self.__dict__) | set(self.__dict__.get("_lazy_where", {})))


def lazy_package(package: str, exports: Mapping[str, Sequence[str]]) -> list[str]:
    """Make ``package`` (its ``__name__``) lazy: ``exports`` map a submodule (or a relative name such as
    ``..planner``, as in a ``from`` import) to its names; returns ``__all__``."""
    module = sys.modules[package]
    where = {name: sub for sub, names in exports.items() for name in names}
    module.__class__ = _LazyPackage
    types.ModuleType.__setattr__(module, "_lazy_where", where)
    for name, sub in where.items():  # a submodule imported before (a circular import) must not shadow its export
        if name == sub and isinstance(module.__dict__.get(name), types.ModuleType):
            del module.__dict__[name]
    return sorted(where)
