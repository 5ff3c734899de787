"""Consistency checks of a committed store (``python -m store validate PATH``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .errors import StoreError
from .layout import SHARDS_GROUP
from .reader import open_store

__all__ = ["validate"]


def validate(where: str, *, deep: bool = False, storage_options: dict[str, Any] | None = None) -> list[str]:
    """Return a list of problems (empty = valid) with the committed state at ``where``.

    Checks the metadata, that index columns agree, that every row points
    inside a committed, complete shard whose arrays have the spec's shape and
    dtype, that paths are unique, labels in range, and that one content hash
    always maps to one place.  ``deep`` also reads every clip and checks its
    values are finite.  Uncommitted shards are reported as notes, not problems.
    """
    try:
        s = open_store(where, storage_options)
    except StoreError as e:
        return [str(e)]
    problems: list[str] = []
    n = len(s)
    if n != s.metadata.commit.n_clips:
        problems.append(f"index has {n} rows but the commit records {s.metadata.commit.n_clips}")
    if len(s.errors) != s.metadata.commit.n_errors:
        problems.append(f"error table has {len(s.errors)} rows but the commit records {s.metadata.commit.n_errors}")
    if len(set(s.paths)) != n:
        problems.append("index paths are not unique")
    if n and (s.labels.min() < -1 or s.labels.max() >= len(s.label_names)):
        problems.append("a label is out of range of label_names")
    if n and (s.lengths.min() < 1 or (s.durations <= 0).any()):
        problems.append("a clip has no frames or no duration")
    shard_ids = s._shard
    if n and (shard_ids.min() < 0 or shard_ids.max() >= len(s.shards)):
        problems.append("a row points at a shard outside the commit")
        return problems
    place: dict[str, tuple[int, int, int]] = {}
    for h, sh, off, ln in zip(s.hashes, shard_ids.tolist(), s._offset.tolist(), s.lengths.tolist()):
        if place.setdefault(h, (sh, off, ln)) != (sh, off, ln):
            problems.append(f"content {h[:12]} is indexed at two different places")
    extents: dict[int, int] = {}
    for sh, off, ln in zip(shard_ids.tolist(), s._offset.tolist(), s.lengths.tolist()):
        extents[sh] = max(extents.get(sh, 0), off + ln)
    for sh, name in enumerate(s.shards):
        try:
            group = s._root[f"{SHARDS_GROUP}/{name}"]
        except KeyError:
            problems.append(f"committed shard {name} is missing")
            continue
        if not group.attrs.get("complete"):
            problems.append(f"committed shard {name} is not marked complete")
        for feat, spec in s.specs.items():
            try:
                arr = s.feature(feat)._shard_array(sh)
            except StoreError as e:
                problems.append(str(e))
                continue
            if arr.shape[1] != spec.n_bins or np.dtype(arr.dtype) != np.dtype(spec.dtype):
                problems.append(f"shard {name}/{feat} is {arr.shape}/{arr.dtype}, spec says {spec.n_bins} bins/{spec.dtype}")
            if arr.shape[0] < extents.get(sh, 0):
                problems.append(f"shard {name}/{feat} has {arr.shape[0]} frames; the index needs {extents[sh]}")
    if deep and not problems:
        for feat in s.specs:
            view = s.feature(feat)
            for i in range(n):
                if not np.isfinite(np.asarray(view.frames(i), dtype=np.float32)).all():
                    problems.append(f"clip {s.paths[i]} has non-finite {feat} values")
                    break
    return problems
