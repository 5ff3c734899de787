"""``make infer`` on a cluster: units of distinct contents run on an executor's workers, one driver commits.

:func:`specstore.infer.engine.predict.predict` comes here when it is given an executor (``executor=``) or a
backend (:class:`~specstore.infer.options.cluster_options.ClusterOptions`, ``--backend dask|ray``):

1. The driver cuts the store's distinct contents into length-sorted units of a few seconds of device time
   (:func:`~specstore.infer.engine.units.cut_units`; a clip too long for any batch is a unit of its own).
2. Each unit is a task (:func:`run_unit`) on the executor (:mod:`specstore.common.executors`: threads,
   loky, dask, ray tasks with retries).  A task carries what identifies its work: the store's location and
   the generation the run started on (a worker refuses another in one line), its rows and their content
   hashes (checked against the store), the model file's path with its sha256 (checked before the model is
   loaded) and the driver's trust decision (a worker trusts the checkpoint's import-path model only when
   the driver did, never on its own allow-list).  A worker plans its own budgeted batches (on a GPU from
   its free memory, on a CPU from ``BUDGET_MB`` or, without it, the default capped at half of the worker's own
   memory limit), returns the unit's logits and writes nothing.
3. The driver alone commits: unit results go into the run's journal
   (:class:`~specstore.infer.engine.journal.Journal`, ``<out>.journal/``) every ``commit_seconds``; a
   result for a unit already committed is dropped and counted.  Rerunning the same command computes only
   the units the journal lacks; a journal of another run is refused in one line (``--restart`` discards
   it).  The CSV is written by ``predict`` as in one process, then the journal is removed.
   ``evaluate`` runs the same way over its split's rows (journalled in ``<out_dir>/heldout.csv.journal``);
   its report is the one-process run's.
4. While no unit finishes, the driver watches the cluster's live workers as extraction does
   (:class:`~specstore.common.executors.idle.IdleWatch`): warnings naming the scheduler, and ``max_idle``.

A masked model's logits do not depend on which clips share its batch, so the CSV is byte-identical to the
one-process run's.

Workers keep the store, the model and its engine per process (:data:`_CACHE`, keyed by the store's
location and generation and by the model's digest, trust and run options): a per-process cache of what
the tasks of one run share, never a channel between runs (a different key replaces the entry).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from specstore.common import ConfigError
from specstore.common.atomic import output_target
from specstore.common.errors import ExecutorError
from specstore.common.executors import Executor, TaskFuture, open_executor, task_key
from specstore.common.executors.idle import IdleWatch
from specstore.common.executors.memory import memory_limit
from specstore.infer.batching.budget import Budget
from specstore.infer.data import feature_specs
from specstore.infer.engine.device import DEFAULT_CPU_BUDGET_MB
from specstore.infer.engine.journal import Journal
from specstore.infer.engine.runtime import Engine, RunOptions, RunStats
from specstore.infer.engine.units import Unit, cut_units
from specstore.infer.errors import CheckpointError, PredictionsError, UntrustedModelError
from specstore.infer.models.checkpoint import Checkpoint, load_checkpoint
from specstore.infer.options.cluster_options import ClusterOptions
from specstore.store import Store, open_store
from specstore.store.location import Location

if TYPE_CHECKING:
    from torch import nn

    from specstore.infer.engine.predict import LoadedModel

__all__ = ["WORKER_BUDGET_SHARE", "ClusterRun", "UnitJob", "UnitResult", "file_digest", "journal_folder",
           "run_unit"]

log = logging.getLogger(__name__)

WORKER_BUDGET_SHARE = 0.5
"""The share of a worker's memory limit its batches may use when ``BUDGET_MB`` is not given; the rest holds
the model, the store's reader, the unit's logits and the worker's own runtime."""


class _InferIdleWatch(IdleWatch):
    """The empty-cluster watch, warning on this module's logger."""

    logger = log


def file_digest(path: str | os.PathLike[str]) -> str:
    """sha256 of the file at ``path``, hex (read in blocks: memory does not grow with the file)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _load_verified(path: str, digest: str | None) -> tuple[Checkpoint, str]:
    """The checkpoint at ``path`` and its sha256, read once: refused (one line) when ``digest`` is given and
    differs.  The bytes whose digest was checked are the bytes loaded (from a private copy), so a file
    replaced meanwhile cannot slip in."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint {path} on {socket.gethostname()}: "
                              f"{e.strerror or e}") from None
    got = hashlib.sha256(data).hexdigest()
    if digest is not None and got != digest:
        raise CheckpointError(f"the checkpoint {path} on {socket.gethostname()} is not the run's (sha256 "
                              f"{got[:12]}, the run's {digest[:12]}); give every worker the same file")
    with tempfile.TemporaryDirectory(prefix="specstore-model-") as folder:
        copy = Path(folder) / "model.pt"
        copy.write_bytes(data)
        ckpt = load_checkpoint(copy)
    return dataclasses.replace(ckpt, source=path), got


