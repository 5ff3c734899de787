"""Creating a store, or opening an existing one made the same way (:func:`create_store`)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import zarr

from .errors import SpecMismatch, StoreError
from .layout import ATTR_KEY, INDEX_GROUP, LABEL_RULE, SHARDS_GROUP
from .location import Location, as_location
from .lock import WriterLock
from .metadata import Commit, LabelNumbering, StoreMetadata, open_root
from .spec import FeatureSpec, spec_differences
from .writer import StoreWriter

__all__ = ["create_store"]


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
            try:
                loc.local.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise StoreError(f"cannot create the store folder {loc.local}: {e.strerror or e}") from None
        lock = WriterLock.acquire(loc)
        try:
            if not loc.exists():  # nobody created it while we took the lock
                commit = Commit(0, None, (), tuple(label_names), 0, 0, shard_frames=(), segments=(),
                                label_numbering=LabelNumbering(LABEL_RULE, len(label_names)))
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
