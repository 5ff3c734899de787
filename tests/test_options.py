"""The option generator (store/options.py): one dataclass field is one option, its default, type and help."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from store.options import add_options, borrowed, given, option


def _parse(value: str) -> int | None:
    return None if value == "auto" else int(value)


@dataclass(frozen=True)
class Example:
    port: int = option(8000, "port to listen on")
    rate: float = option(0.5, "a rate")
    name: str | None = option(None, "a name", metavar="NAME")
    mode: str = option("a", "a mode", choices=("a", "b"))
    fast: bool = option(False, "go fast")
    hosts: tuple[str, ...] = option((), "a host (repeatable)", flag="--host", shown="none")
    count: int | None = option(None, "a count", parse=_parse, shown="auto")
    hidden: int = 3  # no help: not an option


@dataclass(frozen=True)
class Borrower:
    port: int = borrowed(Example, "port")


def _parser(absent: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_options(p, Example, absent=absent)
    return p


def test_options_not_given_are_absent_and_the_dataclass_fills_them() -> None:
    args = _parser().parse_args([])
    assert given(args, Example) == {}
    assert Example(**given(args, Example)) == Example()


def test_types_come_from_the_annotations() -> None:
    args = _parser().parse_args(["--port", "9", "--rate", "2", "--name", "x", "--mode", "b", "--fast",
                                 "--host", "h1", "--host", "h2", "--count", "auto"])
    assert given(args, Example) == {"port": 9, "rate": 2.0, "name": "x", "mode": "b", "fast": True,
                                    "hosts": ("h1", "h2"), "count": None}
    assert _parser().parse_args(["--no-fast"]).fast is False
    with pytest.raises(SystemExit):
        _parser().parse_args(["--mode", "c"])
    with pytest.raises(SystemExit):
        _parser().parse_args(["--hidden", "1"])


def test_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for expected in ("port to listen on (default 8000)", "a rate (default 0.5)", "a name (default none)",
                     "go fast (default False)", "(repeatable) (default none)", "a count (default auto)"):
        assert expected in text, expected


def test_present_defaults_and_borrowed_fields() -> None:
    assert _parser(absent=False).parse_args([]).port == 8000
    p = argparse.ArgumentParser()
    add_options(p, Borrower)
    assert Borrower().port == 8000 and given(p.parse_args(["--port", "1"]), Borrower) == {"port": 1}