@dataclass(frozen=True)
class UnitJob:
    """What every unit of a run shares: the store (``location``, the ``generation`` the run started on), the
    model file (``model_path``, its ``model_digest``), the import paths the driver trusted (``trusted``: the
    checkpoint's own, or none), the feature and the run options (no progress bars)."""

    location: Location
    generation: int
    model_path: str
    model_digest: str
    trusted: tuple[str, ...]
    feature: str
    options: RunOptions


@dataclass
class UnitResult:
    """One unit's logits (one float32 row per content, in ``hashes``' order), the run figures of its worker's
    loop, and where it ran (``host:pid``)."""

    key: str
    hashes: tuple[str, ...]
    logits: np.ndarray
    stats: RunStats
    worker: str


@dataclass
class _Cached:
    store: Store | None = None
    store_key: tuple[str, int] | None = None
    model: tuple[Engine, nn.Module, Budget] | None = None
    model_key: tuple[str, tuple[str, ...], RunOptions, str] | None = None


_CACHE = _Cached()
"""This process's store, model, engine and budget (see the module docstring): one of each, replaced when a
task of another store generation or model comes."""
_LOCK = threading.Lock()


def _worker_store(job: UnitJob) -> Store:
    """The run's store in this process, opened once; refused (one line) when it is not at the run's
    generation (it changed under the run)."""
    key = (job.location.url, job.generation)
    if _CACHE.store_key != key or _CACHE.store is None:
        s = open_store(job.location)
        if s.generation != job.generation:
            raise PredictionsError(f"store {job.location.url} changed under this run (it is at commit "
                                   f"{s.generation}, the run started on {job.generation}); rerun with --restart "
                                   "to predict the new commit")
        _CACHE.store, _CACHE.store_key = s, key
    return _CACHE.store


def _worker_model(job: UnitJob, store: Store) -> tuple[Engine, nn.Module, Budget]:
    """The run's model on this worker's engine, with its budget: loaded once per process from the file whose
    digest the run gave, trusted only as the driver trusted it."""
    key = (job.model_digest, job.trusted, job.options, job.feature)
    if _CACHE.model_key != key or _CACHE.model is None:
        ckpt, _ = _load_verified(job.model_path, job.model_digest)
        target = ckpt.model.target
        if not ckpt.model.builtin and target not in job.trusted:
            raise UntrustedModelError(f"checkpoint {job.model_path} names its model by the import path {target!r}, "
                                      "which the driver did not trust; a worker trusts no more than its driver")
        engine = _worker_engine(job.options)
        model = engine.prepare(ckpt.build(trust_model_code=list(job.trusted)))
        budget = engine.budget(model, sum(s.n_bins for s in feature_specs(store, job.feature).values()))
        _CACHE.model, _CACHE.model_key = (engine, model, budget), key
    return _CACHE.model


def _worker_engine(options: RunOptions) -> Engine:
    """This worker's engine.  On a CPU without ``BUDGET_MB`` its budget is the default, capped at
    :data:`WORKER_BUDGET_SHARE` of the worker's own memory limit (a dask worker's, a ray task's memory, a
    cgroup's: :func:`~specstore.common.executors.memory.memory_limit`), so a small worker plans small batches."""
    engine = Engine(options)
    if engine.device.type != "cpu" or options.budget_mb is not None or (limit := memory_limit()) is None:
        return engine
    budget_mb = min(DEFAULT_CPU_BUDGET_MB, limit[0] * WORKER_BUDGET_SHARE / 2**20)
    if budget_mb >= DEFAULT_CPU_BUDGET_MB:
        return engine
    log.info("batch budget %.0f MiB: %.0f%% of %s (%.0f MiB)", budget_mb, 100 * WORKER_BUDGET_SHARE, limit[1],
             limit[0] / 2**20)
    return Engine(dataclasses.replace(options, budget_mb=budget_mb))


