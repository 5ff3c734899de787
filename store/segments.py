"""Index segments (store format 3): each commit appends one, and the newest few are merged as it does.

A segment is a zarr group under ``index/`` holding what one commit (or one merge of commits) changed:

* the rows it adds or replaces (the columns of :data:`~specstore.store.layout.INDEX_COLUMNS`, sorted by path);
* ``shards/``: the shards it adds (``name``, ``n_frames``); a row's ``shard`` numbers the concatenation of
  every segment's shard table, oldest segment first;
* ``errors/``: the files it records as failed (``path``, ``reason``);
* ``gone/``: the paths it takes out of the index and the error table.

The committed index is every segment read oldest first where, **for each path, the newest segment that
mentions it decides** (a row, an error, or gone).  Within one segment a path appears once.  So a commit
costs what it adds, and the order of rows never depends on how the segments happen to be cut: the index
is sorted by path.

The writer keeps the number of segments small by merging the newest ones with each new commit
(:func:`merge_count`): a segment is merged into its elder neighbour once the entries after it have grown
to its size, so every entry is rewritten about log2(n) times over a store's life, a merge that reaches
the oldest segment is rare, and a store of n entries has at most about log2(n) segments.  Everything
here is pure except :func:`read_segment` and :func:`write_segment`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zarr

from .layout import ERROR_COLUMNS, ERRORS_GROUP, GONE_COLUMNS, GONE_TABLE, INDEX_COLUMNS, SHARD_COLUMNS, SHARD_TABLE
from .table import empty_column, read_columns, write_columns

__all__ = ["Segment", "merge", "merge_count", "read_segment", "write_segment", "without_shards", "MAX_SEGMENTS"]

#: A merge also takes in older segments while there are more than this many (a cap on what a reader opens).
MAX_SEGMENTS = 24

Columns = dict[str, np.ndarray]


def _empty(schema: Mapping[str, str]) -> Columns:
    return {name: empty_column(dtype) for name, dtype in schema.items()}


@dataclass
class Segment:
    """One segment's four tables (see the module docstring), as read or as it will be written."""

    rows: Columns = field(default_factory=lambda: _empty(INDEX_COLUMNS))
    shards: Columns = field(default_factory=lambda: _empty(SHARD_COLUMNS))
    errors: Columns = field(default_factory=lambda: _empty(ERROR_COLUMNS))
    gone: Columns = field(default_factory=lambda: _empty(GONE_COLUMNS))

    @property
    def size(self) -> int:
        """Entries: rows, shards, errors and removed paths (what a merge rewrites)."""
        return sum(len(t[next(iter(t))]) for t in (self.rows, self.shards, self.errors, self.gone))

    @property
    def empty(self) -> bool:
        return self.size == 0


def merge_count(sizes: Sequence[int], added: int, *, max_segments: int = MAX_SEGMENTS) -> int:
    """How many of the newest segments (``sizes``, oldest first, in entries) to merge with ``added`` new entries.

    A segment is taken in while it holds no more entries than the merge gathered so far, like the carries
    of a binary counter: most commits merge nothing or a few small segments, and the merge that reaches
    the oldest (largest) segment comes once the store has doubled.  Older segments are also taken in while
    more than ``max_segments`` would remain.
    """
    k, gathered = 0, max(added, 1)
    while k < len(sizes) and sizes[-1 - k] <= gathered:
        gathered += sizes[-1 - k]
        k += 1
    return max(k, len(sizes) + 1 - max_segments)


def _concat(parts: Sequence[Columns], schema: Mapping[str, str]) -> Columns:
    if len(parts) == 1:
        return dict(parts[0])
    return {c: np.concatenate([p[c] for p in parts]) if parts else empty_column(dt) for c, dt in schema.items()}


