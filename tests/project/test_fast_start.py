"""Commands that answer at once: ``--help``, usage errors and path checks before torch.

Every console command of ``pyproject.toml`` is run as a user runs it, in a
fresh interpreter, and its imports are read back at exit: ``--help`` (exit
0), a usage error (exit 2, one ``error:`` line) and a missing store, corpus
or checkpoint (exit 2, one ``specstore: error:`` line) must not import
torch or librosa (nor, for ``--help``, zarr).  Under load those imports
took minutes before the command said anything.  The lazy packages
(:mod:`specstore.common.lazy`) that make this possible are checked too: what each
exports lazily is what its ``if TYPE_CHECKING:`` imports tell type checkers,
and every name resolves to that object.  How long the commands take is a
benchmark row (``python -m benchmarks --only startup``).
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from factories import make_store

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
HEAVY = ("torch", "librosa")
"""What no --help, usage error or path check may import (seconds quiet, minutes under load)."""

RUNNER = """\
import atexit, json, os, sys
atexit.register(lambda: open(os.environ["FAST_START_MODULES"], "w").write(json.dumps(sorted(sys.modules))))
sys.argv[0] = {name!r}
from {module} import {function} as entry
sys.exit(entry())
"""
"""A console command as its installed script runs it (``entry()`` with ``sys.argv``), recording the modules
loaded when the interpreter exits."""


def run_command(name: str, args: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    """Run console command ``name`` with ``args`` in a fresh interpreter; its result and top-level modules."""
    module, function = SCRIPTS[name].split(":")
    record = tmp_path / f"modules-{os.getpid()}-{len(list(tmp_path.iterdir()))}.json"
    env = {**os.environ, "FAST_START_MODULES": str(record), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", RUNNER.format(name=name, module=module, function=function), *args],
                          capture_output=True, text=True, timeout=300, check=False, cwd=ROOT, env=env)
    modules = {m.split(".")[0] for m in json.loads(record.read_text())} if record.exists() else set()
    return proc, modules


def test_every_console_command_is_covered() -> None:
    """A new console command must say here which path it checks (or that it reads none)."""
    assert set(SCRIPTS) == set(MISSING_PATHS) | NO_INPUT_PATHS and not set(MISSING_PATHS) & NO_INPUT_PATHS


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_answers_before_the_heavy_stack(name: str, tmp_path: Path) -> None:
    proc, modules = run_command(name, ["--help"], tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr[-2000:]
    assert not {*HEAVY, "zarr"} & modules, sorted({*HEAVY, "zarr"} & modules)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_a_usage_error_is_one_line_before_the_heavy_stack(name: str, tmp_path: Path) -> None:
    proc, modules = run_command(name, ["--no-such-option"], tmp_path)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == 2 and len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """``STORE``: a real store; ``NOSTORE``, ``NOCORPUS``, ``NOMODEL``: paths that do not exist; ``OUT``: a
    writable folder."""
    root = tmp_path_factory.mktemp("fast-start")
    make_store(root / "s.zarr", lengths=[12, 20, 16])
    return {"STORE": str(root / "s.zarr"), "NOSTORE": str(root / "none.zarr"), "NOCORPUS": str(root / "no-corpus"),
            "NOMODEL": str(root / "none.pt"), "OUT": str(root / "out")}


MISSING_PATHS: dict[str, list[tuple[list[str], str]]] = {
    "specstore": [(["classify", "x.wav", "--model", "NOMODEL"], "no checkpoint at NOMODEL")],
    "specstore-features": [(["NOCORPUS", "OUT/s.zarr"], "corpus NOCORPUS does not exist")],
    "specstore-store": [(["info", "NOSTORE"], "no store at NOSTORE"), (["repair", "NOSTORE"], "no store at NOSTORE")],
    "specstore-infer": [(["NOSTORE", "NOMODEL"], "no store at NOSTORE"),
                        (["STORE", "NOMODEL"], "no checkpoint at NOMODEL")],
    "specstore-plan": [(["NOSTORE"], "no store at NOSTORE"), (["STORE", "--model", "NOMODEL"], "no checkpoint at")],
    "specstore-init-model": [(["NOSTORE", "OUT/m.pt"], "no store at NOSTORE")],
    "specstore-train": [(["NOSTORE", "OUT/m.pt"], "no store at NOSTORE")],
    "specstore-eval": [(["NOSTORE", "NOMODEL"], "no store at NOSTORE"),
                       (["STORE", "NOMODEL"], "no checkpoint at NOMODEL"),
                       (["STORE", "STORE/zarr.json", "--baseline-store", "NOSTORE"], "no store at NOSTORE")],
    "specstore-cv": [(["NOSTORE", "--out-dir", "OUT/cv"], "no store at NOSTORE")],
}
"""Command -> (arguments naming a missing path, what its one error line says); names in capitals are
:func:`paths`'."""
NO_INPUT_PATHS = {"specstore-demo-corpus", "specstore-realcorpus"}
"""Commands that read no store, corpus or checkpoint (they write a corpus)."""

