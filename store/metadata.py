"""The store's metadata document (the root group's ``specstore`` attribute), and loading it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import zarr

from .errors import StoreCorrupt, StoreError, StoreNotFound
from .layout import (
    ATTR_KEY,
    CONTENT_HASH,
    CONTENT_HASHES,
    FORMAT_NAME,
    FORMAT_VERSION,
    INDEX_GROUP,
    INDEX_NAME,
    LABEL_RULE,
    LAYOUTS,
    LEGACY_CONTENT_HASH,
    READABLE_VERSIONS,
    SAFE_NAME,
    SEGMENT_NAME,
    empty_commit,
)
from .location import Location
from .spec import FeatureSpec

__all__ = ["StoreMetadata", "Commit", "Corpus", "LabelNumbering", "load_metadata", "open_root"]


@dataclass(frozen=True)
class Corpus:
    """A corpus whose files the store indexes: its root folder and the prefix of its stored paths.

    The first corpus extracted into a store has the prefix ``""``; one added
    later (explicitly, ``--add-corpus``) stores its paths under its own
    prefix, ``"<name>/"``, so that they cannot collide.
    """

    root: str
    prefix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"root": self.root, "prefix": self.prefix}


@dataclass(frozen=True)
class LabelNumbering:
    """The rule that numbered a store's labels: labels ``since`` on follow ``rule``.

    :data:`~specstore.store.layout.LABEL_RULE`: each run (or commit) adds the labels new to the store after
    the earlier ones, sorted by name among themselves, so two extractions of one corpus number their
    classes alike whatever order their work finished in.  Labels before ``since`` were numbered as they
    were first committed (stores written before the rule; they keep their numbering).
    """

    rule: str = LABEL_RULE
    since: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "since": self.since}


@dataclass(frozen=True)
class Commit:
    """One committed state: which index segments (format 3) or index generation (format 2) and which shards.

    Format 3 (what this specstore writes): ``segments`` are the index's segment groups, oldest first, with
    ``segment_sizes`` (entries each: rows, errors, removed paths and shards; what compaction weighs) and
    ``history`` (the segment groups of the commits before, kept for readers still opening them).  The
    shard list is the concatenation of the segments' shard tables, so the root document stays small at
    any store size; ``shards`` and ``shard_frames`` are filled in when the segments are read
    (:meth:`with_shards`), and ``n_shards`` says how many there must be.

    Format 2: ``index`` is the one index group, ``shards`` and ``shard_frames`` are in the document
    (``shard_frames`` None for stores committed before it was recorded: a reader then checks each shard
    when it opens it).
    """

    generation: int
    index: str | None
    shards: tuple[str, ...]
    label_names: tuple[str, ...]
    n_clips: int
    n_errors: int
    corpora: tuple[Corpus, ...] = ()
    shard_frames: tuple[int, ...] | None = None
    segments: tuple[str, ...] | None = None
    segment_sizes: tuple[int, ...] = ()
    history: tuple[tuple[str, ...], ...] = ()
    n_shards: int = 0
    label_numbering: LabelNumbering | None = None

    @property
    def segmented(self) -> bool:
        """Whether this commit is format 3's (index segments), not format 2's (one index group)."""
        return self.segments is not None

    def with_shards(self, shards: tuple[str, ...], frames: tuple[int, ...]) -> Commit:
        """This commit with the shard list read from its segments."""
        return replace(self, shards=shards, shard_frames=frames)

    def to_dict(self) -> dict[str, Any]:
        """The format-3 document (a writer always writes format 3)."""
        if self.segments is None:
            raise StoreError("a format-2 commit is not written again; a writer upgrades the store first")
        return {
            "generation": self.generation, "segments": list(self.segments),
            "segment_sizes": list(self.segment_sizes), "history": [list(h) for h in self.history],
            "n_shards": self.n_shards, "label_names": list(self.label_names),
            "label_numbering": (self.label_numbering or LabelNumbering()).to_dict(),
            "n_clips": self.n_clips, "n_errors": self.n_errors, "corpora": [c.to_dict() for c in self.corpora],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Commit:
        corpora = tuple(Corpus(str(c["root"]), str(c["prefix"])) for c in d.get("corpora", []))
        if "segments" in d:
            numbering = d.get("label_numbering") or {}
            return cls(int(d["generation"]), None, (), tuple(d["label_names"]), int(d["n_clips"]),
                       int(d["n_errors"]), corpora, None, tuple(d["segments"]),
                       tuple(int(n) for n in d["segment_sizes"]), tuple(tuple(h) for h in d.get("history", [])),
                       int(d["n_shards"]),
                       LabelNumbering(str(numbering.get("rule", LABEL_RULE)), int(numbering.get("since", 0))))
        frames = d.get("shard_frames")
        return cls(int(d["generation"]), d["index"], tuple(d["shards"]), tuple(d["label_names"]),
                   int(d["n_clips"]), int(d["n_errors"]), corpora,
                   None if frames is None else tuple(int(n) for n in frames))

    def check_names(self) -> None:
        """Refuse (``ValueError``) an index, segment or shard name that is not the format's: no path leaves the
        store."""
        if self.index is not None and not (isinstance(self.index, str) and INDEX_NAME.fullmatch(self.index)):
            raise ValueError(f"commit.index {self.index!r} is not an index generation ({INDEX_GROUP}/gNNNNNN)")
        if self.segments is not None:
            named = [*self.segments, *(g for h in self.history for g in h)]
            bad = [g for g in named if not (isinstance(g, str) and (SEGMENT_NAME.fullmatch(g)
                                                                     or INDEX_NAME.fullmatch(g)))]
            if bad or not all(isinstance(g, str) and SEGMENT_NAME.fullmatch(g) for g in self.segments):
                first = bad[0] if bad else next(g for g in self.segments if not SEGMENT_NAME.fullmatch(g))
                raise ValueError(f"commit.segments names {first!r}, which is not an index segment "
                                 f"({INDEX_GROUP}/sNNNNNN)")
            if len(set(self.segments)) != len(self.segments) or len(self.segment_sizes) != len(self.segments):
                raise ValueError("commit.segments names a segment twice, or segment_sizes does not match it")
            if self.n_shards < 0 or any(n < 0 for n in self.segment_sizes):
                raise ValueError("commit.n_shards or a segment size is negative")
        self.check_shards()

    def check_shards(self) -> None:
        """Refuse (``ValueError``) a shard list with a name that is not the format's, a name twice, or counts
        that do not match it."""
        for name in self.shards:
            if not (isinstance(name, str) and SAFE_NAME.fullmatch(name)):
                raise ValueError(f"commit.shards holds {name!r}, which is not a shard name")
        if len(set(self.shards)) != len(self.shards):
            raise ValueError("commit.shards names a shard twice")
        if self.shard_frames is not None and (len(self.shard_frames) != len(self.shards)
                                              or any(n < 0 for n in self.shard_frames)):
            raise ValueError(f"commit.shard_frames has {len(self.shard_frames)} counts (some negative?) "
                             f"for {len(self.shards)} shards")


@dataclass(frozen=True)
class StoreMetadata:
    """Everything in the root attributes: format, layout, feature specs, the current commit, and the content
    hash its clips are keyed on (``content_hash``: new stores :data:`~specstore.store.layout.CONTENT_HASH`; a store
    that records none is :data:`~specstore.store.layout.LEGACY_CONTENT_HASH`, and keeps it as it grows)."""

    layout: str
    features: dict[str, FeatureSpec]
    default_feature: str
    commit: Commit = field(default_factory=lambda: Commit.from_dict(empty_commit()))
    format_version: int = FORMAT_VERSION
    content_hash: str = CONTENT_HASH

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise StoreError(f"unknown store layout {self.layout!r}; choose from {', '.join(LAYOUTS)}")
        if self.content_hash not in CONTENT_HASHES:
            raise StoreError(f"unknown content hash {self.content_hash!r}; this specstore knows "
                             f"{', '.join(CONTENT_HASHES)}")
        if not self.features:
            raise StoreError("a store needs at least one feature")
        if self.default_feature not in self.features:
            raise StoreError(f"default feature {self.default_feature!r} is not one of {sorted(self.features)}")
        bad = [k for k in self.features if not (isinstance(k, str) and SAFE_NAME.fullmatch(k))]
        if bad:
            raise StoreError(f"feature name {bad[0]!r} is not one path segment of letters, digits, '_', '-', '.'")
        rates = {(s.sample_rate, s.hop_length) for s in self.features.values()}
        if len(rates) != 1:
            raise StoreError("all features of a store must share sample_rate and hop_length (one frame grid)")

    @property
    def frame_seconds(self) -> float:
        """Seconds per frame (shared by every feature)."""
        return self.features[self.default_feature].frame_seconds

    def to_attrs(self) -> dict[str, Any]:
        """The JSON document stored under ``attributes["specstore"]``."""
        return {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "layout": self.layout,
            "content_hash": self.content_hash,
            "default_feature": self.default_feature,
            "features": {k: v.to_dict() for k, v in self.features.items()},
            "commit": self.commit.to_dict(),
        }

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], where: str) -> StoreMetadata:
        """Parse and check the root attributes; a one-line error when they are not a store's."""
        doc = attrs.get(ATTR_KEY)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise StoreCorrupt(f"{where} is a zarr group but not a specstore store (no '{ATTR_KEY}' attributes)")
        version = doc.get("format_version")
        if version not in READABLE_VERSIONS:
            hint = (" (no chunk checksums, no writer lock): extract the corpus again into a new STORE path"
                    if isinstance(version, int) and version < min(READABLE_VERSIONS) else
                    ": a newer specstore wrote it; upgrade specstore" if isinstance(version, int) else "")
            raise StoreCorrupt(f"{where} has store format version {version}; this specstore reads versions "
                               f"{', '.join(map(str, READABLE_VERSIONS))}{hint}")
        try:
            commit = Commit.from_dict(doc["commit"])
            commit.check_names()
            if commit.segmented != (version >= 3):
                raise ValueError(f"a format-{version} store's commit must "
                                 f"{'name index segments' if version >= 3 else 'name one index group'}")
            return cls(
                layout=doc["layout"],
                features={k: FeatureSpec.from_dict(v) for k, v in doc["features"].items()},
                default_feature=doc["default_feature"],
                commit=commit,
                format_version=version,
                content_hash=doc.get("content_hash", LEGACY_CONTENT_HASH),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise StoreCorrupt(f"{where} has unreadable store metadata: {e}") from None
        except StoreError as e:
            raise StoreCorrupt(f"{where} has unreadable store metadata: {e}") from None

    def with_commit(self, commit: Commit) -> StoreMetadata:
        """This metadata with ``commit``; a format-3 commit makes it a format-3 document."""
        return replace(self, commit=commit, format_version=FORMAT_VERSION if commit.segmented else self.format_version)


def load_metadata(loc: Location) -> StoreMetadata:
    """Read and check the root document: :class:`StoreNotFound` if there is none, else :class:`StoreCorrupt`
    for anything unreadable ("corrupt store metadata")."""
    raw = loc.get("zarr.json")
    if raw is None:
        raise StoreNotFound(f"no store at {loc}")
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise StoreCorrupt(f"corrupt store metadata: {loc}/zarr.json is not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("node_type") != "group" or not isinstance(doc.get("attributes", {}), dict):
        raise StoreCorrupt(f"corrupt store metadata: {loc}/zarr.json is not a zarr v3 group document")
    return StoreMetadata.from_attrs(doc.get("attributes", {}), str(loc))


def open_root(loc: Location, mode: Literal["r", "r+", "a", "w", "w-"]) -> tuple[zarr.Group, StoreMetadata]:
    """The root group (``mode`` as for :func:`zarr.open_group`) and its checked metadata."""
    meta = load_metadata(loc)
    try:
        root = loc.open_group(mode)
    except (zarr.errors.GroupNotFoundError, FileNotFoundError, ValueError, KeyError) as e:
        raise StoreCorrupt(f"corrupt store metadata at {loc}: {e}".splitlines()[0]) from None
    return root, meta
