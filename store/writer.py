"""Writing a store: create it, write whole shards (in workers), commit them (in the driver).

The protocol that makes a crash at any instant harmless:

1. A worker writes one *whole* shard under ``shards/<random name>/`` and marks
   it complete in the shard's attributes last.  Nobody else writes into that
   shard, so zarr's lost-update problem with concurrent partial chunk writes
   cannot happen.  An unfinished or uncommitted shard is invisible to readers.
2. The driver commits: it writes a complete new index generation
   ``index/gNNNNNN/`` and then rewrites the root metadata document (one atomic
   ``zarr.json`` write) to point at it.  Before that write, readers see the
   previous commit; after it, the new one.  There is no state in between.
3. A rerun removes uncommitted shards (:meth:`StoreWriter.remove_orphans`)
   and redoes only what the last commit lacks.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from .errors import SpecMismatch, StoreError, StoreNotFound
from .layout import (
    ATTR_KEY, ERROR_COLUMNS, ERRORS_GROUP, INDEX_COLUMNS, INDEX_GROUP, KEEP_GENERATIONS, SHARDS_GROUP,
    ZSTD_CHUNK_FRAMES, ZSTD_LEVEL, generation_name, index_path, shard_path,
)
from .location import Location, as_location
from .metadata import Commit, StoreMetadata
from .spec import FeatureSpec, spec_differences
from .table import read_columns, write_columns

__all__ = ["StoredClip", "ShardInfo", "IndexRow", "ErrorRow", "StoreWriter", "create_store", "write_shard"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredClip:
    """One distinct clip (content) inside a shard: its rows are ``offset : offset + n_frames``."""

    hash: str
    offset: int
    n_frames: int
    duration: float


@dataclass(frozen=True)
class ShardInfo:
    """What a worker wrote: the shard's name and the clips it holds."""

    name: str
    clips: tuple[StoredClip, ...]

    @property
    def n_frames(self) -> int:
        return sum(c.n_frames for c in self.clips)


@dataclass(frozen=True)
class IndexRow:
    """One indexed path: which content it holds and its label name (``None`` = unlabelled)."""

    path: str
    hash: str
    label: str | None = None


@dataclass(frozen=True)
class ErrorRow:
    """A file that could not be turned into features, with a one-line reason."""

    path: str
    reason: str


def _array_options(layout: str, n_frames: int, n_bins: int) -> dict[str, Any]:
    """zarr ``create_array`` options for a shard feature array in ``layout``.

    Raw: one uncompressed chunk holding the whole array, written even when it
    is all zeros, so the chunk file is exactly the C-order float bytes and can
    be memory-mapped.  zstd: chunks of ``ZSTD_CHUNK_FRAMES`` frames.
    """
    common: dict[str, Any] = dict(
        fill_value=0, filters=None, config={"write_empty_chunks": True},
        chunk_key_encoding={"name": "default", "separator": "/"},
    )
    if layout == "raw":
        return dict(chunks=(max(n_frames, 1), n_bins), compressors=None, **common)
    return dict(chunks=(min(max(n_frames, 1), ZSTD_CHUNK_FRAMES), n_bins),
                compressors=zarr.codecs.ZstdCodec(level=ZSTD_LEVEL), **common)


def _read_metadata(loc: Location) -> tuple[zarr.Group, StoreMetadata]:
    if not loc.exists():
        raise StoreNotFound(f"no store at {loc} (create it with `make features`)")
    root = loc.open_group("r+")
    return root, StoreMetadata.from_attrs(dict(root.attrs), str(loc))


def write_shard(
    where: "str | Location",
    features: Mapping[str, Sequence[np.ndarray]],
    hashes: Sequence[str],
    durations: Sequence[float],
    *,
    storage_options: dict[str, Any] | None = None,
) -> ShardInfo:
    """Write one whole shard and return what it holds (it is not visible until committed).

    ``features[name][k]`` is clip ``k``'s ``(n_frames, n_bins)`` array for
    every feature of the store (cast to the spec's dtype here); ``hashes[k]``
    and ``durations[k]`` (seconds) describe the same clip.  Safe to call from
    many processes at once: each call writes a fresh, randomly named shard.
    """
    loc = as_location(where, storage_options)
    _, meta = _read_metadata(loc)
    n = len(hashes)
    if len(durations) != n:
        raise ValueError("hashes and durations differ in length")
    if set(features) != set(meta.features):
        raise ValueError(f"shard features {sorted(features)} differ from the store's {sorted(meta.features)}")
    lengths: list[int] | None = None
    for name, arrays in features.items():
        spec = meta.features[name]
        if len(arrays) != n:
            raise ValueError(f"feature {name!r} has {len(arrays)} clips, expected {n}")
        for a in arrays:
            if a.ndim != 2 or a.shape[1] != spec.n_bins:
                raise ValueError(f"feature {name!r} arrays must be (n_frames, {spec.n_bins}), got {a.shape}")
        these = [int(a.shape[0]) for a in arrays]
        if lengths is not None and these != lengths:
            raise ValueError("features of one clip must have the same number of frames")
        lengths = these
    lengths = lengths or [0] * n
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    total = int(offsets[-1])

    name = uuid.uuid4().hex[:16]
    store = loc.zarr_store(read_only=False)
    group = zarr.create_group(store, path=shard_path(name), zarr_format=3)
    for feat, arrays in features.items():
        spec = meta.features[feat]
        data = np.empty((total, spec.n_bins), dtype=spec.dtype)
        for k, a in enumerate(arrays):
            data[offsets[k]:offsets[k + 1]] = a
        arr = group.create_array(feat, shape=data.shape, dtype=spec.dtype,
                                 **_array_options(meta.layout, total, spec.n_bins))
        if total:
            arr[...] = data
        del data
    clips = tuple(StoredClip(h, int(offsets[k]), int(lengths[k]), float(durations[k])) for k, h in enumerate(hashes))
    # Written last: a shard without this marker was interrupted.
    group.attrs.update({"clips": [vars(c) for c in clips], "n_frames": total, "complete": True})
    return ShardInfo(name, clips)


