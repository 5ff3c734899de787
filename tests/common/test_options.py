"""The option generator (common/options.py): one dataclass field is one option, its default, type and help."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import pytest

from specstore.common.options import add_options, borrowed, given, option


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


def _refusal(parser: argparse.ArgumentParser, argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line that refuses ``argv`` as it is parsed (exit status 2, no usage above it)."""
    with pytest.raises(SystemExit) as done:
        parser.parse_args(argv)
    err = capsys.readouterr().err
    assert done.value.code == 2 and len(err.splitlines()) == 1 and err.startswith("specstore: error: "), err
    return err.strip().removeprefix("specstore: error: ")


def test_a_bounded_field_is_checked_as_the_command_line_is_parsed(capsys: pytest.CaptureFixture[str]) -> None:
    """Its refusal is the one line the dataclass would raise, naming the flag too; NaN, infinities, huge values
    and text that is no number (``1e30`` for an integer) alike."""
    from specstore.common.limits import bounded
    from specstore.common.options import described

    @dataclass(frozen=True)
    class Bounded:
        jobs: int = described(bounded(1, 1, 64, "processes"), "worker processes")
        rate: float | None = described(bounded(None, 0.0, 10.0, "a rate", kind=float, low_open=True, optional=True,
                                               spelled="RATE"), "a rate", parse=lambda t: None if t == "auto" else
                                       float(t))

    p = argparse.ArgumentParser()
    add_options(p, Bounded)
    assert given(p.parse_args(["--jobs", "64", "--rate", "auto"]), Bounded) == {"jobs": 64, "rate": None}
    assert p.parse_args(["--rate", "10"]).rate == 10.0
    for value in ("65", "0", "1e30", "nan", "1" + "0" * 30, "x"):
        assert _refusal(p, ["--jobs", value], capsys).startswith("jobs (--jobs) must be an integer in [1, 64], got ")
    for value in ("nan", "inf", "-inf", "1e30", "0", "-1"):
        line = _refusal(p, [f"--rate={value}"], capsys)
        assert line.startswith("rate (RATE, --rate) must be a finite number in (0, 10] (or unset), got "), line
        assert line.endswith("(a rate)"), line


def test_a_hand_written_option_gets_the_same_check(capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.common.limits import Limit
    from specstore.common.options import bounded_argument

    p = argparse.ArgumentParser()
    bounded_argument(p, "--jobs", "-j", limit=Limit(1, 8, "processes", optional=True), default=None)
    bounded_argument(p, "--seconds", limit=Limit(0.0, 60.0, "seconds", kind=float, low_open=True), default=5.0)
    assert vars(p.parse_args([])) == {"jobs": None, "seconds": 5.0}
    assert vars(p.parse_args(["-j", "8", "--seconds", "60"])) == {"jobs": 8, "seconds": 60.0}
    assert _refusal(p, ["-j", "9"], capsys) == "--jobs must be an integer in [1, 8] (or unset), got 9 (processes)"
    assert _refusal(p, ["--seconds", "nan"], capsys) == ("--seconds must be a finite number in (0, 60], got nan "
                                                         "(seconds)")


def test_a_limit_the_generator_cannot_check_is_refused_when_the_options_are_made() -> None:
    from specstore.common.limits import bounded
    from specstore.common.options import described

    @dataclass(frozen=True)
    class Switch:
        on: bool = described(bounded(False, 0, 1, "a switch", kind=int), "a switch")

    with pytest.raises(TypeError, match="not checked"):
        add_options(argparse.ArgumentParser(), Switch)
