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
import os
import time
from collections.abc import Iterable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from specstore.common import ConfigError
from specstore.store import Corpus, FeatureSpec, StoreWriter, create_store, default_specs, escape_path
from specstore.store.kinds import DEFAULT_KINDS, kind_names
from specstore.store.location import as_location

from .backends import BACKENDS
from .backends import joblib_backend as _backend
from .cleanup import clean_stale_worker_files, remove_interrupted_shards
from .corpus import CorpusError, scan_corpus
from .corpus_hashes import HASH_BATCH  # noqa: F401 - importable from here, as before the split
from .corpus_hashes import hash_batch as _hash_batch  # noqa: F401 - tests import it from here
from .corpus_hashes import hash_files as _hash_all
from .extract_options import BLOCK_SECONDS, COMMIT_SECONDS, JOBS
from .extract_report import ExtractError, ExtractSummary
from .extract_report import dir_bytes as _dir_bytes
from .extract_report import human_bytes as _human_bytes  # noqa: F401 - importable from here, as before
from .extract_run import MAX_ROUNDS, MAX_TASK_BYTES, MAX_TASK_FILES, plan_tasks  # noqa: F401 - as before
from .extract_run import ExtractRun as _Run
from .extract_run import owner_of as _owner
from .features import min_samples
from .tasks import run_task

__all__ = ["BACKENDS", "ExtractError", "ExtractSummary", "extract", "plan_tasks"]

log = logging.getLogger(__name__)


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
    JOBS.check("--jobs", jobs)
    if backend not in BACKENDS:
        raise ConfigError(f"unknown backend {backend!r}; choose {', '.join(BACKENDS)}")
    BLOCK_SECONDS.check("--block-seconds", block_seconds)
    COMMIT_SECONDS.check("--commit-seconds", commit_seconds)
    return specs




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
    """Decode ``corpus`` once into the feature store ``specstore.store``; resumable and deduplicated.

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
    (:func:`specstore.pipeline.corpus.scan_corpus`); each run sets the groups of the
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
        remove_interrupted_shards(writer)
        run = _Run(writer, summary, corpora, specs, block_seconds, commit_seconds, progress, storage_options,
                   task=run_task)  # looked up here: the extraction bench wraps it
        run.plan(items, entry, remove_missing, _hash_all)  # looked up here: tests patch it
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