def run_unit(job: UnitJob, key: str, rows: tuple[int, ...], hashes: tuple[str, ...]) -> UnitResult:
    """A worker's task: the logits of one unit (store ``rows`` whose contents are ``hashes``).  Writes nothing.

    The rows' hashes are checked against the store, so a unit never computes other clips than the driver
    meant.  Batches are planned here, under this worker's budget (on CUDA its free memory now).
    """
    with _LOCK:  # the threads of one process share the cache (and then the model, run in inference mode)
        store = _worker_store(job)
        engine, model, budget = _worker_model(job, store)
    got = tuple(store.hashes[r] for r in rows)
    if got != hashes:
        raise PredictionsError(f"store {job.location.url} does not hold the unit's clips at its rows (it "
                               "changed under this run); rerun with --restart")
    res = engine.logits(model, store, np.asarray(rows, dtype=np.int64), feature=job.feature,
                        budget=engine.live_budget(budget), desc="unit")
    return UnitResult(key, hashes, res.logits, res.run_stats(), f"{socket.gethostname()}:{os.getpid()}")


def journal_folder(out: str | os.PathLike[str] | None) -> Path | None:
    """Where a run writing ``out`` keeps its journal: ``<out>.journal`` beside a regular file; None (in memory,
    no resume) for no output or one written straight through (a FIFO, ``/dev/stdout``)."""
    if out is None:
        return None
    target = output_target(out, what="predictions")
    if target.stream:
        return None
    return target.given.with_name(target.given.name + ".journal")


@dataclass
class _Progress:
    """What the driver counts: units in all, resumed from the journal, computed now; the workers' figures."""

    units: int = 0
    resumed: int = 0
    computed: int = 0
    stats: RunStats = dataclasses.field(default_factory=RunStats)

    def add(self, s: RunStats) -> None:
        t = self.stats
        t.batches += s.batches
        t.real_frames += s.real_frames
        t.computed_frames += s.computed_frames
        t.windowed += s.windowed
        t.oom_retries += s.oom_retries
        t.peak_bytes = max(t.peak_bytes, s.peak_bytes)
        t.budget_bytes = max(t.budget_bytes, s.budget_bytes)