class StoreWriter:
    """The driver's handle on a store: knows the committed state and commits new shards.

    Only one writer (one driver process) may commit to a store at a time;
    workers call :func:`write_shard` freely.
    """

    def __init__(self, loc: Location, root: zarr.Group, meta: StoreMetadata) -> None:
        self.location = loc
        self._root = root
        self.metadata = meta
        self._index: dict[str, np.ndarray] = read_columns(root, meta.commit.index, INDEX_COLUMNS)
        self._errors: dict[str, np.ndarray] = read_columns(
            root, None if meta.commit.index is None else f"{meta.commit.index}/{ERRORS_GROUP}", ERROR_COLUMNS)

    # -- opening -------------------------------------------------------------------------
    @classmethod
    def open(cls, where: "str | Location", storage_options: dict[str, Any] | None = None) -> "StoreWriter":
        """Open an existing store for appending."""
        loc = as_location(where, storage_options)
        root, meta = _read_metadata(loc)
        return cls(loc, root, meta)

    # -- the committed state -------------------------------------------------------------
    @property
    def commit_state(self) -> Commit:
        return self.metadata.commit

    def committed_paths(self) -> dict[str, str]:
        """``path -> content hash`` of every indexed path."""
        return dict(zip(self._index["path"].tolist(), self._index["hash"].tolist()))

    def committed_rows(self) -> dict[str, tuple[str, str | None]]:
        """``path -> (content hash, label name or None)`` of every indexed path."""
        names = self.metadata.commit.label_names
        return {p: (h, names[lab] if lab >= 0 else None) for p, h, lab in
                zip(self._index["path"].tolist(), self._index["hash"].tolist(), self._index["label"].tolist())}

    def committed_hashes(self) -> set[str]:
        """Content hashes already stored (their paths can be indexed without decoding)."""
        return set(self._index["hash"].tolist())

    def committed_errors(self) -> dict[str, str]:
        """``path -> reason`` of the files recorded as bad."""
        return dict(zip(self._errors["path"].tolist(), self._errors["reason"].tolist()))

    def remove_orphans(self) -> list[str]:
        """Delete shards that were written but never committed (an interrupted run's work)."""
        committed = set(self.metadata.commit.shards)
        shards = self._root.require_group(SHARDS_GROUP)
        orphans = [k for k in shards.group_keys() if k not in committed]
        for k in orphans:
            del shards[k]
        if orphans:
            log.info("removed %d uncommitted shard(s) left by an interrupted run", len(orphans))
        return orphans

    # -- committing ----------------------------------------------------------------------
    def commit(
        self,
        shards: Sequence[ShardInfo] = (),
        rows: Sequence[IndexRow] = (),
        errors: Sequence[ErrorRow] = (),
        clear_errors: Iterable[str] = (),
    ) -> Commit:
        """Make new shards, index rows and error rows visible in one atomic step.

        A row's content hash must be in one of ``shards`` or already committed.
        A row for an already indexed path replaces it; an indexed or cleared
        path leaves the error table.  Rows are kept sorted by path, so the
        committed content does not depend on the order work finished in.
        """
        old = self.metadata.commit
        shard_names = list(old.shards)
        where_is: dict[str, tuple[int, int, int, float]] = {}
        idx = self._index
        for h, s, o, n, d in zip(idx["hash"].tolist(), idx["shard"].tolist(), idx["offset"].tolist(),
                                 idx["n_frames"].tolist(), idx["duration"].tolist()):
            where_is.setdefault(h, (s, o, n, d))
        for info in shards:
            if info.name in shard_names:
                raise StoreError(f"shard {info.name} is already committed")
            shard_names.append(info.name)
            for c in info.clips:
                where_is.setdefault(c.hash, (len(shard_names) - 1, c.offset, c.n_frames, c.duration))

        labels = list(old.label_names)
        label_id = {n: i for i, n in enumerate(labels)}
        by_path: dict[str, tuple[Any, ...]] = {
            p: (p, l, h, s, o, n, d) for p, l, h, s, o, n, d in zip(*(idx[c].tolist() for c in INDEX_COLUMNS))
        }
        for r in rows:
            if r.hash not in where_is:
                raise StoreError(f"cannot index {r.path}: its content {r.hash[:12]} is in no shard")
            lab = -1
            if r.label is not None and r.label != "":
                if r.label not in label_id:
                    label_id[r.label] = len(labels)
                    labels.append(r.label)
                lab = label_id[r.label]
            s, o, n, d = where_is[r.hash]
            by_path[r.path] = (r.path, lab, r.hash, s, o, n, d)

        err = self.committed_errors()
        for p in list(clear_errors) + [r.path for r in rows]:
            err.pop(p, None)
        for e in errors:
            err[e.path] = e.reason
            by_path.pop(e.path, None)

        ordered = [by_path[p] for p in sorted(by_path)]
        columns = {c: _column([row[i] for row in ordered], dt) for i, (c, dt) in enumerate(INDEX_COLUMNS.items())}
        err_paths = sorted(err)
        err_cols = {"path": _column(err_paths, "str"), "reason": _column([err[p] for p in err_paths], "str")}

        gen = old.generation + 1
        write_columns(self._root, index_path(gen), columns, INDEX_COLUMNS)
        write_columns(self._root, f"{index_path(gen)}/{ERRORS_GROUP}", err_cols, ERROR_COLUMNS)
        new = Commit(gen, index_path(gen), tuple(shard_names), tuple(labels), len(ordered), len(err_paths))
        meta = self.metadata.with_commit(new)
        self._root.attrs.update({ATTR_KEY: meta.to_attrs()})  # the atomic commit point
        self.metadata, self._index, self._errors = meta, columns, err_cols
        self._prune(gen)
        return new

    def add_clips(self, rows: Sequence[Mapping[str, Any]], features: Mapping[str, Sequence[np.ndarray]]) -> Commit:
        """Write one shard from in-memory arrays and commit it (for tests and notebooks).

        ``rows[k]`` has ``path``, ``hash``, ``duration`` (seconds) and optional
        ``label`` (a name, an index into the store's label names, or None).
        """
        names = list(self.metadata.commit.label_names)
        info = write_shard(self.location, features, [r["hash"] for r in rows], [float(r["duration"]) for r in rows])
        idx_rows = []
        for r in rows:
            lab = r.get("label")
            if isinstance(lab, (int, np.integer)):
                lab = names[int(lab)] if int(lab) >= 0 else None
            idx_rows.append(IndexRow(str(r["path"]), str(r["hash"]), lab))
        return self.commit([info], idx_rows)

    def _prune(self, generation: int) -> None:
        """Drop index generations older than the last ``KEEP_GENERATIONS``."""
        index = self._root.require_group(INDEX_GROUP)
        keep = {generation_name(g) for g in range(generation - KEEP_GENERATIONS + 1, generation + 1)}
        for name in list(index.group_keys()):
            if name not in keep:
                del index[name]


