"""Shared benchmark machinery: figure records, interleaved repeats, CPU accounting, machine facts.

Every figure is a ratio measured side by side in one run: the compared
variants run interleaved inside each repeat (their order rotates from repeat
to repeat), so a burst of load from another process hits all of them, and
the reported value is the median over repeats of the per-repeat ratio.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parents[1]

#: Comparison operators a target may use.
OPS: dict[str, Callable[[float, float], bool]] = {">=": lambda v, t: v >= t, "<=": lambda v, t: v <= t}


@dataclass
class Figure:
    """One benchmark figure: a value, its target and whether the target is met.

    ``target``/``op`` are None for figures reported for information only
    (``met`` is then None too); ``value`` is None for a figure that could
    not be measured on this machine (``note`` says why).
    """

    key: str
    title: str
    value: float | None
    unit: str
    description: str
    target: float | None = None
    op: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None or self.target is None or self.op is None:
            return None
        return bool(OPS[self.op](self.value, self.target))

    def to_dict(self) -> dict[str, Any]:
        return {
            "title": self.title, "value": self.value, "target": self.target, "op": self.op, "met": self.met,
            "unit": self.unit, "description": self.description, "note": self.note, "details": self.details,
        }

    @classmethod
    def from_dict(cls, key: str, d: dict[str, Any]) -> Figure:
        """The figure ``to_dict`` wrote under ``key`` (``met`` is derived, so it is not read back)."""
        return cls(key, d["title"], d["value"], d["unit"], d["description"], target=d["target"], op=d["op"],
                   details=d.get("details") or {}, note=d.get("note", ""))


@dataclass
class GroupResult:
    """What one benchmark group produced: its figures, and text for the doc (method, profile)."""

    name: str
    figures: list[Figure]
    method: str = ""
    profile: str = ""
    seconds: float = 0.0
    measured: str = ""
    """When it was measured (UTC), where that differs from the report's run (groups kept by ``--merge``)."""
    run: str = ""
    """The id of the run that measured it, for groups kept by ``--merge`` from an earlier run; empty: this run."""
    partial: bool = False
    """Only some of the group's figures were measured (``MODEL_CORPORA=small``): ``--merge`` keeps the earlier
    run's other figures of the group, each noted with the date it was measured."""


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs))


def rotated(items: Sequence[Any], k: int) -> list[Any]:
    """``items`` rotated left by ``k`` (the variant order of repeat ``k``)."""
    k %= max(len(items), 1)
    return list(items[k:]) + list(items[:k])


# ---------------------------------------------------------------- CPU accounting

_TICK = os.sysconf("SC_CLK_TCK")


def _system_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies over all CPUs since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)  # idle + iowait
    total = sum(parts[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)
    return total - idle, total


def _tree_jiffies(root: int) -> int:
    """utime + stime of ``root`` and all its live descendants (threads included)."""
    parent: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        rest = raw[raw.rfind(")") + 2:].split()
        pid = int(entry)
        parent[pid] = int(rest[1])
        times[pid] = int(rest[11]) + int(rest[12])
    total = 0
    for pid, t in times.items():
        p = pid
        while p > 1:
            if p == root:
                total += t
                break
            p = parent.get(p, 0)
    return total


class CpuWindow:
    """Measures a timed section: wall seconds, cores this process tree used, cores others used.

    ``foreign_cores`` is the average number of cores busy with work outside
    this benchmark's process tree (other users' jobs, the kernel) during the
    section: the noise that hit the measurement.
    """

    def __init__(self) -> None:
        self.wall = 0.0
        self.own_cores = 0.0
        self.foreign_cores = 0.0

    def __enter__(self) -> CpuWindow:
        self._sys0 = _system_jiffies()
        self._own0 = _tree_jiffies(os.getpid())
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self._t0
        busy1, _ = _system_jiffies()
        own1 = _tree_jiffies(os.getpid())
        wall = max(self.wall, 1e-9)
        own = max(own1 - self._own0, 0) / _TICK
        busy = max(busy1 - self._sys0[0], 0) / _TICK
        self.own_cores = own / wall
        self.foreign_cores = max(busy - own, 0.0) / wall


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """Run ``fn``; return (wall seconds, foreign cores during it, its result)."""
    with CpuWindow() as w:
        out = fn()
    return w.wall, w.foreign_cores, out


def load_average() -> list[float]:
    with open("/proc/loadavg") as f:
        return [float(x) for x in f.read().split()[:3]]


def wait_for_quiet(max_load: float, max_wait: float) -> list[float]:
    """Wait (up to ``max_wait`` s) until the 1-minute load average is below ``max_load``."""
    t0 = time.monotonic()
    load = load_average()
    while load[0] >= max_load and time.monotonic() - t0 < max_wait:
        log.info("load average %.2f >= %.2f: waiting for a quieter machine", load[0], max_load)
        time.sleep(20)
        load = load_average()
    return load


# ---------------------------------------------------------------- subprocess probes


def run_probe(args: list[str], timeout: float = 300.0, module: str = "benchmarks.bench_probe") -> dict[str, Any]:
    """Run ``module`` (``bench_probe.py`` by default) with ``args`` in a fresh interpreter (its peak RSS its own);
    its last stdout line is JSON."""
    cmd = [sys.executable, "-m", module, *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{module} {args[0]} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- machine facts


def machine_info() -> dict[str, Any]:
    """CPU model, cores, RAM and library versions, for the doc."""
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    flags = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = line
                    break
    except OSError:
        pass
    mem_gib = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_gib = round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    versions: dict[str, str] = {"python": platform.python_version()}
    for mod in ("torch", "numpy", "zarr", "librosa", "soundfile", "soxr", "scipy", "joblib"):
        try:
            versions[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - a missing library is reported, not fatal
            versions[mod] = "n/a"
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu_model": model, "cores": cores, "ram_gib": mem_gib, "avx512_bf16": " avx512_bf16" in flags,
        "os": f"{platform.system()} {platform.release()}", "gpu": gpu, "versions": versions,
    }


def run_alone(group: str, workdir: Path | None, run: Callable[[Path], GroupResult]) -> int:
    """A group's own command line (``python -m benchmarks.bench_<group>``): ``run`` in ``workdir`` (default: a
    temporary folder, removed after), every figure logged with its status; exit status 0."""
    import shutil
    import tempfile

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    work = workdir or Path(tempfile.mkdtemp(prefix=f"specstore-bench-{group}-"))
    try:
        result = run(work)
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    for f in result.figures:
        status = {True: "met", False: "MISSED", None: "info"}[f.met]
        log.info("   %-34s %s %s (%s) %s", f.key, f.value, f.unit, status, f.note or f.details)
    return 0