class ClusterRun:
    """One cluster run of ``predict`` or ``evaluate`` (see the module docstring): :meth:`logits` computes (or
    resumes) the logits of every row (of ``rows``, when given: ``make eval``'s split), :meth:`finish` removes
    the journal once the output is written."""

    def __init__(self, store: Store, model: object, loaded: LoadedModel, options: RunOptions,
                 cluster: ClusterOptions, out: str | os.PathLike[str] | None, rows: np.ndarray | None = None,
                 desc: str = "predicting") -> None:
        if not isinstance(model, (str, os.PathLike)) or not Path(model).is_file():
            raise ConfigError(f"a cluster run sends its workers a checkpoint file; {model!r} is not one (save the "
                              "model with `make train` or `specstore init-model`, or run without --backend)")
        self.store, self.feature, self.options, self.cluster = store, loaded.feature, options, cluster
        self.model_path = str(Path(model).resolve())
        self.digest = file_digest(self.model_path)
        # the driver built ``loaded`` from this file, so its import path (if any) was trusted: workers get that
        self.trusted: tuple[str, ...] = () if loaded.import_path is None else (loaded.import_path,)
        self.rows = np.arange(len(store), dtype=np.int64) if rows is None else np.asarray(rows, dtype=np.int64)
        self.run_key = {"store": store.location.url, "generation": store.generation, "model sha256": self.digest,
                        "feature": self.feature, "device": options.device, "precision": options.precision}
        if rows is not None:  # a subset (make eval's split): another subset is another run
            self.run_key["rows sha256"] = hashlib.sha256(self.rows.astype("<i8").tobytes()).hexdigest()
        self.journal = Journal.open(folder, self.run_key, restart=cluster.restart) \
            if (folder := journal_folder(out)) is not None else Journal(None, self.run_key)
        self.token = task_key("run", *sorted(self.run_key.items()))
        self.count = _Progress()
        self.where = "this process"
        self.desc = desc

    # -- the driver ------------------------------------------------------------------------------
    def units(self, model: nn.Module, engine: Engine) -> list[Unit]:
        """Every unit of the run's rows (the driver's budget says which clips are too long for any batch)."""
        n_bins = sum(s.n_bins for s in feature_specs(self.store, self.feature).values())
        long_frames = engine.budget(model, n_bins).max_window if len(self.rows) else None
        return cut_units(self.store.lengths, self.store.hashes, unit_frames=self.cluster.unit_frames,
                         long_frames=long_frames, rows=self.rows)

    def logits(self, model: nn.Module, engine: Engine, executor: Executor | None) -> np.ndarray:
        """The run's rows' logits ``(len(rows), C)`` (every store row unless ``rows`` was given), in their order:
        the journal's units and the others computed on ``executor`` (or on one opened from the cluster options,
        shut down at the end)."""
        units = self.units(model, engine)
        done = self.journal.logits_by_content()
        todo = [u for u in units if u.key not in self.journal.done and not all(h in done for h in u.hashes)]
        self.count.units, self.count.resumed = len(units), len(units) - len(todo)
        self.count.stats.distinct = sum(len(u.hashes) for u in units)
        if self.count.resumed:
            log.info("resuming from %s: %d of %d units are journalled", self.journal.folder, self.count.resumed,
                     len(units))
        if todo:
            if executor is not None:
                self._run(todo, executor)
            else:
                if self.cluster.backend is None:
                    raise ConfigError("a cluster run needs an executor or a backend")
                with open_executor(self.cluster.backend, self.cluster.workers, self.cluster.scheduler) as ex:
                    self._run(todo, ex)
        return self._assemble()

    def _job(self, executor: Executor) -> UnitJob:
        url = self.store.location.url if self.store.location.local is None else str(self.store.location.local)
        if url.startswith("memory://") and not executor.in_process:
            raise PredictionsError(f"{url} lives in this process's memory, where workers cannot read; use the "
                                   "threading backend, or a file or object-store path")
        options = dataclasses.replace(self.options, progress=False)
        if not executor.in_process and options.threads is None:
            options = dataclasses.replace(options, threads=1)  # one task per core: more threads only compete
        return UnitJob(self.store.location, self.store.generation, self.model_path, self.digest, self.trusted,
                       self.feature, options)

    def _run(self, todo: list[Unit], executor: Executor) -> None:
        self.where = executor.describe()
        job = self._job(executor)
        futures = [executor.submit(run_unit, job, u.key, u.rows, u.hashes, retries=1,
                                   key=task_key("predict_unit", self.token, u.key)) for u in todo]
        c = self.cluster
        watch = _InferIdleWatch(executor, c.idle_warn_seconds, c.idle_warn_every, c.max_idle)
        last = time.monotonic()
        bar = tqdm(total=sum(len(u.rows) for u in todo), unit="clip", desc=f"{self.desc} ({len(todo)} units)",
                   disable=not self.options.progress, dynamic_ncols=True)
        try:
            for future in watch.finished(futures):
                res: UnitResult = future.result()
                if self.journal.add(res.key, res.hashes, res.logits):
                    self.count.computed += 1
                    self.count.add(res.stats)
                    bar.update(len(res.hashes))
                if time.monotonic() - last >= c.commit_seconds:
                    self.journal.commit()
                    last = time.monotonic()
        except ExecutorError as e:  # a unit the cluster lost for good (TaskLost): keep what has finished
            raise self._stop(str(e), futures) from e
        except BaseException:
            _cancel(futures)
            self.journal.commit()
            raise
        finally:
            bar.close()
        self.journal.commit()
        if watch.stopped is not None:
            raise self._stop(watch.stopped, futures, "start workers and rerun to resume")

    def _stop(self, reason: str, futures: list[TaskFuture], advice: str = "rerun to resume") -> PredictionsError:
        """The one-line error that stops the run, once what has finished is journalled."""
        _cancel(futures)
        for f in futures:
            if f.done() and not f.cancelled() and f.exception() is None:
                res: UnitResult = f.result()
                if not self.journal.has(res.key):
                    self.journal.add(res.key, res.hashes, res.logits)
                    self.count.computed += 1
        self.journal.commit()
        kept = f"journalled in {self.journal.folder}" if self.journal.folder is not None else "lost (no journal)"
        return PredictionsError(f"{reason}: {len(self.journal.done)} of {self.count.units} units are {kept}; "
                                f"{advice}")

    def _assemble(self) -> np.ndarray:
        by_content = self.journal.logits_by_content()
        hashes = self.store.hashes
        if not len(self.rows):
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack([by_content[hashes[r]] for r in self.rows.tolist()]).astype(np.float32, copy=False)

    def finish(self) -> None:
        """The CSV is written: remove the journal."""
        self.journal.remove()

    def figures(self) -> dict[str, Any]:
        """The run's figures for :class:`~specstore.infer.engine.predict.ClusterStats`: the workers' loops summed,
        and the units'."""
        return {**vars(self.count.stats), "units": self.count.units, "resumed": self.count.resumed,
                "computed": self.count.computed, "dropped": self.journal.dropped, "commits": self.journal.commits,
                "where": self.where}


def _cancel(futures: list[TaskFuture]) -> None:
    for f in futures:
        f.cancel()
