"""The extraction driver: corpus -> hashes -> tasks on joblib workers -> atomic commits.

The driver is the store's only committer.  Workers decode and write whole
shards; results come back as they finish and are committed in small batches
(every ``commit_seconds``), so an interruption loses at most the work since
the last commit, and a rerun does only what is missing.
"""

from __future__ import annotations

import logging
import math
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joblib import Parallel, delayed, effective_n_jobs, parallel_config
from joblib.parallel import get_active_backend
from tqdm.auto import tqdm

from store import SpecstoreError, ErrorRow, FeatureSpec, IndexRow, ShardInfo, StoreWriter, create_store, default_specs

from .corpus import CorpusItem, scan_corpus
from .hashing import content_hash
from .tasks import TaskItem, TaskResult, run_task

__all__ = ["ExtractError", "ExtractSummary", "extract", "plan_tasks"]

log = logging.getLogger(__name__)

#: Files hashed per joblib call (amortises dispatch; hashing one file is ~ms).
HASH_BATCH = 64
#: Upper bounds on one task (= one shard): files, and bytes of source files.
MAX_TASK_FILES = 64
MAX_TASK_BYTES = 256 << 20


class ExtractError(SpecstoreError):
    """The run had to stop (the store stays at its last commit); one-line message."""


@dataclass
class ExtractSummary:
    """What one extraction run did. Times in seconds, sizes in bytes."""

    store: str
    files: int = 0
    decoded: int = 0
    indexed: int = 0
    duplicates: int = 0
    unchanged: int = 0
    audio_seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)
    store_bytes: int | None = None
    wall_seconds: float = 0.0
    clips_in_store: int = 0

    def report(self, max_errors: int = 20) -> str:
        """A short human-readable summary, bad files with their reasons included."""
        rate = self.audio_seconds / self.wall_seconds if self.wall_seconds else 0.0
        size = "unknown" if self.store_bytes is None else _human_bytes(self.store_bytes)
        lines = [
            f"store        {self.store}",
            f"files found  {self.files:,}",
            f"decoded      {self.decoded:,} clips, {self.audio_seconds / 3600:.2f} h of audio ({rate:,.0f}x realtime)",
            f"indexed      {self.indexed:,} paths this run; {self.clips_in_store:,} in the store",
            f"duplicates   {self.duplicates:,} paths whose content was already decoded",
            f"unchanged    {self.unchanged:,} paths already in the store",
            f"bad files    {len(self.errors):,}",
        ]
        for path, reason in sorted(self.errors.items())[:max_errors]:
            lines.append(f"  {path}: {reason}")
        if len(self.errors) > max_errors:
            lines.append(f"  ... and {len(self.errors) - max_errors} more (see the store's error table)")
        lines += [f"store size   {size}", f"wall time    {self.wall_seconds:.1f} s"]
        return "\n".join(lines)


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _hash_batch(sources: list[str]) -> list[tuple[str | None, str | None]]:
    """``(hash, None)`` or ``(None, reason)`` for each source file."""
    out: list[tuple[str | None, str | None]] = []
    for src in sources:
        try:
            if os.path.islink(src) and not os.path.exists(src):
                out.append((None, "broken symlink"))
                continue
            st = os.stat(src)
            if not stat.S_ISREG(st.st_mode):
                out.append((None, "not a regular file"))
            elif st.st_size == 0:
                out.append((None, "empty file"))
            else:
                out.append((content_hash(src), None))
        except PermissionError:
            out.append((None, "unreadable: permission denied"))
        except OSError as e:
            out.append((None, f"unreadable: {e.strerror or e}"))
    return out


def plan_tasks(todo: Sequence[tuple[TaskItem, int]], n_jobs: int, *, max_files: int = MAX_TASK_FILES,
               max_bytes: int = MAX_TASK_BYTES) -> list[list[TaskItem]]:
    """Group ``(item, file bytes)`` pairs into tasks (one task = one shard).

    Aims at >= 4 tasks per worker so the pool stays busy to the end, while a
    task never exceeds ``max_files`` files or ``max_bytes`` source bytes (a
    lone larger file is a task of its own).  Order is kept: deterministic.
    """
    if not todo:
        return []
    per_task = max(1, min(max_files, math.ceil(len(todo) / (4 * max(n_jobs, 1)))))
    tasks: list[list[TaskItem]] = []
    cur: list[TaskItem] = []
    cur_bytes = 0
    for item, size in todo:
        if cur and (len(cur) >= per_task or cur_bytes + size > max_bytes):
            tasks.append(cur)
            cur, cur_bytes = [], 0
        cur.append(item)
        cur_bytes += size
    tasks.append(cur)
    return tasks


