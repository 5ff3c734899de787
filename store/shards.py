"""Reading committed shards whole-or-not-at-all: sizes checked on open, checksums on every chunked read.

A shard's own ``zarr.json`` records what it holds (``n_frames``, its clips,
``complete``) and, per feature, the checksum of every chunk
(:mod:`specstore.store.checksum`).  What a read may return is only what was written:

* raw layout, local: the chunk file must have exactly ``n_frames`` frames of
  bytes (a missing or truncated file raises); it is then memory-mapped.  Its
  checksum is checked by ``validate --deep`` and ``open_store(verify=True)``
  (checking it on every open would read the whole shard for one clip).
* zstd layout, and raw layout through zarr (remote stores): every chunk a
  read touches is decompressed whole (as zarr does anyway) and its values
  checked against the recorded CRC-32C, so a missing chunk (which zarr
  would read as fill-value zeros), a damaged or a truncated one raises
  :class:`StoreCorrupt` naming the shard.

:func:`shard_problems` is the one check behind ``validate`` (quick: every
chunk exists with its recorded size; deep: every checksum) and
``repair`` (which drops the shards it finds damaged).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import zarr

from .checksum import ChunkSums, crc32c, values_bytes
from .errors import StoreCorrupt, StoreError
from .layout import shard_path
from .location import Location
from .spec import FeatureSpec

__all__ = ["ShardRecord", "VerifiedArray", "array_problem", "chunk_key", "open_feature", "shard_problems"]


def chunk_key(shard: str, feature: str, k: int) -> str:
    """Store key of chunk ``k`` (along frames) of a shard's feature array."""
    return f"{shard_path(shard, feature)}/c/{k}/0"


def _repair_hint(loc: Location) -> str:
    return f"the store is damaged: `specstore store repair {loc}` drops the damaged shard, a rerun re-decodes it"


@dataclass(frozen=True)
class ShardRecord:
    """A committed shard's own record (its group attributes)."""

    name: str
    n_frames: int
    complete: bool
    sums: dict[str, ChunkSums]

    @classmethod
    def load(cls, loc: Location, name: str, features: dict[str, FeatureSpec]) -> ShardRecord:
        """Read and check a shard's record; :class:`StoreCorrupt` naming the shard when it is missing or bad."""
        import json

        raw = loc.get(f"{shard_path(name)}/zarr.json")
        if raw is None:
            raise StoreCorrupt(f"committed shard {name} is missing; {_repair_hint(loc)}")
        try:
            attrs = json.loads(raw)["attributes"]
            n_frames = int(attrs["n_frames"])
            complete = bool(attrs.get("complete"))
            sums_doc = attrs.get("checksums") or {}
        except (ValueError, KeyError, TypeError):
            raise StoreCorrupt(f"committed shard {name} has corrupt metadata; {_repair_hint(loc)}") from None
        if n_frames < 0:
            raise StoreCorrupt(f"committed shard {name} records {n_frames} frames; {_repair_hint(loc)}")
        missing = [f for f in features if f not in sums_doc]
        if missing:
            raise StoreCorrupt(f"committed shard {name} records no checksums for {', '.join(missing)}")
        sums = {f: ChunkSums.from_dict(sums_doc[f], f"shard {name}/{f}") for f in features}
        return cls(name, n_frames, complete, sums)


def array_problem(loc: Location, record: ShardRecord, feature: str, spec: FeatureSpec,
                  shape: tuple[int, ...] | None = None, dtype: str | None = None) -> str | None:
    """What is wrong with a shard's feature array against its record and the store's spec (None = nothing).

    ``shape`` and ``dtype`` as zarr has them; when not given they are read
    from the array's own ``zarr.json`` (metadata only, no frames).  Its
    frames must be the record's, its bins and dtype the spec's.
    """
    where = f"shard {record.name}/{feature}"
    if shape is None or dtype is None:
        import json

        raw = loc.get(f"{shard_path(record.name, feature)}/zarr.json")
        if raw is None:
            return f"committed shard {record.name} has no array {feature}"
        try:
            doc = json.loads(raw)
            shape, dtype = tuple(int(n) for n in doc["shape"]), str(doc["data_type"])
        except (ValueError, KeyError, TypeError):
            return f"{where}: its array metadata is unreadable"
    if len(shape) != 2 or shape[1] != spec.n_bins:
        return f"{where} is an array of shape {shape}, but the store's {feature} spec has {spec.n_bins} bins"
    if shape[0] != record.n_frames:
        return f"{where} holds {shape[0]} frames, but the shard's record says {record.n_frames}"
    try:
        same_dtype = np.dtype(dtype) == np.dtype(spec.dtype)
    except TypeError:
        same_dtype = False
    if not same_dtype:
        return f"{where} holds {dtype} values, but the store's {feature} spec says {spec.dtype}"
    return None


