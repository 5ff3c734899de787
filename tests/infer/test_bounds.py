"""Bounds on everything a file or an option can ask of the inference side.

A checkpoint's model config is checked against the bounds beside each field
of :class:`~specstore.infer.models.ModelConfig` (and a parameter count computed from
it) when it is read, before any tensor is allocated; the run options
(:class:`~specstore.infer.engine.runtime.RunOptions`: budget, margin, batch size, threads)
are checked when they are made; :meth:`Budget.max_window` ends for any
budget.  Every refusal is one line and exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from factories import make_checkpoint, make_store

from specstore.common import ConfigError
from specstore.infer.batching.budget import Budget, PlanError
from specstore.infer.cli import _run_options, build_parser
from specstore.infer.cli import main as infer_main
from specstore.infer.engine.runtime import RunOptions
from specstore.infer.models import MaskedClassifier, ModelConfig, ModelConfigError, build_model
from specstore.infer.models.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    save_torch_file,
)
from specstore.infer.models.contract import ModelSpec
from specstore.infer.options.defaults import PLAIN_MODEL
from specstore.infer.train import TrainConfig, TrainError

# (names new with the bounds are imported inside the tests, so this file also runs, and fails, on the code
# before them)
ROOT = Path(__file__).resolve().parents[2]
TIB = 2**40
"""1 TiB, the largest budget the commands take (infer.defaults.MAX_BUDGET_MB MiB)."""
CORES = len(os.sched_getaffinity(0))
"""The cores this process may use: the most --threads may ask for."""


def _run(*args: str, timeout: float = 120, prelude: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m specstore.infer ARGS`` in a fresh process (``prelude``: Python run first, e.g. a memory limit)."""
    code = prelude + "\nimport sys\nfrom specstore.infer.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def _one_line(stderr: str) -> str:
    """The one error line of a refused command (warnings of libraries aside, nothing else on stderr)."""
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("specstore: error: "), stderr
    return lines[0]


