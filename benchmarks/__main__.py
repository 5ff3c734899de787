"""`make bench`: specstore's performance side by side with what users would otherwise run.

    python -m benchmarks [--quick] [--out-dir docs] [--only extract,plan,...] [--merge]

Writes ``benchmarks.json`` and ``benchmarks.md`` into ``--out-dir``
(default ``docs/`` for a full run and ``reports/bench-quick/`` for
``--quick``, so a smoke run never overwrites the committed figures).
``--quick`` is a smoke run (tiny sizes, one repeat, under a minute) that exercises every benchmark and writes
the same files; its values are not meaningful. Groups (``--only``): extract, extract-mem, plan, infer,
infer-mem, reads, gpu, library, model, serve, serve-limits, startup, decode-formats, scale, cluster; with
``--merge`` the groups not rerun are kept from the report already there, each marked with its date. A group that
needs what ``make install`` does not give (the quick model group renders with fluidsynth and a Debian SoundFont) is
skipped where that is missing, with one line saying how to enable it (``make realcorpus-deps``). Nothing here
is collected by pytest (no ``test_`` names); ``tests/project/test_bench_quick.py`` runs the quick mode.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import bench_common
from .bench_common import GroupResult, load_average, log, machine_info, wait_for_quiet

GROUPS = ("extract", "extract-mem", "plan", "infer", "infer-mem", "reads", "gpu", "library", "model", "serve",
          "serve-limits", "startup", "decode-formats", "scale", "cluster")

#: Sizes: full run (about 9-11 minutes on 2 cores, of which the scale group about 2.5) and the smoke run.
FULL: dict[str, dict[str, Any]] = {
    "extract": dict(n_files=48, mean_seconds=50.0, repeats=5),
    "extract-mem": dict(short_seconds=300.0, long_seconds=7200.0, repeats=2),
    "plan": dict(n_clips=5000, repeats=5),
    "infer": dict(n_clips={"uniform": 48, "lognormal": 64}, repeats=3, model={}),
    "infer-mem": dict(sizes=(1000, 20000), repeats=1),
    "reads": dict(n_clips=400, n_reads=1000, repeats=3),
    "gpu": dict(n_clips=64, repeats=3),
    "library": dict(train=dict(n_clips=48, median_s=4.0, budget_mb=512, repeats=5, model={}),
                    sampler=dict(n_clips=5000, epochs=4),
                    memory=dict(median_s=30.0, n_base=64, tiles=(2, 12), workers=4, budget_mb=512, repeats=2),
                    loader=dict(n_clips=24, median_s=60.0, repeats=3, model={})),
    "model": dict(quick=False),
    "serve": dict(n_files=64, clients=(8, 32), repeats=3, seconds=(15.0, 240.0), workers=2, max_delay_ms=50.0,
                  ramp_s=4.0, model={}),
    "serve-limits": dict(n_slow=300, n_normal=16, seconds=(5.0, 15.0), read_timeout=10.0, max_connections=512,
                         model=dict(width=8, depth=2)),
    "startup": dict(repeats=7),
    "decode-formats": dict(seconds=60.0, repeats=3),
    "scale": dict(sizes=(10_000, 1_000_000), commits=1000, clips_per_shard=64, big_commits=3, big_rows=1000,
                  one_row_commits=10, workers=2, limit_s=360.0, repeats=3),
    "cluster": dict(n_clips=2000, workers=2, repeats=3, journal_pairs=2),
}
QUICK: dict[str, dict[str, Any]] = {
    "extract": dict(n_files=8, mean_seconds=3.0, repeats=1, lhotse_pool=False, longer=2),
    "extract-mem": dict(short_seconds=5.0, long_seconds=30.0, repeats=1),
    "plan": dict(n_clips=300, repeats=1),
    "infer": dict(n_clips={"uniform": 3, "lognormal": 3}, repeats=1, model=dict(width=8, depth=2)),
    "infer-mem": dict(sizes=(100, 400), repeats=1),
    "reads": dict(n_clips=30, n_reads=100, repeats=1),
    "gpu": dict(n_clips=4, repeats=1),
    "library": dict(train=dict(n_clips=8, median_s=3.0, budget_mb=64, repeats=1, model=dict(width=8, depth=2)),
                    sampler=dict(n_clips=300, epochs=1),
                    memory=dict(median_s=3.0, n_base=16, tiles=(2, 6), workers=4, budget_mb=64, repeats=1),
                    loader=dict(n_clips=4, median_s=3.0, repeats=1, model=dict(width=8, depth=2))),
    "model": dict(quick=True),
    "serve": dict(n_files=4, clients=(2, 4), repeats=1, seconds=(2.0, 6.0), workers=1, max_delay_ms=50.0,
                  ramp_s=0.2, model=dict(width=8, depth=2)),
    "serve-limits": dict(n_slow=24, n_normal=4, seconds=(2.0, 4.0), read_timeout=2.0, max_connections=48,
                         model=dict(width=8, depth=2)),
    "startup": dict(repeats=1),
    "decode-formats": dict(seconds=3.0, repeats=1),
    "scale": dict(sizes=(1000, 10_000), commits=10, clips_per_shard=64, big_commits=1, big_rows=100,
                  one_row_commits=3, workers=2, limit_s=60.0, repeats=1),
    "cluster": dict(n_clips=200, workers=2, repeats=1, journal_pairs=0),
}

NOTES = [
    "Targets are issue 5's (the serving rows: issue 20's). Rows marked (info) give context and have no target.",
    "This machine is a 2-vCPU virtual machine shared with other engineers' jobs. `foreign_cores` in the "
    "details is the CPU that other processes used during the timed runs; contention on the host (other "
    "virtual machines) is invisible to it and shows only as run-to-run spread in `times_s`.",
    "GPU: there is no CUDA device here, so the GPU rows are not measured (value and met are null). Whenever "
    "torch.cuda.is_available(), run.py runs prediction on the GPU under the autocast predict chooses (bf16 where "
    "supported, else fp16) and records throughput against a fixed batch of 4 under the same autocast, "
    "torch.cuda.max_memory_allocated against the planner's budget (free memory minus the margin), and the number "
    "of out-of-memory retries.",
    "Cold-cache reads are not measured: dropping the page cache is a machine-wide action on a shared machine.",
]


def _runner(name: str, work: Path, sizes: dict[str, Any]) -> Callable[[], GroupResult]:
    if name == "extract":
        from . import bench_extract

        return lambda: bench_extract.run_speed(work / "extract", **sizes)
    if name == "extract-mem":
        from . import bench_extract

        return lambda: bench_extract.run_memory(work / "extract-mem", **sizes)
    if name == "plan":
        from . import bench_plan

        return lambda: bench_plan.run(**sizes)
    if name == "infer":
        from . import bench_infer

        return lambda: bench_infer.run_throughput(work / "infer", **sizes)
    if name == "infer-mem":
        from . import bench_infer

        return lambda: bench_infer.run_memory(work / "infer-mem", **sizes)
    if name == "reads":
        from . import bench_reads

        return lambda: bench_reads.run(work / "reads", **sizes)
    if name == "gpu":
        from . import bench_infer

        return lambda: bench_infer.run_gpu(work / "gpu", **sizes)
    if name == "library":
        from . import bench_library

        return lambda: bench_library.run(work / "library", **sizes)
    if name == "serve":
        from . import bench_serve

        return lambda: bench_serve.run(work / "serve", **sizes)
    if name == "serve-limits":
        from . import bench_serve_limits

        return lambda: bench_serve_limits.run(work / "serve-limits", **sizes)
    if name == "startup":
        from . import bench_startup

        return lambda: bench_startup.run(**sizes)
    if name == "decode-formats":
        from . import bench_decode

        return lambda: bench_decode.run(work / "decode-formats", **sizes)
    if name == "scale":
        from . import bench_scale

        return lambda: bench_scale.run(work / "scale", **sizes)
    if name == "cluster":
        from . import bench_cluster

        return lambda: bench_cluster.run(work / "cluster", **sizes)
    if name == "model":
        from . import bench_model

        return lambda: bench_model.run(work / "model", **sizes)
    raise ValueError(name)


def unavailable(name: str, quick: bool) -> str | None:
    """Why group ``name`` cannot run on this machine, as one line that says how to enable it; None if it can.

    Only the quick model group needs more than ``make install`` gives: it renders the tiny development corpus,
    which needs fluidsynth and a SoundFont from Debian packages (``make realcorpus-deps``: apt-get, root or
    sudo) and music21.  The full model group measures corpora rendered beforehand and reports each missing one
    as not measured.  The decode-formats group needs PyAV (in ``make install``; the ``formats`` extra elsewhere).
    """
    if name == "decode-formats" and importlib.util.find_spec("av") is None:
        return "missing PyAV: run `.venv/bin/pip install -e '.[formats]'` to measure it"
    if name == "cluster" and importlib.util.find_spec("distributed") is None:
        return "missing dask.distributed: run `.venv/bin/pip install -e '.[dask]'` to measure it"
    if name != "model" or not quick:
        return None
    from specstore.realcorpus.catalogue import SIZES
    from specstore.realcorpus.errors import RealCorpusError
    from specstore.realcorpus.render import check_renderer

    try:
        check_renderer(SIZES["tiny"].soundfonts)
    except RealCorpusError as e:
        return f"{e} to measure it"
    if importlib.util.find_spec("music21") is None:
        return "missing music21: run `.venv/bin/pip install -e '.[realcorpus]'` to measure it"
    return None


def select_groups(names: list[str], quick: bool) -> tuple[list[str], dict[str, str]]:
    """The groups of ``names`` that can run here, and the others with why not (see :func:`unavailable`)."""
    reasons = {name: unavailable(name, quick) for name in names}
    return [n for n in names if reasons[n] is None], {n: r for n, r in reasons.items() if r is not None}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, one repeat (< 1 minute)")
    p.add_argument("--out-dir", type=Path, default=None,
                   help="where benchmarks.json and benchmarks.md go (default: docs/, or reports/bench-quick/ "
                        "with --quick)")
    p.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups ({', '.join(GROUPS)})")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a fresh temporary one)")
    p.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                   help="first wait up to this long for the 1-minute load average to drop below --max-load")
    p.add_argument("--max-load", type=float, default=1.5)
    p.add_argument("--merge", action="store_true",
                   help="keep the groups not rerun from the report already in --out-dir (each marked with the "
                        "date it was measured) instead of writing only the groups run now")
    args = p.parse_args(argv)
    groups = [g.strip() for g in args.only.split(",") if g.strip()]
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        p.error(f"unknown group(s) {', '.join(bad)}; choose from {', '.join(GROUPS)}")
    args.groups = groups
    if args.out_dir is None:
        args.out_dir = bench_common.ROOT / ("reports/bench-quick" if args.quick else "docs")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("numba", "matplotlib", "asyncio", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    sizes = QUICK if args.quick else FULL
    if args.wait_quiet > 0:
        wait_for_quiet(args.max_load, args.wait_quiet)
    load_before = load_average()
    if load_before[0] >= args.max_load and not args.quick:
        log.warning("load average %.2f: other processes are busy; figures will be noisy", load_before[0])
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    run_id = uuid.uuid4().hex  # what marks a group as this run's: two runs may start in the same minute
    runnable, skipped = select_groups(args.groups, args.quick)
    for name, why in skipped.items():
        log.warning("== %s skipped: %s", name, why)
    own_work = args.workdir is None
    work = Path(tempfile.mkdtemp(prefix="specstore-bench-")) if own_work else args.workdir
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    groups: list[GroupResult] = []
    try:
        for name in runnable:
            log.info("== %s", name)
            g0 = time.perf_counter()
            result = _runner(name, work, sizes[name])()
            result.seconds = time.perf_counter() - g0
            groups.append(result)
            for f in result.figures:
                status = {True: "met", False: "MISSED", None: "info"}[f.met]
                log.info("   %-34s %s %s (%s)", f.key, f.value, f.unit, status)
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
    from . import bench_report

    command = "make bench QUICK=1" if args.quick else "make bench"
    if args.groups != list(GROUPS):
        command = f".venv/bin/python -m benchmarks{' --quick' if args.quick else ''} --only {','.join(args.groups)}"
    old_json = args.out_dir / "benchmarks.json"
    if args.merge and old_json.is_file():
        groups = bench_report.merged(json.loads(old_json.read_text()), groups)
        command += " --merge"
    meta = {
        "notes": NOTES,
        "command": command, "runner": "python -m benchmarks", "quick": args.quick, "started": started,
        "run": run_id, "skipped": skipped,
        "wall_seconds": round(time.perf_counter() - t0, 1), "load_before": load_before,
        "load_after": load_average(), "machine": machine_info(), "sizes": {g: sizes[g] for g in args.groups},
    }
    jp, mp = bench_report.write(args.out_dir, groups, meta)
    log.info("wrote %s and %s in %.0f s", jp, mp, meta["wall_seconds"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
