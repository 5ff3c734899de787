"""Each rule has one home: who may import whom, and where the padding rule and the defaults are written."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGED = ("store", "pipeline", "infer", "democorpus", "realcorpus", "serving")


def _modules(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts)


def _package(path: Path) -> str:
    """The dotted package ``path`` lies in: a package folder's modules are ``specstore.<folder>...``."""
    parts = path.relative_to(ROOT).with_suffix("").parts[:-1]
    return ".".join(("specstore", *parts) if parts and parts[0] in PACKAGED else parts)


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved against its package)."""
    package = _package(path)
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


def _absolute_imports(path: Path) -> set[str]:
    """The modules ``path`` imports by an absolute name (``import x.y``, ``from x.y import z``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
    return found


def test_no_code_imports_a_folder_by_its_bare_name() -> None:
    """One name per module: the package folders are ``specstore.store``, ``specstore.infer``, ...; an import of
    ``store`` or ``infer.cli`` would load a second copy of every module under the bare name (ruff's TID251 rule
    checks the same outside the package folders, where it can tell a relative import from an absolute one)."""
    generators = {ROOT / "tests" / "fixtures" / "pre_specstore" / "make_fixtures.py"}  # run at the old commit only
    offenders = {}
    for folder in (*PACKAGED, "specstore", "tests", "benchmarks", "examples", "tools"):
        for p in _modules(ROOT / folder):
            bare = sorted(n for n in _absolute_imports(p) if n.split(".")[0] in PACKAGED)
            if bare and p not in generators:
                offenders[str(p.relative_to(ROOT))] = bare
    assert not offenders


def test_the_core_does_not_import_the_notebook_helpers() -> None:
    """``specstore.infer.explore`` builds on the core (predictions CSV, metrics, figures); never the other way round."""
    offenders = {str(p.relative_to(ROOT)): sorted(n for n in _imports(p) if n.startswith("specstore.infer.explore"))
                 for p in _modules(ROOT / "infer") if "explore" not in p.parts}
    assert not {k: v for k, v in offenders.items() if v}


def test_packaged_code_and_tests_do_not_import_the_benchmarks() -> None:
    """``benchmarks/`` is not packaged: nothing installed, and no test, may need it (its planners live in
    ``specstore.infer.batching.planner_baselines``)."""
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
    from specstore.infer.batching import budget

    hits = [f"{p.relative_to(ROOT)}:{i}" for folder in ("infer", "pipeline", "store", "benchmarks")
            for p in _modules(ROOT / folder)
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if ROUND_UP.search(line)]
    source_lines, start = inspect.getsourcelines(budget.align_frames)
    home = [f"infer/batching/budget.py:{start + k}" for k, line in enumerate(source_lines) if ROUND_UP.search(line)]
    assert len(home) == 1 and hits == home, hits


def test_run_defaults_have_one_home() -> None:
    """Device, precision, budget and batch size: infer.defaults, read by every object that has a default."""
    from specstore.infer.batching.budget import Budget
    from specstore.infer.cli import build_parser
    from specstore.infer.data import BudgetBatchSampler
    from specstore.infer.engine.device import DEFAULT_CPU_BUDGET_MB, DEFAULT_CUDA_MARGIN_MB
    from specstore.infer.engine.runtime import RunOptions
    from specstore.infer.options import defaults
    from specstore.infer.train import TrainConfig

    options, config = RunOptions(), TrainConfig()
    assert (options.device, options.precision, options.max_batch) == (defaults.DEVICE, defaults.PRECISION,
                                                                       defaults.MAX_BATCH)
    assert (config.run.device, config.run.precision, config.run.max_batch) == (defaults.DEVICE, defaults.PRECISION,
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


LONG_TABLE = re.compile(r"^\s*#\s*layout:\s*long table\s*[—-]+\s*\S")
"""``# layout: long table — <reason>`` on the line before a statement: a data table allowed past the limits."""


def _table_lines(source: str, tree: ast.Module) -> set[int]:
    """Line numbers of the statements that follow a long-table marker (each statement whole)."""
    marked = {i + 2 for i, line in enumerate(source.splitlines()) if LONG_TABLE.match(line)}
    return {n for node in ast.walk(tree) if isinstance(node, ast.stmt) and node.lineno in marked
            and node.end_lineno is not None for n in range(node.lineno, node.end_lineno + 1)}


def test_modules_and_functions_are_short() -> None:
    """Every module of every package (benchmarks and the corpus generators included) is at most 450 lines and
    every function at most 80 (docstring included), so each reads as one job; a data table may run longer when
    the line before it says why (``# layout: long table — <reason>``); its lines are not counted."""
    too_long = []
    for folder in (*PACKAGED, "benchmarks"):
        for path in _modules(ROOT / folder):
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source)
            table = _table_lines(source, tree)
            name = str(path.relative_to(ROOT))
            lines = len(source.splitlines()) - len(table)
            if lines > 450:
                too_long.append(f"{name} ({lines} lines)")
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                    n = node.end_lineno - node.lineno + 1 - len(table & set(range(node.lineno, node.end_lineno + 1)))
                    if n > 80:
                        too_long.append(f"{name}:{node.name} ({n} lines)")
    assert not too_long, too_long


def test_feature_kinds_are_switched_on_only_in_their_registry() -> None:
    """No ``kind == "mel"`` or ``in ("mel", "cqt")`` outside store/kinds.py and pipeline/kinds.py: a kind's
    defaults, display and computation are its registry entries, so adding a kind edits no switch."""
    from specstore.store.kinds import kind_names

    names = set(kind_names())
    homes = {ROOT / "store" / "kinds.py", ROOT / "pipeline" / "kinds.py"}

    def names_a_kind(node: ast.expr) -> bool:
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return any(names_a_kind(e) for e in node.elts)
        return isinstance(node, ast.Constant) and node.value in names

    switches = []
    for folder in (*PACKAGED, "benchmarks"):
        for p in _modules(ROOT / folder):
            if p in homes:
                continue
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                compared = (isinstance(node, ast.Compare)
                            and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops)
                            and any(names_a_kind(e) for e in (node.left, *node.comparators)))
                matched = isinstance(node, ast.MatchValue) and names_a_kind(node.value)
                if compared or matched:
                    switches.append(f"{p.relative_to(ROOT)}:{node.lineno}")
    assert not switches, switches

