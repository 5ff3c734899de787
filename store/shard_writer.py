"""Writing one whole shard, clip by clip and block by block, with a checksum for every chunk.

A pipeline worker hands each feature's frames to :class:`ShardWriter` as
they are computed, so its memory does not grow with a clip's length: the
raw layout appends them to the shard's chunk file (a local temporary file
for remote stores, uploaded at the end), the zstd layout fills one chunk of
``ZSTD_CHUNK_FRAMES`` frames at a time and writes it through zarr.  A clip
that fails half-way (a decode error, a file that changed meanwhile) is
rolled back with :meth:`ShardWriter.drop_clip`, leaving no trace.

The shard becomes *complete* in its attributes last, with its clips and the
checksums (:mod:`specstore.store.checksum`); it stays invisible to readers until the
driver commits it (:meth:`specstore.store.StoreWriter.commit`).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.codecs

from specstore.common.errors import ConfigError

from .checksum import ChunkSums, crc32c, values_bytes
from .layout import SHARDS_GROUP, ZSTD_CHUNK_FRAMES, ZSTD_LEVEL, shard_path
from .location import Location, as_location
from .metadata import StoreMetadata, open_root
from .shards import chunk_key
from .spec import FeatureSpec
from .zarr_files import write_array_document, write_group_document, zarr_document

__all__ = ["ShardInfo", "ShardWriter", "StoredClip", "array_options", "write_shard"]

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


def array_options(layout: str, n_frames: int, n_bins: int) -> dict[str, Any]:
    """zarr ``create_array`` options for a shard feature array in ``layout``.

    Raw: one uncompressed chunk holding the whole array, written even when it
    is all zeros, so the chunk file is exactly the C-order float bytes and can
    be memory-mapped.  zstd: chunks of ``ZSTD_CHUNK_FRAMES`` frames, with
    zstd's own content checksum (so plain zarr readers detect damage too).
    """
    common: dict[str, Any] = dict(
        fill_value=0, filters=None, config={"write_empty_chunks": True},
        chunk_key_encoding={"name": "default", "separator": "/"},
    )
    if layout == "raw":
        return dict(chunks=(max(n_frames, 1), n_bins), compressors=None, **common)
    return dict(chunks=(ZSTD_CHUNK_FRAMES, n_bins),
                compressors=zarr.codecs.ZstdCodec(level=ZSTD_LEVEL, checksum=True), **common)


@functools.lru_cache(maxsize=32)
def _raw_array_template(n_bins: int, dtype: str) -> str:
    """The ``zarr.json`` zarr writes for a raw-layout ``(1, n_bins)`` array of ``dtype`` (made once per process)."""
    return zarr_document(lambda store: zarr.create_array(store, shape=(1, n_bins), dtype=dtype,
                                                         **array_options("raw", 1, n_bins)))


class _RawSink:
    """A raw-layout feature: its single chunk file, appended frame block by frame block."""

    def __init__(self, path: Path, spec: FeatureSpec) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.spec = path, spec
        self.row = spec.n_bins * np.dtype(spec.dtype).itemsize
        self._f = open(path, "wb")
        self.frames = 0
        self._crc = 0
        self._mark = (0, 0)

    def append(self, rows: np.ndarray) -> None:
        data = values_bytes(rows, self.spec.dtype)
        self._f.write(data)
        self._crc = crc32c(data, self._crc)
        self.frames += rows.shape[0]

    def mark(self) -> None:
        self._mark = (self.frames, self._crc)

    def rollback(self) -> None:
        self.frames, self._crc = self._mark
        self._f.seek(self.frames * self.row)
        self._f.truncate()

    def close(self) -> ChunkSums:
        self._f.close()
        return ChunkSums(max(self.frames, 1), (self._crc,), (self.frames * self.row,))

    def discard(self) -> None:
        self._f.close()


class _ChunkedSink:
    """A zstd-layout feature: frames fill one chunk at a time, each written through zarr when full."""

    def __init__(self, loc: Location, group: zarr.Group, shard: str, feature: str, spec: FeatureSpec) -> None:
        self.loc, self.shard, self.feature, self.spec = loc, shard, feature, spec
        self.cf = ZSTD_CHUNK_FRAMES
        self.arr = group.create_array(feature, shape=(0, spec.n_bins), dtype=spec.dtype,
                                      **array_options("zstd", 0, spec.n_bins))
        self.buf = np.empty((self.cf, spec.n_bins), dtype=spec.dtype)
        self.fill = 0
        self.flushed = 0  # whole chunks written
        self.written = 0  # chunk keys that may exist (stale ones are deleted at close)
        self.crcs: list[int] = []
        self._mark: tuple[int, int, np.ndarray] = (0, 0, self.buf[:0].copy())

    @property
    def frames(self) -> int:
        return self.flushed * self.cf + self.fill

    def append(self, rows: np.ndarray) -> None:
        i = 0
        while i < rows.shape[0]:
            take = min(self.cf - self.fill, rows.shape[0] - i)
            self.buf[self.fill:self.fill + take] = rows[i:i + take]
            self.fill += take
            i += take
            if self.fill == self.cf:
                self._write_chunk(self.cf)
                self.flushed += 1
                self.fill = 0

    def _write_chunk(self, n: int) -> None:
        k = self.flushed
        lo = k * self.cf
        if self.arr.shape[0] != lo + n:
            self.arr.resize((lo + n, self.spec.n_bins))
        self.arr[lo:lo + n] = self.buf[:n]
        self.crcs.append(crc32c(values_bytes(self.buf[:n], self.spec.dtype)))
        self.written = max(self.written, k + 1)

    def mark(self) -> None:
        self._mark = (self.flushed, self.fill, self.buf[:self.fill].copy())

    def rollback(self) -> None:
        self.flushed, self.fill, prefix = self._mark
        self.buf[:self.fill] = prefix
        del self.crcs[self.flushed:]

    def close(self) -> ChunkSums:
        if self.fill:
            self._write_chunk(self.fill)
        n_chunks = self.flushed + (1 if self.fill else 0)
        if self.arr.shape[0] != self.frames:
            self.arr.resize((self.frames, self.spec.n_bins))
        for k in range(n_chunks, self.written):  # chunks of a rolled-back clip beyond the end
            self.loc.delete(chunk_key(self.shard, self.feature, k))
        sizes = []
        for k in range(n_chunks):
            size = self.loc.size(chunk_key(self.shard, self.feature, k))
            if size is None:
                raise OSError(f"chunk {k} of shard {self.shard}/{self.feature} was not written")
            sizes.append(size)
        return ChunkSums(self.cf, tuple(self.crcs), tuple(sizes))

    def discard(self) -> None:
        pass


class ShardWriter:
    """Writes one new shard of a store; use as a context manager (an exception deletes the shard).

    Per clip: :meth:`append` each feature's frames in order (any float
    dtype; cast to the spec's storage dtype), then :meth:`end_clip` with the
    clip's content hash and duration, or :meth:`drop_clip` to forget it.
    :meth:`close` finishes the shard and returns its :class:`ShardInfo`
    (None when no clip was kept, and the shard is removed).  Safe to use from
    many processes at once: each writer writes a fresh, randomly named shard
    that nobody else touches.
    """

    def __init__(self, where: str | os.PathLike[str] | Location, *, storage_options: dict[str, Any] | None = None,
                 metadata: StoreMetadata | None = None) -> None:
        self.location = loc = as_location(where, storage_options)
        if metadata is None:
            _, metadata = open_root(loc, "r")
        self.metadata = metadata
        self.name = uuid.uuid4().hex[:16]
        self._attrs: dict[str, Any] = {"complete": False, "created": time.time()}
        # A raw shard on a local disk writes its zarr documents as files (zarr's per-node cost, one shard per
        # extraction task: docs/measurements.md); elsewhere through zarr.
        self._dir = loc.local / shard_path(self.name) if loc.local is not None and metadata.layout == "raw" else None
        self._group: zarr.Group | None = None
        if self._dir is not None:
            write_group_document(self._dir, self._attrs)
        else:
            self._group = zarr.create_group(loc.zarr_store(read_only=False), path=shard_path(self.name),
                                            zarr_format=3, attributes=self._attrs)
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._sinks: dict[str, _RawSink | _ChunkedSink] = {}
        for feat, spec in metadata.features.items():
            if metadata.layout == "raw":
                if loc.local is not None:
                    path = loc.local / chunk_key(self.name, feat, 0)
                else:
                    if self._tmp is None:
                        self._tmp = tempfile.TemporaryDirectory(prefix="specstore-shard-")
                    path = Path(self._tmp.name, feat)
                self._sinks[feat] = _RawSink(path, spec)
            else:
                assert self._group is not None  # the zstd layout never takes the local raw path
                self._sinks[feat] = _ChunkedSink(loc, self._group, self.name, feat, spec)
        self._clips: list[StoredClip] = []
        self._start = 0
        self._closed = False

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and not self._closed:
            self.abort()

    @property
    def clips(self) -> tuple[StoredClip, ...]:
        return tuple(self._clips)

    def sink(self, feature: str) -> Callable[[np.ndarray], None]:
        """A callable that appends ``(n, n_bins)`` frames of ``feature`` to the current clip."""
        return lambda rows: self.append(feature, rows)

    def append(self, feature: str, rows: np.ndarray) -> None:
        """Append frames ``(n, n_bins)`` of ``feature`` to the current clip."""
        sink = self._sinks.get(feature)
        if sink is None:
            raise ConfigError(f"the store has no feature {feature!r}; it has {sorted(self._sinks)}")
        if rows.ndim != 2 or rows.shape[1] != sink.spec.n_bins:
            raise ConfigError(f"feature {feature!r} frames must be (n_frames, {sink.spec.n_bins}), got {rows.shape}")
        if rows.shape[0]:
            sink.append(rows)

    def end_clip(self, content_hash: str, duration: float) -> StoredClip:
        """Keep the frames appended since the last clip as one clip of ``duration`` seconds."""
        counts = {f: s.frames - self._start for f, s in self._sinks.items()}
        if len(set(counts.values())) != 1:
            raise ConfigError(f"features of one clip must have the same number of frames, got {counts}")
        if not 0 < float(duration) < math.inf:  # what a reader requires of every row (store.index_rows)
            raise ConfigError(f"a clip lasts a finite number of seconds above 0, got {duration!r}")
        clip = StoredClip(content_hash, self._start, next(iter(counts.values())), float(duration))
        self._clips.append(clip)
        self._start += clip.n_frames
        for s in self._sinks.values():
            s.mark()
        return clip

    def drop_clip(self) -> None:
        """Forget the frames appended since the last clip (a clip that failed half-way)."""
        for s in self._sinks.values():
            s.rollback()

    def close(self) -> ShardInfo | None:
        """Finish the shard (arrays, checksums, then ``complete`` last); None if it holds no clip."""
        self.drop_clip()
        if not self._clips:
            self.abort()
            return None
        sums: dict[str, ChunkSums] = {}
        total = self._start
        for feat, sink in self._sinks.items():
            sums[feat] = sink.close()
            if isinstance(sink, _RawSink):
                if self.location.local is None:
                    self.location.upload(sink.path, chunk_key(self.name, feat, 0))
                if self._dir is not None:
                    n_bins = sink.spec.n_bins
                    write_array_document(self._dir / feat, _raw_array_template(n_bins, str(sink.spec.dtype)),
                                         (total, n_bins), (max(total, 1), n_bins))
                else:
                    assert self._group is not None
                    self._group.create_array(feat, shape=(total, sink.spec.n_bins), dtype=sink.spec.dtype,
                                             **array_options("raw", total, sink.spec.n_bins))
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        # Written last: a shard without this marker was interrupted.
        self._attrs.update({"clips": [vars(c) for c in self._clips], "n_frames": total, "complete": True,
                            "checksums": {f: s.to_dict() for f, s in sums.items()}})
        if self._dir is not None:
            write_group_document(self._dir, self._attrs)
        else:
            assert self._group is not None
            self._group.attrs.update(self._attrs)
        self._closed = True
        return ShardInfo(self.name, tuple(self._clips))

    def abort(self) -> None:
        """Remove everything this writer wrote (best effort)."""
        self._closed = True
        for s in self._sinks.values():
            s.discard()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        try:
            shards = zarr.open_group(self.location.zarr_store(read_only=False), path=SHARDS_GROUP, mode="r+",
                                     zarr_format=3)
            del shards[self.name]
        except (KeyError, FileNotFoundError, OSError, zarr.errors.GroupNotFoundError):
            log.debug("could not remove shard %s", self.name, exc_info=True)


def write_shard(
    where: str | os.PathLike[str] | Location,
    features: Mapping[str, Sequence[np.ndarray]],
    hashes: Sequence[str],
    durations: Sequence[float],
    *,
    storage_options: dict[str, Any] | None = None,
) -> ShardInfo:
    """Write one whole shard from in-memory arrays and return what it holds (not visible until committed).

    ``features[name][k]`` is clip ``k``'s ``(n_frames, n_bins)`` array for
    every feature of the store; ``hashes[k]`` and ``durations[k]`` (seconds)
    describe the same clip.  For tests, notebooks and small data; the
    pipeline streams through :class:`ShardWriter`.
    """
    n = len(hashes)
    if len(durations) != n:
        raise ConfigError("hashes and durations differ in length")
    for name, arrays in features.items():
        if len(arrays) != n:
            raise ConfigError(f"feature {name!r} has {len(arrays)} clips, expected {n}")
    with ShardWriter(where, storage_options=storage_options) as w:
        if set(features) != set(w.metadata.features):
            raise ConfigError(f"shard features {sorted(features)} differ from the store's "
                              f"{sorted(w.metadata.features)}")
        for k in range(n):
            for name, arrays in features.items():
                w.append(name, np.asarray(arrays[k]))
            w.end_clip(hashes[k], float(durations[k]))
        info = w.close()
    if info is None:
        raise ConfigError("a shard needs at least one clip")
    return info