class VerifiedArray:
    """One feature of a committed shard read through zarr, every chunk checked against its checksum.

    Supports ``shape``, ``dtype`` and ``arr[start:stop]`` (frames); results
    are read-only.  The last chunks read are kept, so consecutive clips of
    one chunk decompress it once.
    """

    def __init__(self, loc: Location, root: zarr.Group, record: ShardRecord, feature: str, spec: FeatureSpec) -> None:
        self._loc, self._record, self._feature, self._spec = loc, record, feature, spec
        self.sums = record.sums[feature]
        try:
            self._arr: Any = cast(Any, root[shard_path(record.name, feature)])
        except KeyError:
            raise StoreCorrupt(f"committed shard {record.name} has no array {feature}; {_repair_hint(loc)}") from None
        self.shape = (record.n_frames, spec.n_bins)
        self.dtype = np.dtype(spec.dtype)
        problem = array_problem(loc, record, feature, spec, tuple(self._arr.shape), str(self._arr.dtype))
        if problem:
            raise StoreCorrupt(f"{problem}; {_repair_hint(loc)}")
        self._cached: tuple[int, int, np.ndarray] | None = None

    def chunk(self, k: int) -> np.ndarray:
        """Chunk ``k``'s in-bounds frames, checked."""
        return self._read(k, k + 1)

    def _read(self, c0: int, c1: int) -> np.ndarray:
        if self._cached is not None and self._cached[0] <= c0 and c1 <= self._cached[1]:
            a0 = self._cached[0]
            cf = self.sums.chunk_frames
            return self._cached[2][(c0 - a0) * cf: (c1 - a0) * cf]
        cf, n = self.sums.chunk_frames, self._record.n_frames
        lo, hi = c0 * cf, min(c1 * cf, n)
        name = f"shard {self._record.name}/{self._feature}"
        try:
            block = np.asarray(self._arr[lo:hi])
        except (RuntimeError, ValueError, TypeError, OSError) as e:  # zstd's own checksum, a torn chunk
            raise StoreCorrupt(f"{name}: a chunk in frames {lo}..{hi} cannot be decoded ({e}); "
                               f"{_repair_hint(self._loc)}".replace("\n", " ")) from None
        for k in range(c0, c1):
            part = block[(k - c0) * cf: min((k - c0 + 1) * cf, hi - lo)]
            if crc32c(values_bytes(part, self._spec.dtype)) != self.sums.crc[k]:
                what = ("is missing" if self._loc.size(chunk_key(self._record.name, self._feature, k)) is None
                        else "does not match its checksum")
                raise StoreCorrupt(f"{name}: chunk {k} {what}; {_repair_hint(self._loc)}")
        block.setflags(write=False)
        self._cached = (c0, c1, block)
        return block

    def __getitem__(self, sel: slice) -> np.ndarray:
        if not isinstance(sel, slice) or sel.step not in (None, 1):
            raise TypeError("shard arrays are read by frame ranges: arr[start:stop]")
        start, stop, _ = sel.indices(self.shape[0])
        if stop <= start:
            return np.zeros((0, self.shape[1]), dtype=self.dtype)
        cf = self.sums.chunk_frames
        c0, c1 = start // cf, -(-stop // cf)
        block = self._read(c0, c1)
        return block[start - c0 * cf: stop - c0 * cf]


def _frames_bytes(n_frames: int, spec: FeatureSpec) -> str:
    """``"140 frames x 16 bins of float16 are 4480 bytes"``: what a raw chunk file must hold."""
    return (f"{n_frames} frames x {spec.n_bins} bins of {spec.dtype} are "
            f"{n_frames * spec.n_bins * np.dtype(spec.dtype).itemsize} bytes")


def _raw_chunk_file(loc: Location, name: str, feature: str) -> Path:
    assert loc.local is not None
    return loc.local / chunk_key(name, feature, 0)


