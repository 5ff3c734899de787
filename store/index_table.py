"""What the writer knows of the committed index between commits, and the segment one commit appends.

:class:`LiveIndex` is loaded once when a writer opens (the merged index) and then kept up to date with
each commit's changes, at the cost of what the commit adds: which paths are indexed or recorded as bad,
where each content lies, the label names and the shards.  :meth:`LiveIndex.edit` turns one commit's
shards, rows, errors and removals into the segment it appends (:mod:`specstore.store.segments`), sorted by
path so the committed content does not depend on the order work finished in, and the counts after it;
:meth:`LiveIndex.apply` takes it in once it is committed.  Nothing here touches the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from specstore.common.errors import ConfigError

from .errors import Stale, StoreError
from .layout import ERROR_COLUMNS, GONE_COLUMNS, INDEX_COLUMNS, SHARD_COLUMNS
from .segments import Segment
from .shard_writer import ShardInfo
from .table import column

__all__ = ["ErrorRow", "IndexRow", "LiveIndex", "Pending"]


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


#: One row as the segment stores it, in :data:`INDEX_COLUMNS` order (``label``: an index, -1 = none).
_Entry = tuple[str, int, str, int, int, int, float, str, int, int]


@dataclass
class Pending:
    """One commit's changes, computed by :meth:`LiveIndex.edit` and taken in by :meth:`LiveIndex.apply`."""

    segment: Segment
    rows: dict[str, IndexRow]
    errors: dict[str, str]
    gone: set[str]
    shards: list[ShardInfo]
    labels: list[str]
    n_clips: int
    n_errors: int


