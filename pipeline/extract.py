"""The extraction driver: corpus -> hashes -> tasks on joblib workers -> atomic commits.

The driver is the store's only committer and holds its writer lock for the
whole run.  Workers decode and write whole shards; results come back as they
finish and are committed in small batches (every ``commit_seconds``), so an
interruption loses at most the work since the last commit, and a rerun does
only what is missing.  Every file of the corpus ends up either indexed or in
the error table with its reason.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import stat
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joblib import Parallel, delayed, effective_n_jobs, parallel_config
from joblib.parallel import get_active_backend
from tqdm.auto import tqdm

from store import (
    ConfigError,
    Corpus,
    ErrorRow,
    FeatureSpec,
    IndexRow,
    ShardInfo,
    SpecstoreError,
    StoreWriter,
    create_store,
    default_specs,
    escape_path,
)
from store.kinds import DEFAULT_KINDS, kind_names
from store.location import as_location

from .cleanup import clean_stale_worker_files
from .corpus import CorpusError, CorpusItem, scan_corpus
from .decoder_log import DecoderWarnings, log_lines
from .features import min_samples
from .hashing import Fingerprint, SourceChanged, fingerprint
from .tasks import TaskItem, TaskResult, run_task

__all__ = ["BACKENDS", "ExtractError", "ExtractSummary", "extract", "plan_tasks"]

log = logging.getLogger(__name__)

#: Files hashed per thread call (amortises dispatch; hashing one file is ~ms).
HASH_BATCH = 64
#: Upper bounds on one task (= one shard): files, and bytes of source files.
MAX_TASK_FILES = 64
MAX_TASK_BYTES = 256 << 20
#: Rounds of decoding for the copies of a file that changed while it was decoded.
MAX_ROUNDS = 3
BACKENDS = ("loky", "threading", "multiprocessing", "dask", "ray")


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
    refreshed: int = 0
    changed: int = 0
    missing: int = 0
    removed: int = 0
    repaired: int = 0
    audio_seconds: float = 0.0
    errors: dict[str, str] = field(default_factory=dict)
    store_bytes: int | None = None
    wall_seconds: float = 0.0
    clips_in_store: int = 0
    jobs: int = 0
    decoder: DecoderWarnings = field(default_factory=DecoderWarnings)  # the C decoders' messages on stderr

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
            f"unchanged    {self.unchanged:,} paths already in the store"
            + (f" ({self.refreshed:,} with a new label, group or file time)" if self.refreshed else ""),
            f"changed      {self.changed:,} paths whose content changed since they were indexed",
            f"missing      {self.missing:,} indexed paths no longer in the corpus"
            + (f", {self.removed:,} removed" if self.removed else " (--remove-missing drops them)" if self.missing
               else ""),
        ]
        if self.repaired:
            lines.append(f"repaired     {self.repaired:,} paths of damaged shards dropped and decoded again")
        note = self.decoder.summary()
        if note is not None:
            lines.append(f"decoder      {note}")
        lines.append(f"bad files    {len(self.errors):,}")
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


def _hash_batch(sources: list[str]) -> list[tuple[Fingerprint | None, str | None]]:
    """``(fingerprint, None)`` or ``(None, reason)`` for each source file."""
    out: list[tuple[Fingerprint | None, str | None]] = []
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
                out.append((fingerprint(src), None))
        except SourceChanged as e:
            out.append((None, e.strerror or "changed while being read"))
        except PermissionError:
            out.append((None, "unreadable: permission denied"))
        except FileNotFoundError:
            out.append((None, "file not found (removed while the corpus was scanned)"))
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


def _cores() -> int:
    """The cores this process may run on (what ``nproc`` says): the default number of workers."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _check_arguments(features: tuple[str, ...], specs: dict[str, FeatureSpec] | None, jobs: int | None,
                     backend: str, block_seconds: float, commit_seconds: float) -> dict[str, FeatureSpec]:
    """Every argument checked before any work: one-line :class:`ConfigError` naming the bad value."""
    if specs is None:
        if not features:
            raise ConfigError(f"no features given; choose from {', '.join(kind_names())} (e.g. --features mel,cqt)")
        specs = default_specs(features)
    if not specs:
        raise ConfigError("no feature specs given")
    min_samples(specs)  # the specs' own consistency (shared grid, n_fft, Nyquist)
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"--jobs must be a whole number >= 1, not {jobs!r}")
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
    if not (isinstance(block_seconds, (int, float)) and math.isfinite(block_seconds) and block_seconds > 0):
        raise ConfigError(f"--block-seconds must be a positive number of seconds, not {block_seconds!r}")
    if not (isinstance(commit_seconds, (int, float)) and math.isfinite(commit_seconds) and commit_seconds >= 0):
        raise ConfigError(f"--commit-seconds must be >= 0 seconds, not {commit_seconds!r}")
    return specs


