"""One extraction run's bookkeeping (:class:`ExtractRun`): what to decode, the tasks, what came back, the commits.

The driver (:func:`specstore.pipeline.extract.extract`) owns the store's writer; a
run indexes what needs no decoding, groups the rest into tasks (one task =
one shard, :func:`plan_tasks`) for an executor's workers
(:class:`specstore.common.executors.Executor`), and commits their results in
small batches as they come back.  While it waits for them it watches the
executor's live workers (:class:`IdleWatch`): a cluster that has had none for a
while is named in a warning, repeated at intervals, and ``max_idle`` bounds the
wait (what has finished is committed, then the run stops).
"""

from __future__ import annotations

import logging
import math
import os
import time
import uuid
from collections.abc import Sequence

from tqdm.auto import tqdm

from specstore.common.errors import ExecutorError
from specstore.common.executors import Executor, TaskFuture, task_key
from specstore.common.executors.idle import IDLE_POLL_SECONDS
from specstore.common.executors.idle import IdleWatch as _IdleWatch
from specstore.store import Corpus, ErrorRow, FeatureSpec, IndexRow, ShardInfo, StoreWriter

from .corpus import CorpusItem
from .corpus_hashes import hash_files
from .decoder_log import log_lines
from .extract_options import ExtractOptions
from .extract_report import ExtractError, ExtractSummary
from .hashing import Fingerprint
from .tasks import TaskItem, TaskResult, run_task

__all__ = ["IDLE_POLL_SECONDS", "MAX_ROUNDS", "MAX_TASK_BYTES", "MAX_TASK_FILES", "ExtractRun", "IdleWatch", "owner_of",
           "plan_tasks"]

log = logging.getLogger("specstore.pipeline.extract")

#: Upper bounds on one task (= one shard): files, and bytes of source files.
MAX_TASK_FILES = 64
MAX_TASK_BYTES = 256 << 20
#: Rounds of decoding for the copies of a file that changed while it was decoded.
MAX_ROUNDS = 3


def plan_tasks(todo: Sequence[tuple[TaskItem, int]], n_jobs: int, *, max_files: int = MAX_TASK_FILES,
               max_bytes: int = MAX_TASK_BYTES) -> list[list[TaskItem]]:
    """Group ``(item, file bytes)`` pairs into tasks (one task = one shard).

    Aims at >= 4 tasks per worker so the pool stays busy to the end, while a
    task never exceeds ``max_files`` files or ``max_bytes`` source bytes (a
    lone larger file is a task of its own).  With several workers the last
    ``n_jobs`` tasks are cut into tasks of halving size (:func:`_shrinking`),
    so the tasks shrink towards the end and the workers finish together
    (less time with one worker idle while the other ends a long task).
    Order is kept: deterministic.
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
    if n_jobs > 1 and len(tasks) > n_jobs:
        tail = [it for t in tasks[-n_jobs:] for it in t]
        tasks[-n_jobs:] = _shrinking(tail, per_task, n_jobs)
    return tasks


def _shrinking(items: list[TaskItem], size: int, n_jobs: int) -> list[list[TaskItem]]:
    """``items`` cut into tasks of halving size, ``n_jobs`` of each size (size 6, 2 jobs, 12 items: 3, 3, 2, 2,
    1, 1), order kept: the tasks shrink towards the end, so the workers finish together."""
    pieces: list[list[TaskItem]] = []
    while items:
        size = max(1, math.ceil(size / 2))
        for _ in range(n_jobs):
            if items:
                pieces.append(items[:size])
                items = items[size:]
    return pieces


class IdleWatch(_IdleWatch):
    """:class:`specstore.common.executors.idle.IdleWatch` (its home; inference uses it too), warning on
    extraction's logger."""

    logger = log


def owner_of(path: str, corpora: Sequence[Corpus]) -> int:
    """Which corpus a stored path belongs to: the one with the longest matching prefix (-1: none)."""
    best, best_len = -1, -1
    for i, c in enumerate(corpora):
        if path.startswith(c.prefix) and len(c.prefix) > best_len:
            best, best_len = i, len(c.prefix)
    return best