def _column(values: list[Any], dtype: str) -> np.ndarray:
    if dtype == "str":
        return np.array(values, dtype=np.dtypes.StringDType()) if values else np.array([], dtype=np.dtypes.StringDType())
    return np.asarray(values, dtype=dtype)


def create_store(
    where: "str | Location",
    features: Mapping[str, FeatureSpec],
    *,
    layout: str = "raw",
    default_feature: str | None = None,
    label_names: Sequence[str] = (),
    storage_options: dict[str, Any] | None = None,
) -> StoreWriter:
    """Create a store, or open an existing one whose specs are the same.

    ``layout`` is ``"raw"`` (uncompressed, memory-mapped reads; the default
    for local disks) or ``"zstd"`` (compressed chunks, for archives and object
    stores).  An existing store with different specs or layout is refused with
    :class:`SpecMismatch`, never silently mixed.
    """
    loc = as_location(where, storage_options)
    default = default_feature or next(iter(features))
    meta = StoreMetadata(layout=layout, features=dict(features), default_feature=default)
    if loc.exists():
        writer = StoreWriter.open(loc)
        have = writer.metadata
        problems = [f"layout: {have.layout!r} != {layout!r}"] if have.layout != layout else []
        if set(have.features) != set(features):
            problems.append(f"features: {sorted(have.features)} != {sorted(features)}")
        else:
            for k in features:
                problems += [f"{k}.{d}" for d in spec_differences(have.features[k], features[k])]
        if problems:
            raise SpecMismatch(f"{loc} already holds a store made differently ({'; '.join(problems)}); "
                               "use another STORE path or delete it")
        return writer
    if not loc.is_vacant():
        raise StoreError(f"{loc} exists and is not a specstore store; choose another STORE path")
    commit = Commit(0, None, (), tuple(label_names), 0, 0)
    # The root document carries the metadata from its first write: a crash
    # right after it leaves an empty, valid store.
    root = zarr.create_group(loc.zarr_store(read_only=False), zarr_format=3, overwrite=True,
                             attributes={ATTR_KEY: meta.with_commit(commit).to_attrs()})
    root.require_group(SHARDS_GROUP)
    root.require_group(INDEX_GROUP)
    return StoreWriter.open(loc)