BAD_VALUES: list[tuple[str, list[str], str]] = [
    ("specstore-infer", ["STORE", "NOMODEL", "--budget-mb", "nan"], "budget_mb (BUDGET_MB, --budget-mb) must be"),
    ("specstore-eval", ["STORE", "NOMODEL", "--margin-mb", "-1"], "margin_mb (--margin-mb) must be"),
    ("specstore-plan", ["STORE", "--max-batch", "0"], "max_batch (MAX_BATCH, --max-batch) must be"),
    ("specstore-train", ["STORE", "OUT/m.pt", "--epochs", "0"], "epochs (--epochs) must be an integer in"),
    ("specstore-train", ["STORE", "OUT/m.pt", "--width", "100000"], "width (--width) must be an integer in"),
    ("specstore-cv", ["STORE", "--threads", "100000"], "threads (--threads) must be an integer in"),
]
"""Option values refused before anything is read: (command, arguments, the start of the message)."""


def _filled(text: str, paths: dict[str, str]) -> str:
    for key in sorted(paths, key=len, reverse=True):
        text = text.replace(key, paths[key])
    return text


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("specstore: error: "), proc.stderr
    return lines[0]


@pytest.mark.parametrize("name, args, expected", [(name, args, expected) for name, cases in MISSING_PATHS.items()
                                                  for args, expected in cases])
def test_a_missing_path_is_one_line_before_the_heavy_stack(name: str, args: list[str], expected: str,
                                                           paths: dict[str, str], tmp_path: Path) -> None:
    proc, modules = run_command(name, [_filled(a, paths) for a in args], tmp_path)
    assert _filled(expected, paths) in _one_error_line(proc)
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)


@pytest.mark.parametrize("name, args, expected", BAD_VALUES)
def test_a_bad_option_value_is_one_line_before_the_heavy_stack(name: str, args: list[str], expected: str,
                                                               paths: dict[str, str], tmp_path: Path) -> None:
    proc, modules = run_command(name, [_filled(a, paths) for a in args], tmp_path)
    assert _one_error_line(proc).removeprefix("specstore: error: ").startswith(expected)
    assert not set(HEAVY) & modules, sorted(set(HEAVY) & modules)


@pytest.mark.parametrize("args", [["specstore", "--help"], ["specstore", "train", "--help"],
                                  ["specstore", "features", "--help"], ["specstore", "store", "--help"],
                                  ["specstore", "classify", "--help"], ["specstore.infer", "--help"]])
