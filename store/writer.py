"""Committing to a store (in the driver) under the writer lock; shards are written by
:mod:`specstore.store.shard_writer`.

The protocol that makes a crash at any instant harmless:

1. A worker writes one *whole* shard under ``shards/<random name>/``
   (:class:`specstore.store.ShardWriter`) and marks it complete, with the checksums of
   its chunks, in the shard's attributes last.  Nobody else writes into that
   shard, so zarr's lost-update problem with concurrent partial chunk writes
   cannot happen.  An unfinished or uncommitted shard is invisible to readers.
2. The driver commits: it writes a complete new index generation
   ``index/gNNNNNN/`` and then rewrites the root metadata document (one atomic
   ``zarr.json`` write) to point at it.  Before that write, readers see the
   previous commit; after it, the new one.  There is no state in between.
3. A rerun removes uncommitted shards (:meth:`StoreWriter.remove_orphans`),
   drops committed shards that are damaged (:meth:`StoreWriter.repair`) and
   redoes only what the last commit lacks.

Only one :class:`StoreWriter` may hold a store at a time (:mod:`specstore.store.lock`).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from .errors import SpecMismatch, StoreError, StoreLocked
from .index_table import ErrorRow, IndexEdit, IndexRow
from .layout import (
    ATTR_KEY,
    ERROR_COLUMNS,
    ERRORS_GROUP,
    INDEX_COLUMNS,
    INDEX_GROUP,
    KEEP_GENERATIONS,
    SHARDS_GROUP,
    generation_name,
    index_path,
)
from .location import Location, as_location
from .lock import LEASE_SECONDS, WriterLock
from .metadata import Commit, Corpus, StoreMetadata, load_metadata, open_root
from .shard_writer import ShardInfo, StoredClip, write_shard
from .shards import ShardRecord, shard_problems
from .spec import FeatureSpec, spec_differences
from .table import read_columns, write_columns

__all__ = ["StoredClip", "ShardInfo", "IndexRow", "ErrorRow", "RepairReport", "StoreWriter", "create_store",
           "write_shard"]

log = logging.getLogger(__name__)


@dataclass
class RepairReport:
    """What :meth:`StoreWriter.repair` found and did: damaged shards dropped and the paths they held."""

    problems: list[str] = field(default_factory=list)
    dropped_shards: list[str] = field(default_factory=list)
    dropped_paths: list[str] = field(default_factory=list)

    def line(self) -> str:
        if not self.dropped_shards:
            return "no damaged shards"
        return (f"dropped {len(self.dropped_shards)} damaged shard(s) holding {len(self.dropped_paths)} path(s); "
                "the next extraction decodes them again")


class StoreWriter:
    """The driver's handle on a store: holds the writer lock, knows the committed state, commits.

    Only one writer may hold a store at a time; opening a second raises
    :class:`StoreLocked` naming the holder.  Close it (or use ``with``) to
    release the lock; a writer that is garbage-collected releases it too.
    Workers write shards with :class:`specstore.store.ShardWriter` freely.
    """

    def __init__(self, loc: Location, root: zarr.Group, meta: StoreMetadata, lock: WriterLock) -> None:
        self.location = loc
        self._root = root
        self.metadata = meta
        self._lock: WriterLock | None = lock
        self._index: dict[str, np.ndarray] = read_columns(root, meta.commit.index, INDEX_COLUMNS)
        self._errors: dict[str, np.ndarray] = read_columns(
            root, None if meta.commit.index is None else f"{meta.commit.index}/{ERRORS_GROUP}", ERROR_COLUMNS)

    # -- opening and closing -------------------------------------------------------------
    @classmethod
    def open(cls, where: str | Location, storage_options: dict[str, Any] | None = None) -> StoreWriter:
        """Open an existing store for appending; takes the writer lock."""
        loc = as_location(where, storage_options)
        load_metadata(loc)  # StoreNotFound / StoreCorrupt before locking anything
        lock = WriterLock.acquire(loc)
        try:
            root, meta = open_root(loc, "r+")
            return cls(loc, root, meta, lock)
        except BaseException:
            lock.release()
            raise

    def close(self) -> None:
        """Release the writer lock (the writer cannot commit afterwards)."""
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is not None:
            try:
                lock.release()
            except Exception:  # noqa: BLE001 - at interpreter exit; the kernel drops a flock anyway
                pass

    @property
    def lock(self) -> WriterLock:
        if self._lock is None:
            raise StoreError(f"the writer of {self.location} is closed")
        return self._lock

    # -- the committed state -------------------------------------------------------------
    @property
    def commit_state(self) -> Commit:
        return self.metadata.commit

    def committed_rows(self) -> dict[str, IndexRow]:
        """``path -> IndexRow`` of every indexed path."""
        names = self.metadata.commit.label_names
        idx = self._index
        return {p: IndexRow(p, h, names[lab] if lab >= 0 else None, g, sz, mt) for p, h, lab, g, sz, mt in
                zip(*(idx[c].tolist() for c in ("path", "hash", "label", "group", "size", "mtime_ns")), strict=False)}

    def committed_hashes(self) -> set[str]:
        """Content hashes already stored (their paths can be indexed without decoding)."""
        return set(self._index["hash"].tolist())

    def committed_errors(self) -> dict[str, str]:
        """``path -> reason`` of the files recorded as bad."""
        return dict(zip(self._errors["path"].tolist(), self._errors["reason"].tolist(), strict=False))

    def remove_orphans(self) -> list[str]:
        """Delete shards that were written but never committed (an interrupted run's work).

        Only the lock holder calls this, so no live writer's shards are among
        them.  Under a lease (object stores), where two writers could
        overlap for a moment, only shards older than two lease periods go.
        """
        self.lock.check()
        committed = set(self.metadata.commit.shards)
        shards = self._root.require_group(SHARDS_GROUP)
        orphans = [k for k in shards.group_keys() if k not in committed]
        if not self.lock.reliable:
            cutoff = time.time() - 2 * LEASE_SECONDS
            orphans = [k for k in orphans if _created(shards[k]) < cutoff]
        for k in orphans:
            del shards[k]
        if orphans:
            log.info("removed %d uncommitted shard(s) left by an interrupted run", len(orphans))
        return orphans

    # -- damage ----------------------------------------------------------------------------
    def damaged_shards(self, *, deep: bool = False) -> dict[str, list[str]]:
        """Committed shards with problems (quick: missing or short chunks; ``deep``: checksums too)."""
        needed: dict[int, int] = {}
        for sh, off, n in zip(self._index["shard"].tolist(), self._index["offset"].tolist(),
                              self._index["n_frames"].tolist(), strict=False):
            needed[sh] = max(needed.get(sh, 0), off + n)
        out = {}
        for i, name in enumerate(self.metadata.commit.shards):
            problems = shard_problems(self.location, self._root, self.metadata.layout, name, self.metadata.features,
                                      deep=deep, needed_frames=needed.get(i, 0))
            if problems:
                out[name] = problems
        return out

    def repair(self, *, deep: bool = True) -> RepairReport:
        """Drop damaged shards from the index (one commit) and delete them; undamaged data is untouched.

        The paths they held leave the index, so the next extraction decodes
        their files again.  ``deep`` checks every checksum (reads the whole
        store); otherwise only that every chunk exists with its size.
        """
        damaged = self.damaged_shards(deep=deep)
        report = RepairReport(problems=[p for ps in damaged.values() for p in ps])
        if not damaged:
            return report
        ids = {i for i, n in enumerate(self.metadata.commit.shards) if n in damaged}
        report.dropped_paths = [
            p for p, sh in zip(self._index["path"].tolist(), self._index["shard"].tolist(), strict=False) if sh in ids
        ]
        report.dropped_shards = sorted(damaged)
        self.commit(drop_shards=report.dropped_shards)
        shards = self._root.require_group(SHARDS_GROUP)
        for name in report.dropped_shards:
            try:
                del shards[name]
            except (KeyError, OSError):
                pass  # already gone, or left to the next orphan cleanup
        log.warning("%s: %s", self.location, report.line())
        return report

    # -- committing ----------------------------------------------------------------------
    def commit(
        self,
        shards: Sequence[ShardInfo] = (),
        rows: Sequence[IndexRow] = (),
        errors: Sequence[ErrorRow] = (),
        clear_errors: Iterable[str] = (),
        *,
        remove: Iterable[str] = (),
        drop_shards: Iterable[str] = (),
        corpora: Sequence[Corpus] | None = None,
    ) -> Commit:
        """Make new shards, index rows and error rows visible in one atomic step.

        A row's content hash must be in one of ``shards`` or already committed.
        A row for an already indexed path replaces it; an indexed or cleared
        path leaves the error table.  ``remove`` takes paths out of the index
        and the error table; ``drop_shards`` takes committed shards out, with
        every row pointing into them; ``corpora`` replaces the recorded corpus
        roots.  Rows are kept sorted by path, so the committed content does
        not depend on the order work finished in.  Raises
        :class:`StoreLocked` if another writer committed meanwhile.
        """
        old = self.metadata.commit
        dropped = set(drop_shards)
        keep = [i for i, n in enumerate(old.shards) if n not in dropped]
        edit = IndexEdit(self._index, keep, old.shards, old.label_names, self.committed_errors())
        edit.add_shards(shards)
        edit.add_rows(rows)
        edit.settle_errors(errors, clear=[*clear_errors, *(r.path for r in rows)], remove=remove)
        columns, err_cols = edit.index_columns(), edit.error_columns()

        self._check_not_overtaken(old)
        gen = old.generation + 1
        local = self.location.local
        write_columns(self._root, index_path(gen), columns, INDEX_COLUMNS, local)
        write_columns(self._root, f"{index_path(gen)}/{ERRORS_GROUP}", err_cols, ERROR_COLUMNS, local)
        new = Commit(
            gen,
            index_path(gen),
            tuple(edit.shard_names),
            tuple(edit.labels),
            len(edit.by_path),
            len(edit.errors),
            old.corpora if corpora is None else tuple(corpora),
            self._shard_frames(old, keep, shards),
        )
        meta = self.metadata.with_commit(new)
        self._check_not_overtaken(old)
        self._root.attrs.update({ATTR_KEY: meta.to_attrs()})  # the atomic commit point
        self.metadata, self._index, self._errors = meta, columns, err_cols
        self._prune(gen)
        return new

    def _shard_frames(self, old: Commit, keep: Sequence[int], new: Sequence[ShardInfo]) -> tuple[int, ...] | None:
        """Frame counts of the next commit's shards (``keep`` of the old ones, then ``new``), for readers' checks.

        A store committed before commits recorded them gets them from its
        shards' own records, once; None if one of those cannot be read (a
        reader then checks each shard when it opens it).
        """
        if old.shard_frames is not None:
            kept = [old.shard_frames[i] for i in keep]
        else:
            try:
                kept = [ShardRecord.load(self.location, old.shards[i], self.metadata.features).n_frames for i in keep]
            except StoreError as e:
                log.warning("%s: shard frame counts not recorded (%s)", self.location, e)
                return None
        return tuple(kept) + tuple(info.n_frames for info in new)

    def _check_not_overtaken(self, old: Commit) -> None:
        """Refuse to commit when the lock is lost or the store moved on since this writer read it."""
        self.lock.check()
        now = load_metadata(self.location).commit.generation
        if now != old.generation:
            raise StoreLocked(
                f"another writer committed to {self.location} meanwhile (generation {now}, this "
                f"writer started from {old.generation}); nothing was committed by this one"
            )

    def add_clips(self, rows: Sequence[Mapping[str, Any]], features: Mapping[str, Sequence[np.ndarray]]) -> Commit:
        """Write one shard from in-memory arrays and commit it (for tests and notebooks).

        ``rows[k]`` has ``path``, ``hash``, ``duration`` (seconds) and optional
        ``label`` (a name, an index into the store's label names, or None)
        and ``group``.
        """
        names = list(self.metadata.commit.label_names)
        info = write_shard(self.location, features, [r["hash"] for r in rows], [float(r["duration"]) for r in rows])
        idx_rows = []
        for r in rows:
            lab = r.get("label")
            if isinstance(lab, (int, np.integer)):
                lab = names[int(lab)] if int(lab) >= 0 else None
            idx_rows.append(IndexRow(str(r["path"]), str(r["hash"]), lab, str(r.get("group") or "")))
        return self.commit([info], idx_rows)

    def _prune(self, generation: int) -> None:
        """Drop index generations older than the last ``KEEP_GENERATIONS``."""
        index = self._root.require_group(INDEX_GROUP)
        keep = {generation_name(g) for g in range(generation - KEEP_GENERATIONS + 1, generation + 1)}
        for name in list(index.group_keys()):
            if name not in keep:
                del index[name]


def _created(group: Any) -> float:
    """When a shard was created (seconds since the epoch; 0 if it does not say)."""
    return float(group.attrs.get("created", 0))


def create_store(
    where: str | os.PathLike[str] | Location,
    features: Mapping[str, FeatureSpec],
    *,
    layout: str = "raw",
    default_feature: str | None = None,
    label_names: Sequence[str] = (),
    storage_options: dict[str, Any] | None = None,
) -> StoreWriter:
    """Create a store, or open an existing one whose specs are the same; returns its (locked) writer.

    ``layout`` is ``"raw"`` (uncompressed, memory-mapped reads; the default
    for local disks) or ``"zstd"`` (compressed chunks, for archives and object
    stores).  An existing store with different specs or layout is refused with
    :class:`SpecMismatch`, never silently mixed; a path that is a file, lies
    under a file or holds other data is refused before anything is written.
    """
    loc = as_location(where, storage_options)
    loc.check_writable_path()
    default = default_feature or next(iter(features), "")
    meta = StoreMetadata(layout=layout, features=dict(features), default_feature=default)
    if not loc.exists():
        if not loc.is_vacant():
            raise StoreError(f"{loc} exists and is not a specstore store; choose another STORE path")
        if loc.local is not None:
            loc.local.mkdir(parents=True, exist_ok=True)
        lock = WriterLock.acquire(loc)
        try:
            if not loc.exists():  # nobody created it while we took the lock
                commit = Commit(0, None, (), tuple(label_names), 0, 0, shard_frames=())
                # The root document carries the metadata from its first write: a crash
                # right after it leaves an empty, valid store.  No overwrite: that would
                # delete the lock file we hold.
                root = zarr.create_group(
                    loc.zarr_store(read_only=False),
                    zarr_format=3,
                    overwrite=False,
                    attributes={ATTR_KEY: meta.with_commit(commit).to_attrs()},
                )
                root.require_group(SHARDS_GROUP)
                root.require_group(INDEX_GROUP)
                root, meta = open_root(loc, "r+")
                return StoreWriter(loc, root, meta, lock)
        except BaseException:
            lock.release()
            raise
        lock.release()
    writer = StoreWriter.open(loc)
    have = writer.metadata
    problems = [f"layout: {have.layout!r} != {layout!r}"] if have.layout != layout else []
    if set(have.features) != set(features):
        problems.append(f"features: {sorted(have.features)} != {sorted(features)}")
    else:
        for k in features:
            problems += [f"{k}.{d}" for d in spec_differences(have.features[k], features[k])]
    if problems:
        writer.close()
        raise SpecMismatch(
            f"{loc} already holds a store made differently ({'; '.join(problems)}); use another STORE path or delete it"
        )
    return writer
