"""Consistency checks of a committed store (``python -m specstore store validate PATH [--deep]``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .errors import IndexCorrupt, StoreError
from .reader import open_store
from .shards import shard_problems

__all__ = ["validate"]


def validate(where: str | os.PathLike[str], *, deep: bool = False,
             storage_options: dict[str, Any] | None = None) -> list[str]:
    """Return a list of problems (empty = valid) with the committed state at ``where``.

    Checks the metadata; that the index tells the truth (what
    :func:`open_store` refuses, from the same code, :mod:`specstore.store.extents` and
    :mod:`specstore.store.index_rows`: shard numbers, offsets, lengths and labels in
    range, no two clips sharing frames, every extent inside its shard,
    row counts as the commit records, paths unique, durations finite and
    positive; one line per kind of problem); that one content hash always
    maps to one place; and that every committed shard is complete, holds
    the frames the commit records for it, its arrays have its record's
    frames and the spec's bins, and every chunk exists with the size its
    record implies.  ``deep`` also reads every chunk, checks its CRC-32C
    and that its values are finite.  Uncommitted shards are not problems
    (the next writer removes them).
    """
    try:
        s = open_store(where, storage_options)
    except IndexCorrupt as e:
        return e.problems or [str(e)]
    except StoreError as e:
        return [str(e)]
    problems: list[str] = []
    n = len(s)
    place: dict[str, tuple[int, int, int]] = {}
    for h, sh, off, ln in zip(s.hashes, s._shard.tolist(), s._offset.tolist(), s.lengths.tolist(), strict=False):
        if place.setdefault(h, (sh, off, ln)) != (sh, off, ln):
            problems.append(f"content {h[:12]} is indexed at two different places")
    for sh, name in enumerate(s.shards):
        row = int(s._end_rows[sh])
        needed_by = f"clip {row}, {s.paths[row]}" if row >= 0 else ""
        found = shard_problems(s.location, s._root, s.layout, name, s.specs, deep=deep,
                               needed_frames=int(s._ends[sh]), needed_by=needed_by)
        try:
            s.shard_record(sh)  # what a read checks first: the commit's frame count for it
        except StoreError as e:
            found = found or [str(e)]
        problems += found
    if deep and not problems:
        for feat in s.specs:
            view = s.feature(feat)
            for i in range(n):
                if not np.isfinite(np.asarray(view.frames(i), dtype=np.float32)).all():
                    problems.append(f"clip {s.paths[i]} has non-finite {feat} values")
                    break
    return problems
