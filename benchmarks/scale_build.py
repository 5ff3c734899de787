"""The scale group's synthetic stores: built through the public writer in a fresh child process (the *driver*).

No audio: one feature (log-mel of 4 bins, float16, raw layout, a local
temporary folder) and 1-2 frames per clip, so what is measured is the
store's own bookkeeping.  The driver holds the
:class:`~specstore.store.StoreWriter` and builds the store as an extraction
does: 2 forked worker processes write the shards with
:func:`~specstore.store.write_shard` while the driver commits them with
:meth:`~specstore.store.StoreWriter.commit` as they come, in ``commits``
commits (about 64 clips per shard where that gives at least that many
shards, else one shard per commit).  Paths look like
``genre_07/track_0123456.wav``, labels are 10 genres, content hashes are
unique hex.  After the build the driver times 1 000-row commits and one-row
commits (each one new shard of one clip; only ``commit`` is timed), counts
the index segments, times one ``compact()`` (:func:`segments_and_compaction`),
and reports its own peak RSS (VmHWM).

A build that passes ``limit_s``, or that its measured commit costs project past 3 times it, stops early (a
writer whose commits grow with the index would otherwise run for hours); its figures are then not measured.

    python -m benchmarks.scale_build STORE --rows N ...
        the driver (run by :func:`run_driver`; prints one JSON line)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import multiprocessing
import resource
import statistics
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from benchmarks.bench_probe import status_kib

from .bench_common import log, run_probe

if TYPE_CHECKING:
    from specstore.store import IndexRow, ShardInfo, StoreWriter

#: The feature every clip has: the smallest mel the spec allows that still looks like one (bins), float16.
N_BINS = 4
DTYPE = "float16"
FRAME_SECONDS = 512 / 22050
GENRES = tuple(f"genre_{g:02d}" for g in range(10))


# ---------------------------------------------------------------- the synthetic corpus


def clip_hash(i: int) -> str:
    """Clip ``i``'s content hash: unique, random-looking hex (32 digits, as the pipeline's)."""
    return hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).hexdigest()


def clip_path(i: int) -> str:
    """Clip ``i``'s path in the index: ``genre_NN/track_NNNNNNN.wav``."""
    return f"{GENRES[i % len(GENRES)]}/track_{i:07d}.wav"


def clip_frames(i: int) -> int:
    """Clip ``i``'s length: 1 or 2 frames."""
    return 1 + i % 2


