"""Is a committed index telling the truth about where each clip lies?  Vectorised checks, no I/O.

Row ``i`` of the index claims frames ``offset[i] : offset[i] + n_frames[i]``
of shard ``shard[i]``, and label ``label[i]``.  A reader slices exactly that,
so an index that lies would hand out another clip's frames, an empty or
shortened clip, or a traceback.  :func:`index_problems` checks, in a few
numpy passes (about 0.2 s for a million rows, sorting by shard and offset
once), that:

* every shard number is one of the commit's shards;
* every length is at least one frame and every offset is not negative (and
  neither beyond :data:`MAX_FRAMES`);
* every label is -1 (none) or an index into the label names;
* every extent ends inside its shard, where the commit records each shard's
  frame count, and in any case at most at frame :data:`MAX_FRAMES`, checked
  as ``n_frames > end - offset`` so that nothing wraps in int64 (the sum of
  two values of 2**62 would); every ``offset + n_frames`` computed after
  these checks fits in int64;
* no two extents overlap, except rows that share one extent exactly and
  hold the same content hash (identical files are stored once).

Where the commit does not record frame counts (stores written before it
did), the reader checks one shard's ends against its own record when it
first opens it, against :func:`shard_ends`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_FRAMES", "Problem", "index_problems", "shard_ends"]

#: No extent may end beyond this frame (2**62: ``offset + n_frames`` then fits in int64 with room to spare).
MAX_FRAMES = 1 << 62


@dataclass(frozen=True)
class Problem:
    """One kind of lie: the first row that tells it, what is wrong, and how many rows tell it.

    ``other`` is the row it collides with (overlaps), else -1.
    """

    row: int
    what: str
    count: int = 1
    other: int = -1


def _first(mask: np.ndarray, describe: Callable[[int], str]) -> Problem | None:
    """A :class:`Problem` for the first row where ``mask`` holds, described by ``describe(row)``; or None."""
    rows = np.flatnonzero(mask)
    if not len(rows):
        return None
    return Problem(int(rows[0]), describe(int(rows[0])), len(rows))


def _value_problems(shard: np.ndarray, offset: np.ndarray, n_frames: np.ndarray, label: np.ndarray,
                    n_shards: int, n_labels: int) -> list[Problem]:
    """Values out of range, each checked on its own (no sorting)."""
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = [
        ((shard < 0) | (shard >= n_shards),
         lambda i: f"points at shard number {shard[i]}, but the commit lists {n_shards} shard(s)"),
        (n_frames < 1, lambda i: f"has {n_frames[i]} frames (a clip has at least 1)"),
        (n_frames > MAX_FRAMES, lambda i: f"claims {n_frames[i]} frames, more than any shard can hold"),
        (offset < 0, lambda i: f"starts at frame {offset[i]} of its shard (a negative offset)"),
        (offset > MAX_FRAMES, lambda i: f"starts at frame {offset[i]}, beyond any shard's end"),
        ((label < -1) | (label >= n_labels),
         lambda i: f"has label number {label[i]}, but the store has {n_labels} label name(s) (-1 = none)"),
    ]
    return [p for mask, describe in checks if (p := _first(mask, describe)) is not None]


def _extent_order(shard: np.ndarray, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions in (shard, offset) order, with the shards and offsets in that order.

    One packed int64 key when it fits (several times faster than lexsort on
    a million rows), else a lexsort.
    """
    if not len(shard):
        return np.zeros(0, dtype=np.int64), shard, offset
    bits = 62 - int(shard.max()).bit_length()
    if int(offset.max()) < (1 << bits):
        key = (shard << bits) | offset
        order = np.argsort(key)
        key = key[order]
        return order, key >> bits, key & ((1 << bits) - 1)
    order = np.lexsort((offset, shard))
    return order, shard[order], offset[order]