def _owner(path: str, corpora: Sequence[Corpus]) -> int:
    """Which corpus a stored path belongs to: the one with the longest matching prefix (-1: none)."""
    best, best_len = -1, -1
    for i, c in enumerate(corpora):
        if path.startswith(c.prefix) and len(c.prefix) > best_len:
            best, best_len = i, len(c.prefix)
    return best


def _choose_corpus(writer: StoreWriter, root: Path, add_corpus: bool) -> tuple[int, tuple[Corpus, ...]]:
    """The index of ``root`` among the store's corpora (added when allowed) and the corpora to commit."""
    corpora = writer.commit_state.corpora
    key = str(root.resolve())
    for i, c in enumerate(corpora):
        if c.root == key:
            return i, corpora
    if not corpora:
        if writer.commit_state.n_clips or writer.commit_state.n_errors:
            raise ConfigError(f"{writer.location} records no corpus root (written without one); "
                              "extract into a new STORE path")
        return 0, (Corpus(key, ""),)
    if not add_corpus:
        raise ConfigError(f"{writer.location} holds the corpus {corpora[0].root}, not {key}: use another STORE "
                          f"path, or pass --add-corpus to add it (its paths are stored under their own prefix)")
    indexed = writer.committed_rows().keys() | writer.committed_errors().keys()
    taken = {c.prefix for c in corpora} | {p.split("/", 1)[0] + "/" for p in indexed}
    base = escape_path(root.name or "corpus").replace("/", "_")
    prefix, k = f"{base}/", 2
    while prefix in taken:
        prefix, k = f"{base}-{k}/", k + 1
    log.info("adding corpus %s under %s", key, prefix)
    return len(corpora), (*corpora, Corpus(key, prefix))


def extract(
    corpus: str | os.PathLike[str],
    store: str | os.PathLike[str],
    *,
    features: Iterable[str] = DEFAULT_KINDS,
    jobs: int | None = None,
    backend: str = "loky",
    scheduler: str | None = None,
    layout: str = "raw",
    specs: dict[str, FeatureSpec] | None = None,
    block_seconds: float = 60.0,
    commit_seconds: float = 2.0,
    progress: bool = True,
    storage_options: dict[str, Any] | None = None,
    add_corpus: bool = False,
    remove_missing: bool = False,
    follow_links: bool = False,
    group_by: str | None = None,
) -> ExtractSummary:
    """Decode ``corpus`` once into the feature store ``store``; resumable and deduplicated.

    ``corpus`` is a folder (one sub-folder per label) or a ``path,label[,group]``
    CSV.  ``jobs`` workers (default: all cores; never more than there are
    tasks) run on the joblib ``backend`` (``loky``; ``dask`` with
    ``scheduler`` = a ``tcp://`` address, or a local cluster when None;
    ``threading``; ``ray`` if installed).  A store records the corpus it
    was extracted from: another corpus goes in only with ``add_corpus``
    (under its own path prefix).  ``remove_missing`` drops indexed paths
    whose files are gone.  Links whose target lies outside the corpus root
    are recorded as bad files unless ``follow_links``.  ``group_by``
    (``"parent"`` or a regular expression over the path) gives a folder
    corpus's files groups, as a manifest's ``group`` column does
    (:func:`pipeline.corpus.scan_corpus`); each run sets the groups of the
    corpus's indexed paths anew, so a rerun with another ``group_by`` (or
    none) regroups them without decoding (logged).  Returns an
    :class:`ExtractSummary`; raises ``ConfigError`` for bad arguments (before
    any work), ``CorpusError`` for an unusable corpus, ``StoreError`` for an
    incompatible or locked store, :class:`ExtractError` when writing fails.
    """
    t0 = time.perf_counter()
    specs = _check_arguments(tuple(features), specs, jobs, backend, block_seconds, commit_seconds)
    loc = as_location(store, storage_options)
    loc.check_writable_path()
    root, items = scan_corpus(corpus, follow_links=follow_links, group_by=group_by)
    clean_stale_worker_files()
    summary = ExtractSummary(store=str(store), files=len(items))
    with create_store(loc, specs, layout=layout) as writer:
        entry, corpora = _choose_corpus(writer, root, add_corpus)
        prefix = corpora[entry].prefix
        if prefix:
            items = [dataclasses.replace(it, path=prefix + it.path) for it in items]
        clash = [it.path for it in items if _owner(it.path, corpora) != entry]
        if clash:
            raise CorpusError(f"{len(clash)} path(s) of {root} would be stored where another corpus of the store "
                              f"keeps its files (first: {clash[0]}); rename that folder")
        try:
            repaired = writer.repair(deep=False)
        except OSError as e:
            raise ExtractError(f"repairing the store failed ({e.strerror or e})") from None
        summary.repaired = len(repaired.dropped_paths)
        writer.remove_orphans()
        run = _Run(writer, summary, corpora, specs, block_seconds, commit_seconds, progress, storage_options)
        run.plan(items, entry, remove_missing)
        n_jobs = min(jobs or _cores(), max(len(run.todo), 1))
        if jobs is not None and run.todo and n_jobs < jobs:
            log.info("--jobs %d capped to %d: there are only %d files to decode", jobs, n_jobs, len(run.todo))
        summary.jobs = n_jobs
        with ExitStack() as stack:
            stack.enter_context(_backend(backend, scheduler, n_jobs, stack))
            run.decode(n_jobs)
        if writer.commit_state.corpora != corpora:
            run.commit([], [], [])
        summary.clips_in_store = writer.commit_state.n_clips
    summary.wall_seconds = time.perf_counter() - t0
    if loc.local is not None:
        summary.store_bytes = _dir_bytes(loc.local)
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