def _file_size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def extract(
    corpus: str | os.PathLike[str],
    store: str,
    *,
    features: Iterable[str] = ("mel", "cqt"),
    jobs: int | None = None,
    backend: str = "loky",
    scheduler: str | None = None,
    layout: str = "raw",
    specs: dict[str, FeatureSpec] | None = None,
    block_seconds: float = 60.0,
    commit_seconds: float = 2.0,
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
) -> ExtractSummary:
    """Decode ``corpus`` once into the feature store ``store``; resumable and deduplicated.

    ``corpus`` is a folder (one sub-folder per label) or a ``path,label`` CSV.
    ``jobs`` workers (default: all cores) run on the joblib ``backend``
    (``loky``; ``dask`` with ``scheduler`` = a ``tcp://`` address, or a local
    cluster when None; ``threading``; ``ray`` if installed).  Returns an
    :class:`ExtractSummary`; raises ``CorpusError`` for an unusable corpus,
    ``StoreError`` for an incompatible store, :class:`ExtractError` when
    writing fails.
    """
    t0 = time.perf_counter()
    root, items = scan_corpus(corpus)
    specs = specs or default_specs(tuple(features))
    writer = create_store(store, specs, layout=layout, storage_options=storage_options)
    writer.remove_orphans()
    n_jobs = jobs or os.cpu_count() or 1
    summary = ExtractSummary(store=str(store), files=len(items))

    with ExitStack() as stack:
        stack.enter_context(_backend(backend, scheduler, n_jobs, stack))
        # 1. Hash every file (cheap, parallel): dedup and resume both key on content.
        hashes, hash_errors = _hash_all(items, progress)
        # 2. Decide what needs decoding.
        committed = writer.committed_rows()
        known = writer.committed_hashes()
        quick_rows: list[IndexRow] = []
        todo: dict[str, list[CorpusItem]] = {}
        for it in items:
            h = hashes.get(it.path)
            if h is None:
                continue
            if committed.get(it.path) == (h, it.label):
                summary.unchanged += 1
            elif h in known:
                quick_rows.append(IndexRow(it.path, h, it.label))
                summary.duplicates += 1
            else:
                todo.setdefault(h, []).append(it)
        summary.duplicates += sum(len(v) - 1 for v in todo.values())
        summary.errors.update(hash_errors)
        if quick_rows or hash_errors:
            _commit(writer, [], quick_rows, [ErrorRow(p, r) for p, r in hash_errors.items()])
            summary.indexed += len(quick_rows)
        # 3. Decode the distinct contents, one shard per task, committing as results arrive.
        work = [(TaskItem(str(v[0].source), h), _file_size(v[0].source)) for h, v in todo.items()]
        tasks = plan_tasks(work, n_jobs)
        spec_dicts = {k: v.to_dict() for k, v in specs.items()}
        _run_tasks(writer, tasks, todo, spec_dicts, block_seconds, commit_seconds, progress, summary,
                   storage_options)

    summary.clips_in_store = writer.commit_state.n_clips
    summary.wall_seconds = time.perf_counter() - t0
    if writer.location.local is not None:
        summary.store_bytes = _dir_bytes(writer.location.local)
    return summary


def _backend(backend: str, scheduler: str | None, n_jobs: int, stack: ExitStack) -> Any:
    """The joblib ``parallel_config`` for ``backend`` (connecting to or starting dask or ray when asked)."""
    if backend == "dask":
        try:
            from dask.distributed import Client, LocalCluster
        except ImportError:
            raise ExtractError("BACKEND=dask needs dask.distributed: pip install 'specstore[dask]'") from None
        if scheduler:
            try:
                client = stack.enter_context(Client(scheduler))
            except (OSError, ValueError) as e:
                raise ExtractError(f"cannot reach the dask scheduler at {scheduler}: {e}".splitlines()[0]) from None
        else:
            cluster = stack.enter_context(LocalCluster(n_workers=n_jobs, threads_per_worker=1, processes=True))
            client = stack.enter_context(Client(cluster))
        log.info("dask backend on %s", client.dashboard_link or scheduler)
        return parallel_config(backend="dask", n_jobs=-1)
    if backend == "ray":
        try:
            import ray
            from ray.util.joblib import register_ray
        except ImportError:
            raise ExtractError("BACKEND=ray needs ray: pip install ray") from None
        # SCHEDULER (or RAY_ADDRESS) names a running cluster ("auto", "ray://head:10001");
        # without one, a local ray of n_jobs CPUs lives for this run.
        address = scheduler or os.environ.get("RAY_ADDRESS")
        if not ray.is_initialized():
            options: dict[str, Any] = {"address": address} if address else {"num_cpus": n_jobs}
            try:
                ray.init(**options)
            except (ConnectionError, OSError, ValueError) as e:
                reason = str(e).splitlines()[0] if str(e) else type(e).__name__
                raise ExtractError(f"cannot start or reach ray ({address or 'local'}): {reason}") from None
            stack.callback(ray.shutdown)
        register_ray()
        return parallel_config(backend="ray", n_jobs=-1 if address else n_jobs)
    if backend not in ("loky", "threading", "multiprocessing"):
        raise ExtractError(f"unknown backend {backend!r}; choose loky, threading, multiprocessing, dask or ray")
    extra = {"inner_max_num_threads": 1} if backend == "loky" else {}
    return parallel_config(backend=backend, n_jobs=n_jobs, **extra)


