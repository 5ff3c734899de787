"""Command-line options generated from dataclass fields: one home for an option's name, type, default and help.

A settings dataclass declares each option as a field whose metadata holds
its help (and, where needed, its parser, choices, metavar and how its
default is shown); :func:`add_options` turns the fields into ``argparse``
options and :func:`given` reads back the ones the user gave, so the
dataclass, not the command line, supplies every default::

    @dataclass(frozen=True)
    class Limits:
        port: int = option(8000, "port to listen on")

    add_options(parser, Limits)
    limits = Limits(**given(parser.parse_args(), Limits))

Every generated option is absent from the parsed namespace unless given
(``argparse.SUPPRESS``), so a config file or the dataclass fills it.  The
type comes from the field's annotation, resolved with
:func:`typing.get_type_hints`: ``int``, ``float`` and ``str`` parse as
such, ``bool`` becomes ``--name/--no-name``, ``tuple[X, ...]`` a repeatable
option, and ``X | None`` parses as ``X``.  Stdlib only, so every package
(``store``, ``pipeline``, ``infer``, ``serving``) can use it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["add_options", "borrowed", "described", "flag_of", "given", "option", "option_fields", "shown_default"]

_MISSING: Any = dataclasses.MISSING


def option(default: Any = _MISSING, help: str = "", *, default_factory: Callable[[], Any] | None = None,
           **meta: Any) -> Any:
    """A dataclass field that is a command-line option.

    ``meta``: ``parse`` (a function of the text, instead of the annotation's
    type), ``choices``, ``metavar``, ``flag`` (the option's name, when not
    ``--field-name``) and ``shown`` (the default as help prints it, e.g.
    ``"auto"`` for a None that means auto).
    """
    metadata = {"help": help, **meta}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def described(f: Any, help: str, **meta: Any) -> Any:
    """Field ``f`` (e.g. a bounded one, :func:`store.limits.bounded`) with option metadata added."""
    field: dataclasses.Field[Any] = f
    metadata = {**field.metadata, "help": help, **meta}
    if field.default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=field.default_factory, metadata=metadata)
    return dataclasses.field(default=field.default, metadata=metadata)


def borrowed(cls: type, name: str, **meta: Any) -> Any:
    """A field with the default and metadata (help, bounds) of field ``name`` of dataclass ``cls``: a setting
    that another settings class also offers, declared once, in ``cls``."""
    source = next(f for f in dataclasses.fields(cls) if f.name == name)
    return described(source, **{"help": "", **source.metadata, **meta})


def option_fields(cls: type, names: Iterable[str] | None = None) -> list[dataclasses.Field[Any]]:
    """The fields of ``cls`` that are options (they have help), in order; only ``names`` when given."""
    wanted = None if names is None else set(names)
    return [f for f in dataclasses.fields(cls) if "help" in f.metadata and (wanted is None or f.name in wanted)]


def _resolved(cls: type, f: dataclasses.Field[Any]) -> Any:
    """Field ``f``'s annotation as a type (one field at a time, so another field's annotation that names a
    type imported for type checking only does not stop it)."""
    holder = type("_Annotation", (), {"__annotations__": {f.name: f.type}, "__module__": cls.__module__})
    module = sys.modules.get(cls.__module__)
    return typing.get_type_hints(holder, globalns=vars(module) if module else None)[f.name]


def _unwrapped(kind: Any) -> Any:
    """``X`` of ``X | None``; ``kind`` otherwise."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def shown_default(f: dataclasses.Field[Any]) -> str:
    """The default of field ``f`` as help prints it: its ``shown`` metadata, ``none`` for None, numbers as
    ``%g``."""
    if "shown" in f.metadata:
        return str(f.metadata["shown"])
    value = f.default if f.default is not dataclasses.MISSING else None
    if value is None:
        return "none"
    return f"{value:g}" if isinstance(value, float) else str(value)


def flag_of(f: dataclasses.Field[Any]) -> str:
    """The option's name: its ``flag`` metadata, or ``--`` and the field name with dashes."""
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                names: Iterable[str] | None = None, *, help_of: Mapping[str, str] | None = None,
                absent: bool = True) -> None:
    """One option per option field of ``cls`` (only ``names`` when given), absent from the parsed namespace
    unless given (``absent=False``: present with the field's default); its help ends with the default
    (``(default X)``, or ``(default: a phrase)``, :func:`shown_default`).  ``help_of`` replaces a field's
    help for this command."""
    for f in option_fields(cls, names):
        text = (help_of or {}).get(f.name, f.metadata["help"])
        shown = shown_default(f)
        said = f"default: {shown}" if " " in shown else f"default {shown}"  # a phrase after a colon
        help_text = f"{text} ({said})".replace("%", "%%")  # argparse formats help with %
        kind = _unwrapped(_resolved(cls, f))
        default = argparse.SUPPRESS if absent or f.default is dataclasses.MISSING else f.default
        common: dict[str, Any] = {"dest": f.name, "default": default, "help": help_text}
        if "metavar" in f.metadata:
            common["metavar"] = f.metadata["metavar"]
        if kind is bool:
            parser.add_argument(flag_of(f), action=argparse.BooleanOptionalAction, **common)
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(flag_of(f), action="append", type=typing.get_args(kind)[0], **common)
        else:
            parser.add_argument(flag_of(f), type=f.metadata.get("parse", kind), choices=f.metadata.get("choices"),
                                **common)


def given(args: argparse.Namespace, cls: type, names: Iterable[str] | None = None) -> dict[str, Any]:
    """The options of ``cls`` (only ``names`` when given) that ``args`` holds, i.e. that the user gave, by
    field name (a repeatable option as a tuple)."""
    out: dict[str, Any] = {}
    for f in option_fields(cls, names):
        if hasattr(args, f.name):
            value = getattr(args, f.name)
            out[f.name] = tuple(value) if isinstance(value, list) else value
    return out
