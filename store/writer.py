"""Committing to a store (in the driver) under the writer lock; shards are written by
:mod:`specstore.store.shard_writer`.

The protocol that makes a crash at any instant harmless:

1. A worker writes one *whole* shard under ``shards/<random name>/``
   (:class:`specstore.store.ShardWriter`) and marks it complete, with the checksums of
   its chunks, in the shard's attributes last.  Nobody else writes into that
   shard, so zarr's lost-update problem with concurrent partial chunk writes
   cannot happen.  An unfinished or uncommitted shard is invisible to readers.
2. The driver commits: it writes one new index segment ``index/sNNNNNN/``
   holding what the commit adds (its rows, shards, errors and removals,
   merged with the newest few segments: :mod:`specstore.store.segments`), then
   rewrites the small root metadata document (one atomic ``zarr.json``
   write) to name it.  Before that write, readers see the previous commit;
   after it, the new one.  There is no state in between.  A commit costs
   what it adds, not what the store holds.
3. A rerun removes uncommitted shards (:meth:`StoreWriter.remove_orphans`),
   drops committed shards that are damaged (:meth:`StoreWriter.repair`) and
   redoes only what the last commit lacks.

Only one :class:`StoreWriter` may hold a store at a time (:mod:`specstore.store.lock`).
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zarr

from .committed import load_index
from .errors import StoreError, StoreLocked
from .index_table import ErrorRow, IndexRow, LiveIndex, Stale
from .layout import ATTR_KEY, INDEX_GROUP, KEEP_GENERATIONS, LABEL_RULE, SHARDS_GROUP, segment_path
from .location import Location, as_location
from .lock import LEASE_SECONDS, WriterLock
from .metadata import Commit, Corpus, LabelNumbering, StoreMetadata, load_metadata, open_root
from .segments import Segment, merge, merge_count, read_segment, without_shards, write_segment
from .shard_writer import ShardInfo, StoredClip, write_shard
from .shards import ShardRecord, shard_problems

__all__ = ["StoredClip", "ShardInfo", "IndexRow", "ErrorRow", "RepairReport", "StoreWriter", "write_shard"]

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
        self._live = self._load()
        self._planned: set[str] = set()  # labels given to add_labels (drop_unused_labels)

    def _reload(self) -> None:
        """Read the committed index again (after commits), keeping the labels given ids but not committed yet."""
        old = self._live
        self._live = self._load()
        self._live.keep_labels(old)

    def _load(self) -> LiveIndex:
        """Read the committed index (once per writer, and after a commit that rewrites it whole)."""
        commit, merged = load_index(self.location, self._root, self.metadata.commit)
        self.metadata = self.metadata.with_commit(commit) if commit.segmented else self.metadata
        self._loaded_at = commit.generation  # the commit whose index the snapshot is
        return LiveIndex(merged, commit.label_names, commit.n_clips, commit.n_errors)

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

    @property
    def shard_names(self) -> tuple[str, ...]:
        """The committed shards, in the order rows number them."""
        return tuple(self._live.shard_names)

    def committed_rows(self) -> dict[str, IndexRow]:
        """``path -> IndexRow`` of every indexed path."""
        if self._live.stale:
            self._reload()
        return self._live.rows()

    def committed_hashes(self) -> set[str]:
        """Content hashes already stored (their paths can be indexed without decoding)."""
        if self._live.stale:
            self._reload()
        return self._live.hashes()

    def committed_errors(self) -> dict[str, str]:
        """``path -> reason`` of the files recorded as bad."""
        return dict(self._live.errors)

    def remove_orphans(self) -> list[str]:
        """Delete shards that were written but never committed (an interrupted run's work).

        Only the lock holder calls this, so no live writer's shards are among
        them.  Under a lease (object stores), where two writers could
        overlap for a moment, only shards older than two lease periods go.
        """
        self.lock.check()
        committed = set(self._live.shard_names)
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
        rows = self._committed().rows
        needed: dict[int, int] = {}
        for sh, off, n in zip(rows["shard"].tolist(), rows["offset"].tolist(), rows["n_frames"].tolist(),
                              strict=True):
            needed[sh] = max(needed.get(sh, 0), off + n)
        out = {}
        for i, name in enumerate(self._live.shard_names):
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
        ids = {i for i, n in enumerate(self._live.shard_names) if n in damaged}
        rows = self._committed().rows
        report.dropped_paths = [p for p, sh in zip(rows["path"].tolist(), rows["shard"].tolist(), strict=True)
                                if sh in ids]
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
        dropped = set(drop_shards) & set(self._live.shard_names)
        try:
            pending = self._live.edit(shards, rows, errors, clear_errors, remove)
        except Stale:  # a content committed since this writer read the index: read it again, once
            self._reload()
            pending = self._live.edit(shards, rows, errors, clear_errors, remove)
        if dropped or not old.segmented:  # a repair, or a format-2 store's first commit: rewrite it whole
            merged = merge([self._committed(), pending.segment], oldest=True)
            return self._commit_whole(without_shards(merged, dropped), pending.labels, corpora)
        sizes = list(old.segment_sizes)
        assert old.segments is not None
        k = merge_count(sizes, pending.segment.size) if not pending.segment.empty else 0
        tail = [read_segment(self._root, path, self.location.local) for path in old.segments[len(sizes) - k:]]
        segment = merge([*tail, pending.segment], oldest=k == len(sizes))
        new = self._write_commit(old, list(old.segments[:len(sizes) - k]), sizes[:len(sizes) - k], segment,
                                 labels=(*self._live.labels, *pending.labels), n_clips=pending.n_clips,
                                 n_errors=pending.n_errors, n_shards=len(self._live.shard_names) + len(shards),
                                 corpora=corpora)
        self._live.apply(pending)
        self.metadata = self.metadata.with_commit(new.with_shards(self.shard_names, tuple(self._live.shard_frames)))
        return new

    def compact(self) -> Commit:
        """Rewrite the index as one segment (one commit); a reader then opens one segment.  Commits merge
        segments as they go (:func:`~specstore.store.segments.merge_count`), so this is never needed;
        it is what a repair does."""
        return self._commit_whole(self._committed(), [], None)

    @property
    def index_segments(self) -> int:
        """How many segments the committed index has (what a reader opens)."""
        return len(self.metadata.commit.segments or ()) if self.metadata.commit.segmented else 1

    def _committed(self) -> Segment:
        """The committed index as one merged segment: the snapshot read at open while nothing has been committed
        since (its tables copied, for callers edit what they get), else read from the store again (costs what
        the store holds)."""
        if self.metadata.commit.generation == self._loaded_at:
            snap = self._live.snapshot
            return Segment(rows=dict(snap.rows), shards={**snap.shards, "n_frames": snap.shards["n_frames"].copy()},
                           errors=dict(snap.errors), gone=dict(snap.gone))
        return load_index(self.location, self._root, self.metadata.commit)[1]

    def _commit_whole(self, merged: Segment, labels: Sequence[str], corpora: Sequence[Corpus] | None,
                      relabel: np.ndarray | None = None, label_names: Sequence[str] | None = None) -> Commit:
        """Commit ``merged`` (the whole index, removals dropped) as the store's only segment."""
        old = self.metadata.commit
        frames = merged.shards["n_frames"]
        if len(frames) and int(frames.min()) < 0:  # a format-2 store that did not record them
            frames[...] = [ShardRecord.load(self.location, n, self.metadata.features).n_frames
                           for n in merged.shards["name"].tolist()]
        if relabel is not None:
            lab = merged.rows["label"]
            merged.rows["label"] = np.where(lab >= 0, relabel[np.maximum(lab, 0)], -1).astype(lab.dtype)
        names = (*self._live.labels, *labels) if label_names is None else tuple(label_names)
        self._write_commit(old, [], [], merged, labels=names, n_clips=len(merged.rows["path"]),
                           n_errors=len(merged.errors["path"]), n_shards=len(merged.shards["name"]), corpora=corpora)
        self._live = self._load()
        return self.metadata.commit

    def _write_commit(self, old: Commit, kept: list[str], sizes: list[int], segment: Segment, *,
                      labels: Sequence[str], n_clips: int, n_errors: int, n_shards: int,
                      corpora: Sequence[Corpus] | None) -> Commit:
        """Write ``segment`` after the ``kept`` segments and make it the committed state (the commit point)."""
        self._check_not_overtaken(old)
        gen = old.generation + 1
        if not segment.empty:
            write_segment(self._root, segment_path(gen), segment, self.location.local)
            kept, sizes = [*kept, segment_path(gen)], [*sizes, segment.size]
        before = old.segments if old.segments is not None else ((old.index,) if old.index else ())
        numbering = old.label_numbering or LabelNumbering(LABEL_RULE, len(old.label_names))
        new = Commit(
            gen, None, (), tuple(labels), n_clips, n_errors,
            old.corpora if corpora is None else tuple(corpora),
            segments=tuple(kept), segment_sizes=tuple(sizes),
            history=(before, *old.history)[:KEEP_GENERATIONS - 1],
            n_shards=n_shards,
            label_numbering=numbering,
        )
        meta = self.metadata.with_commit(new)
        self._check_not_overtaken(old)
        self._root.attrs.update({ATTR_KEY: meta.to_attrs()})  # the atomic commit point
        self.metadata = meta
        self._prune(new)
        return new

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

    def _prune(self, commit: Commit) -> None:
        """Delete index groups that neither ``commit`` nor the commits kept before it name (merged segments,
        an interrupted commit's segment, a format-2 store's generations)."""
        needed = {*(commit.segments or ()), *(g for h in commit.history for g in h)}
        index = self._root.require_group(INDEX_GROUP)
        local = self.location.local
        for name in list(index.group_keys()):
            if f"{INDEX_GROUP}/{name}" in needed:
                continue
            if local is not None:
                shutil.rmtree(local / INDEX_GROUP / name, ignore_errors=True)
            else:
                del index[name]

    # -- labels ----------------------------------------------------------------------------
    def add_labels(self, names: Iterable[str]) -> list[str]:
        """Give ids to the labels of ``names`` the store has none for, sorted by name after the earlier ones.

        An extraction run calls this with every label of its corpus before its first commit, so labels are
        numbered by name whatever order its work finishes in; they are committed with the next commit.
        Returns the names that got ids.
        """
        names = [n for n in names if n]
        self._planned.update(names)
        new = self._live.new_labels(names)
        self._live.add_labels(new)
        return new

    def drop_unused_labels(self) -> list[str]:
        """Take back the ids of labels given to :meth:`add_labels` that no row holds (every file of theirs
        failed), in one commit.  Labels after them move down.  Returns the names dropped.

        When they are the last labels this costs a commit of nothing; one in the middle makes the commit
        rewrite the index whole (a label of a corpus losing all of its files is rare).
        """
        live = self._live
        unused = [n for n in live.labels if n in self._planned and not live.holds(n)]
        if not unused:
            return []
        names = [n for n in live.labels if n not in unused]
        self._planned -= set(unused)
        if live.labels[:len(names)] == names:  # only the last ones go: no row holds an id that moves
            live.labels[:] = names
            live.reset_label_ids()
            self._relabel_tail(names)
            return unused
        relabel = np.full(len(live.labels), -1, dtype=np.int64)
        for new_id, name in enumerate(names):
            relabel[live.labels.index(name)] = new_id
        self._commit_whole(self._committed(), [], None, relabel=relabel, label_names=names)
        return unused

    def _relabel_tail(self, names: list[str]) -> None:
        """Commit ``names`` as the label names (the committed ones, shortened at their end)."""
        old = self.metadata.commit
        assert old.segments is not None
        new = self._write_commit(old, list(old.segments), list(old.segment_sizes), Segment(), labels=names,
                                 n_clips=old.n_clips, n_errors=old.n_errors, n_shards=old.n_shards, corpora=None)
        self.metadata = self.metadata.with_commit(new.with_shards(self.shard_names, tuple(self._live.shard_frames)))


def _created(group: Any) -> float:
    """When a shard was created (seconds since the epoch; 0 if it does not say)."""
    return float(group.attrs.get("created", 0))