def merge(segments: Sequence[Segment], *, oldest: bool) -> Segment:
    """One segment equal to ``segments`` (oldest first) read in order: for each path the newest mention wins.

    ``oldest``: the merge starts at the store's oldest segment, so nothing older is left for a removal to
    hide, and removals are dropped.  Shards are concatenated in order, so the numbers rows hold stay right.
    Rows and errors come out sorted by path.
    """
    if len(segments) == 1 and (not oldest or not len(segments[0].gone["path"])):
        return segments[0]
    rows = _concat([s.rows for s in segments], INDEX_COLUMNS)
    errors = _concat([s.errors for s in segments], ERROR_COLUMNS)
    gone = _concat([s.gone for s in segments], GONE_COLUMNS)
    shards = _concat([s.shards for s in segments], SHARD_COLUMNS)
    # every mention of a path, segment by segment (oldest first): a row, an error or a removal
    paths, kinds, where = [], [], []
    starts = [0, 0, 0]
    for s in segments:
        for kind, table in enumerate((s.rows, s.errors, s.gone)):
            n = len(table["path"])
            paths.append(table["path"])
            kinds.append(np.full(n, kind, dtype=np.int8))
            where.append(np.arange(starts[kind], starts[kind] + n, dtype=np.int64))
            starts[kind] += n
    all_paths = np.concatenate(paths) if paths else empty_column("str")
    kind_of = np.concatenate(kinds) if kinds else np.zeros(0, np.int8)
    at = np.concatenate(where) if where else np.zeros(0, np.int64)
    order = np.argsort(all_paths, kind="stable")  # each segment is sorted: runs that the sort merges
    ordered = all_paths[order]
    newest = np.ones(len(order), dtype=bool)
    newest[:-1] = ordered[:-1] != ordered[1:]  # the last mention of each path, in segment order
    won = order[newest]
    won_kind, won_at = kind_of[won], at[won]
    return Segment(
        rows={c: v[won_at[won_kind == 0]] for c, v in rows.items()},
        shards=shards,
        errors={c: v[won_at[won_kind == 1]] for c, v in errors.items()},
        gone=_empty(GONE_COLUMNS) if oldest else {c: v[won_at[won_kind == 2]] for c, v in gone.items()},
    )


def without_shards(segment: Segment, names: set[str]) -> Segment:
    """``segment`` (a whole index: :func:`merge` with ``oldest``) without the shards ``names`` and the rows
    pointing into them; the other shards are numbered again, in order."""
    if not names:
        return segment
    keep = np.array([n not in names for n in segment.shards["name"].tolist()], dtype=bool)
    renumber = np.cumsum(keep) - 1
    rows = segment.rows
    stays = keep[rows["shard"]] if len(keep) else np.zeros(len(rows["shard"]), dtype=bool)
    kept_rows = {c: v[stays] for c, v in rows.items()}
    kept_rows["shard"] = renumber[kept_rows["shard"]].astype(rows["shard"].dtype)
    return Segment(rows=kept_rows, shards={c: v[keep] for c, v in segment.shards.items()}, errors=segment.errors,
                   gone=segment.gone)


def read_segment(root: zarr.Group, path: str, local: Path | None = None) -> Segment:
    """The four tables of the segment at ``path`` (:class:`~specstore.store.errors.StoreCorrupt` if one is
    missing or malformed)."""
    return Segment(
        rows=read_columns(root, path, INDEX_COLUMNS, local),
        shards=read_columns(root, f"{path}/{SHARD_TABLE}", SHARD_COLUMNS, local),
        errors=read_columns(root, f"{path}/{ERRORS_GROUP}", ERROR_COLUMNS, local),
        gone=read_columns(root, f"{path}/{GONE_TABLE}", GONE_COLUMNS, local),
    )


def write_segment(root: zarr.Group, path: str, segment: Segment, local: Path | None = None) -> None:
    """Write ``segment`` as the group ``path`` (replacing an uncommitted one of that name)."""
    write_columns(root, path, segment.rows, INDEX_COLUMNS, local)
    write_columns(root, f"{path}/{SHARD_TABLE}", segment.shards, SHARD_COLUMNS, local)
    write_columns(root, f"{path}/{ERRORS_GROUP}", segment.errors, ERROR_COLUMNS, local)
    write_columns(root, f"{path}/{GONE_TABLE}", segment.gone, GONE_COLUMNS, local)
