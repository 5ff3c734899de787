"""Each rule has one home: who may import whom, and where the padding rule and the defaults are written."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGED = ("store", "pipeline", "infer", "democorpus", "realcorpus", "serving")


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved against its package)."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found |= {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_the_core_does_not_import_the_notebook_helpers() -> None:
    """``infer.explore`` builds on the core (predictions CSV, metrics, figures); never the other way round."""
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if n.startswith("infer.explore"))
                 for p in _modules(ROOT / "infer") if "explore" not in p.parts}
    assert not {k: v for k, v in offenders.items() if v}


def test_packaged_code_and_tests_do_not_import_the_benchmarks() -> None:
    """``benchmarks/`` is not packaged: nothing installed, and no test, may need it (its planners live in
    ``infer.planner_baselines``)."""
    offenders = {}
    for folder in (*PACKAGED, "tests"):
        for p in _modules(ROOT / folder):
            bad = sorted(n for n in _imports(p) if n == "benchmarks" or n.startswith("benchmarks."))
            if bad and p.name not in ("test_bench_quick.py", "test_layout.py"):  # the bench's own smoke test
                offenders[str(p.relative_to(ROOT))] = bad
    assert not offenders


ROUND_UP = re.compile(r"-\(-[^()]*//\s*([\w.]+)\)\s*\*\s*\1")
"""``-(-n // m) * m``: rounding up to a multiple, the padding rule's arithmetic."""


def test_the_stride_round_up_is_written_once() -> None:
    from infer import budget

    hits = [f"{p.relative_to(ROOT)}:{i}" for folder in ("infer", "pipeline", "store", "benchmarks")
            for p in _modules(ROOT / folder)
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if ROUND_UP.search(line)]
    source_lines, start = inspect.getsourcelines(budget.align_frames)
    home = [f"infer/budget.py:{start + k}" for k, line in enumerate(source_lines) if ROUND_UP.search(line)]
    assert len(home) == 1 and hits == home, hits


def test_run_defaults_have_one_home() -> None:
    """Device, precision, budget and batch size: infer.defaults, read by every object that has a default."""
    from infer import defaults
    from infer.budget import Budget
    from infer.cli import build_parser
    from infer.data import BudgetBatchSampler
    from infer.device import DEFAULT_CPU_BUDGET_MB, DEFAULT_CUDA_MARGIN_MB
    from infer.runtime import RunOptions
    from infer.train import TrainConfig

    options, config = RunOptions(), TrainConfig()
    assert (options.device, options.precision, options.max_batch) == (defaults.DEVICE, defaults.PRECISION,
                                                                       defaults.MAX_BATCH)
    assert (config.device, config.precision, config.max_batch) == (defaults.DEVICE, defaults.PRECISION,
                                                                    defaults.MAX_BATCH)
    assert Budget(1 << 30, 100.0).max_batch == defaults.MAX_BATCH
    assert inspect.signature(BudgetBatchSampler).parameters["max_batch"].default == defaults.MAX_BATCH
    assert (DEFAULT_CPU_BUDGET_MB, DEFAULT_CUDA_MARGIN_MB) == (defaults.CPU_BUDGET_MB, defaults.CUDA_MARGIN_MB)
    # the commands leave an option out unless it is given, so RunOptions (or a --config file) decides
    for command in ("predict", "plan", "eval"):
        args = build_parser().parse_args([command, "s.zarr", *(["m.pt"] if command != "plan" else [])])
        assert not {"device", "precision", "max_batch", "budget_mb"} & set(vars(args)), command


@pytest.mark.parametrize("variable", ["DEVICE", "PRECISION", "MAX_BATCH", "BUDGET_MB", "OUT", "TOPK", "OUT_DIR",
                                      "SPLIT", "FEATURES", "JOBS", "LAYOUT", "BACKEND"])
def test_the_makefile_spells_no_option_default(variable: str) -> None:
    """An empty Make variable means the command's own default; the Makefile does not repeat it."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    match = re.search(rf"^{variable}\s*\?=(.*)$", makefile, re.M)
    assert match is not None and match.group(1).strip() == "", variable


def test_no_training_function_is_over_80_lines() -> None:
    """infer/train/ stays readable: every function fits on a screen or two (its docstring included)."""
    long = [f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path in sorted((ROOT / "infer" / "train").glob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > 80]
    assert not long, long


CLI_MODULES = ("infer/cli.py", "serving/cli.py", "infer/train/config.py")
"""The modules that build command lines (``infer``'s commands, ``train`` and ``cv``'s options, ``specstore``)."""


def test_no_command_line_spells_a_default() -> None:
    """An option's default lives on its dataclass field; the CLI modules make options with the one generator
    (:func:`store.options.add_options`), so no ``add_argument`` call there carries a ``default=``."""
    spelled = [f"{module}:{node.lineno}" for module in CLI_MODULES
               for node in ast.walk(ast.parse((ROOT / module).read_text(encoding="utf-8")))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "add_argument" and any(k.arg == "default" for k in node.keywords)]
    assert not spelled, spelled