class ExtractRun:
    """One extraction run's bookkeeping: what to decode, what came back, what is pending commit.

    Each task is submitted under a key made from this run's own token, its round and its files
    (:func:`specstore.common.executors.task_key`): the same task is recognised within the run, and a
    scheduler shared by several drivers never hands one run another run's shard.
    """

    def __init__(self, writer: StoreWriter, summary: ExtractSummary, corpora: tuple[Corpus, ...],
                 specs: dict[str, FeatureSpec], options: ExtractOptions) -> None:
        self.writer, self.summary, self.corpora = writer, summary, corpora
        self.spec_dicts = {k: v.to_dict() for k, v in specs.items()}
        self.block_seconds, self.commit_seconds = options.block_seconds, options.commit_seconds
        self.progress = options.progress
        self.storage_options = options.storage_options
        self.idle = (options.idle_warn_seconds, options.idle_warn_every, options.max_idle)
        self.token = uuid.uuid4().hex
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
        self.fps, errors = hash_files(scanned, self.progress, w.metadata.content_hash)
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
                   if p not in present and owner_of(p, self.corpora) == entry]
        summary.missing = len(missing)
        remove = missing if remove_missing else []
        summary.removed = len(remove)
        if quick or errors or remove:
            self.commit([], quick, [ErrorRow(p, r) for p, r in errors.items()], remove)
            summary.indexed += len(quick)

    def decode(self, n_jobs: int, executor: Executor) -> None:
        """Decode every content in ``todo`` on ``executor``; copies of a file that changed meanwhile get further
        rounds."""
        groups = self.todo
        for round_ in range(MAX_ROUNDS):
            if not groups:
                break
            work = [(TaskItem(str(v[0].source), h, self.fps[v[0].path]), self.fps[v[0].path].stamp.size)
                    for h, v in groups.items()]
            self.leftover = []
            self._run_tasks(plan_tasks(work, n_jobs), groups, executor, round_)
            groups = {}
            for it in self.leftover:
                groups.setdefault(self.fps[it.path].hash, []).append(it)
        for v in groups.values():
            for it in v:
                self.summary.errors[it.path] = f"not decoded: its copies kept changing ({MAX_ROUNDS} rounds)"
        if groups:
            self.commit([], [], [ErrorRow(it.path, self.summary.errors[it.path]) for v in groups.values() for it in v])

    def _run_tasks(self, tasks: list[list[TaskItem]], todo: dict[str, list[CorpusItem]], executor: Executor,
                   round_: int) -> None:
        w = self.writer
        url = w.location.url if w.location.local is None else str(w.location.local)
        # memory:// is a dict inside this process: only tasks run in this process can write to it.
        if url.startswith("memory://") and not executor.in_process:
            raise ExtractError(f"{url} lives in this process's memory, where worker processes cannot write; "
                               "use jobs=1 or the threading backend, or a file or object-store path")
        if not tasks:
            return
        futures = [executor.submit(run_task, url, t, self.spec_dicts, self.block_seconds, self.storage_options,
                                   driver_pid=os.getpid(),
                                   key=task_key("run_task", self.token, round_, *(f"{i.source}\0{i.hash}" for i in t)))
                   for t in tasks]
        summary = self.summary
        watch = IdleWatch(executor, *self.idle)
        last = time.monotonic()
        bar = tqdm(total=sum(len(t) for t in tasks), unit="file", desc="extracting", disable=not self.progress,
                   dynamic_ncols=True)
        t0 = time.perf_counter()
        collected: set[TaskFuture] = set()
        try:
            for future in watch.finished(futures):
                res: TaskResult = future.result()
                self._collect(res, todo)
                collected.add(future)
                bar.update(res.files)
                elapsed = max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(audio=f"{summary.audio_seconds / 3600:.2f}h",
                                speed=f"{summary.audio_seconds / elapsed:.0f}x", errors=len(summary.errors))
                if time.monotonic() - last >= self.commit_seconds:
                    self.commit(*self.pending)
                    self.pending = ([], [], [])
                    last = time.monotonic()
        except OSError as e:
            _cancel(futures)
            raise ExtractError(f"writing a shard failed ({e.strerror or e}); "
                               f"the store is left at its last commit ({w.commit_state.n_clips} clips)") from None
        except KeyboardInterrupt:
            _cancel(futures)
            if any(self.pending):
                self.commit(*self.pending)
            raise
        except ExecutorError as e:  # a task the cluster lost for good (TaskLost): keep what has finished
            raise self._stop(str(e), futures, collected, todo) from e
        except BaseException:
            _cancel(futures)
            raise
        finally:
            bar.close()
        if any(self.pending):
            self.commit(*self.pending)
            self.pending = ([], [], [])
        if watch.stopped is not None:
            raise self._stop(watch.stopped, futures, collected, todo, "start workers and rerun to resume")

    def _stop(self, reason: str, futures: list[TaskFuture], collected: set[TaskFuture],
              todo: dict[str, list[CorpusItem]], advice: str = "rerun to resume") -> ExtractError:
        """The error that stops the run for ``reason`` (one line, ending with ``advice``), once the unfinished
        tasks are cancelled and what has finished (``collected`` so far, and any task that finished meanwhile)
        is committed."""
        _cancel(futures)
        done = [f for f in futures if f.done() and not f.cancelled() and f.exception() is None]
        for f in done:
            if f not in collected:
                self._collect(f.result(), todo)
        if any(self.pending):
            self.commit(*self.pending)
            self.pending = ([], [], [])
        return ExtractError(f"{reason}: {len(done)} of {len(futures)} tasks finished and are committed "
                            f"({self.writer.commit_state.n_clips} clips in the store); {advice}")

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


def _cancel(futures: list[TaskFuture]) -> None:
    """Cancel the tasks of a run that stops: their shards would never be committed."""
    for f in futures:
        f.cancel()