def _hash_all(items: list[CorpusItem], progress: bool) -> tuple[dict[str, str], dict[str, str]]:
    """Hash every file on local threads (hashlib releases the GIL on large buffers).

    Hashing is I/O-bound and happens where the driver runs, whatever the
    extraction backend, so it needs no worker processes.
    """
    batches = [items[i:i + HASH_BATCH] for i in range(0, len(items), HASH_BATCH)]
    hashes: dict[str, str] = {}
    errors: dict[str, str] = {}
    threads = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=threads) as pool, \
            tqdm(total=len(items), unit="file", desc="hashing", disable=not progress, leave=False) as bar:
        results = pool.map(_hash_batch, ([str(it.source) for it in b] for b in batches))
        for batch, res in zip(batches, results):
            for it, (h, reason) in zip(batch, res):
                if h is not None:
                    hashes[it.path] = h
                else:
                    errors[it.path] = reason or "unreadable"
            bar.update(len(batch))
    return hashes, errors


def _commit(writer: StoreWriter, shards: list[ShardInfo], rows: list[IndexRow], errors: list[ErrorRow]) -> None:
    try:
        writer.commit(shards, rows, errors)
    except OSError as e:
        raise ExtractError(f"committing to the store failed ({e.strerror or e}); "
                           f"the store is left at its last commit ({writer.commit_state.n_clips} clips)") from None


def _run_tasks(writer: StoreWriter, tasks: list[list[TaskItem]], todo: dict[str, list[CorpusItem]],
               spec_dicts: dict[str, dict[str, Any]], block_seconds: float, commit_seconds: float,
               progress: bool, summary: ExtractSummary, storage_options: dict[str, Any] | None) -> None:
    url = writer.location.url if writer.location.local is None else str(writer.location.local)
    # memory:// is a dict inside this process: only threads, or one job run inline, can write to it.
    active, active_jobs = get_active_backend()
    if url.startswith("memory://") and not (getattr(active, "uses_threads", False)
                                             or effective_n_jobs(active_jobs) == 1):
        raise ExtractError(f"{url} lives in this process's memory, where worker processes cannot write; "
                           "use jobs=1 or the threading backend, or a file or object-store path")
    if not tasks:
        return
    calls = [delayed(run_task)(url, t, spec_dicts, block_seconds, storage_options) for t in tasks]

    def finished() -> Iterator[TaskResult]:
        """Task results as they finish (in rounds where the backend can only return whole lists)."""
        if getattr(active, "supports_return_generator", False):
            yield from Parallel(return_as="generator_unordered")(calls)
            return
        # ray's and multiprocessing's joblib backends return lists only: rounds of about four tasks
        # per worker on one pool, so results still reach a commit after every round.
        step = 4 * max(effective_n_jobs(active_jobs), 1)
        with Parallel() as parallel:
            for i in range(0, len(calls), step):
                yield from parallel(calls[i:i + step])

    pending: tuple[list[ShardInfo], list[IndexRow], list[ErrorRow]] = ([], [], [])
    last = time.monotonic()
    total = sum(len(t) for t in tasks)
    bar = tqdm(total=total, unit="file", desc="extracting", disable=not progress, dynamic_ncols=True)
    t0 = time.perf_counter()
    try:
        for res in finished():
            _collect(res, todo, pending, summary)
            bar.update(res.files)
            elapsed = max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix(audio=f"{summary.audio_seconds / 3600:.2f}h",
                            speed=f"{summary.audio_seconds / elapsed:.0f}x", errors=len(summary.errors))
            if time.monotonic() - last >= commit_seconds:
                _commit(writer, *pending)
                pending = ([], [], [])
                last = time.monotonic()
    except OSError as e:
        raise ExtractError(f"writing a shard failed ({e.strerror or e}); "
                           f"the store is left at its last commit ({writer.commit_state.n_clips} clips)") from None
    except KeyboardInterrupt:
        if any(pending):
            _commit(writer, *pending)
        raise
    finally:
        bar.close()
    if any(pending):
        _commit(writer, *pending)


def _collect(res: TaskResult, todo: dict[str, list[CorpusItem]],
             pending: tuple[list[ShardInfo], list[IndexRow], list[ErrorRow]], summary: ExtractSummary) -> None:
    shards, rows, errors = pending
    if res.shard is not None:
        shards.append(res.shard)
        for clip in res.shard.clips:
            rows += [IndexRow(it.path, clip.hash, it.label) for it in todo[clip.hash]]
        summary.decoded += len(res.shard.clips)
        summary.indexed += sum(len(todo[c.hash]) for c in res.shard.clips)
    for h, reason in res.failed.items():
        for it in todo[h]:
            errors.append(ErrorRow(it.path, reason))
            summary.errors[it.path] = reason
    summary.audio_seconds += res.seconds
