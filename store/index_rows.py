"""Is every row of a committed index one clip, once, as many as the commit says?  Vectorised checks, no I/O.

:mod:`specstore.store.extents` checks where each row's frames lie; this checks the
rest a reader relies on and that ``python -m specstore store validate`` has always
required:

* the index has as many rows as the commit's ``n_clips``, and the error
  table as many as its ``n_errors`` (a commit and its index agree);
* no two rows have the same path (a path names one clip; the writer keys
  its rows on it);
* every duration is a finite number of seconds above 0 (a decoded clip
  lasts some time; NaN or infinity would poison every sum of seconds).

Each check is one numpy pass: the paths are compared neighbour to
neighbour when they are sorted, as the writer stores them (a full sort only
when they are not), so opening a large store stays cheap (the figures:
docs/measurements.md).
"""

from __future__ import annotations

import numpy as np

from .extents import Problem

__all__ = ["row_problems"]


def _same_path(paths: np.ndarray) -> Problem | None:
    """The first row whose path an earlier row already has, or None.

    Sorted paths (what the writer stores) have no two alike exactly when each is below the next: one
    comparison pass.  Otherwise a set tells whether any repeat, and only then a sort says which rows.
    """
    if len(paths) < 2 or bool((paths[:-1] < paths[1:]).all()):
        return None
    listed = paths.tolist()
    if len(set(listed)) == len(listed):
        return None
    order = np.argsort(paths, kind="stable")
    ordered = paths[order]
    repeats = np.flatnonzero(ordered[1:] == ordered[:-1])
    first, again = sorted((int(order[repeats[0]]), int(order[repeats[0] + 1])))
    return Problem(again, f"has the same path as clip {first}", len(repeats), first)


def _bad_durations(durations: np.ndarray) -> Problem | None:
    """The first row whose duration is not a finite number of seconds above 0 (NaN fails both tests)."""
    bad = np.flatnonzero(~((durations > 0) & (durations < np.inf)))
    if not len(bad):
        return None
    row = int(bad[0])
    return Problem(row, f"lasts {durations[row]} s (a clip lasts a finite number of seconds above 0)", len(bad))


def row_problems(paths: np.ndarray, durations: np.ndarray, *, n_errors: int, n_clips: int,
                 n_errors_recorded: int) -> list[Problem]:
    """Every kind of problem with the rows (empty = none): counts against the commit, repeated paths, durations.

    ``paths`` and ``durations`` are the index's columns as stored; ``n_errors`` is the error table's rows;
    ``n_clips`` and ``n_errors_recorded`` what the commit records.  A problem of the whole index (a count)
    has row -1.
    """
    found: list[Problem | None] = []
    if len(paths) != n_clips:
        found.append(Problem(-1, f"the index has {len(paths)} rows but the commit records n_clips = {n_clips}"))
    if n_errors != n_errors_recorded:
        found.append(Problem(-1, f"the error table has {n_errors} rows but the commit records "
                                 f"n_errors = {n_errors_recorded}"))
    found += [_same_path(paths), _bad_durations(np.asarray(durations, dtype=np.float64))]
    return [p for p in found if p is not None]