def _status(main: Callable[[list[str]], int], argv: list[str]) -> int | str | None:
    """``main(argv)``'s exit status: returned, or the parse's own exit (an option refused as it is parsed)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def _big_checkpoint(tmp_path: Path, *, version: int = 2, **config: int) -> Path:
    """A real checkpoint of a small model whose recorded config then asks for ``config`` (e.g. width 60000)."""
    small = load_checkpoint(make_checkpoint(tmp_path / "small.pt"))
    path = tmp_path / "big.pt"
    kwargs = {**small.model.kwargs, **config}
    if version == 2:
        save_checkpoint(Checkpoint(ModelSpec(small.model.target, kwargs), small.label_names, small.feature,
                                   small.specs, small.state_dict), path)
    else:  # the first format: the built-in model's config itself
        save_torch_file({"format": "specstore-checkpoint", "version": 1, "model": {"arch": "cnn", **kwargs},
                         "label_names": small.label_names, "feature": small.feature,
                         "feature_spec": small.spec.to_dict(), "state_dict": small.state_dict}, path)
    return path


# --- finding 5: a checkpoint cannot demand any allocation ------------------------------------------------


def _bounded_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(ModelConfig) if "limit" in f.metadata]


def _numeric_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(ModelConfig) if f.type in ("int", "float")]


def test_every_number_of_the_model_config_is_bounded_with_a_reason() -> None:
    numeric = _numeric_fields()
    bounded = [f.name for f in _bounded_fields()]
    assert numeric and bounded == numeric
    for f in _bounded_fields():
        limit = f.metadata["limit"]
        assert math.isfinite(limit.low) and math.isfinite(limit.upper) and limit.low < limit.upper, f.name
        assert len(limit.why) > 10, f.name
        assert limit.allows(getattr(ModelConfig(), f.name)), f.name  # the default lies within


@pytest.mark.parametrize("name", _numeric_fields())
def test_a_value_beyond_a_bound_is_refused_naming_field_value_and_bound(name: str) -> None:
    limit = ModelConfig.__dataclass_fields__[name].metadata.get("limit")
    assert limit is not None, f"{name} has no bound"
    step = 2 if limit.odd else 1
    above = int(limit.upper) + step if limit.kind is int else limit.upper * 2 + 1
    below = int(limit.low) - step if limit.kind is int else limit.low - abs(limit.low) - 1
    bound = str(int(limit.upper)) if float(limit.upper).is_integer() else f"{limit.upper:g}"
    for bad in (above, below):
        rule = rf"^{name} must be .*{re.escape(bound)}.*got {re.escape(repr(bad))}"
        with pytest.raises(ModelConfigError, match=rule):
            ModelConfig(**{name: bad})
    if limit.kind is float:
        for bad in (math.nan, math.inf, -math.inf):
            with pytest.raises(ModelConfigError, match=name):
                ModelConfig(**{name: bad})


def test_per_bin_normalisation_and_switches_are_checked_too() -> None:
    with pytest.raises(ModelConfigError, match=r"bin_std\[3\] must be .*\(0, 1000\]"):
        ModelConfig(n_bins=4, bin_mean=[0.0] * 4, bin_std=[1.0, 1.0, 1.0, 0.0])
    with pytest.raises(ModelConfigError, match=r"bin_mean\[0\] must be"):
        ModelConfig(n_bins=2, bin_mean=[math.nan, 0.0], bin_std=[1.0, 1.0])
    with pytest.raises(ModelConfigError, match="time_pool must be true or false"):
        ModelConfig(time_pool="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("config", [
    dict(arch="cnn"), dict(arch="resnet"),
    dict(arch="cnn", pooling="meanstd", freq_pooling="keep", stem_freq_kernel=13, time_kernel=5, stats_head=True),
    dict(arch="resnet", pooling="attention", freq_pooling="keep", blocks_per_stage=3, max_width=24,
         input_time_pool=2, stats_head=True),
    dict(arch="resnet", width=8, max_width=8, depth=2, blocks_per_stage=1, time_pool=False, time_kernel=1),
])
def test_parameters_and_stride_are_counted_from_the_config_exactly(config: dict) -> None:
    c = ModelConfig(n_bins=20, n_classes=7, width=config.pop("width", 6), depth=config.pop("depth", 3),
                    **{**PLAIN_MODEL, **config})
    model = build_model(c)
    assert c.n_parameters == sum(p.numel() for p in model.parameters())
    assert c.time_stride == model.time_stride


def test_a_config_over_the_parameter_budget_is_refused_before_anything_is_built(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from specstore.infer.models import MAX_PARAMETERS

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a model was built")

    monkeypatch.setattr(MaskedClassifier, "__init__", never)
    # every field within its bound, the whole far beyond: 16 stages of 4096 channels, 255-frame kernels
    with pytest.raises(ModelConfigError, match=rf"parameters, above the bound of {MAX_PARAMETERS:,}"):
        ModelConfig(arch="resnet", width=4096, max_width=4096, depth=8, time_kernel=255)
    with pytest.raises(ModelConfigError, match="time stride"):
        ModelConfig(depth=16, input_time_pool=2)


@pytest.mark.parametrize("version", [1, 2])
def test_a_checkpoint_out_of_bounds_is_refused_on_load_before_building(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int) -> None:
    path = _big_checkpoint(tmp_path, version=version, width=60000, max_width=60000)

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a model was built")

    monkeypatch.setattr(MaskedClassifier, "__init__", never)
    with pytest.raises(CheckpointError, match=r"bad cnn model config: width must be an integer in \[1, 4096\], "
                                              r"got 60000"):
        load_checkpoint(path)


def test_width_60000_through_predict_is_one_line_and_no_allocation(tmp_path: Path) -> None:
    """Before: a 129.6 GB request reached the allocator (39-line traceback, status 1).  The command runs under an
    address-space limit 2 GiB above what the imports took, so a regression fails here instead of allocating.
    torch is imported before the limit is measured: a CUDA build maps GBs of libraries when it loads."""
    store = make_store(tmp_path / "s.zarr", lengths=[40] * 4)
    path = _big_checkpoint(tmp_path, width=60000, max_width=60000)
    limit = textwrap.dedent("""
        import resource
        import torch
        import specstore.infer.cli
        size = next(int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmSize:"))
        resource.setrlimit(resource.RLIMIT_AS, (size + (2 << 30), size + (2 << 30)))
    """) if Path("/proc/self/status").exists() else ""
    done = _run("predict", str(store), str(path), "--out", str(tmp_path / "p.csv"), "--device", "cpu",
                "--threads", "1", "--no-progress", prelude=limit)
    line = _one_line(done.stderr)
    assert done.returncode == 2
    assert "width" in line and "60000" in line and "4096" in line
    assert not (tmp_path / "p.csv").exists()


def test_training_options_that_become_the_model_config_are_checked_up_front() -> None:
    with pytest.raises(TrainError, match=r"width must be an integer in \[1, 4096\], got 60000"):
        TrainConfig(width=60000)
    with pytest.raises(TrainError, match="dropout"):
        TrainConfig(dropout=math.nan)
    with pytest.raises(TrainError, match="depth"):
        TrainConfig(depth=40)
    TrainConfig(arch="tests.user_models:Tiny", width=0)  # a user model's width is its own business


# --- finding 10: option values ------------------------------------------------------------------------


def test_threads_up_to_the_cores_this_process_may_use() -> None:
    from specstore.common.limits import usable_cores

    assert usable_cores() == CORES
    assert RunOptions(threads=CORES).threads == CORES
    for bad in (0, -1, CORES + 1, 100_000):
        with pytest.raises(ConfigError, match=rf"threads \(--threads\) must be an integer in \[1, {CORES}\]"):
            RunOptions(threads=bad)


def test_threads_100000_is_one_line_not_a_crash(tmp_path: Path) -> None:
    """Before: status 139 (a segfault starting 100 000 OpenMP threads), no message."""
    store = make_store(tmp_path / "s.zarr", lengths=[40] * 4)
    model = make_checkpoint(tmp_path / "m.pt")
    done = _run("predict", str(store), str(model), "--out", str(tmp_path / "p.csv"), "--device", "cpu",
                "--no-progress", "--threads", "100000")
    assert done.returncode == 2, done.stderr[-2000:]
    line = _one_line(done.stderr)
    assert "threads" in line and "100000" in line and f"[1, {CORES}]" in line


def test_training_threads_are_checked_before_the_store_is_read(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    for command in (["train", str(tmp_path / "none.zarr"), str(tmp_path / "m.pt")],
                    ["cv", str(tmp_path / "none.zarr"), "--out-dir", str(tmp_path / "cv")]):
        assert _status(infer_main, [*command, "--threads", str(CORES + 1)]) == 2
        assert "threads (--threads) must be" in _one_line(capsys.readouterr().err)


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Fail (TimeoutError) instead of hanging when the block runs past ``seconds`` (SIGALRM; pure-Python loops
    see it between bytecodes)."""
    def expire(_signum: int, _frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_budget_1e30_is_one_line_not_a_hang(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Before: ``Budget.max_window`` never returned (adding a frame did not change the float product)."""
    store = make_store(tmp_path / "s.zarr", lengths=[40] * 4)
    model = make_checkpoint(tmp_path / "m.pt")
    with _deadline(30):
        rc = _status(infer_main, ["predict", str(store), str(model), "--out", str(tmp_path / "p.csv"), "--device",
                                  "cpu", "--no-progress", "--budget-mb", "1e30"])
    assert rc == 2
    line = _one_line(capsys.readouterr().err)
    assert "budget_mb" in line and "1048576" in line


@pytest.mark.parametrize("budget, cost, overhead, align", [
    (TIB, 1e-6, 0, 1),  # 1.1e18 frames: one more frame is below the float product's resolution
    (TIB, 3e-9, 7, 16),
    (TIB, 1.0, 0, 1),
    (10_499, 10.0, 500, 1),
    (TIB, 1e-300, 0, 3),  # more frames than a float holds: the window stops at 2**62 frames
])
def test_max_window_ends_for_any_budget(budget: int, cost: float, overhead: int, align: int) -> None:
    with _deadline(10):
        b = Budget(budget, cost, overhead, frame_align=align)
    w = b.max_window
    assert 0 < w <= 2**62 and w % align == 0 and b.fits(1, w)
    assert not b.fits(1, w + align) or w + align > 2**62


def test_a_budget_beyond_the_float_resolution_ends_too() -> None:
    """Before: 1e30 MiB at 3.6 KiB per frame walked from 2.8e32 frames one frame at a time, for ever."""
    with _deadline(10):
        b = Budget(10**36, 3686.4, frame_align=16)
        assert b.max_window == 2**62 and b.fits(1, b.max_window)


def test_max_window_is_the_longest_aligned_length_that_fits() -> None:
    for budget in range(1000, 3000, 37):
        for cost, overhead, align in ((3.3, 0, 1), (7.0, 250, 4), (0.9, 999, 16)):
            longest = max(k * align for k in range(0, budget + 1) if k * align * cost + overhead <= budget)
            if longest < align:  # not one aligned frame fits: refused
                with pytest.raises(PlanError, match="below one batch"):
                    Budget(budget, cost, overhead, frame_align=align)
            else:
                assert Budget(budget, cost, overhead, frame_align=align).max_window == longest


@pytest.mark.parametrize("option, values", [
    ("--budget-mb", ["nan", "inf", "-inf", "0", "-5", "1e30", "1048577"]),
    ("--margin-mb", ["nan", "inf", "-inf", "-1", "1e30"]),
    ("--max-batch", ["0", "-1", "4097", "100000000"]),
    ("--threads", ["0", "-2", str(CORES + 1)]),
])
def test_run_options_out_of_range_are_one_line(option: str, values: list[str],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    name = option[2:].replace("-", "_")
    for value in values:  # refused as the command line is parsed, with the line RunOptions would raise
        assert _status(build_parser().parse_args, ["predict", "s.zarr", "m.pt", f"{option}={value}"]) == 2
        line = _one_line(capsys.readouterr().err).removeprefix("specstore: error: ")
        assert re.match(rf"^{name} \((?:[A-Z_]+, )?{re.escape(option)}\) must be", line), line
        with pytest.raises(ConfigError, match=rf"^{name} \((?:[A-Z_]+, )?{re.escape(option)}\) must be"):
            RunOptions(**{name: float(value) if option.endswith("-mb") else int(value)})
    for value in {"--budget-mb": ["1048576", "0.5"], "--margin-mb": ["0", "1048576"], "--max-batch": ["1", "4096"],
                  "--threads": ["1", str(CORES)]}[option]:
        _run_options(build_parser().parse_args(["predict", "s.zarr", "m.pt", f"{option}={value}"]))


def _float_options() -> list[tuple[str, str]]:
    """(command, option) for every option of ``python -m specstore.infer`` that parses to a float."""
    found = []
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command, parser in sub.choices.items():  # type: ignore[union-attr]
        for action in parser._actions:
            if not action.option_strings or action.type is None:
                continue
            try:
                parsed = action.type("0.5")  # type: ignore[operator]
            except (TypeError, ValueError, argparse.ArgumentTypeError):
                continue
            if isinstance(parsed, float):
                found.append((command, action.option_strings[-1]))
    return found


def test_the_float_options_are_found() -> None:
    found = set(_float_options())
    assert {("predict", "--budget-mb"), ("eval", "--margin-mb"), ("train", "--lr"), ("train", "--dropout"),
            ("cv", "--weight-decay"), ("train", "--crop-seconds")} <= found


@pytest.mark.parametrize("command, option", _float_options())
def test_nan_and_infinity_are_refused_by_every_float_option(command: str, option: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``float('nan')`` passes a naive ``> 0`` check: each option refuses it (and +-inf) in one line naming it,
    before the (missing) store is opened."""
    store, model = str(tmp_path / "none.zarr"), str(tmp_path / "m.pt")
    argv = {"predict": [store, model], "eval": [store, model], "plan": [store], "train": [store, model],
            "cv": [store, "--out-dir", str(tmp_path / "cv")]}[command]
    name = option[2:].replace("-", "_")
    for value in ("nan", "inf", "-inf"):
        assert _status(infer_main, [command, *argv, f"{option}={value}"]) == 2
        err = capsys.readouterr().err
        # one line; or argparse's usage above the one line of an option's own parser (--unknown-below)
        line = _one_line(err) if err.startswith("specstore: ") else err.rstrip().splitlines()[-1]
        assert name in line or f"argument {option}: " in line, (option, value, err)
