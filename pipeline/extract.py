"""The extraction driver: corpus -> hashes -> tasks on an executor's workers -> atomic commits.

The driver is the store's only committer and holds its writer lock for the
whole run.  Workers decode and write whole shards; results come back as they
finish and are committed in small batches (every ``commit_seconds``), so an
interruption loses at most the work since the last commit, and a rerun does
only what is missing.  Every file of the corpus ends up either indexed or in
the error table with its reason.  Where the tasks run is an
:class:`~specstore.common.executors.Executor` (:mod:`specstore.pipeline.backends`).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import Any

from specstore.common import ConfigError
from specstore.common.limits import usable_cores
from specstore.store import Corpus, FeatureSpec, StoreWriter, create_store, default_specs, escape_path
from specstore.store.kinds import kind_names
from specstore.store.location import as_location

from .backends import run_executor
from .cleanup import clean_stale_worker_files, remove_interrupted_shards
from .corpus import CorpusError, scan_corpus
from .extract_options import ExtractOptions
from .extract_report import ExtractError, ExtractSummary, dir_bytes
from .extract_run import ExtractRun, owner_of
from .features import min_samples

__all__ = ["ExtractError", "ExtractOptions", "ExtractSummary", "extract"]

log = logging.getLogger(__name__)


def _specs(options: ExtractOptions) -> dict[str, FeatureSpec]:
    """The run's feature specs (``options.specs``, else the default specs of ``options.features``), checked
    before any work: one-line :class:`ConfigError` naming the bad value."""
    specs = dict(options.specs) if options.specs is not None else None
    if specs is None:
        if not options.features:
            raise ConfigError(f"no features given; choose from {', '.join(kind_names())} (e.g. --features mel,cqt)")
        specs = default_specs(options.features)
    if not specs:
        raise ConfigError("no feature specs given")
    min_samples(specs)  # the specs' own consistency (shared grid, n_fft, Nyquist)
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


def extract(corpus: str | os.PathLike[str], store: str | os.PathLike[str], options: ExtractOptions | None = None,
            **settings: Any) -> ExtractSummary:
    """Decode ``corpus`` once into the feature store ``store``; resumable and deduplicated.

    ``corpus`` is a folder (one sub-folder per label) or a ``path,label[,group]``
    CSV.  How the run goes is ``options`` (:class:`ExtractOptions`), or its
    fields given as keywords (``features=("mel", "cqt"), jobs=2``; with
    ``options`` too, they replace its fields): ``jobs`` workers on the
    ``backend`` (or on an ``executor`` of the caller's).  A store records the
    corpus it was extracted from: another corpus goes in only with
    ``add_corpus`` (under its own path prefix).  ``remove_missing`` drops
    indexed paths whose files are gone.  Links whose target lies outside the
    corpus root are recorded as bad files unless ``follow_links``.
    ``group_by`` (``"parent"`` or a regular expression over the path) gives a
    folder corpus's files groups, as a manifest's ``group`` column does
    (:func:`specstore.pipeline.corpus.scan_corpus`); each run sets the groups
    of the corpus's indexed paths anew, so a rerun with another ``group_by``
    (or none) regroups them without decoding (logged).  Returns an
    :class:`ExtractSummary`; raises ``ConfigError`` for bad arguments (before
    any work), ``CorpusError`` for an unusable corpus, ``StoreError`` for an
    incompatible or locked store, :class:`ExtractError` when writing fails.
    """
    t0 = time.perf_counter()
    if options is None:
        options = ExtractOptions(**settings)
    elif settings:
        options = dataclasses.replace(options, **settings)
    specs = _specs(options)
    loc = as_location(store, options.storage_options)
    loc.check_writable_path()
    root, items = scan_corpus(corpus, follow_links=options.follow_links, group_by=options.group_by)
    clean_stale_worker_files()
    summary = ExtractSummary(store=str(store), files=len(items))
    with create_store(loc, specs, layout=options.layout) as writer:
        entry, corpora = _choose_corpus(writer, root, options.add_corpus)
        prefix = corpora[entry].prefix
        if prefix:
            items = [dataclasses.replace(it, path=prefix + it.path) for it in items]
        clash = [it.path for it in items if owner_of(it.path, corpora) != entry]
        if clash:
            raise CorpusError(f"{len(clash)} path(s) of {root} would be stored where another corpus of the store "
                              f"keeps its files (first: {clash[0]}); rename that folder")
        try:
            repaired = writer.repair(deep=False)
        except OSError as e:
            raise ExtractError(f"repairing the store failed ({e.strerror or e})") from None
        summary.repaired = len(repaired.dropped_paths)
        remove_interrupted_shards(writer)
        # Labels are numbered by name before the first commit, so the order work finishes in cannot number them.
        writer.add_labels(it.label for it in items if it.label)
        run = ExtractRun(writer, summary, corpora, specs, options)
        run.plan(items, entry, options.remove_missing)
        n_jobs = min(options.jobs or usable_cores(), max(len(run.todo), 1))
        if options.jobs is not None and run.todo and n_jobs < options.jobs:
            log.info("--jobs %d capped to %d: there are only %d files to decode", options.jobs, n_jobs, len(run.todo))
        summary.jobs = n_jobs
        with run_executor(options, n_jobs) as executor:
            run.decode(n_jobs, executor)
        if writer.commit_state.corpora != corpora:
            run.commit([], [], [])
        dropped = writer.drop_unused_labels()  # a label none of whose files decoded gets no id
        if dropped:
            log.info("no file of label(s) %s could be decoded; they get no class number", ", ".join(dropped))
        summary.clips_in_store = writer.commit_state.n_clips
    summary.wall_seconds = time.perf_counter() - t0
    if loc.local is not None:
        summary.store_bytes = dir_bytes(loc.local)
    return summary
