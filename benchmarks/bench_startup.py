"""Start-up: how long a console command takes to answer ``--help`` or a mistyped path.

Each command runs as a user runs it: its installed console script in a fresh interpreter (``python -c`` on
its ``pyproject.toml`` entry point where the script is not installed), with the venv's ``bin`` first on the
``PATH``.  The variants of one repeat run back to back, their order rotating from repeat to repeat, so a
burst of load from elsewhere hits all of them; each figure is the median wall time over the repeats.  The
floor is ``python -c pass``, the interpreter's own start (its site packages included), which no command can
beat; each command's ratio to it is in its details.  ``import torch`` alone is timed beside them for
context: what a command used to pay before it printed anything (on a loaded machine, minutes).  The
target, one second, is the issue's goal for ``specstore --help`` on a quiet machine, applied to every row
here; ``tests/project/test_fast_start.py`` checks the imports themselves (no torch, no librosa) for every command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from .bench_common import ROOT, CpuWindow, Figure, GroupResult, median, rotated

TARGET_S = 1.0
"""The issue's goal: ``specstore --help`` answers within a second on a quiet machine."""


def _command(name: str) -> list[str]:
    """How a user runs console command ``name``: its installed script, else its entry point in a fresh
    interpreter."""
    script = Path(sys.executable).parent / name
    if script.is_file():
        return [str(script)]
    module, function = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][name].split(":")
    return [sys.executable, "-c", f"import sys; sys.argv[0] = {name!r}; from {module} import {function} as f; "
                                  "sys.exit(f())"]


def _variants(scratch: Path) -> dict[str, tuple[list[str], int]]:
    """Variant -> (command line, the exit status it must end with)."""
    missing = [str(scratch / "no-such.zarr"), str(scratch / "no-such.pt")]
    return {
        "floor": ([sys.executable, "-c", "pass"], 0),
        "specstore_help": ([*_command("specstore"), "--help"], 0),
        "features_help": ([*_command("specstore-features"), "--help"], 0),
        "train_help": ([*_command("specstore-train"), "--help"], 0),
        "missing_store": ([*_command("specstore-infer"), *missing], 2),
        "import_torch": ([sys.executable, "-c", "import torch"], 0),
    }


def _time_once(argv: list[str], status: int, env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds of one run of ``argv`` (which must exit with ``status``), and the cores others used."""
    with CpuWindow() as w:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT, env=env)
    if proc.returncode != status:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}, not {status}: {proc.stderr.strip()[-2000:]}")
    return w.wall, w.foreign_cores


ROWS = {
    "specstore_help": ("startup_specstore_help", "`specstore --help`"),
    "features_help": ("startup_features_help", "`specstore-features --help`"),
    "train_help": ("startup_train_help", "`specstore-train --help`"),
    "missing_store": ("startup_missing_store", "`specstore-infer` on a store path that does not exist"),
}
"""Timed variant -> (figure key, what it runs); ``floor`` and ``import_torch`` are the context rows."""


def run(*, repeats: int) -> GroupResult:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT)}
    times: dict[str, list[float]] = {}
    foreign: list[float] = []
    with tempfile.TemporaryDirectory(prefix="specstore-startup-") as scratch:
        variants = _variants(Path(scratch))
        for argv, status in variants.values():  # one untimed run each: the files in the page cache
            _time_once(argv, status, env)
        for k in range(repeats):
            for name in rotated(list(variants), k):
                wall, others = _time_once(*variants[name], env)
                times.setdefault(name, []).append(wall)
                foreign.append(others)
    floor = median(times["floor"])
    details_common = {"foreign_cores": round(median(foreign), 2), "repeats": repeats}
    figures = [Figure("startup_floor", "`python -c pass`: the interpreter's own start", round(floor, 3), "s",
                      "median wall time of a fresh interpreter that does nothing: the floor of every row below",
                      details={"times_s": [round(t, 3) for t in times["floor"]], **details_common})]
    for name, (key, what) in ROWS.items():
        value = median(times[name])
        figures.append(Figure(key, f"{what}: time to answer", round(value, 3), "s",
                              f"median wall time from start to exit of {what}, in a fresh process; "
                              f"{value / floor:.1f} x the interpreter's floor", TARGET_S, "<=",
                              {"vs_floor": round(value / floor, 2), "times_s": [round(t, 3) for t in times[name]],
                               **details_common}))
    torch_s = median(times["import_torch"])
    figures.append(Figure("startup_import_torch", "`python -c 'import torch'`, for context", round(torch_s, 3), "s",
                          "median wall time of a fresh interpreter that imports torch: what a command that "
                          f"imports it before parsing its arguments pays first ({torch_s / floor:.1f} x the floor)",
                          details={"vs_floor": round(torch_s / floor, 2),
                                   "times_s": [round(t, 3) for t in times["import_torch"]], **details_common}))
    method = f"`python -m benchmarks --only startup`: {__doc__.split(chr(10) + chr(10), 1)[1]}"
    return GroupResult("startup", figures, method=method)
