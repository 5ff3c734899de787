"""Every numeric option of every command has bounds, NaN and infinity included, checked as it is parsed.

The commands are found, not listed: every console script of ``pyproject.toml``
and every ``python -m`` package entry is run up to the moment it parses its
command line, and the parser it built is taken from there.  Every option of
it (and of its sub-commands) whose value parses as a number is fed ``nan``,
``inf``, ``1e30`` (for an integer also a 31-digit one) and their negatives:
each must be refused in one line naming the option, with exit status 2 and no
traceback.  Two commands are also run as a user runs them, to show that the
refusal comes before torch or librosa is imported.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import subprocess
import sys
import tomllib
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SCRIPTS: dict[str, str] = PROJECT["project"]["scripts"]
PACKAGES = sorted(f"specstore.{p.parent.name}" for p in (ROOT / "specstore").glob("*/__main__.py"))
"""The distribution's packages with a ``__main__.py``: ``python -m`` commands."""

BAD = ("nan", "inf", "-inf", "1e30", "-1e30")
"""What every numeric option refuses."""
HUGE = ("1" + "0" * 30, "-1" + "0" * 30)
"""What an integer option refuses too (``1e30`` is not an integer's spelling, so it proves no upper bound)."""
PROBES = ("1", "2", "0.5", "16", "1000", "44100")
"""Values one of which any numeric option accepts: how a numeric option is told from the others."""