@dataclass(frozen=True)
class BuildPlan:
    """How a store of ``rows`` clips is built: ``commits`` build commits, then the timed ones.

    The timed commits (``big_commits`` of ``big_rows`` rows, then ``one_row_commits`` of one) add their rows
    to the build's, so the store ends with exactly ``rows`` clips.
    """

    rows: int
    commits: int
    clips_per_shard: int
    big_commits: int
    big_rows: int
    one_row_commits: int

    @property
    def build_rows(self) -> int:
        """Rows the build commits write (the store's rows less the timed commits')."""
        return self.rows - self.big_commits * self.big_rows - self.one_row_commits

    @property
    def n_shards(self) -> int:
        """Shards of the build: ``clips_per_shard`` clips each, but at least one per commit."""
        return max(math.ceil(self.build_rows / self.clips_per_shard), self.commits)

    def shard_clips(self, s: int) -> range:
        """Clip ids of build shard ``s``."""
        return range(s * self.build_rows // self.n_shards, (s + 1) * self.build_rows // self.n_shards)

    def commit_shards(self, c: int) -> range:
        """Build shards of commit ``c``."""
        return range(c * self.n_shards // self.commits, (c + 1) * self.n_shards // self.commits)

    def check(self) -> None:
        """Raise ValueError where the timed commits leave fewer rows than build commits."""
        if self.build_rows < self.commits:
            raise ValueError(f"{self.rows} rows are too few for {self.commits} commits after the timed ones")


# ---------------------------------------------------------------- the worker side


def write_clips(store: str, clips: Sequence[int]) -> ShardInfo:
    """Write one shard holding ``clips`` (their frames, hashes, durations); returns its ShardInfo."""
    from specstore.store import write_shard

    lengths = [clip_frames(i) for i in clips]
    frames = [np.full((n, N_BINS), i % 251, dtype=np.float16) for i, n in zip(clips, lengths, strict=True)]
    return write_shard(store, {"mel": frames}, [clip_hash(i) for i in clips], [n * FRAME_SECONDS for n in lengths])


def write_commit_shards(store: str, shards: Sequence[Sequence[int]]) -> tuple[list[ShardInfo], float]:
    """A worker's task: the shards of one commit; returns their ShardInfos and the seconds it took."""
    t0 = time.perf_counter()
    infos = [write_clips(store, clips) for clips in shards]
    return infos, time.perf_counter() - t0


# ---------------------------------------------------------------- the driver side


def index_rows(clips: Sequence[int]) -> list[IndexRow]:
    """The index rows of ``clips``: path, content hash, genre label."""
    from specstore.store import IndexRow

    return [IndexRow(clip_path(i), clip_hash(i), GENRES[i % len(GENRES)]) for i in clips]


def segments_and_compaction(writer: StoreWriter) -> dict[str, Any]:
    """The writer's index segments (``writer.index_segments``), the seconds one ``writer.compact()`` takes,
    and the segments after it."""
    out: dict[str, Any] = {"segments": writer.index_segments}
    t0 = time.perf_counter()
    writer.compact()
    out["compact_s"] = time.perf_counter() - t0
    out["segments_after"] = writer.index_segments
    return out


def commit_model(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``commit seconds = a + b * rows already committed`` through ``points``; (a, b), b >= 0.

    A line through the medians of the first and the last third of the points (in commit order), so that a
    few commits slowed by other processes do not tilt it.
    """
    if len(points) < 6:
        return (statistics.median(s for _, s in points) if points else 0.0), 0.0
    k = len(points) // 3
    (r0, s0), (r1, s1) = ((statistics.median(r for r, _ in part), statistics.median(s for _, s in part))
                          for part in (points[:k], points[-k:]))
    b = max((s1 - s0) / (r1 - r0), 0.0) if r1 > r0 else 0.0
    return float(s0 - b * r0), float(b)


def projected_commit_s(model: tuple[float, float], rows: int, commits: int) -> float:
    """Seconds ``commits`` commits of ``rows / commits`` rows each take under ``model`` (rows before commit c:
    ``c * rows / commits``)."""
    a, b = model
    return commits * a + b * rows * (commits - 1) / 2


class Builder:
    """The driver: the store's writer, a pool of shard-writing workers, and what the build measured."""

    def __init__(self, store: str, plan: BuildPlan, workers: int, limit_s: float) -> None:
        self.store, self.plan, self.limit_s = store, plan, limit_s
        from specstore.store import FeatureSpec, create_store, write_shard  # noqa: F401 - imported once, forked

        # Forked after the imports (so no worker pays them inside a timed task) and before the writer and
        # zarr's I/O threads exist.
        self.pool = multiprocessing.get_context("fork").Pool(workers)
        self.workers = workers

        self.writer = create_store(store, {"mel": FeatureSpec.mel(n_bins=N_BINS, dtype=DTYPE)}, layout="raw",
                                   label_names=GENRES)
        self.points: list[tuple[int, float]] = []  # (rows before, seconds) of every build commit
        self.worker_s = 0.0
        self.wait_s = 0.0
        self.rows = 0

    def close(self) -> None:
        """Close the writer and the worker pool."""
        self.writer.close()
        self.pool.close()
        self.pool.join()

    def _commit(self, infos: Sequence[ShardInfo], clips: Sequence[int]) -> float:
        """Commit ``infos`` with the rows of ``clips``; the seconds ``commit`` took (the rows built first)."""
        rows = index_rows(clips)
        t0 = time.perf_counter()
        self.writer.commit(infos, rows)
        seconds = time.perf_counter() - t0
        self.rows += len(rows)
        return seconds

    def _over_limit(self, t0: float, done: int) -> bool:
        """Past the limit, or projected past 3 times it by the commit costs measured so far (checked every 10
        commits once a tenth of them are done: a slope fitted over fewer rows extrapolates too far; the margin
        lets a build that only looks slow finish, up to the limit itself)."""
        elapsed = time.perf_counter() - t0
        if elapsed > self.limit_s:
            return True
        if done < max(20, self.plan.commits // 10) or done % 10:
            return False
        left = projected_commit_s(commit_model(self.points), self.plan.build_rows, self.plan.commits)
        left -= projected_commit_s(commit_model(self.points), self.rows, done)
        return elapsed + left > 3 * self.limit_s

    def build(self) -> bool:
        """The build commits, each committed as soon as its shards are written (at most 2 per worker in
        flight, so finished shards do not pile up in the driver); False if it stopped at the limit."""
        plan = self.plan
        pending: deque[Any] = deque()  # AsyncResults of write_commit_shards, in commit order
        t0 = time.perf_counter()
        submitted = 0
        for c in range(plan.commits):
            while submitted < plan.commits and len(pending) < 2 * self.workers:
                shards = [list(plan.shard_clips(s)) for s in plan.commit_shards(submitted)]
                pending.append(self.pool.apply_async(write_commit_shards, (self.store, shards)))
                submitted += 1
            w0 = time.perf_counter()
            infos, worker_s = pending.popleft().get()
            self.wait_s += time.perf_counter() - w0
            self.worker_s += worker_s
            clips = [i for s in plan.commit_shards(c) for i in plan.shard_clips(s)]
            self.points.append((self.rows, self._commit(infos, clips)))
            if c + 1 < plan.commits and self._over_limit(t0, c + 1):
                log.info("scale: build of %d rows stopped after %d commits (%d rows, %.0f s): past the %.0f s limit",
                         plan.rows, c + 1, self.rows, time.perf_counter() - t0, self.limit_s)
                for r in pending:
                    r.wait()
                return False
        return True

    def timed_commits(self) -> dict[str, list[float]]:
        """``big_commits`` commits of ``big_rows`` rows (shards of 64 clips), then ``one_row_commits`` of one
        shard of one clip: only ``commit`` is timed, whatever segment merging it does included."""
        plan = self.plan
        first = plan.build_rows
        big: list[float] = []
        for k in range(plan.big_commits):
            clips = list(range(first + k * plan.big_rows, first + (k + 1) * plan.big_rows))
            shards = [clips[j:j + 64] for j in range(0, len(clips), 64)]
            infos, _ = write_commit_shards(self.store, shards)
            big.append(self._commit(infos, clips))
        first += plan.big_commits * plan.big_rows
        one: list[float] = []
        for k in range(plan.one_row_commits):
            info = write_clips(self.store, [first + k])
            one.append(self._commit([info], [first + k]))
        return {"big_s": big, "one_s": one}


def drive(store: str, plan: BuildPlan, workers: int, limit_s: float) -> dict[str, Any]:
    """Build the store and time the writer (the child process's work); what it measured, as JSON-able values."""
    plan.check()
    b = Builder(store, plan, workers, limit_s)
    t0 = time.perf_counter()
    try:
        complete = b.build()
        build_s = time.perf_counter() - t0
        out: dict[str, Any] = {"complete": complete, "build_s": build_s, "build_commits": len(b.points),
                               "built_rows": b.rows, "commit_s_total": sum(s for _, s in b.points),
                               "worker_s": b.worker_s, "wait_s": b.wait_s, "model": commit_model(b.points),
                               "shards_written": sum(len(plan.commit_shards(c)) for c in range(len(b.points)))}
        if complete:
            out.update(b.timed_commits())
            out["vm_hwm_before_compact_kib"] = status_kib("VmHWM")
            out.update(segments_and_compaction(b.writer))
            out["rows"] = b.rows
    finally:
        b.close()
    out["vm_hwm_kib"] = status_kib("VmHWM")
    out["ru_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return out


def run_driver(store: Path, plan: BuildPlan, workers: int, limit_s: float) -> dict[str, Any]:
    """:func:`drive` in a fresh interpreter (its peak RSS is the writer's alone); its last stdout line."""
    args = [str(store), "--workers", str(workers), "--limit-s", str(limit_s),
            *(f"--{k.replace('_', '-')}={v}" for k, v in asdict(plan).items())]
    return run_probe(args, timeout=limit_s * 3 + 600, module="benchmarks.scale_build")


def main(argv: list[str] | None = None) -> int:
    """The driver's command line: build one store, print what :func:`drive` measured as one JSON line."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_build", description=__doc__.split("\n\n")[0])
    p.add_argument("store")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--limit-s", type=float, default=math.inf)
    for name in BuildPlan.__dataclass_fields__:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, required=True)
    a = vars(p.parse_args(argv))
    plan = BuildPlan(**{k: a[k] for k in BuildPlan.__dataclass_fields__})
    sys.stdout.write(json.dumps(drive(a["store"], plan, a["workers"], a["limit_s"])) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
