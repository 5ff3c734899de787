"""The clip index and the error table of one commit, edited in memory before :meth:`StoreWriter.commit` writes them.

:class:`IndexEdit` starts from the committed columns (:data:`specstore.store.layout.INDEX_COLUMNS`),
takes shards out or in, indexes rows, records and clears errors, and gives
the next generation's columns, sorted by path so the committed content does
not depend on the order work finished in.  Nothing here touches the store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specstore.common.errors import ConfigError

from .errors import StoreError
from .layout import INDEX_COLUMNS
from .shard_writer import ShardInfo

__all__ = ["ErrorRow", "IndexEdit", "IndexRow"]


@dataclass(frozen=True)
class IndexRow:
    """One indexed path: its content, label name (``None`` = unlabelled), group, and the source file's stamp.

    ``size`` (bytes) and ``mtime_ns`` describe the source file whose bytes
    have ``hash`` (-1 = unknown); ``group`` is e.g. the musical work ("" = none).
    """

    path: str
    hash: str
    label: str | None = None
    group: str = ""
    size: int = -1
    mtime_ns: int = -1


@dataclass(frozen=True)
class ErrorRow:
    """A file that could not be turned into features, with a one-line reason."""

    path: str
    reason: str


@dataclass(frozen=True)
class _Place:
    """Where a content's frames are: shard number, first frame, frames, seconds of audio."""

    shard: int
    offset: int
    n_frames: int
    duration: float


@dataclass
class _Entry:
    """One row of the clip index, its fields in :data:`INDEX_COLUMNS` order (``label``: an index, -1 = none)."""

    path: str
    label: int
    hash: str
    shard: int
    offset: int
    n_frames: int
    duration: float
    group: str
    size: int
    mtime_ns: int

    @property
    def place(self) -> _Place:
        return _Place(self.shard, self.offset, self.n_frames, self.duration)


if tuple(f.name for f in dataclasses.fields(_Entry)) != tuple(INDEX_COLUMNS):  # pragma: no cover - a format edit
    raise AssertionError("_Entry's fields must be INDEX_COLUMNS, in order")


class IndexEdit:
    """The next commit's index and error table, built from the committed ones (see the module docstring)."""

    def __init__(self, index: Mapping[str, np.ndarray], keep: Sequence[int], old_shards: Sequence[str],
                 label_names: Sequence[str], errors: dict[str, str]) -> None:
        """Start from the committed ``index`` columns, keeping the rows of shards ``keep`` (renumbered in order)."""
        renumber = {i: j for j, i in enumerate(keep)}
        self.shard_names = [old_shards[i] for i in keep]
        self.labels = list(label_names)
        self._label_id = {n: i for i, n in enumerate(self.labels)}
        self.by_path: dict[str, _Entry] = {}
        self.where_is: dict[str, _Place] = {}
        self.errors = errors
        for values in zip(*(index[c].tolist() for c in INDEX_COLUMNS), strict=False):
            entry = _Entry(*values)
            if entry.shard not in renumber:
                continue
            entry.shard = renumber[entry.shard]
            self.by_path[entry.path] = entry
            self.where_is.setdefault(entry.hash, entry.place)

    def add_shards(self, shards: Sequence[ShardInfo]) -> None:
        """New shards after the kept ones; their clips' contents become indexable."""
        for info in shards:
            if info.name in self.shard_names:
                raise StoreError(f"shard {info.name} is already committed")
            self.shard_names.append(info.name)
            for c in info.clips:
                self.where_is.setdefault(c.hash, _Place(len(self.shard_names) - 1, c.offset, c.n_frames, c.duration))

    def _label(self, name: str | None) -> int:
        """The index of label ``name`` (added to the label names if new); -1 for no label."""
        if name is None or name == "":
            return -1
        if name not in self._label_id:
            self._label_id[name] = len(self.labels)
            self.labels.append(name)
        return self._label_id[name]

    def add_rows(self, rows: Sequence[IndexRow]) -> None:
        """Index ``rows`` (replacing the rows of their paths); a row's content must be in a shard."""
        for r in rows:
            if r.hash not in self.where_is:
                raise StoreError(f"cannot index {r.path}: its content {r.hash[:12]} is in no shard")
            check_text(r.path, "path")
            lab = self._label(r.label)
            p = self.where_is[r.hash]
            self.by_path[r.path] = _Entry(r.path, lab, r.hash, p.shard, p.offset, p.n_frames, p.duration,
                                          r.group or "", int(r.size), int(r.mtime_ns))

    def settle_errors(self, errors: Sequence[ErrorRow], clear: Iterable[str], remove: Iterable[str]) -> None:
        """Paths in ``clear`` or ``remove`` leave the error table, ``remove`` the index; ``errors`` are recorded
        (their paths leave the index)."""
        gone = set(remove)
        for p in [*clear, *gone]:
            self.errors.pop(p, None)
        for p in gone:
            self.by_path.pop(p, None)
        for e in errors:
            check_text(e.path, "path")
            self.errors[e.path] = " ".join(str(e.reason).split()) or "unreadable"
            self.by_path.pop(e.path, None)

    def index_columns(self) -> dict[str, np.ndarray]:
        """The index as columns, rows sorted by path."""
        ordered = [self.by_path[p] for p in sorted(self.by_path)]
        return {c: column([getattr(e, c) for e in ordered], dt) for c, dt in INDEX_COLUMNS.items()}

    def error_columns(self) -> dict[str, np.ndarray]:
        """The error table as columns, sorted by path."""
        paths = sorted(self.errors)
        return {"path": column(paths, "str"), "reason": column([self.errors[p] for p in paths], "str")}


def check_text(value: str, what: str) -> None:
    """A stored string must be valid Unicode (escape file names first: :func:`specstore.store.layout.escape_path`)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {value!r} is not valid UTF-8; escape it with store.escape_path") from None


def column(values: list[Any], dtype: str) -> np.ndarray:
    """A 1-D column of ``values`` (``"str"`` = variable-length UTF-8)."""
    if dtype == "str":
        return (
            np.array(values, dtype=np.dtypes.StringDType()) if values else np.array([], dtype=np.dtypes.StringDType())
        )
    return np.asarray(values, dtype=dtype)