def _hash_all(items: list[CorpusItem], progress: bool) -> tuple[dict[str, Fingerprint], dict[str, str]]:
    """Fingerprint every file on local threads (hashlib releases the GIL on large buffers).

    Hashing is I/O-bound and happens where the driver runs, whatever the
    extraction backend, so it needs no worker processes.
    """
    batches = [items[i:i + HASH_BATCH] for i in range(0, len(items), HASH_BATCH)]
    fps: dict[str, Fingerprint] = {}
    errors: dict[str, str] = {}
    threads = min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=threads) as pool, \
            tqdm(total=len(items), unit="file", desc="hashing", disable=not progress, leave=False) as bar:
        results = pool.map(_hash_batch, ([str(it.source) for it in b] for b in batches))
        for batch, res in zip(batches, results, strict=False):
            for it, (fp, reason) in zip(batch, res, strict=False):
                if fp is not None:
                    fps[it.path] = fp
                else:
                    errors[it.path] = reason or "unreadable"
            bar.update(len(batch))
    return fps, errors


class _Run:
    """One extraction run's bookkeeping: what to decode, what came back, what is pending commit."""

    def __init__(self, writer: StoreWriter, summary: ExtractSummary, corpora: tuple[Corpus, ...],
                 specs: dict[str, FeatureSpec], block_seconds: float, commit_seconds: float, progress: bool,
                 storage_options: dict[str, Any] | None) -> None:
        self.writer, self.summary, self.corpora = writer, summary, corpora
        self.spec_dicts = {k: v.to_dict() for k, v in specs.items()}
        self.block_seconds, self.commit_seconds, self.progress = block_seconds, commit_seconds, progress
        self.storage_options = storage_options
        self.fps: dict[str, Fingerprint] = {}
        self.todo: dict[str, list[CorpusItem]] = {}
        self.pending: tuple[list[ShardInfo], list[IndexRow], list[ErrorRow]] = ([], [], [])
        self.leftover: list[CorpusItem] = []

    def row(self, it: CorpusItem, content: str, fp: Fingerprint | None = None) -> IndexRow:
        fp = fp or self.fps[it.path]
        return IndexRow(it.path, content, it.label, it.group, fp.stamp.size, fp.stamp.mtime_ns)

    def commit(self, shards: list[ShardInfo], rows: list[IndexRow], errors: list[ErrorRow],
               remove: Sequence[str] = ()) -> None:
        w = self.writer
        try:
            w.commit(shards, rows, errors, remove=remove, corpora=self.corpora)
        except OSError as e:
            raise ExtractError(f"committing to the store failed ({e.strerror or e}); "
                               f"the store is left at its last commit ({w.commit_state.n_clips} clips)") from None

    def plan(self, items: list[CorpusItem], entry: int, remove_missing: bool) -> None:
        """Hash the corpus, index what needs no decoding, and collect what does in ``todo``."""
        w, summary = self.writer, self.summary
        scanned = [it for it in items if it.problem is None]
        self.fps, errors = _hash_all(scanned, self.progress)
        errors.update({it.path: it.problem for it in items if it.problem is not None})
        committed = w.committed_rows()
        known = w.committed_hashes()
        quick: list[IndexRow] = []
        regrouped = 0
        for it in scanned:
            fp = self.fps.get(it.path)
            if fp is None:
                continue
            old = committed.get(it.path)
            if old is not None and old.hash == fp.hash:
                summary.unchanged += 1
                if old != self.row(it, fp.hash):
                    quick.append(self.row(it, fp.hash))
                    summary.refreshed += 1
                    regrouped += old.group != it.group
                continue
            if old is not None:
                summary.changed += 1
            if fp.hash in known:
                quick.append(self.row(it, fp.hash))
                summary.duplicates += 1
            else:
                self.todo.setdefault(fp.hash, []).append(it)
        if regrouped:
            log.warning("%d indexed paths get another group than the store recorded (groups follow this run's "
                        "--group-by, or a manifest's group column): the train/validation split changes, so "
                        "retrain models trained on this store before", regrouped)
        summary.duplicates += sum(len(v) - 1 for v in self.todo.values())
        summary.errors.update(errors)
        present = {it.path for it in items}
        missing = [p for p in [*committed, *w.committed_errors()]
                   if p not in present and _owner(p, self.corpora) == entry]
        summary.missing = len(missing)
        remove = missing if remove_missing else []
        summary.removed = len(remove)
        if quick or errors or remove:
            self.commit([], quick, [ErrorRow(p, r) for p, r in errors.items()], remove)
            summary.indexed += len(quick)

    def decode(self, n_jobs: int) -> None:
        """Decode every content in ``todo``; copies of a file that changed meanwhile get further rounds."""
        groups = self.todo
        for _ in range(MAX_ROUNDS):
            if not groups:
                break
            work = [(TaskItem(str(v[0].source), h, self.fps[v[0].path]), self.fps[v[0].path].stamp.size)
                    for h, v in groups.items()]
            self.leftover = []
            self._run_tasks(plan_tasks(work, n_jobs), groups)
            groups = {}
            for it in self.leftover:
                groups.setdefault(self.fps[it.path].hash, []).append(it)
        for v in groups.values():
            for it in v:
                self.summary.errors[it.path] = f"not decoded: its copies kept changing ({MAX_ROUNDS} rounds)"
        if groups:
            self.commit([], [], [ErrorRow(it.path, self.summary.errors[it.path]) for v in groups.values() for it in v])

    def _run_tasks(self, tasks: list[list[TaskItem]], todo: dict[str, list[CorpusItem]]) -> None:
        w = self.writer
        url = w.location.url if w.location.local is None else str(w.location.local)
        # memory:// is a dict inside this process: only threads, or one job run inline, can write to it.
        active, active_jobs = get_active_backend()
        if url.startswith("memory://") and not (getattr(active, "uses_threads", False)
                                                 or effective_n_jobs(active_jobs) == 1):
            raise ExtractError(f"{url} lives in this process's memory, where worker processes cannot write; "
                               "use jobs=1 or the threading backend, or a file or object-store path")
        if not tasks:
            return
        calls = [delayed(run_task)(url, t, self.spec_dicts, self.block_seconds, self.storage_options,
                                   driver_pid=os.getpid()) for t in tasks]

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

        summary = self.summary
        last = time.monotonic()
        bar = tqdm(total=sum(len(t) for t in tasks), unit="file", desc="extracting", disable=not self.progress,
                   dynamic_ncols=True)
        t0 = time.perf_counter()
        try:
            for res in finished():
                self._collect(res, todo)
                bar.update(res.files)
                elapsed = max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(audio=f"{summary.audio_seconds / 3600:.2f}h",
                                speed=f"{summary.audio_seconds / elapsed:.0f}x", errors=len(summary.errors))
                if time.monotonic() - last >= self.commit_seconds:
                    self.commit(*self.pending)
                    self.pending = ([], [], [])
                    last = time.monotonic()
        except OSError as e:
            raise ExtractError(f"writing a shard failed ({e.strerror or e}); "
                               f"the store is left at its last commit ({w.commit_state.n_clips} clips)") from None
        except KeyboardInterrupt:
            if any(self.pending):
                self.commit(*self.pending)
            raise
        finally:
            bar.close()
        if any(self.pending):
            self.commit(*self.pending)
            self.pending = ([], [], [])

    def _collect(self, res: TaskResult, todo: dict[str, list[CorpusItem]]) -> None:
        shards, rows, errors = self.pending
        summary = self.summary
        if res.shard is not None:
            shards.append(res.shard)
            summary.decoded += len(res.shard.clips)
        for h, dec in res.decoded.items():
            first, *copies = todo[h]
            rows.append(IndexRow(first.path, dec.hash, first.label, first.group, dec.size, dec.mtime_ns))
            if dec.hash == h:
                rows += [self.row(it, h) for it in copies]
            else:  # the file changed after it was hashed: its copies still hold the old content
                log.info("%s changed after it was hashed; indexed with the content that was decoded", first.path)
                self.leftover += copies
            summary.indexed += 1 + (len(copies) if dec.hash == h else 0)
        for h, reason in res.failed.items():
            for it in todo[h]:
                errors.append(ErrorRow(it.path, reason))
                summary.errors[it.path] = reason
        for h, reason in res.unavailable.items():  # the representative file itself, not its content
            first, *copies = todo[h]
            errors.append(ErrorRow(first.path, reason))
            summary.errors[first.path] = reason
            self.leftover += copies
        summary.audio_seconds += res.seconds
        log_lines(res.decoder)  # the lines of worker processes (the driver's own are on stderr already)
        summary.decoder.add(res.decoder)