class _Built(Exception):
    """Raised in place of parsing: carries the parser a command built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__(parser.prog)
        self.parser = parser


def _parser_of(run: Callable[[], Any]) -> argparse.ArgumentParser:
    """The parser ``run`` (a command's entry point) builds, taken when it starts parsing."""
    def grab(self: argparse.ArgumentParser, *_args: Any, **_kwargs: Any) -> Any:
        raise _Built(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = grab  # type: ignore[method-assign]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the __main__ module was imported before
            run()
    except _Built as built:
        return built.parser
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    raise AssertionError(f"{run} parsed no command line")


def _entries() -> dict[str, Callable[[], Any]]:
    """Every command: the console scripts, and ``python -m PACKAGE`` for each package with a ``__main__``."""
    import importlib

    def script(target: str) -> Callable[[], Any]:
        module, function = target.split(":")
        return lambda: getattr(importlib.import_module(module), function)([])

    def dash_m(package: str) -> Callable[[], Any]:
        def run() -> None:
            argv = sys.argv
            sys.argv = [f"python -m {package}"]
            try:
                runpy.run_module(package, run_name="__main__", alter_sys=False)
            finally:
                sys.argv = argv
        return run

    def verb(name: str) -> Callable[[], Any]:
        from specstore.cli import main
        return lambda: main([name])

    from specstore.cli import VERBS

    entries = {name: script(target) for name, target in SCRIPTS.items() if target != "specstore.cli:main"}
    entries.update({f"specstore {name}": verb(name) for name in VERBS})  # the front door's verbs
    entries.update({f"python -m {p}": dash_m(p) for p in PACKAGES})
    return entries


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """``parser`` and every sub-command's parser, each with the words that reach it."""
    yield words, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _leaves(sub, (*words, name))


def _numeric(action: argparse.Action) -> bool:
    """Whether ``action`` is an option that takes a number: its type reads one of :data:`PROBES` as one."""
    if not action.option_strings or action.nargs == 0 or action.type is None:
        return False
    for text in PROBES:
        try:
            value = action.type(text)  # type: ignore[operator]
        except (ValueError, TypeError, argparse.ArgumentTypeError):
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
    return False


def _filler(parser: argparse.ArgumentParser) -> list[str]:
    """Words that satisfy ``parser``'s required arguments (positionals and required options)."""
    words: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if not action.option_strings and action.nargs not in ("*", "?"):
            words += ["x"] * (action.nargs if isinstance(action.nargs, int) else 1)
        elif action.option_strings and action.required:
            words += [action.option_strings[-1], "x"]
    return words


Case = tuple[str, tuple[str, ...], str]
"""(command, the words that reach the sub-command, the option's long flag)."""


@pytest.fixture(scope="module")
def walk() -> dict[Case, tuple[argparse.ArgumentParser, list[str], argparse.Action]]:
    """Every numeric option of every command: its root parser, the words before it, and the option."""
    found = {}
    for command, run in _entries().items():
        root = _parser_of(run)
        for words, parser in _leaves(root):
            for action in parser._actions:
                if _numeric(action):
                    flag = max(action.option_strings, key=len)
                    found[(command, words, flag)] = (root, [*words, *_filler(parser)], action)
    return found


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[int | str | None, str]:
    """Parse ``argv`` in this process: the exit status (None when it parsed) and what went to stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as e:
            return e.code, err.getvalue()
    return None, err.getvalue()


def test_the_walk_finds_every_command_and_their_numeric_options(walk: dict[Case, Any]) -> None:
    commands = {command for command, _, _ in walk}
    no_number = {"specstore-store", "specstore store", "python -m specstore.store"}  # those take no number
    assert commands == set(_entries()) - no_number
    assert {"python -m specstore.infer", "python -m specstore.serving", "python -m specstore.democorpus",
            "python -m specstore.realcorpus", "specstore features", "specstore train", "specstore serve"} <= commands
    flags = {flag for _, _, flag in walk}
    assert {"--block-seconds", "--jobs", "--commit-seconds", "--sample-rate", "--fmax", "--n-mels", "--budget-mb",
            "--epochs", "--lr", "--topk", "--top", "--folds", "--seed", "--per-style", "--max-seconds",
            "--train-clips", "--max-file-mb", "--port", "--batch-overhead-frames", "--unknown-below"} <= flags
    assert {words for command, words, _ in walk if command == "python -m specstore.serving"} == {("classify",),
                                                                                                 ("serve",)}
    assert {words for command, words, _ in walk if command == "python -m specstore.infer"} == {
        (c,) for c in ("predict", "plan", "init", "train", "cv", "eval")}


def test_every_numeric_option_refuses_nan_infinity_and_huge_values(walk: dict[Case, Any]) -> None:
    """One line naming the option, exit status 2, no traceback: for every numeric option and every bad value."""
    failures = []
    for (command, words, flag), (parser, before, action) in sorted(walk.items(), key=lambda kv: kv[0]):
        integer = all(_is_int(action, text) for text in PROBES if _reads(action, text))
        for value in BAD + (HUGE if integer else ()):
            status, err = _parse(parser, [*before, f"{flag}={value}"])
            lines = [x for x in err.splitlines() if x.strip()]
            errors = [x for x in lines if "error:" in x]
            refused = (status == 2 and "Traceback" not in err and len(errors) == 1 and lines[-1] == errors[0]
                       and flag in errors[0])
            if not refused:
                failures.append(f"{command} {' '.join(words)} {flag}={value}: "
                                + ("accepted" if status is None else f"status {status}: {err.strip()[-300:]}"))
    assert not failures, f"{len(failures)} values not refused in one line:\n" + "\n".join(failures)


def test_a_bounded_option_still_takes_its_default(walk: dict[Case, Any]) -> None:
    """The bounds leave room for what the commands do by default (where the parser holds the default)."""
    for (command, _words, flag), (parser, before, action) in walk.items():
        default = action.default
        if isinstance(default, (int, float)) and not isinstance(default, bool):
            status, err = _parse(parser, [*before, f"{flag}={default!r}"])
            assert status is None, (command, flag, default, err)


def _reads(action: argparse.Action, text: str) -> bool:
    try:
        value = action.type(text)  # type: ignore[operator]
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_int(action: argparse.Action, text: str) -> bool:
    return isinstance(action.type(text), int)  # type: ignore[operator]


RUNNER = """\
import atexit, json, os, sys
atexit.register(lambda: open(os.environ["OPTION_BOUNDS_MODULES"], "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = {name!r}
from {module} import {function} as entry
sys.exit(entry())
"""


@pytest.mark.parametrize("name, args, flag", [
    ("specstore-features", ["no-corpus", "s.zarr", "--fmax", "nan"], "--fmax"),
    ("specstore-train", ["s.zarr", "m.pt", "--epochs", "1" + "0" * 30], "--epochs"),
])
def test_a_command_refuses_in_one_line_before_the_heavy_stack(name: str, args: list[str], flag: str,
                                                              tmp_path: Path) -> None:
    module, function = SCRIPTS[name].split(":")
    record = tmp_path / "modules.json"
    env = {**os.environ, "OPTION_BOUNDS_MODULES": str(record), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(name=name, module=module, function=function), *args],
                          capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path, env=env)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("specstore: error: "), proc.stderr
    assert flag in lines[0] and "must be" in lines[0], lines[0]
    modules = {m.split(".")[0] for m in json.loads(record.read_text())}
    assert not {"torch", "librosa"} & modules