ARCH_SWITCH = re.compile(r"""\barch\s*(==|!=)|(==|!=)\s*["'](cnn|resnet)["']|["'](cnn|resnet)["']\s*(==|!=)"""
                         r"""|\bin\s*[(\[{]\s*["'](cnn|resnet)["']|\b(freq_)?pooling\s*(==|!=|in\s*[(\[{])""")
"""A string switch on an architecture or a pooling: ``arch == "cnn"``, ``"resnet" != ...``, ``in ("cnn", ...)``,
``pooling == "meanstd"``."""


def test_every_architecture_and_pooling_is_reached_through_its_registry() -> None:
    """The architectures and poolings are the entries of their registries (infer/models/registry.py), the one
    list that the command lines' choices, ModelConfig's check and parameter count and the checkpoint loader
    read; no module switches on their names."""
    from specstore.infer import cli
    from specstore.infer.models import config as model_config
    from specstore.infer.models import contract, registry

    offenders = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
                 for folder in (*PACKAGED, "benchmarks", "examples") for p in _modules(ROOT / folder)
                 if p != ROOT / "infer" / "models" / "registry.py"
                 for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
                 if ARCH_SWITCH.search(line.split("#")[0])]
    assert not offenders, offenders
    assert model_config.ARCHS is registry.ARCH_REGISTRY.names and contract.ARCHS is model_config.ARCHS
    assert model_config.POOLINGS is registry.POOLING_REGISTRY.names
    assert model_config.FREQ_POOLINGS is registry.FREQ_POOLING_REGISTRY.names
    init = cli.build_parser()._subparsers._group_actions[0].choices["init"]  # type: ignore[union-attr,index]
    assert next(a for a in init._actions if a.dest == "arch").choices is model_config.ARCHS
    build = next(node for node in ast.parse((ROOT / "infer" / "models" / "build.py").read_text(encoding="utf-8")).body
                 if isinstance(node, ast.FunctionDef) and node.name == "build_model")
    assert not any(isinstance(node, ast.If) for node in ast.walk(build))  # the registry's builder, no if chain
    assert ARCH_SWITCH.search('if config.arch == "cnn":') and ARCH_SWITCH.search('pooling == "meanstd"')


CLI_MODULES = ("infer/cli.py", "serving/cli.py", "infer/train/config.py")
"""The modules that build command lines (``specstore.infer``'s commands, ``train`` and ``cv``'s options, ``specstore``).
"""


def test_no_command_line_spells_a_default() -> None:
    """An option's default lives on its dataclass field; the CLI modules make options with the one generator
    (:func:`specstore.common.options.add_options`), so no ``add_argument`` call there carries a ``default=``."""
    spelled = [f"{module}:{node.lineno}" for module in CLI_MODULES
               for node in ast.walk(ast.parse((ROOT / module).read_text(encoding="utf-8")))
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == "add_argument" and any(k.arg == "default" for k in node.keywords)]
    assert not spelled, spelled


def test_no_import_circle() -> None:
    """No module of specstore reaches itself through its imports (run-time imports, function-local ones included;
    what only type checkers read is left out).  import-linter's contracts in pyproject.toml keep the arrows
    pointing down between packages and between the inference side's rooms; this keeps them from closing."""
    grimp = pytest.importorskip("grimp")
    graph = grimp.build_graph("specstore", exclude_type_checking_imports=True)
    edges = {m: {d for d in graph.find_modules_directly_imported_by(m) if d.startswith("specstore.")}
             for m in graph.modules if m.startswith("specstore.")}
    # Tarjan's strongly connected components, iteratively
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                part = []
                while True:
                    member = stack.pop()
                    part.append(member)
                    if member == node:
                        break
                if len(part) > 1:
                    circles.append(sorted(part))
    assert not circles, circles
