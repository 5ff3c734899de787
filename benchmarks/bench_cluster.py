"""``make infer`` on a local dask cluster against one process, the machine's bare scaling and the journal's cost.

One synthetic store (``n_clips`` clips of 40-330 frames, 64 mel bins, written with the store's writer by
:mod:`benchmarks.bench_infer_data`) and one untrained plain CNN checkpoint.  Three kinds of process run it:

* two *plain children* (``python -m benchmarks.bench_cluster --serve``), each pinned to one thread
  (``OMP_NUM_THREADS=1``, ``threads=1``), started and warmed once; they take commands on stdin: ``predict``
  (the whole store, one process, today's path), ``journal`` (the cluster path on an inline executor: one
  process, the journal committing every ``commit_seconds``) and ``logits`` (every other row through the
  engine, no framework: the bare work of one half);
* a local dask cluster of 2 single-thread worker processes (``LocalCluster(n_workers=2,
  threads_per_worker=1, processes=True)``), started once and warmed (every worker loads the store, the model
  and runs one tiny unit): that start-up is timed and reported apart;
* this process, the cluster's driver (``predict(..., executor=DaskExecutor(client))``).

Each repeat runs, in an order rotated from repeat to repeat: one process (``t_one``), the two halves at once
(``t_two``), the cluster (``t_cluster``) and one process with the journal (``t_journal``); extra
``journal_pairs`` repeats run only the last A/B.  Figures are medians of per-repeat ratios.  Every CSV
written (one process, cluster, journal) must be byte-identical; the group stops otherwise.

    python -m benchmarks.bench_cluster [--quick] [--workdir DIR]
        runs the group and logs its figures (``make bench ONLY=cluster`` writes the report)
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import numpy as np

from .bench_common import ROOT, CpuWindow, Figure, GroupResult, load_average, log, median, rotated, run_alone

#: The targets (issue 49): the cluster's speed-up as a fraction of the bare scaling, the journal's overhead.
TARGETS = dict(vs_bare=0.85, journal=0.03)
N_BINS, LENGTHS, COMMIT_SECONDS = 64, (40, 330), 2.0
_MARK = "@@bench-cluster "
_THREAD_ENV = {k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")}


# ---------------------------------------------------------------- the plain child (one thread, no framework)


def _options() -> Any:
    from specstore.infer.engine.runtime import RunOptions

    return RunOptions(device="cpu", threads=1, progress=False)


def _sha(path: str | Path) -> str:
    """A CSV's sha256 (:func:`specstore.infer.engine.distributed.file_digest`): equal CSVs, equal digests."""
    from specstore.infer.engine.distributed import file_digest

    return file_digest(path)