class LiveIndex:
    """The committed index as the writer needs it for its next commit (see the module docstring).

    ``merged`` is the committed index read when the writer opened (rows sorted by path, errors, shards);
    what commits change afterwards is kept beside it (which paths are indexed now: about 150 bytes a
    path), so no commit reads or rewrites the rows before it.  The set of indexed paths and the place of
    each stored content are built from ``merged`` the first time a commit needs them.  What needs the
    rows themselves after commits (:meth:`rows`, a content committed since open) is :attr:`stale`: the
    writer reads the index again, once.
    """

    def __init__(self, merged: Segment, label_names: Sequence[str], n_clips: int, n_errors: int) -> None:
        self.snapshot = merged
        self.shard_names: list[str] = merged.shards["name"].tolist()
        self.shard_frames: list[int] = [int(n) for n in merged.shards["n_frames"].tolist()]
        self.labels = list(label_names)
        self._label_id = {n: i for i, n in enumerate(self.labels)}
        self.n_clips, self.n_errors = n_clips, n_errors
        self.errors: dict[str, str] = dict(zip(merged.errors["path"].tolist(), merged.errors["reason"].tolist(),
                                               strict=True))
        self.changed: dict[str, bool] = {}  # paths committed since open: indexed now or not
        self._indexed: set[str] | None = None
        self._old_places: dict[str, int] | None = None  # content hash -> a row of the snapshot
        self.labels_used: set[str] = set()  # label names of rows committed since open
        labels = merged.rows["label"]
        self._label_rows = np.bincount(labels[labels >= 0], minlength=len(self.labels))

    # -- what is committed --------------------------------------------------------------------
    def indexed(self, path: str) -> bool:
        """Whether ``path`` is in the committed index."""
        now = self.changed.get(path)
        if now is not None:
            return now
        if self._indexed is None:
            self._indexed = set(self.snapshot.rows["path"].tolist())
        return path in self._indexed

    def place(self, content: str) -> _Place | None:
        """Where the frames of content hash ``content`` are, if a row read at open holds them."""
        rows = self.snapshot.rows
        i = self._first_rows().get(content)
        if i is None:
            return None
        return _Place(int(rows["shard"][i]), int(rows["offset"][i]), int(rows["n_frames"][i]),
                      float(rows["duration"][i]))

    def _first_rows(self) -> dict[str, int]:
        """Content hash -> the first row of the snapshot that holds it (built once)."""
        if self._old_places is None:
            hashes = self.snapshot.rows["hash"].tolist()
            self._old_places = dict(zip(reversed(hashes), range(len(hashes) - 1, -1, -1), strict=True))
        return self._old_places

    @property
    def stale(self) -> bool:
        """Whether commits changed the index since it was read (:meth:`rows` and :meth:`hashes` need it read
        again)."""
        return bool(self.changed)

    def hashes(self) -> set[str]:
        """Content hashes of the indexed rows read at open (their paths can be indexed without decoding)."""
        return set(self._first_rows())

    def rows(self) -> dict[str, IndexRow]:
        """``path -> IndexRow`` of every row read at open."""
        names, r = self.labels, self.snapshot.rows
        return {p: IndexRow(p, h, names[lab] if lab >= 0 else None, g, sz, mt) for p, h, lab, g, sz, mt in
                zip(*(r[c].tolist() for c in ("path", "hash", "label", "group", "size", "mtime_ns")), strict=True)}

    # -- labels ----------------------------------------------------------------------------
    def new_labels(self, names: Iterable[str | None]) -> list[str]:
        """The names among ``names`` the store has no id for yet, sorted (the order they take ids in)."""
        return sorted({n for n in names if n and n not in self._label_id})

    def holds(self, label: str) -> bool:
        """Whether a row holds ``label``: one committed before the writer opened, or since."""
        i = self._label_id.get(label, -1)
        return label in self.labels_used or 0 <= i < len(self._label_rows) and bool(self._label_rows[i])

    def keep_labels(self, before: LiveIndex) -> None:
        """Take over the labels ``before`` (this index read earlier) gave ids to, committed or not, and
        what it knows of their use."""
        self.labels = list(before.labels)
        self.labels_used |= before.labels_used
        self.reset_label_ids()

    def reset_label_ids(self) -> None:
        """Number the labels by their place in :attr:`labels` again (after labels were taken out)."""
        self._label_id = {n: i for i, n in enumerate(self.labels)}

    def add_labels(self, names: Iterable[str]) -> None:
        """Give ids to the labels of ``names`` new to the store: after the earlier ones, sorted by name."""
        for n in self.new_labels(names):
            self._label_id[n] = len(self.labels)
            self.labels.append(n)

    # -- one commit ------------------------------------------------------------------------
    def edit(self, shards: Sequence[ShardInfo], rows: Sequence[IndexRow], errors: Sequence[ErrorRow],
             clear: Iterable[str], remove: Iterable[str]) -> Pending:
        """The segment one commit appends, and the counts after it.  Nothing changes until :meth:`apply`.

        For each path the strongest of the commit's mentions decides: an error, then a removal, then a
        row (the last given), then a cleared error.  A row's content must be in ``shards`` or committed.
        """
        places: dict[str, _Place] = {}
        first = len(self.shard_names)
        for k, info in enumerate(shards):
            if info.name in self.shard_names or any(info.name == s.name for s in shards[:k]):
                raise StoreError(f"shard {info.name} is already committed")
            for c in info.clips:
                places.setdefault(c.hash, _Place(first + k, c.offset, c.n_frames, c.duration))
        gone = set(remove)
        failed = {e.path: " ".join(str(e.reason).split()) or "unreadable" for e in errors}
        for p in failed:
            check_text(p, "path")
        new_rows: dict[str, IndexRow] = {}
        for r in rows:
            check_text(r.path, "path")
            if r.hash not in places:
                found = self.place(r.hash)
                if found is None:
                    if self.stale:  # perhaps committed since open: the writer reads the index again and retries
                        raise Stale(r.hash)
                    raise StoreError(f"cannot index {r.path}: its content {r.hash[:12]} is in no shard")
                places[r.hash] = found
            new_rows[r.path] = r
        for p in failed:  # an error is recorded whatever else the commit says of its path
            new_rows.pop(p, None)
            gone.discard(p)
        for p in gone:
            new_rows.pop(p, None)
        gone |= {p for p in clear if p in self.errors and p not in failed and p not in new_rows}
        gone = {p for p in gone if self.indexed(p) or p in self.errors}
        labels = self.new_labels(r.label for r in new_rows.values())
        n_clips, n_errors = self.n_clips, self.n_errors
        for p in new_rows:
            n_clips += not self.indexed(p)
            n_errors -= p in self.errors
        for p in failed:
            n_clips -= self.indexed(p)
            n_errors += p not in self.errors
        for p in gone:
            n_clips -= self.indexed(p)
            n_errors -= p in self.errors
        ids = {**self._label_id, **{n: len(self.labels) + i for i, n in enumerate(labels)}}
        entries: list[_Entry] = []
        for p in sorted(new_rows):
            r = new_rows[p]
            at = places[r.hash]
            entries.append((p, ids[r.label] if r.label else -1, r.hash, at.shard, at.offset, at.n_frames,
                            at.duration, r.group or "", int(r.size), int(r.mtime_ns)))
        bad = sorted(failed)
        segment = Segment(
            rows={c: column([e[i] for e in entries], dt) for i, (c, dt) in enumerate(INDEX_COLUMNS.items())},
            shards={"name": column([s.name for s in shards], SHARD_COLUMNS["name"]),
                    "n_frames": column([s.n_frames for s in shards], SHARD_COLUMNS["n_frames"])},
            errors={"path": column(bad, ERROR_COLUMNS["path"]),
                    "reason": column([failed[p] for p in bad], ERROR_COLUMNS["reason"])},
            gone={"path": column(sorted(gone), GONE_COLUMNS["path"])},
        )
        return Pending(segment, new_rows, failed, gone, list(shards), labels, n_clips, n_errors)

    def apply(self, pending: Pending) -> None:
        """Take in a commit's changes once it is committed."""
        self.add_labels(pending.labels)
        for info in pending.shards:
            self.shard_names.append(info.name)
            self.shard_frames.append(info.n_frames)
        for p, r in pending.rows.items():
            self.changed[p] = True
            self.errors.pop(p, None)
            if r.label:
                self.labels_used.add(r.label)
        for p, reason in pending.errors.items():
            self.changed[p] = False
            self.errors[p] = reason
        for p in pending.gone:
            self.changed[p] = False
            self.errors.pop(p, None)
        self.n_clips, self.n_errors = pending.n_clips, pending.n_errors


def check_text(value: str, what: str) -> None:
    """A stored string must be valid Unicode (escape file names first: :func:`specstore.store.layout.escape_path`)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ConfigError(f"{what} {value!r} is not valid UTF-8; escape it with store.escape_path") from None
