"""Command lines and their shared rules: entry points with --help, options generated from the training
config, one root exception and one error handler, bad options refused before any work."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import pkgutil
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from factories import make_checkpoint, make_separable_store, make_store

from specstore.common import SpecstoreError
from specstore.common.options import option_fields
from specstore.infer.cli import COMMANDS
from specstore.infer.cli import main as infer_main
from specstore.infer.options.run_options import RunOptions
from specstore.infer.train import TrainConfig, config_path_for, metrics_path_for
from specstore.infer.train.config import RUN_RECORDED

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("specstore.common", "specstore.store", "specstore.pipeline", "specstore.infer", "specstore.serving",
            "specstore.democorpus", "specstore.realcorpus")


def test_every_make_target_has_a_console_command_with_help() -> None:
    from specstore.cli import VERBS
    from specstore.cli import main as front_door

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["specstore"] == "specstore.cli:main"
    for command, (console, *_rest) in COMMANDS.items():  # each inference command is a verb of the front door
        assert console.split()[0] == "specstore" and console.split()[1] in VERBS, (command, console)
    assert set(VERBS) == {"features", "train", "cv", "infer", "eval", "plan", "init-model", "classify", "serve",
                          "export", "store", "demo-corpus", "realcorpus"}
    expected = {"specstore-features", "specstore-store", "specstore-demo-corpus", "specstore-infer",
                "specstore-plan", "specstore-init-model", "specstore-train", "specstore-eval"}
    assert expected <= set(scripts)  # the former commands stay, as aliases
    for name, target in scripts.items():
        module, func = target.split(":")
        entry = getattr(importlib.import_module(module), func)
        if name == "specstore":
            assert entry(["--help"]) == 0
            continue
        with pytest.raises(SystemExit) as done:
            entry(["--help"])
        assert done.value.code == 0, name
    for verb in VERBS:
        with pytest.raises(SystemExit) as done:
            front_door([verb, "--help"])
        assert done.value.code == 0, verb


@pytest.mark.parametrize("argv", [["-m", "specstore.infer", "--help"], ["-m", "specstore", "train", "--help"],
                                  ["-m", "specstore", "store", "--help"], ["-m", "specstore", "features", "--help"]])
@pytest.mark.slow
def test_python_dash_m_works(argv: list[str]) -> None:
    proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "usage:" in proc.stdout


def test_train_options_are_generated_from_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    """Adding a TrainConfig field is the one edit an option needs: the CLI lists every field, and every run
    setting a recipe records (from RunOptions' fields)."""
    with pytest.raises(SystemExit):
        infer_main(["train", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    run = [f for f in dataclasses.fields(RunOptions) if f.name in RUN_RECORDED]
    for f in [*option_fields(TrainConfig), *run]:
        flag = "--" + f.name.replace("_", "-")
        assert flag in help_text, flag
        assert " ".join(f.metadata["help"].split())[:30] in help_text, f.name


def test_make_variables_are_train_options() -> None:
    """Every option the Makefile's train target passes is one the train command generates from the config."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    every = ["CONFIG=c.toml", "EPOCHS=2", "ARCH=cnn", "MODEL_ARGS={}", "WIDTH=8", "CROP=5", "LR=0.01", "SEED=1",
             "VAL=0.2", "DEVICE=cpu", "PRECISION=fp32", "MAX_BATCH=4", "BUDGET_MB=64", "TRUST_MODEL_CODE=1",
             "OVERWRITE=1"]
    dry = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), "train", "STORE=s.zarr",
                          "MODEL=m.pt", *every, "VENV=/nonexistent"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    line = next(x for x in dry.stdout.splitlines() if " -m specstore train " in x)
    flags = set(re.findall(r"(--[a-z][a-z-]+)", line))
    known = {"--" + name.replace("_", "-") for name in (*(f.name for f in option_fields(TrainConfig)), *RUN_RECORDED)}
    known |= {"--config", "--overwrite", "--margin-mb", "--threads", "--no-progress", "--verbose",
              "--trust-model-code"}
    assert len(flags) == len(every) and flags <= known, sorted(flags - known)


def test_config_file_and_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = make_separable_store(tmp_path / "s.zarr", n=24)
    cfg = tmp_path / "train.toml"
    cfg.write_text('epochs = 1\nwidth = 4\ndepth = 2\ncrop_seconds = 0.5\nlr = 0.02\ndevice = "cpu"\n'
                   "val_fraction = 0.25\n", encoding="utf-8")
    model = tmp_path / "m.pt"
    assert infer_main(["train", str(store), str(model), "--config", str(cfg), "--width", "6", "--no-progress"]) == 0
    resolved = json.loads(config_path_for(model).read_text())["train_config"]
    assert resolved["width"] == 6 and resolved["depth"] == 2 and resolved["crop_seconds"] == 0.5  # CLI > file
    assert resolved["epochs"] == 1 and resolved["lr"] == 0.02
    rows = metrics_path_for(model).read_text().splitlines()
    assert rows[0].startswith("epoch,loss,train_accuracy,val_accuracy,val_f1") and len(rows) == 2
    bad = tmp_path / "bad.toml"
    bad.write_text("colour = 'red'\n", encoding="utf-8")
    capsys.readouterr()
    assert infer_main(["train", str(store), str(tmp_path / "m2.pt"), "--config", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specstore: error:") and "colour" in err and len(err.splitlines()) == 1


def _exception_classes() -> list[type[BaseException]]:
    """Every public exception class the packages define, found where it is defined (a private one, such as the
    clip cache's ``_BadEntry`` that its module turns into a cache miss, never reaches a caller)."""
    found: dict[str, type[BaseException]] = {}
    for name in PACKAGES:
        package = importlib.import_module(name)
        names = [name] + [i.name for i in pkgutil.walk_packages(package.__path__, prefix=f"{name}.")
                          if not i.name.endswith("__main__")]
        for module in map(importlib.import_module, names):
            for obj in vars(module).values():
                if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__
                        and not obj.__name__.startswith("_")):
                    found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return list(found.values())


def test_every_user_facing_error_derives_from_one_root() -> None:
    classes = _exception_classes()
    assert len(classes) >= 12
    stray = [c.__qualname__ for c in classes if not issubclass(c, SpecstoreError)]
    assert not stray, f"exceptions outside SpecstoreError: {stray}"


def test_every_error_class_is_defined_in_its_package_errors_module() -> None:
    """Each package gathers its error classes in one module, ``specstore.<package>.errors``; the modules that raise
    them import them from there, so the names they exported before still import."""
    classes = _exception_classes()
    assert {c.__module__ for c in classes} == {f"{name}.errors" for name in PACKAGES}
    elsewhere = [f"{c.__module__}.{c.__qualname__}" for c in classes
                 if c.__module__ != ".".join(c.__module__.split(".")[:2]) + ".errors"]
    assert not elsewhere, f"error classes outside their package's errors module: {elsewhere}"


@pytest.mark.parametrize("budget", ["inf", "nan", "-5", "0"])
def test_bad_budget_is_refused_before_work(budget: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = make_store(tmp_path / "s.zarr", lengths=[30, 40])
    ckpt = make_checkpoint(tmp_path / "m.pt")
    out = tmp_path / "p.csv"
    with pytest.raises(SystemExit) as done:  # refused as the command line is parsed
        infer_main(["predict", str(store), str(ckpt), "--out", str(out), "--budget-mb", budget, "--no-progress"])
    assert done.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "BUDGET_MB" in err and err.startswith("specstore: error:")
    assert not out.exists()


def test_output_that_is_a_directory_or_under_a_file_fails_first(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    store = make_store(tmp_path / "s.zarr", lengths=[30, 40])
    ckpt = make_checkpoint(tmp_path / "m.pt")
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("x")
    for out, words in ((tmp_path / "adir", "is a directory"), (tmp_path / "afile" / "p.csv", "which is a file")):
        assert infer_main(["predict", str(store), str(ckpt), "--out", str(out), "--no-progress"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err and str(out) in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir", "afile", "m.pt", "s.zarr"]  # no stray temp file
    assert not list((tmp_path / "adir").iterdir())


def test_cli_error_prefix_is_shared(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specstore.pipeline.cli import main as features_main
    from specstore.store.__main__ import main as store_main

    missing = str(tmp_path / "nowhere.zarr")
    assert store_main(["info", missing]) == 2
    assert infer_main(["plan", missing]) == 2
    assert features_main([str(tmp_path / "no-corpus"), missing, "--no-progress"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("specstore: error: ") for line in lines), lines


def test_every_command_that_runs_a_model_offers_the_same_run_options() -> None:
    """``predict``, ``plan``, ``eval``, ``classify`` and ``serve`` take their run options from one generator
    (RunOptions' fields): the same flags, defaults and help; ``train`` and ``cv`` take this machine's only."""
    import argparse

    from specstore.infer.cli import build_parser as infer_parser
    from specstore.infer.options.run_args import COMMAND_FIELDS, MACHINE_FIELDS
    from specstore.serving.cli import build_parser as serving_parser

    def run_flags(parser: argparse.ArgumentParser, command: str) -> dict[str, tuple[object, str | None]]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
        run = {f.name for f in dataclasses.fields(RunOptions)}
        return {a.dest: (a.default, a.help) for a in sub._actions if a.dest in run}

    every = {c: run_flags(infer_parser(), c) for c in ("predict", "plan", "eval")}
    every |= {c: run_flags(serving_parser(), c) for c in ("classify", "serve")}
    assert all(list(flags) == list(COMMAND_FIELDS) for flags in every.values()), every
    assert len({tuple(flags.items()) for flags in every.values()}) == 1  # the same defaults and help everywhere
    assert all(default == argparse.SUPPRESS for default, _ in every["predict"].values())  # RunOptions decides
    for command in ("train", "cv"):
        assert set(run_flags(infer_parser(), command)) == {*RUN_RECORDED, *MACHINE_FIELDS}  # the rest: the recipe's