def test_python_dash_m_help_answers_before_the_heavy_stack(args: list[str], tmp_path: Path) -> None:
    """The ``python -m`` spellings the docs and the Makefile use: the same parsers, the same promise."""
    record = tmp_path / "modules.json"
    code = ("import atexit, json, os, runpy, sys; atexit.register(lambda: open(os.environ['FAST_START_MODULES'], "
            "'w').write(json.dumps(sorted(sys.modules)))); sys.argv = sys.argv[1:]; "
            "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          check=False, cwd=ROOT, env={**os.environ, "FAST_START_MODULES": str(record),
                                                      "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0 and proc.stdout.startswith("usage:"), proc.stderr[-2000:]
    loaded = {m.split(".")[0] for m in json.loads(record.read_text())}
    assert not {*HEAVY, "zarr"} & loaded, sorted({*HEAVY, "zarr"} & loaded)


def test_importing_the_packages_costs_none_of_the_heavy_stack(tmp_path: Path) -> None:
    code = ("import json, sys; import specstore, specstore.store, specstore.pipeline, specstore.infer, "
            "specstore.infer.train, specstore.serving; "
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    loaded = set(json.loads(proc.stdout))
    assert not {*HEAVY, "zarr", "numpy"} & loaded, sorted({*HEAVY, "zarr", "numpy"} & loaded)


# -- the lazy packages ---------------------------------------------------------------------------------

LAZY_PACKAGES = ("specstore", "specstore.common", "specstore.store", "specstore.infer", "specstore.infer.train",
                 "specstore.infer.models", "specstore.pipeline")


def _declared(package: str) -> dict[str, set[str]]:
    """A lazy package's exports as its ``if TYPE_CHECKING:`` imports name them (read here from the source, as
    type checkers read it): module (relative, with its leading dots) -> names.  Its one list of exports."""
    path = ROOT.joinpath(*package.split("."), "__init__.py")
    typed: dict[str, set[str]] = {}
    calls = 0
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_package":
            calls += 1
            assert len(node.args) == 1 and not node.keywords, "the exports are listed once, in TYPE_CHECKING"
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.level, ast.dump(stmt)
                typed["." * stmt.level + (stmt.module or "")] = {alias.name for alias in stmt.names}
    assert calls == 1
    return typed


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_package_exports_what_type_checkers_see(package: str) -> None:
    typed = _declared(package)
    assert typed
    importlib.import_module(package)
    module = sys.modules[package]  # (the attribute infer.train is the function train, not the package)
    assert sorted(module.__all__) == sorted(name for names in typed.values() for name in names)
    for where, names in typed.items():
        home = importlib.import_module(where, package)
        for name in names:
            assert getattr(module, name) is getattr(home, name), f"{package}.{name}"
            assert name in dir(module)


def test_a_function_named_like_its_module_stays_the_function() -> None:
    """``specstore.infer.train``, ``specstore.infer.evaluation.evaluate``, ``specstore.pipeline.extract``,
    ``specstore.store.validate``: the exported function, after its module is imported too, as an eager ``from .train
    import train`` left it."""
    from specstore import infer, pipeline, store

    for package, module in ((infer, "train"), (infer, "evaluation.evaluate"), (infer, "engine.predict"),
                            (pipeline, "extract"), (store, "validate")):
        importlib.import_module(f"{package.__name__}.{module}")
        name = module.rsplit(".", 1)[-1]
        assert callable(getattr(package, name)) and not isinstance(getattr(package, name), type(infer)), name


def test_the_light_homes_agree_with_the_heavy_modules() -> None:
    """What moved out of torch modules for the command lines is the same object where it used to be."""
    defaults, evaluate, model_config, models, run_options, runtime, split = (
        importlib.import_module(f"specstore.infer.{name}")  # (the attribute infer.evaluate is the function evaluate)
        for name in ("options.defaults", "evaluation.evaluate", "models.config", "models", "options.run_options",
                     "engine.runtime", "data.split"))

    assert defaults.EVAL_SPLITS == ("auto", *split.SPLITS)
    assert evaluate.EVAL_SPLITS is defaults.EVAL_SPLITS
    for name in model_config.__all__:
        assert getattr(models, name) is getattr(model_config, name), name
    assert runtime.RunOptions is run_options.RunOptions and runtime.check_run_option is run_options.check_run_option


def test_the_options_room_imports_no_torch() -> None:
    """``specstore.infer.options`` is the torch-free room: every command line is generated from it, so ``--help`` and
    a bad value answer before torch is imported."""
    code = ("import pkgutil, importlib, sys, specstore.infer.options as room; "
            "[importlib.import_module(m.name) for m in pkgutil.walk_packages(room.__path__, room.__name__ + '.')]; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'librosa', 'zarr'}))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True,
                          cwd=ROOT)
    assert proc.stdout.strip() == "[]", proc.stdout
