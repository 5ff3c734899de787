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
(``specstore.store``, ``specstore.pipeline``, ``specstore.infer``, ``specstore.serving``) can use it.

A field with a :class:`~specstore.common.limits.Limit` (:func:`specstore.common.limits.bounded`)
is checked as the command line is parsed: a value out of its bounds, or text
that is no number at all (``nan``, ``1e30`` for an integer), ends the parse
with one line, ``specstore: error: NAME (--flag) must be ..., got X (why)``,
and exit status 2, before the command imports anything heavy.  An option
written by hand gets the same check from :func:`bounded_argument`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .cli import PROG
from .limits import Limit

__all__ = ["BoundedType", "add_options", "borrowed", "bounded_argument", "described", "flag_of", "given", "option",
           "option_fields", "shown_default"]

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
    """Field ``f`` (e.g. a bounded one, :func:`specstore.common.limits.bounded`) with option metadata added."""
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


@dataclasses.dataclass(frozen=True)
class _Refused:
    """What :class:`BoundedType` returns for a value its limit refuses: the one line that says why."""

    line: str


class BoundedType:
    """The ``type`` of a numeric option with a :class:`~specstore.common.limits.Limit`: the text parsed by ``parse``
    (``int``, ``float`` or the field's own parser), then checked against ``limit``.

    Text ``parse`` cannot read is checked as it is (and refused: it is no number), so an integer option given
    ``nan`` or ``1e30`` is told its rule too.  A refused value comes back as a refusal, not an exception, for
    :class:`_BoundedStore` to end the parse with one line (argparse would print its usage above an exception's
    message).  ``name``: the setting as the line names it (a field name, or the flag).
    """

    def __init__(self, parse: Callable[[str], Any], limit: Limit, name: str) -> None:
        self.parse, self.limit, self.name = parse, limit, name
        self.__name__ = getattr(parse, "__name__", "value")  # what argparse calls the type in its messages

    def __call__(self, text: str) -> Any:
        try:
            value = self.parse(text)
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            value = text
        return value if self.limit.allows(value) else _Refused(self.limit.refusal(self.name, value))

    def __repr__(self) -> str:
        return f"BoundedType({self.name}: {self.limit.describe()})"


class _BoundedStore(argparse.Action):
    """Stores what :class:`BoundedType` accepted; a refused value ends the parse: one line and status 2, as a
    bad value found by a command's body is (:func:`specstore.common.run_cli`)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if isinstance(values, _Refused):
            parser.exit(2, f"{PROG}: error: {values.line}\n")
        setattr(namespace, self.dest, values)


def _spelled_with(spelled: str, flag: str) -> str:
    """``spelled`` (how commands spell a setting, e.g. ``BUDGET_MB, --budget-mb``) with ``flag`` among them."""
    return spelled if flag in spelled.split(", ") else ", ".join(s for s in (spelled, flag) if s)


def bounded_argument(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *flags: str, limit: Limit,
                     parse: Callable[[str], Any] | None = None, **kwargs: Any) -> argparse.Action:
    """A numeric option written by hand (``parser.add_argument(*flags, **kwargs)``) whose value is checked
    against ``limit`` as the command line is parsed (:class:`BoundedType`); ``parse`` reads the text (default:
    ``limit``'s kind).  The refusal names the option by its long flag."""
    name = next((f for f in flags if f.startswith("--")), flags[0])
    kind = BoundedType(parse or limit.kind, limit, name)
    return parser.add_argument(*flags, type=kind, action=_BoundedStore, **kwargs)


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type,
                names: Iterable[str] | None = None, *, help_of: Mapping[str, str] | None = None,
                absent: bool = True) -> None:
    """One option per option field of ``cls`` (only ``names`` when given), absent from the parsed namespace
    unless given (``absent=False``: present with the field's default); its help ends with the default
    (``(default X)``, or ``(default: a phrase)``, :func:`shown_default`).  ``help_of`` replaces a field's
    help for this command.  A field with a :class:`~specstore.common.limits.Limit` is checked as the command line is
    parsed (:class:`BoundedType`), its refusal naming the field and the flag."""
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
        limit: Limit | None = f.metadata.get("limit")
        if limit is not None and (kind is bool or typing.get_origin(kind) is tuple):
            raise TypeError(f"{cls.__name__}.{f.name}: a limit on a switch or a repeatable option is not checked")
        if kind is bool:
            parser.add_argument(flag_of(f), action=argparse.BooleanOptionalAction, **common)
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(flag_of(f), action="append", type=typing.get_args(kind)[0], **common)
        elif limit is not None:
            checked = dataclasses.replace(limit, spelled=_spelled_with(limit.spelled, flag_of(f)))
            parser.add_argument(flag_of(f), type=BoundedType(f.metadata.get("parse", kind), checked, f.name),
                                action=_BoundedStore, choices=f.metadata.get("choices"), **common)
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
