"""Units of cluster inference: the store's distinct contents cut into length-sorted pieces of bounded work.

A unit is what one worker computes in one task (:mod:`specstore.infer.engine.distributed`): a list of
store rows, one per distinct content, of similar lengths, whose padded frames stay within a budget of a
few seconds of device time.  A clip too long for any batch (it runs in windows) is a unit of its own, so
one long track does not hold up a unit of short ones.  The cut is a pure function of the clips' lengths
and contents and of the two frame figures: the same store and options give the same units, with the
same keys, in every run, so a rerun finds the units its journal already holds.  Pure numpy; no torch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_UNIT_CLIPS", "Unit", "cut_units", "unit_key"]

MAX_UNIT_CLIPS = 256
"""Most clips in one unit (a unit's logits and its rows travel in one message)."""


def unit_key(hashes: Sequence[str]) -> str:
    """A unit's key: a digest of its content hashes in order (the same contents, the same key, in any process)."""
    digest = hashlib.sha256("\x1f".join(hashes).encode("utf-8", "surrogatepass")).hexdigest()
    return f"u{digest[:32]}"


@dataclass(frozen=True)
class Unit:
    """One piece of work: store ``rows`` (one per distinct content, shortest first), their content ``hashes``,
    their ``frames`` (sum of lengths) and ``key`` (:func:`unit_key`); ``windowed``: its one clip is too long for
    any batch."""

    key: str
    rows: tuple[int, ...]
    hashes: tuple[str, ...]
    frames: int
    windowed: bool = False


def cut_units(lengths: np.ndarray, hashes: Sequence[str], *, unit_frames: int, long_frames: int | None = None,
              max_clips: int = MAX_UNIT_CLIPS, rows: np.ndarray | None = None) -> list[Unit]:
    """The units of store rows with ``lengths`` (frames) and content ``hashes`` (both indexed by row).

    ``rows``: only these store rows (``make eval``'s labelled split; None: every row).
    Rows of a content already seen are dropped (the first row of each content runs); the rest are sorted by
    length (ties by row) and cut so that a unit's padded frames (clips x longest clip) stay within
    ``unit_frames`` and it holds at most ``max_clips`` clips; a clip longer than ``unit_frames`` is a unit
    of its own, and so is one longer than ``long_frames`` (the longest clip a batch of one holds: it runs in
    windows; None: no such limit).  Deterministic.
    """
    if unit_frames < 1 or max_clips < 1:
        raise ValueError(f"unit_frames and max_clips must be >= 1, got {unit_frames} and {max_clips}")
    lengths = np.asarray(lengths, dtype=np.int64)
    seen: set[str] = set()
    first: list[int] = []
    for row in range(len(hashes)) if rows is None else np.asarray(rows, dtype=np.int64).tolist():
        h = hashes[row]
        if h not in seen:
            seen.add(h)
            first.append(row)
    rows = np.asarray(first, dtype=np.int64)
    order = rows[np.argsort(lengths[rows], kind="stable")]
    units: list[Unit] = []
    current: list[int] = []

    def close(windowed: bool = False) -> None:
        if current:
            hs = tuple(hashes[r] for r in current)
            units.append(Unit(unit_key(hs), tuple(current), hs, int(lengths[current].sum()), windowed))
            current.clear()

    for row in order.tolist():
        n = int(lengths[row])
        if long_frames is not None and n > long_frames:
            close()
            current.append(row)
            close(windowed=True)
            continue
        if current and ((len(current) + 1) * n > unit_frames or len(current) >= max_clips):
            close()
        current.append(row)
    close()
    return units
