"""``make gpu-check``: the GPU paths proven and measured in one call on a CUDA machine.

    python -m benchmarks.gpu_check [--out reports/gpu-check] [--clips 2000] [--dry-run]

Without CUDA it says so in one line and exits 0 (``--dry-run`` instead runs
every step on the CPU at toy sizes, which proves this script's logic).  With
CUDA it runs, writing ``gpu_check.json`` and ``gpu_check.md`` to ``--out``
after every step, so a run cut short still returns what it measured:

1. the test suite's CUDA tests (``pytest -m gpu``): budget from free memory,
   the cost probe against ``torch.cuda.max_memory_allocated``, pinned
   copies, bf16/fp16 autocast with the grad scaler, batched == alone under
   autocast, a real out-of-memory split and retried, training with and
   without gradient checkpointing;
2. the GPU figures, on a store of synthetic features made on the machine
   (``--clips`` clips, log-normal lengths, 128 mel bins):

   * ``gpu_infer_vs_fixed4``: clips/s of the engine's prediction loop against
     batches of 4 in arrival order, same model, autocast and loader (target >= 2);
   * ``gpu_peak_vs_budget``: peak allocated memory during prediction over the
     planned budget, under a budget the planner can fill (target <= 1 and >= 0.7);
   * ``gpu_oom_retries``: out-of-memory splits in that normal run (target 0),
     and ``gpu_forced_oom_recovered``: a run squeezed by
     ``torch.cuda.set_per_process_memory_fraction`` splits batches and still
     gives every clip the same probabilities (target 1 = yes);
   * ``gpu_idle_fraction``: the share of the loop's wall time the GPU spends
     between batches, from CUDA events around every forward (target < 0.1),
     for the default loader thread and for DataLoader workers;
   * ``gpu_train_ckpt_memory``: peak memory of training steps with gradient
     checkpointing over without (information);
3. the serving benchmark on the GPU (:mod:`benchmarks.bench_serve`, when time
   is left): ``gpu_serve_c32_vs_fixed4`` and the rest of its rows, the
   server's budgeted batcher against a fixed batch of 4 with the model on
   CUDA (the budget: free GPU memory minus the margin, read before every
   batch).

The figures can then be merged into ``docs/benchmarks.md`` / ``.json``
(``--merge REPORT.json``), under a "GPU" section with the date and device.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .gpu_check_figures import EventTimer, lognormal_lengths, make_store, run_figures
from .gpu_check_report import Report, _fmt, markdown, merge

__all__ = ["EventTimer", "Report", "lognormal_lengths", "main", "make_store", "markdown", "merge", "run_cuda_tests",
           "run_figures", "run_serve"]

log = logging.getLogger("gpu-check")

ROOT = Path(__file__).resolve().parents[1]


# -- steps -----------------------------------------------------------------------------------------------

def run_cuda_tests(report: Report, timeout: float) -> None:
    """``pytest -m gpu`` over the test modules that hold CUDA tests."""
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu",
           "tests/infer/test_gpu.py", "tests/infer/test_data.py", f"--junitxml={report.out / 'gpu_tests.xml'}"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
        tail = (proc.stdout + proc.stderr).strip().splitlines()
        summary = next((ln for ln in reversed(tail) if " passed" in ln or " failed" in ln or " skipped" in ln
                        or " error" in ln), tail[-1] if tail else "no output")
        (report.out / "gpu_tests.log").write_text(proc.stdout + proc.stderr)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        summary, status = f"timed out after {timeout:.0f} s", "failed"
    report.step("cuda-tests", status=status, summary=summary.strip("= "), seconds=round(time.perf_counter() - t0, 1))


# -- merging into the docs --------------------------------------------------------------------------------


def run_serve(report: Report, work: Path, *, device: str, dry_run: bool, deadline: float) -> None:
    """The serving benchmark with the model on ``device``; skipped (and said so) when too little time is left."""
    left = deadline - time.perf_counter()
    if left < 150 and not dry_run:
        report.step("serve", status="skipped", reason=f"{left:.0f} s left of the time limit")
        return
    from . import bench_serve

    sizes: dict[str, Any] = (
        dict(n_files=4, clients=(2, 4), repeats=1, seconds=(2.0, 6.0), workers=1, ramp_s=0.2,
             model=dict(width=8, depth=2))
        if dry_run else
        dict(n_files=32, clients=(8, 32), repeats=1, seconds=(15.0, 240.0), workers=8, ramp_s=4.0, model={}))
    t = time.perf_counter()
    group = bench_serve.run(work / "serve", max_delay_ms=50.0, device=device, **sizes)
    for f in group.figures:
        report.figure(f"gpu_{f.key}", f"GPU: {f.title}", f.value, f.unit, f.description,
                      target=f.target, op=f.op, details=f.details, note=f.note)
    report.step("serve", status="ok", seconds=round(time.perf_counter() - t, 1), profile=group.profile)


# -- the command -----------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m benchmarks.gpu_check``."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT / "reports" / "gpu-check", help="report folder")
    p.add_argument("--clips", type=int, default=2000, help="clips in the synthetic store (default 2000)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats of the throughput figure")
    p.add_argument(
        "--budget-mb",
        type=float,
        default=8192.0,
        help="the budget of the memory figure, MiB (default 8192: one the planner can fill)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=420.0,
        help="seconds after which optional steps are skipped (default 420: leaves room in 8 minutes)",
    )
    p.add_argument("--skip-tests", action="store_true", help="only the figures")
    p.add_argument("--dry-run", action="store_true", help="no CUDA needed: every step on the CPU at toy sizes")
    p.add_argument(
        "--merge",
        type=Path,
        default=None,
        metavar="REPORT_JSON",
        help="merge a report's figures into docs/benchmarks.md/json and exit",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    if args.merge is not None:
        merge(args.merge, ROOT / "docs")
        print(f"merged {args.merge} into docs/benchmarks.md and docs/benchmarks.json")
        return 0
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.dry_run:
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing to check")
        return 0
    device = "cuda" if cuda and not args.dry_run else "cpu"
    start = time.perf_counter()
    deadline = start + args.time_limit
    meta = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.processor() or 'cpu'})",
        "mode": "dry run on the CPU, toy sizes: values mean nothing" if args.dry_run else "full",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    report = Report(args.out, meta)
    steps: list[tuple[str, Callable[[], None]]] = []
    if not args.skip_tests:
        steps.append(("cuda-tests", lambda: run_cuda_tests(report, timeout=max(60.0, args.time_limit * 0.45))))
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    clips = min(args.clips, 40) if args.dry_run else args.clips
    budget_mb = 64.0 if args.dry_run else args.budget_mb
    steps.append(
        (
            "figures",
            lambda: run_figures(
                report,
                work,
                device=device,
                clips=clips,
                repeats=1 if args.dry_run else args.repeats,
                budget_mb=budget_mb,
                deadline=deadline,
            ),
        )
    )
    steps.append(("serve", lambda: run_serve(report, work, device=device, dry_run=args.dry_run, deadline=deadline)))
    failed = False
    try:
        for name, step in steps:
            t = time.perf_counter()
            try:
                step()
            except Exception as e:  # record it and go on: a partial report is still a report
                failed = True
                log.exception("step %s failed", name)
                report.step(
                    name + "-error",
                    status="failed",
                    error=f"{type(e).__name__}: {e}"[:500],
                    seconds=round(time.perf_counter() - t, 1),
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.step("done", status="failed" if failed else "ok", seconds=round(time.perf_counter() - start, 1))
    for key, f in report.doc["figures"].items():
        met = {True: "met", False: "MISSED", None: "info"}[f["met"]]
        print(f"{key:28s} {_fmt(f['value']):>10s} {f['unit']:8s} {met}")
    print(f"report: {args.out / 'gpu_check.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
