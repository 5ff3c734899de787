"""Reading a store: ``open_store(path)`` gives the committed index and each clip's features.

Opening reads the metadata document and the index only (its segments,
merged: :mod:`specstore.store.segments`; a few MB for 100k clips), never
feature data.  The snapshot is fixed at open: a
writer committing meanwhile does not change what this reader sees, because
committed shards are immutable and the index it loaded stays whole.

Local stores in the raw layout are read through ``numpy.memmap`` of the
chunk files, so a clip is a zero-copy view of the page cache; the
compressed layout and remote stores go through zarr, to the same values.
Either way a read returns what was written or raises :class:`StoreCorrupt`
naming the shard (see :mod:`specstore.store.shards`).

Opening also checks that the index tells the truth about where clips lie
(:mod:`specstore.store.extents`: shard numbers, offsets, lengths and labels in range,
no two clips sharing frames, every extent inside its shard, nothing that
wraps in int64) and about its rows (:mod:`specstore.store.index_rows`: as many as the
commit records, no path twice, finite positive durations), and refuses a
store whose index lies with one line (:class:`IndexCorrupt`), so a read can
never return another clip's frames.  These are the checks ``python -m specstore store
validate`` reports, from the same code.  Where the commit does not record its
shards' frame counts (older stores), each shard's end is checked when the
shard is first opened, before any of its frames are returned.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import numpy as np
import zarr

from .committed import load_index
from .errors import IndexCorrupt, StoreCorrupt
from .extents import Problem, index_problems, shard_ends
from .index_rows import row_problems
from .location import Location, as_location
from .metadata import StoreMetadata, load_metadata, open_root
from .shards import ShardRecord, open_feature
from .spec import FeatureSpec

__all__ = ["Store", "FeatureView", "open_store"]

#: Shard arrays kept open per feature (each is an mmap or a zarr handle).
_OPEN_SHARDS = 256
#: Tries to open a store whose index a committing writer pruned meanwhile.
_OPEN_ATTEMPTS = 3


class FeatureView:
    """One feature of a store, indexed by row: ``view[i]`` is ``(n_bins, n_frames)``."""

    def __init__(self, store: Store, name: str) -> None:
        self._store = store
        self.name = name
        self.spec: FeatureSpec = store.specs[name]
        self._open: OrderedDict[int, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    @property
    def lengths(self) -> np.ndarray:
        """Frames of every clip (the store's length index; reading it touches no feature data)."""
        return self._store.lengths

    def __getitem__(self, i: int) -> np.ndarray:
        """Clip ``i`` as ``(n_bins, n_frames)`` (a transposed view of :meth:`frames`)."""
        return self.frames(i).T

    def frames(self, i: int) -> np.ndarray:
        """Clip ``i`` as ``(n_frames, n_bins)``: a read-only zero-copy view for local raw stores."""
        s = self._store
        n = len(s)
        if not -n <= i < n:
            raise IndexError(f"clip {i} out of range for a store of {n} clips")
        i = int(i) % n
        shard = int(s._shard[i])
        start = int(s._offset[i])
        stop = start + int(s.lengths[i])
        return self._shard_array(shard)[start:stop]

    def _shard_array(self, shard: int) -> Any:
        arr = self._open.get(shard)
        if arr is not None:
            self._open.move_to_end(shard)
            return arr
        arr = self._store._open_shard_array(shard, self.name)
        self._open[shard] = arr
        if len(self._open) > _OPEN_SHARDS:
            self._open.popitem(last=False)
        return arr

    def __repr__(self) -> str:
        return f"<FeatureView {self.name}: {len(self)} clips x {self.spec.n_bins} bins, {self.spec.dtype}>"


class Store:
    """A read-only snapshot of a committed store. Create it with :func:`open_store`."""

    def __init__(self, loc: Location, root: zarr.Group, meta: StoreMetadata, *, verify: bool = False) -> None:
        self.location = loc
        self.metadata = meta
        self._root = root
        self._verify = verify
        self._records: dict[int, ShardRecord] = {}
        commit, merged = load_index(loc, root, meta.commit)
        self.metadata = meta = meta.with_commit(commit) if commit.segmented else meta
        idx, err = merged.rows, merged.errors
        self.lengths: np.ndarray = idx["n_frames"].astype(np.int64)
        self.durations: np.ndarray = idx["duration"].astype(np.float64)
        self.labels: np.ndarray = idx["label"].astype(np.int32)
        self.paths: list[str] = idx["path"].tolist()
        self.hashes: list[str] = idx["hash"].tolist()
        self.groups: list[str] = idx["group"].tolist()
        self.label_names: list[str] = list(commit.label_names)
        self.shards: tuple[str, ...] = commit.shards
        self.errors: list[tuple[str, str]] = list(zip(err["path"].tolist(), err["reason"].tolist(), strict=False))
        self._shard = idx["shard"].astype(np.int64)
        self._offset = idx["offset"].astype(np.int64)
        self._check_index(idx)
        self._ends, self._end_rows = shard_ends(self._shard, self._offset, self.lengths, len(self.shards))
        for name in ("lengths", "durations", "labels", "_shard", "_offset", "_ends", "_end_rows"):
            getattr(self, name).setflags(write=False)
        self._views: dict[str, FeatureView] = {}

    def _check_index(self, idx: dict[str, np.ndarray]) -> None:
        """Refuse an index that lies about where its clips are or about its rows: :class:`IndexCorrupt`,
        one line per kind of problem."""
        commit = self.metadata.commit
        found = index_problems(self._shard, self._offset, self.lengths, idx["label"], idx["hash"],
                               shard_names=self.shards, n_labels=len(self.label_names),
                               shard_frames=commit.shard_frames)
        found += row_problems(idx["path"], self.durations, n_errors=len(self.errors), n_clips=commit.n_clips,
                              n_errors_recorded=commit.n_errors)
        if found:
            lines = [self._problem_line(p) for p in found]
            more = f" (and {len(lines) - 1} more kind(s) of problem)" if len(lines) > 1 else ""
            raise IndexCorrupt(f"{lines[0]}{more}; {self._index_hint()}", lines)

    def _problem_line(self, p: Problem) -> str:
        if p.row < 0:  # the whole index
            return f"store {self.location}: {p.what}"
        more = f" ({p.count - 1} more clips too)" if p.count > 1 else ""
        return f"store {self.location}: clip {p.row} ({self.paths[p.row]}) {p.what}{more}"

    def _index_hint(self) -> str:
        return (f"its index is damaged or forged (`specstore store validate {self.location}` lists every problem; "
                f"extract the corpus into a new store)")

    # -- metadata ------------------------------------------------------------------------
    @property
    def specs(self) -> dict[str, FeatureSpec]:
        return dict(self.metadata.features)

    @property
    def default_feature(self) -> str:
        return self.metadata.default_feature

    @property
    def spec(self) -> FeatureSpec:
        """The default feature's spec."""
        return self.metadata.features[self.metadata.default_feature]

    @property
    def layout(self) -> str:
        return self.metadata.layout

    @property
    def generation(self) -> int:
        return self.metadata.commit.generation

    @property
    def total_seconds(self) -> float:
        return float(self.durations.sum())

    # -- data ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> np.ndarray:
        """Clip ``i`` of the default feature as ``(n_bins, n_frames)``."""
        return self.feature(self.default_feature)[i]

    def feature(self, name: str) -> FeatureView:
        """Access to another feature: ``s.feature("cqt")[i]``."""
        if name not in self.metadata.features:
            raise KeyError(f"store has no feature {name!r}; it has {', '.join(self.metadata.features)}")
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = FeatureView(self, name)
        return view

    def _open_shard_array(self, shard: int, feature: str) -> Any:
        return open_feature(self.location, self._root, self.layout, self.shard_record(shard), feature,
                            self.metadata.features[feature], verify=self._verify)

    def shard_record(self, shard: int) -> ShardRecord:
        """Shard number ``shard``'s record, checked against the commit and the index when first loaded.

        :class:`StoreCorrupt` when it disagrees with the frame count the commit records, or ends before a
        clip pointing into it.
        """
        record = self._records.get(shard)
        if record is None:
            record = ShardRecord.load(self.location, self.shards[shard], self.metadata.features)
            self._check_shard_end(shard, record)
            self._records[shard] = record
        return record

    def _check_shard_end(self, shard: int, record: ShardRecord) -> None:
        """Refuse a shard whose record disagrees with the commit, or that ends before a clip pointing into it."""
        recorded = self.metadata.commit.shard_frames
        if recorded is not None and recorded[shard] != record.n_frames:
            raise StoreCorrupt(f"store {self.location}: shard {record.name} holds {record.n_frames} frames but "
                               f"commit {self.generation} records {recorded[shard]}; {self._index_hint()}")
        if self._ends[shard] > record.n_frames:
            row = int(self._end_rows[shard])
            stop = int(self._offset[row]) + int(self.lengths[row])
            raise IndexCorrupt(self._problem_line(Problem(row, (
                f"claims frames {self._offset[row]}..{stop} of shard {record.name}, which holds "
                f"{record.n_frames} frames"))) + f"; {self._index_hint()}", [])

    # -- display -------------------------------------------------------------------------
    def summary(self) -> str:
        """A few readable lines: clips, hours, labels, features, layout, errors."""
        feats = ", ".join(f"{k} ({v.n_bins} bins, {v.dtype})" for k, v in self.metadata.features.items())
        counts: Any = np.bincount(self.labels[self.labels >= 0], minlength=len(self.label_names)) if len(self) else []
        labels = ", ".join(f"{n} {c}" for n, c in zip(self.label_names, counts, strict=False)) or "none"
        unlabelled = int((self.labels < 0).sum())
        lines = [
            f"specstore at {self.location}",
            f"  clips:    {len(self):,} ({len(set(self.hashes)):,} distinct contents), "
            f"{self.total_seconds / 3600:.2f} h of audio",
            f"  frames:   {int(self.lengths.sum()):,} ({self.metadata.frame_seconds * 1000:.1f} ms each)",
            f"  labels:   {labels}" + (f"; unlabelled {unlabelled}" if unlabelled else ""),
            f"  features: {feats}; default {self.default_feature}",
            f"  layout:   {self.layout}, {len(self.shards)} shards, commit {self.generation}",
            f"  errors:   {len(self.errors)}",
        ]
        return "\n".join(lines)

    def __repr__(self) -> str:
        feats = " ".join(f"{k}({v.n_bins})" for k, v in self.metadata.features.items())
        return (f"<specstore {len(self):,} clips, {self.total_seconds / 3600:.2f} h, "
                f"{len(self.label_names)} labels, {feats}, {self.layout}, "
                f"{len(self.errors)} errors at {self.location}>")


def open_store(where: str | os.PathLike[str] | Location, storage_options: dict[str, Any] | None = None, *,
               verify: bool = False) -> Store:
    """Open a store read-only: ``len(s)``, ``s.lengths``, ``s.labels``, ``s[i]``, ``s.feature("cqt")[i]``.

    ``where`` is a local path, a ``file://`` URL or any fsspec URL zarr
    accepts (``memory://``, ``s3://...``).  Raises :class:`StoreNotFound`
    or :class:`StoreCorrupt` with a one-line message.  Reads check sizes
    (raw) or every chunk's checksum (zstd, remote); ``verify`` also checks a
    memory-mapped shard's checksum when it is first opened (one full read).
    """
    loc = as_location(where, storage_options)
    attempt = 1
    while True:
        root, meta = open_root(loc, "r")
        try:
            return Store(loc, root, meta, verify=verify)
        except IndexCorrupt:
            raise
        except StoreCorrupt:
            # A writer that committed KEEP_GENERATIONS times since zarr.json was read has pruned the
            # index it named: read the newer commit.  The same commit failing again is real damage.
            if attempt == _OPEN_ATTEMPTS or load_metadata(loc).commit.generation == meta.commit.generation:
                raise
            attempt += 1