def open_feature(loc: Location, root: zarr.Group, layout: str, record: ShardRecord, feature: str,
                 spec: FeatureSpec, *, verify: bool = False) -> Any:
    """A committed shard's feature as ``(n_frames, n_bins)``: an mmap view (local raw) or a :class:`VerifiedArray`.

    Raises :class:`StoreCorrupt` naming the shard when it is incomplete or its
    data file is missing or of the wrong size.  ``verify`` also checks a
    memory-mapped chunk's checksum (one full read of it).
    """
    if not record.complete:
        raise StoreCorrupt(f"committed shard {record.name} is not marked complete; {_repair_hint(loc)}")
    if loc.local is None or layout != "raw":
        return VerifiedArray(loc, root, record, feature, spec)
    problem = array_problem(loc, record, feature, spec)
    if problem:
        raise StoreCorrupt(f"{problem}; {_repair_hint(loc)}")
    chunk = _raw_chunk_file(loc, record.name, feature)
    row = spec.n_bins * np.dtype(spec.dtype).itemsize
    want = record.n_frames * row
    try:
        size = chunk.stat().st_size
    except FileNotFoundError:
        raise StoreCorrupt(f"shard {record.name}/{feature}: its data file {chunk} is missing; "
                           f"{_repair_hint(loc)}") from None
    if size != want:
        raise StoreCorrupt(f"shard {record.name}/{feature}: its data file has {size} bytes, but "
                           f"{_frames_bytes(record.n_frames, spec)}; {_repair_hint(loc)}")
    if want == 0:
        return np.zeros((0, spec.n_bins), dtype=spec.dtype)
    mapped = np.memmap(chunk, dtype=np.dtype(spec.dtype).newbyteorder("<"), mode="r",
                       shape=(record.n_frames, spec.n_bins))
    if verify and crc32c(mapped.tobytes()) != record.sums[feature].crc[0]:
        raise StoreCorrupt(f"shard {record.name}/{feature}: its data file does not match its checksum; "
                           f"{_repair_hint(loc)}")
    return mapped.view(np.ndarray)  # plain ndarray views; the mmap lives on as their base


def shard_problems(loc: Location, root: zarr.Group, layout: str, name: str, features: dict[str, FeatureSpec],
                   *, deep: bool, needed_frames: int = 0, needed_by: str = "") -> list[str]:
    """What is wrong with a committed shard (empty = whole).

    Quick: its record is readable and complete, every feature array has the
    record's frames and the spec's bins and dtype, every chunk exists with
    its recorded size, and it holds the ``needed_frames`` the index points
    into (``needed_by``: the clip that needs them, for the message).
    ``deep`` also reads every chunk and checks its checksum.  Each problem
    names the shard.
    """
    try:
        record = ShardRecord.load(loc, name, features)
    except StoreError as e:
        return [str(e)]
    problems: list[str] = []
    if not record.complete:
        problems.append(f"committed shard {name} is not marked complete")
    if record.n_frames < needed_frames:
        problems.append(f"shard {name} holds {record.n_frames} frames; the index needs {needed_frames}"
                        + (f" ({needed_by})" if needed_by else ""))
    for feat, spec in features.items():
        found = _chunk_problems(loc, layout, record, feat, spec)
        problems += found
        if found or problems or not deep:
            continue
        try:
            arr = open_feature(loc, root, layout, record, feat, spec, verify=True)
            if isinstance(arr, VerifiedArray):
                for k in range(arr.sums.n_chunks(record.n_frames)):
                    arr.chunk(k)
        except StoreError as e:
            problems.append(str(e))
    return problems


def _chunk_problems(loc: Location, layout: str, record: ShardRecord, feat: str, spec: FeatureSpec) -> list[str]:
    """Quick checks of one feature array of a shard: its metadata, then each chunk's presence and size."""
    name = record.name
    problem = array_problem(loc, record, feat, spec)
    if problem:
        return [problem]
    sums = record.sums[feat]
    n_chunks = sums.n_chunks(record.n_frames)
    if len(sums.crc) != n_chunks:
        return [f"shard {name}/{feat} records {len(sums.crc)} checksums for {n_chunks} chunks"]
    row = spec.n_bins * np.dtype(spec.dtype).itemsize
    problems = []
    for k in range(n_chunks):
        size = loc.size(chunk_key(name, feat, k))
        if size is None:
            problems.append(f"shard {name}/{feat}: chunk {k} is missing")
        elif size != sums.nbytes[k]:
            problems.append(f"shard {name}/{feat}: chunk {k} has {size} bytes, its record says {sums.nbytes[k]}")
        elif layout == "raw" and size != record.n_frames * row:
            problems.append(f"shard {name}/{feat}: chunk {k} has {size} bytes, but "
                            f"{_frames_bytes(record.n_frames, spec)}")
    return problems