def _serve(store: str, model: str) -> int:
    """The child's loop: warm up, say ready, then answer one JSON command per stdin line (seconds taken by the
    work, CPU seconds of this process, a digest of what it computed) until ``quit`` or end of input."""
    import torch

    from specstore.common.executors import InlineExecutor
    from specstore.infer.engine.predict import ClusterStats, predict
    from specstore.infer.engine.runtime import Engine
    from specstore.infer.models.checkpoint import load_checkpoint
    from specstore.infer.options.cluster_options import ClusterOptions
    from specstore.store import open_store

    torch.set_num_threads(1)
    s, opts = open_store(store), _options()
    engine = Engine(opts)
    net = engine.prepare(load_checkpoint(model).build())
    engine.logits(net, s, np.arange(min(8, len(s))), desc="warm-up")

    def reply(**kw: Any) -> None:
        sys.stdout.write(_MARK + json.dumps(kw) + "\n")
        sys.stdout.flush()

    reply(ready=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        t0, c0 = time.perf_counter(), time.process_time()
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "logits":
            rows = np.arange(cmd["start"], len(s), cmd["step"])
            res = engine.logits(net, s, rows, desc="half")
            out = {"sha": hashlib.sha256(np.ascontiguousarray(res.logits).tobytes()).hexdigest()}
        elif cmd["op"] == "predict":
            predict(store, model, cmd["out"], options=opts)
            out = {"sha": _sha(cmd["out"])}
        else:  # journal: the cluster path in this process, the journal committing every few seconds
            with InlineExecutor() as ex:
                stats = predict(store, model, cmd["out"], options=opts, executor=ex,
                                cluster=ClusterOptions(commit_seconds=cmd["commit_seconds"])).stats
            assert isinstance(stats, ClusterStats)
            out = {"sha": _sha(cmd["out"]), "commits": str(stats.commits), "units": str(stats.units)}
        reply(s=time.perf_counter() - t0, cpu_s=time.process_time() - c0, **out)
    return 0


class Child:
    """A plain child process (``--serve``): started now, warm when :meth:`wait_ready` returns."""

    def __init__(self, store: Path, model: Path, log_path: Path) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **_THREAD_ENV)
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, "-m", "benchmarks.bench_cluster", "--serve", str(store),
                                      str(model)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._log, env=env, cwd=ROOT, text=True)

    def send(self, **cmd: Any) -> None:
        stdin: IO[str] | None = self.proc.stdin
        assert stdin is not None
        stdin.write(json.dumps(cmd) + "\n")
        stdin.flush()

    def read(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(_MARK):
                return dict(json.loads(line[len(_MARK):]))
        raise RuntimeError(f"cluster bench child {self.proc.pid} exited ({self.proc.wait()}); see {self._log.name}")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(op="quit")
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self._log.close()


# ---------------------------------------------------------------- the cluster


@dataclasses.dataclass
class Cluster:
    """A warm local dask cluster: its client and executor, and what starting and warming it took (s)."""

    cluster: Any
    client: Any
    executor: Any
    start_s: float
    warm_s: float

    def close(self) -> None:
        self.client.close()
        self.cluster.close()


def start_cluster(store: Path, model: Path, workers: int) -> Cluster:
    """Start the local cluster and warm every worker: each opens the store, loads the model (the run's
    digest, options and feature, so the driver's tasks find them cached) and runs one unit of 4 clips."""
    from dask.distributed import Client

    from specstore.common.executors import DaskExecutor
    from specstore.common.executors.dask_cluster import local_cluster
    from specstore.infer.engine.distributed import UnitJob, file_digest, run_unit
    from specstore.infer.engine.units import unit_key
    from specstore.store import open_store

    for name in ("distributed", "bokeh", "tornado"):
        logging.getLogger(name).setLevel(logging.ERROR)
    t0 = time.perf_counter()
    cluster = local_cluster(workers, dashboard_address=None)  # as `make infer BACKEND=dask` starts one
    client = Client(cluster)
    client.wait_for_workers(workers)
    start_s = time.perf_counter() - t0
    s = open_store(store)
    job = UnitJob(s.location, s.generation, str(model.resolve()), file_digest(model), (), "mel",
                  _options())
    rows = tuple(range(min(4, len(s))))
    hashes = tuple(s.hashes[r] for r in rows)
    t1 = time.perf_counter()
    client.run(run_unit, job, unit_key(hashes), rows, hashes)
    warm_s = time.perf_counter() - t1
    log.info("cluster: %d workers started in %.2f s, warm in %.2f s", workers, start_s, warm_s)
    return Cluster(cluster, client, DaskExecutor(client), start_s, warm_s)


# ---------------------------------------------------------------- the runs


@dataclasses.dataclass
class Runs:
    """What the repeats measured: wall seconds per variant, foreign cores per variant, CSV digests."""

    times: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    foreign: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    cpu: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    csv: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    halves: set[tuple[str, ...]] = dataclasses.field(default_factory=set)
    commits: list[int] = dataclasses.field(default_factory=list)
    units: int = 0

    def add(self, name: str, wall: float, foreign: float) -> None:
        self.times.setdefault(name, []).append(wall)
        self.foreign.setdefault(name, []).append(foreign)

    def ratios(self, a: str, b: str) -> list[float]:
        """Per-repeat ``a / b`` over the repeats that ran both (each variant's k-th time is repeat k's)."""
        return [x / y for x, y in zip(self.times[a], self.times[b], strict=False)]


def _variants(work: Path, children: tuple[Child, Child], cl: Cluster, store: Path, model: Path,
              runs: Runs) -> dict[str, Callable[[int], None]]:
    """The timed variants, each taking the repeat number (for its output's name) and recording into ``runs``."""
    from specstore.infer.engine.predict import ClusterStats, predict

    a, b = children

    def child_run(name: str, op: str, k: int) -> None:
        out = work / f"{name}-{k}.csv"
        with CpuWindow() as w:
            a.send(op=op, out=str(out), commit_seconds=COMMIT_SECONDS)
            res = a.read()
        runs.add(name, w.wall, w.foreign_cores)
        runs.cpu.setdefault(name, []).append(res["cpu_s"])
        runs.csv.setdefault(name, set()).add(res["sha"])
        if op == "journal":
            runs.commits.append(int(res["commits"]))
        out.unlink(missing_ok=True)

    def two(k: int) -> None:
        with CpuWindow() as w:
            a.send(op="logits", start=0, step=2)
            b.send(op="logits", start=1, step=2)
            got = (a.read(), b.read())
        runs.add("two", w.wall, w.foreign_cores)
        runs.halves.add(tuple(g["sha"] for g in got))

    def cluster(k: int) -> None:
        out = work / f"cluster-{k}.csv"
        with CpuWindow() as w:
            stats = predict(str(store), str(model), out, options=_options(), executor=cl.executor).stats
        assert isinstance(stats, ClusterStats)
        runs.add("cluster", w.wall, w.foreign_cores)
        runs.csv.setdefault("cluster", set()).add(_sha(out))
        runs.units = stats.units
        out.unlink(missing_ok=True)

    return {"one": lambda k: child_run("one", "predict", k), "two": two, "cluster": cluster,
            "journal": lambda k: child_run("journal", "journal", k)}


def measure(work: Path, store: Path, model: Path, workers: int, repeats: int, journal_pairs: int) -> tuple[Runs,
                                                                                                           Cluster]:
    """Start the children and the cluster, then run every variant ``repeats`` times (rotating their order) and
    the journal A/B ``journal_pairs`` more times; the cluster is returned closed (its start-up figures)."""
    import torch

    threads = torch.get_num_threads()  # the driver's engine sets 1 thread here: given back at the end
    children = (Child(store, model, work / "child-a.log"), Child(store, model, work / "child-b.log"))
    cl = None
    try:
        for c in children:
            c.read()  # ready
        cl = start_cluster(store, model, workers)
        runs = Runs()
        variants = _variants(work, children, cl, store, model, runs)
        for k in range(repeats):
            for name in rotated(list(variants), k):
                variants[name](k)
            log.info("cluster: repeat %d: %s", k + 1, {n: round(t[-1], 2) for n, t in runs.times.items()})
        for k in range(repeats, repeats + journal_pairs):
            for name in rotated(["one", "journal"], k):
                variants[name](k)
    finally:
        for c in children:
            c.close()
        if cl is not None:
            cl.close()
        torch.set_num_threads(threads)
    assert cl is not None
    return runs, cl


def check_identical(runs: Runs) -> int:
    """The CSVs of every run (one process, cluster, journal) must be one file: raise otherwise; the number
    of CSVs compared."""
    digests = set().union(*runs.csv.values())
    if len(digests) != 1:
        seen = {k: sorted(v) for k, v in runs.csv.items()}
        raise RuntimeError(f"cluster bench: the runs wrote different CSVs: {seen}")
    if len(runs.halves) != 1:
        raise RuntimeError(f"cluster bench: the halves' logits differ between repeats: {runs.halves}")
    return sum(len(runs.times.get(name, [])) for name in ("one", "cluster", "journal"))


# ---------------------------------------------------------------- figures


def _r(xs: list[float], nd: int = 3) -> list[float]:
    return [round(x, nd) for x in xs]


def figures(runs: Runs, cl: Cluster, n_clips: int, workers: int, n_csv: int,
            load: tuple[list[float], list[float]]) -> list[Figure]:
    """The group's figures from what :func:`measure` recorded."""
    t = runs.times
    speedup = median(runs.ratios("one", "cluster"))
    bare = median(runs.ratios("one", "two"))
    vs_bare = median(runs.ratios("two", "cluster"))  # (t_one / t_cluster) / (t_one / t_two), per repeat
    journal = median([r - 1.0 for r in runs.ratios("journal", "one")])
    cpu_journal = median([j / o - 1.0 for j, o in zip(runs.cpu["journal"], runs.cpu["one"], strict=False)])
    common = {"load_before": load[0], "load_after": load[1]}
    t_one = _r(t["one"][:len(t["cluster"])])  # the repeats' (the journal pairs' follow)
    fg = {n: round(median(v), 2) for n, v in runs.foreign.items()}
    return [
        Figure("cluster_vs_bare_scaling", f"Cluster: {workers} dask workers' speed-up as a fraction of bare scaling",
               round(vs_bare, 3), "fraction",
               f"(t_one / t_cluster) / (t_one / t_two) per repeat, median: `predict` of {n_clips:,} clips on a warm "
               f"local dask cluster of {workers} single-thread workers (this process the driver) against the same "
               "rows in two halves, each through the engine in a plain single-thread child process, both at once",
               target=TARGETS["vs_bare"], op=">=",
               details={"t_cluster_s": _r(t["cluster"]), "t_two_s": _r(t["two"]), "units": runs.units,
                        "foreign_cores": fg, **common}),
        Figure("cluster_speedup", f"Cluster: {workers} dask workers against one process", round(speedup, 3), "x",
               "t_one / t_cluster per repeat, median: one single-thread child process running `predict` on the "
               "whole store (today's path, CSV written) against the cluster run",
               details={"t_one_s": t_one, "t_cluster_s": _r(t["cluster"])}),
        Figure("cluster_bare_scaling", "Cluster: the machine's bare scaling over 2 processes", round(bare, 3), "x",
               "t_one / t_two per repeat, median: what 2 plain processes with no framework give on this machine",
               details={"t_one_s": t_one, "t_two_s": _r(t["two"])}),
        Figure("cluster_startup_s", "Cluster: start-up (excluded from the times above)",
               round(cl.start_s + cl.warm_s, 2), "s",
               f"LocalCluster({workers} single-thread worker processes) and Client up with every worker connected "
               f"({cl.start_s:.2f} s), then every worker warm: store opened, model loaded and one 4-clip unit run "
               f"({cl.warm_s:.2f} s)", details={"start_s": round(cl.start_s, 3), "warm_s": round(cl.warm_s, 3)}),
        Figure("cluster_journal_overhead", "Cluster: the journal's overhead in one process", round(journal, 4),
               "fraction",
               f"t_journal / t_one - 1 per A/B pair, median of {len(t['journal'])}: the cluster path on an inline "
               f"executor in one single-thread child, the journal committing every {COMMIT_SECONDS:g} s, against "
               "plain `predict` in the same child",
               target=TARGETS["journal"], op="<=",
               details={"t_journal_s": _r(t["journal"]), "t_one_s": _r(t["one"]), "commits": runs.commits,
                        "cpu_overhead": round(cpu_journal, 4), **common}),
        Figure("cluster_csv_identical", "Cluster: every run's CSV byte-identical", 1.0, "fraction",
               f"{n_csv} CSVs (one process, cluster, journal) compared by sha256: 1 when all are one file (the "
               "group stops otherwise); the halves' logits identical between repeats", target=1.0, op=">=",
               details={"csvs": n_csv}),
    ]


def _method(n_clips: int, workers: int, repeats: int, journal_pairs: int) -> str:
    return (f"A store of {n_clips:,} clips ({LENGTHS[0]}-{LENGTHS[1]} frames, uniform; {N_BINS} mel bins, float16, "
            f"raw layout, local disk) and an untrained plain CNN (the default model, {N_BINS} bins). Two plain child "
            "processes pinned to one thread (OMP_NUM_THREADS=1, threads=1) are started and warmed once; a local dask "
            f"cluster of {workers} single-thread worker processes is started and warmed once (every worker opens the "
            "store, loads the model and runs one tiny unit: the start-up figure, excluded from the others). Each of "
            f"{repeats} repeat(s) runs, in an order rotated from repeat to repeat: one child's `predict` of the "
            "whole store (t_one), both children at once each on every other row through the engine alone (t_two), "
            "`predict(..., executor=DaskExecutor(client))` from this process on the cluster with the default units "
            "and journal (t_cluster), and one child's `predict` on an inline executor with the journal committing "
            f"every {COMMIT_SECONDS:g} s (t_journal); {journal_pairs} more A/B pair(s) of t_one and t_journal follow. "
            "Figures are medians of per-repeat ratios. Every CSV must be byte-identical, or the group stops.")


def run(work: Path, *, n_clips: int, workers: int, repeats: int, journal_pairs: int) -> GroupResult:
    """The cluster group (see the module docstring)."""
    from .bench_infer_data import make_checkpoint, make_store

    work.mkdir(parents=True, exist_ok=True)
    store, model = work / "cluster.zarr", work / "cluster.pt"
    shutil.rmtree(store, ignore_errors=True)
    lengths = np.random.default_rng(49).integers(LENGTHS[0], LENGTHS[1] + 1, n_clips)
    make_store(store, lengths, n_bins=N_BINS)
    make_checkpoint(model, n_bins=N_BINS)
    load_before = load_average()
    runs, cl = measure(work, store, model, workers, repeats, journal_pairs)
    n_csv = check_identical(runs)
    figs = figures(runs, cl, n_clips, workers, n_csv, (load_before, load_average()))
    return GroupResult("cluster inference", figs, method=_method(n_clips, workers, repeats, journal_pairs))


# ---------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """Run the group at the full (or ``--quick``) sizes and log every figure; ``--serve``: the plain child."""
    from .__main__ import FULL, QUICK

    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_cluster", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the QUICK sizes")
    p.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    p.add_argument("--serve", nargs=2, metavar=("STORE", "MODEL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        return _serve(*args.serve)
    return run_alone("cluster", args.workdir, lambda work: run(work, **(QUICK if args.quick else FULL)["cluster"]))


if __name__ == "__main__":
    raise SystemExit(main())
