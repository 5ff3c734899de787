"""The store at scale: the writer and the reader at a small and a large index (10 000 and 1 000 000 rows).

Each store is built in a fresh child process that holds the writer
(:mod:`benchmarks.scale_build`: the synthetic corpus, the build, the timed
1 000-row and one-row commits, the index segments and one compaction, the
child's peak RSS).  This process then times ``open_store``, ``validate``
(quick) and a full ``plan_batches`` over every clip's length on the finished
store, and turns both into the group's figures, with their targets.

A build that passes ``limit_s``, or that its measured commit costs project far past it, stops early: its
figures are then not measured, and the projection says how long the build would take.

    python -m benchmarks.bench_scale [--sizes 10000,1000000] [--quick] [--workdir DIR]
        runs the group (default: the full sizes, 10 000 and 1 000 000 rows; log only: ``make bench ONLY=scale``
        writes the report)
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .bench_common import Figure, GroupResult, log, run_alone
from .scale_build import DTYPE, N_BINS, BuildPlan, projected_commit_s, run_driver

#: The planner's budget, as ``bench_plan`` uses it: CPU default (2 GiB), 33 MiB per 1 000 frames, 16 clips, align 16.
PLAN_BUDGET_BYTES, PLAN_COST_PER_FRAME, PLAN_MAX_BATCH, PLAN_ALIGN = 2 << 30, 33 * 2**20 / 1000, 16, 16
#: The targets: one-row commit growth (x), open (s), validate (s), plan (s), the writer's peak (MB = 10^6 bytes).
TARGETS = dict(commit1_growth=2.0, open_s=2.0, validate_s=10.0, plan_s=30.0, writer_peak_mb=1000.0)


# ---------------------------------------------------------------- the reader side


def _seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def read_side(store: Path, repeats: int) -> dict[str, Any]:
    """``open_store`` (median of ``repeats``), quick ``validate``, ``len`` and a full ``plan_batches``."""
    from specstore.infer.batching.budget import Budget
    from specstore.infer.batching.planner import plan_batches
    from specstore.store import open_store, validate

    opens = [_seconds(lambda: open_store(store)) for _ in range(repeats)]
    s = opens[-1][1]
    validate_s, problems = _seconds(lambda: validate(store))
    if problems:
        log.warning("scale: validate found %d problem(s) in %s: %s", len(problems), store, problems[0])
    budget = Budget(PLAN_BUDGET_BYTES, PLAN_COST_PER_FRAME, max_batch=PLAN_MAX_BATCH, frame_align=PLAN_ALIGN)
    plan_s, plan = _seconds(lambda: plan_batches(s.lengths, budget))
    return {"open_s": statistics.median(t for t, _ in opens), "open_times_s": [round(t, 4) for t, _ in opens],
            "validate_s": validate_s, "problems": len(problems), "len": len(s), "plan_s": plan_s,
            "batches": plan.n_batches, "shards": len(s.shards)}


# ---------------------------------------------------------------- the group


def build_plans(sizes: Sequence[int], commits: int, clips_per_shard: int, big_commits: int, big_rows: int,
                one_row_commits: int) -> list[BuildPlan]:
    return [BuildPlan(n, commits, clips_per_shard, big_commits, big_rows, one_row_commits) for n in sizes]


def measure_size(work: Path, plan: BuildPlan, workers: int, limit_s: float, repeats: int) -> dict[str, Any]:
    """Build one store, time its writer (child) and reader (here); the store is deleted afterwards."""
    store = work / f"scale-{plan.rows}.zarr"
    shutil.rmtree(store, ignore_errors=True)
    try:
        res = run_driver(store, plan, workers, limit_s)
        if res["complete"]:
            res.update(read_side(store, repeats))
    finally:
        shutil.rmtree(store, ignore_errors=True)
    log.info("scale: %d rows: %s", plan.rows, {k: (round(v, 4) if isinstance(v, float) else v)
                                              for k, v in res.items() if not isinstance(v, list)})
    return res


def label(n: int) -> str:
    """10000 -> "10k", 1000000 -> "1M"."""
    for unit, div in (("M", 1_000_000), ("k", 1000)):
        if n >= div and n % (div // 10) == 0:
            return f"{n / div:g}{unit}"
    return f"{n:,}"


def projections(plan: BuildPlan, res: dict[str, Any], workers: int) -> dict[str, float]:
    """Seconds the whole build of ``plan`` takes at this writer's measured commit costs, and with free commits
    (shard writing alone, over ``workers`` processes)."""
    per_shard = res["worker_s"] / max(res["shards_written"], 1)
    shards_s = per_shard * plan.n_shards / workers
    a, b = res["model"]
    commits_s = projected_commit_s((a, b), plan.build_rows, plan.commits)
    return {"today_s": commits_s + shards_s, "cheap_s": shards_s, "commits_s": commits_s,
            "per_shard_ms": per_shard * 1e3, "commit_a_ms": res["model"][0] * 1e3,
            "commit_us_per_row": res["model"][1] * 1e6}


def _rounded(times: Sequence[float] | None) -> list[float] | None:
    return None if times is None else [round(t, 4) for t in times]


def _shards_per_commit(plan: BuildPlan) -> str:
    low, high = plan.n_shards // plan.commits, -(-plan.n_shards // plan.commits)
    return str(low) if low == high else f"{low}-{high}"


def _value(res: dict[str, Any], key: str, scale: float = 1.0) -> float | None:
    v = res.get(key)
    return None if v is None else round(float(v) * scale, 4)


def _not_measured(plan: BuildPlan, res: dict[str, Any], proj: dict[str, float]) -> str:
    if res["complete"]:
        return ""
    return (f"not measured: the build stopped at {res['built_rows']:,} rows after {res['build_s']:.0f} s (its limit); "
            f"the commit costs measured project {proj['today_s'] / 3600:.1f} h for the whole build")


def size_figures(tag: str, plan: BuildPlan, res: dict[str, Any], proj: dict[str, float], large: bool) -> list[Figure]:
    """The figures of one store size (``tag`` small or large); targets only on the large one."""
    n = label(plan.rows)
    note = _not_measured(plan, res, proj)
    peak = res["vm_hwm_kib"] * 1024 / 1e6 if res["complete"] else None

    def target(name: str) -> dict[str, Any]:
        return dict(target=TARGETS[name], op="<=") if large else {}

    return [
        Figure(f"scale_commit1000_{tag}_ms", f"Scale: a {plan.big_rows:,}-row commit at {n} rows",
               _value(res, "big_ms"), "ms",
               f"median of {plan.big_commits} commit(s) of {plan.big_rows:,} rows (shards of 64 clips written "
               f"first, not timed) into the {n}-row store", details={"times_s": _rounded(res.get("big_s"))},
               note=note),
        Figure(f"scale_segments_{tag}", f"Scale: index segments after the build at {n} rows",
               _value(res, "segments"), "segments",
               "`writer.index_segments` after the build's and the timed commits, before compaction",
               details={"after_compaction": res.get("segments_after")}, note=note),
        Figure(f"scale_compact_{tag}_s", f"Scale: compaction at {n} rows", _value(res, "compact_s"), "s",
               "one `writer.compact()` after the build's and the timed commits (the index rewritten as one "
               "segment)", note=note),
        Figure(f"scale_open_{tag}_s", f"Scale: open_store at {n} rows", _value(res, "open_s"), "s",
               "open_store(path) of the finished store in this process, median of its repeats",
               details={"times_s": res.get("open_times_s")}, note=note, **target("open_s")),
        Figure(f"scale_validate_{tag}_s", f"Scale: validate (quick) at {n} rows", _value(res, "validate_s"), "s",
               f"specstore.store.validate(path) of the finished store ({res.get('shards', '?')} shards; "
               f"problems found: {res.get('problems', '?')})", note=note, **target("validate_s")),
        Figure(f"scale_len_{tag}", f"Scale: len(store) at {n} rows", _value(res, "len"), "clips",
               "len(open_store(path)): the build's and the timed commits' rows", note=note),
        Figure(f"scale_plan_{tag}_s", f"Scale: plan_batches over every clip at {n} rows", _value(res, "plan_s"), "s",
               f"plan_batches(store.lengths, Budget(2 GiB, 33 MiB per 1,000 frames, max batch 16, align 16)) as "
               f"bench_plan calls it; {res.get('batches', '?')} batches", note=note, **target("plan_s")),
        Figure(f"scale_writer_peak_{tag}_mb", f"Scale: the writer's process peak memory at {n} rows",
               None if peak is None else round(peak, 1), "MB",
               "VmHWM of the child process that holds the writer (imports, build, timed commits, compaction; the "
               "shard-writing workers are other processes), MB = 10^6 bytes",
               details={"ru_maxrss_kib": res["ru_maxrss_kib"],
                        "vm_hwm_before_compaction_mb": _value(res, "vm_hwm_before_compact_kib", 1024 / 1e6)},
               note=note, **target("writer_peak_mb")),
        Figure(f"scale_build_{tag}_s", f"Scale: building the {n}-row store", round(res["build_s"], 2), "s",
               f"{plan.commits} commits of {_shards_per_commit(plan)} shard(s) of "
               f"~{plan.build_rows / plan.n_shards:.0f} clips ({plan.build_rows:,} rows), shards written "
               f"by 2 processes while the driver commits",
               details={"complete": res["complete"], "commits_done": res["build_commits"],
                        "rows_built": res["built_rows"], "commit_s_total": round(res["commit_s_total"], 2),
                        "worker_s_total": round(res["worker_s"], 2), "driver_wait_s": round(res["wait_s"], 2),
                        **{k: round(v, 3) for k, v in proj.items()}}),
    ]


def run(work: Path, *, sizes: Sequence[int], commits: int, clips_per_shard: int, big_commits: int, big_rows: int,
        one_row_commits: int, workers: int, limit_s: float, repeats: int) -> GroupResult:
    """The scale group: a small and a large store (``sizes``), each built and measured in turn."""
    work.mkdir(parents=True, exist_ok=True)
    plans = build_plans(sizes, commits, clips_per_shard, big_commits, big_rows, one_row_commits)
    for p in plans:
        p.check()
    results = [measure_size(work, p, workers, limit_s, repeats) for p in plans]
    for res in results:
        res["big_ms"] = statistics.median(res["big_s"]) * 1e3 if res.get("big_s") else None
        res["one_ms"] = statistics.median(res["one_s"]) * 1e3 if res.get("one_s") else None
    projs = [projections(p, r, workers) for p, r in zip(plans, results, strict=True)]
    figures = _commit1_figures(plans, results, projs)
    for tag, p, r, pr in zip(("small", "large"), plans, results, projs, strict=True):
        figures += size_figures(tag, p, r, pr, large=tag == "large")
    figures += _projection_figures(plans[-1], projs[-1])
    return GroupResult("store at scale", figures, method=_method(plans, workers, limit_s, repeats))


def _commit1_figures(plans: Sequence[BuildPlan], results: Sequence[dict[str, Any]],
                     projs: Sequence[dict[str, float]]) -> list[Figure]:
    small, large = results
    ns = [label(p.rows) for p in plans]
    growth = None
    if small.get("one_ms") and large.get("one_ms"):
        growth = round(large["one_ms"] / small["one_ms"], 3)
    what = (f"median of {plans[0].one_row_commits} commits, each adding one new shard of one clip (written first, "
            f"not timed), whatever compaction the writer does included")
    return [
        Figure("scale_commit1_small_ms", f"Scale: a one-row commit at {ns[0]} rows", _value(small, "one_ms"), "ms",
               what, details={"times_s": _rounded(small.get("one_s"))}, note=_not_measured(plans[0], small, projs[0])),
        Figure("scale_commit1_large_ms", f"Scale: a one-row commit at {ns[1]} rows", _value(large, "one_ms"), "ms",
               what, details={"times_s": _rounded(large.get("one_s"))}, note=_not_measured(plans[1], large, projs[1])),
        Figure("scale_commit1_growth", f"Scale: a one-row commit at {ns[1]} rows vs at {ns[0]}", growth, "x",
               "scale_commit1_large_ms / scale_commit1_small_ms, both measured in this run",
               target=TARGETS["commit1_growth"], op="<=",
               note=_not_measured(plans[1], large, projs[1]) or _not_measured(plans[0], small, projs[0])),
    ]


def _projection_figures(plan: BuildPlan, proj: dict[str, float]) -> list[Figure]:
    n = label(plan.rows)
    return [
        Figure("scale_build_projected_today_s", f"Scale: the {n}-row build at this writer's commit costs",
               round(proj["today_s"], 1), "s",
               f"projected from the large build's commits: commit seconds fitted as a + b x rows already committed "
               f"(a {proj['commit_a_ms']:.1f} ms, b {proj['commit_us_per_row']:.2f} us per row) summed over the "
               f"{plan.commits} commits ({proj['commits_s']:.0f} s), plus the shard writing alone (both on the same 2 "
               f"cores); for a writer that rewrote the whole index at every commit it would grow with the square of "
               f"the rows"),
        Figure("scale_build_projected_cheap_s", f"Scale: the {n}-row build with free commits (shard writing alone)",
               round(proj["cheap_s"], 1), "s",
               f"{plan.n_shards:,} shards at {proj['per_shard_ms']:.2f} ms each (measured in the workers) over 2 "
               f"processes: the floor any index can reach"),
    ]


def _method(plans: Sequence[BuildPlan], workers: int, limit_s: float, repeats: int) -> str:
    sizes = " and ".join(f"{p.rows:,}" for p in plans)
    return (f"Stores of {sizes} rows, one feature (mel, {N_BINS} bins, {DTYPE}, raw layout, local disk), 1-2 frames "
            f"per clip, no audio. Each is built in a fresh child process holding the writer, as an extraction "
            f"builds it: {workers} forked workers write the shards (write_shard) while the driver commits them "
            f"(StoreWriter.commit, IndexRow per path: genre_NN/track_NNNNNNN.wav, 10 genre labels, unique hex "
            f"hashes) in {plans[0].commits} commits of about {plans[-1].clips_per_shard} clips per shard where the "
            f"rows allow (otherwise one smaller shard per commit: {plans[0].build_rows / plans[0].n_shards:.0f} "
            f"clips at {plans[0].rows:,} rows). Then, in the same child: {plans[0].big_commits} commit(s) of "
            f"{plans[0].big_rows:,} rows and {plans[0].one_row_commits} one-row commits (timed), the index segments "
            f"(writer.index_segments) and one writer.compact(), the child's VmHWM; the timed commits' rows complete "
            f"the store's size. Then here: open_store ({repeats} time(s)), validate (quick), len and plan_batches over "
            f"every clip. A build that passes {limit_s:.0f} s, or that its measured commit costs project past 3 times "
            f"that, stops early, and its size's figures are not measured.")


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """Run the group at the full (or ``--quick``) sizes, or at ``--sizes``, and log every figure."""
    from .__main__ import FULL, QUICK

    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the QUICK sizes")
    p.add_argument("--sizes", default=None, help="two comma-separated row counts (default: the group's)")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = p.parse_args(argv)
    sizes = dict((QUICK if args.quick else FULL)["scale"])
    if args.sizes:
        sizes["sizes"] = tuple(int(x) for x in args.sizes.split(","))
        if len(sizes["sizes"]) != 2:
            p.error("--sizes takes two row counts, small and large")
    return run_alone("scale", args.workdir, lambda work: run(work, **sizes))


if __name__ == "__main__":
    raise SystemExit(main())