def _overlap_problems(ids: np.ndarray, shard: np.ndarray, offset: np.ndarray, n_frames: np.ndarray,
                      hashes: np.ndarray | Sequence[str], shard_names: Sequence[str]) -> list[Problem]:
    """Extents that share frames: sorted by (shard, offset), each must end before the next begins.

    ``ids`` are the rows the other columns hold (those with values in
    range); ``hashes`` is the whole column.  Rows with exactly the same
    extent are one stored content indexed under several paths; they must
    then have the same hash.
    """
    order, s, o = _extent_order(shard, offset)
    n = n_frames[order]
    same_shard = s[1:] == s[:-1]
    identical = same_shard & (o[1:] == o[:-1]) & (n[1:] == n[:-1])
    out = []
    overlap = np.flatnonzero(same_shard & ~identical & (o[:-1] + n[:-1] > o[1:]))
    if len(overlap):
        a, b = order[overlap[0]], order[overlap[0] + 1]
        out.append(Problem(int(ids[b]), f"claims frames {offset[b]}..{offset[b] + n_frames[b]} of shard "
                                        f"{shard_names[s[overlap[0]]]}, which overlap frames "
                                        f"{offset[a]}..{offset[a] + n_frames[a]} of clip {ids[a]}",
                           len(overlap), int(ids[a])))
    pairs = np.flatnonzero(identical)
    if len(pairs):  # few (duplicate files): compare only their hashes, not a million strings
        differ = [(int(ids[a]), int(ids[b])) for a, b in zip(order[pairs], order[pairs + 1], strict=True)
                  if hashes[ids[a]] != hashes[ids[b]]]
        if differ:
            a, b = differ[0]
            out.append(Problem(b, f"claims the same frames as clip {a} but a different content hash "
                                  f"({str(hashes[b])[:12]} vs {str(hashes[a])[:12]})", len(differ), a))
    return out


def index_problems(shard: np.ndarray, offset: np.ndarray, n_frames: np.ndarray, label: np.ndarray,
                   hashes: np.ndarray | Sequence[str], *, shard_names: Sequence[str], n_labels: int,
                   shard_frames: Sequence[int] | None = None) -> list[Problem]:
    """Every kind of lie in an index (empty = it describes its store): the first row of each kind.

    Columns as stored (of one length).  ``shard_frames``: each shard's frame
    count as the commit records it (None: unknown; the reader then checks a
    shard's end when it opens it, :func:`shard_ends`).  The extent checks
    run on the rows whose values are in range.
    """
    shard, offset, n_frames, label = (np.asarray(a, dtype=np.int64) for a in (shard, offset, n_frames, label))
    problems = _value_problems(shard, offset, n_frames, label, len(shard_names), n_labels)
    ids = np.flatnonzero((shard >= 0) & (shard < len(shard_names)) & (n_frames >= 1) & (n_frames <= MAX_FRAMES)
                         & (offset >= 0) & (offset <= MAX_FRAMES))
    sh, off, n = (shard, offset, n_frames) if len(ids) == len(shard) else (shard[ids], offset[ids], n_frames[ids])
    past = _past_the_end(sh, off, n, shard_names, shard_frames)
    if past is not None:
        problems.append(Problem(int(ids[past[0].row]), past[0].what, past[0].count))
        inside = ~past[1]
        ids, sh, off, n = ids[inside], sh[inside], off[inside], n[inside]
    return problems + _overlap_problems(ids, sh, off, n, hashes, shard_names)


def _past_the_end(shard: np.ndarray, offset: np.ndarray, n_frames: np.ndarray, shard_names: Sequence[str],
                  shard_frames: Sequence[int] | None) -> tuple[Problem, np.ndarray] | None:
    """Extents (values in range) that end past their shard's recorded end, or past :data:`MAX_FRAMES`.

    Compared as ``n_frames > end - offset``: both sides lie in [-2**62, 2**62], so nothing wraps.  The
    problem's rows are positions in these arrays; the mask says which.
    """
    end: int | np.ndarray = MAX_FRAMES
    if shard_frames is not None:  # a recorded count beyond MAX_FRAMES is a lie the shard's record refuses at open
        end = np.asarray([min(int(f), MAX_FRAMES) for f in shard_frames], dtype=np.int64)[shard]
    over = n_frames > end - offset

    def describe(k: int) -> str:
        span = f"claims frames {offset[k]}..{int(offset[k]) + int(n_frames[k])}"
        if shard_frames is None:
            return f"{span}, past frame {MAX_FRAMES} (2**62), beyond any shard's end"
        return f"{span} of shard {shard_names[shard[k]]}, which holds {shard_frames[shard[k]]} frames"

    found = _first(over, describe)
    return None if found is None else (found, over)


def shard_ends(shard: np.ndarray, offset: np.ndarray, n_frames: np.ndarray,
               n_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """Per shard: the largest ``offset + n_frames`` of its rows, and a row that reaches it (0 and -1: no row).

    Call it on an index in which :func:`index_problems` found nothing.
    """
    shard = np.asarray(shard, dtype=np.int64)
    end = np.asarray(offset, dtype=np.int64) + np.asarray(n_frames, dtype=np.int64)
    ends = np.zeros(n_shards, dtype=np.int64)
    np.maximum.at(ends, shard, end)
    rows = np.full(n_shards, -1, dtype=np.int64)
    reach = np.flatnonzero(end == ends[shard])
    rows[shard[reach]] = reach
    return ends, rows
