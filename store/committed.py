"""The committed index of one commit, read from the store: its rows, its error table and its shards.

Format 3 reads the commit's segments and merges them (:mod:`specstore.store.segments`); format 2 reads its
one index group, and takes the shard list from the root document.  Either way the rows come sorted by
path, and the commit comes back with its shard list filled in.
"""

from __future__ import annotations

import numpy as np
import zarr

from .errors import StoreCorrupt
from .extents import MAX_FRAMES
from .layout import ERROR_COLUMNS, ERRORS_GROUP, INDEX_COLUMNS
from .location import Location
from .metadata import Commit
from .segments import Segment, merge, read_segment
from .table import column, read_columns

__all__ = ["load_index"]


def load_index(loc: Location, root: zarr.Group, commit: Commit) -> tuple[Commit, Segment]:
    """``commit`` with its shards, and its index as one merged segment (rows, errors, shards; no removals).

    :class:`StoreCorrupt` when a segment is missing or its shard tables do not add up to the commit's
    ``n_shards`` or name a shard wrongly.
    """
    local = loc.local
    if not commit.segmented:
        rows = read_columns(root, commit.index, INDEX_COLUMNS, local)
        errors = read_columns(root, None if commit.index is None else f"{commit.index}/{ERRORS_GROUP}",
                              ERROR_COLUMNS, local)
        # -1: a count the commit does not record, or not one a shard can hold (the reader refuses that shard
        # against the commit's number when it opens it; a writer's upgrade reads it from the shard's record)
        recorded = commit.shard_frames if commit.shard_frames is not None else [-1] * len(commit.shards)
        frames = [n if 0 <= n <= MAX_FRAMES else -1 for n in recorded]
        shards = {"name": column(list(commit.shards), "str"), "n_frames": np.asarray(frames, dtype=np.int64)}
        return commit, Segment(rows=rows, shards=shards, errors=errors)
    assert commit.segments is not None
    merged = merge([read_segment(root, path, local) for path in commit.segments], oldest=True) \
        if commit.segments else Segment()
    names = tuple(merged.shards["name"].tolist())
    counts = tuple(int(n) for n in merged.shards["n_frames"].tolist())
    if len(names) != commit.n_shards:
        raise StoreCorrupt(f"store {loc}: its index segments list {len(names)} shards but commit "
                           f"{commit.generation} records n_shards = {commit.n_shards}")
    loaded = commit.with_shards(names, counts)
    try:
        loaded.check_shards()
    except ValueError as e:
        raise StoreCorrupt(f"store {loc}: {e}") from None
    return loaded, merged

