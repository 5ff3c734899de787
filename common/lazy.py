"""Lazy package exports: a package names what it exports, and a name's module is imported on first use.

``import specstore.store`` (or ``from specstore.store import open_store``)
then costs only the modules the caller uses, so a command's ``--help``, its
usage errors and its path checks answer before zarr, librosa or torch are
imported (PEP 562 module attributes).  A package lists each export once, as
an import in its ``if TYPE_CHECKING:`` block: type checkers read the block,
and :func:`lazy_package` reads the same block from the package's source to
know where each name lives.

A package may export a function named like one of its modules
(``specstore.infer.train``, ``specstore.store.validate``): the name stays the function even
after the module is imported, as an eager ``from .train import train``
would leave it.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["declared_exports", "lazy_package"]


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


def declared_exports(path: str | Path) -> dict[str, list[str]]:
    """The exports a package's ``__init__.py`` at ``path`` declares in its ``if TYPE_CHECKING:`` block: module
    (relative, with its leading dots, as the ``from`` import writes it) -> names.  The block is the one list
    of a package's exports: type checkers read it as imports, :func:`lazy_package` as the lazy map."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    found: dict[str, list[str]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                if not (isinstance(stmt, ast.ImportFrom) and stmt.level):
                    raise TypeError(f"{path}: a lazy package's TYPE_CHECKING block holds relative imports only")
                found.setdefault("." * stmt.level + (stmt.module or ""), []).extend(
                    alias.asname or alias.name for alias in stmt.names)
    return found


def lazy_package(package: str, exports: Mapping[str, Sequence[str]] | None = None) -> list[str]:
    """Make ``package`` (its ``__name__``) lazy; returns ``__all__``.

    ``exports`` maps a submodule (or a relative name such as ``..planner``, as in a ``from`` import) to its
    names; by default they are what the package's ``if TYPE_CHECKING:`` block imports
    (:func:`declared_exports`), so each name is written once.
    """
    module = sys.modules[package]
    if exports is None:
        assert module.__file__ is not None
        exports = declared_exports(module.__file__)
    # a submodule of the package itself is held without its dot (".train" -> "train"), as the import system names
    # the attribute it binds
    where = {name: sub[1:] if sub.startswith(".") and not sub.startswith("..") else sub
             for sub, names in exports.items() for name in names}
    module.__class__ = _LazyPackage
    types.ModuleType.__setattr__(module, "_lazy_where", where)
    for name, sub in where.items():  # a submodule imported before (a circular import) must not shadow its export
        if name == sub and isinstance(module.__dict__.get(name), types.ModuleType):
            del module.__dict__[name]
    return sorted(where)
