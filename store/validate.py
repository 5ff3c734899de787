"""Consistency checks of a committed store (``python -m store validate PATH [--deep]``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import StoreError
from .reader import open_store
from .shards import shard_problems

__all__ = ["validate"]


def validate(where: str | os.PathLike[str], *, deep: bool = False,
             storage_options: dict[str, Any] | None = None) -> list[str]:
    """Return a list of problems (empty = valid) with the committed state at ``where``.

    Checks the metadata, that index columns agree, that paths are unique,
    labels in range, that one content hash always maps to one place, and
    that every row points inside a committed, complete shard every chunk of
    which exists with the size its record implies.  ``deep`` also reads every
    chunk, checks its CRC-32C and that its values are finite.  Uncommitted
    shards are not problems (the next writer removes them).
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
    for h, sh, off, ln in zip(s.hashes, shard_ids.tolist(), s._offset.tolist(), s.lengths.tolist(), strict=False):
        if place.setdefault(h, (sh, off, ln)) != (sh, off, ln):
            problems.append(f"content {h[:12]} is indexed at two different places")
    extents: dict[int, int] = {}
    for sh, off, ln in zip(shard_ids.tolist(), s._offset.tolist(), s.lengths.tolist(), strict=False):
        extents[sh] = max(extents.get(sh, 0), off + ln)
    for sh, name in enumerate(s.shards):
        problems += shard_problems(s.location, s._root, s.layout, name, s.specs, deep=deep,
                                   needed_frames=extents.get(sh, 0))
    if deep and not problems:
        for feat in s.specs:
            view = s.feature(feat)
            for i in range(n):
                if not np.isfinite(np.asarray(view.frames(i), dtype=np.float32)).all():
                    problems.append(f"clip {s.paths[i]} has non-finite {feat} values")
                    break
    return problems
