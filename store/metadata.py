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
    LAYOUTS,
    LEGACY_CONTENT_HASH,
    SAFE_NAME,
    empty_commit,
)
from .location import Location
from .spec import FeatureSpec

__all__ = ["StoreMetadata", "Commit", "Corpus", "load_metadata", "open_root"]


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
class Commit:
    """One committed state: which index generation and which shards are visible.

    ``shard_frames[k]`` is shard ``k``'s frame count (what its own record
    says), so a reader checks every extent of the index against its shard's
    end without opening a shard; None for stores committed before commits
    recorded it (a reader then checks each shard when it opens it).
    """

    generation: int
    index: str | None
    shards: tuple[str, ...]
    label_names: tuple[str, ...]
    n_clips: int
    n_errors: int
    corpora: tuple[Corpus, ...] = ()
    shard_frames: tuple[int, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "generation": self.generation, "index": self.index, "shards": list(self.shards),
            "label_names": list(self.label_names), "n_clips": self.n_clips, "n_errors": self.n_errors,
            "corpora": [c.to_dict() for c in self.corpora],
        }
        if self.shard_frames is not None:
            doc["shard_frames"] = list(self.shard_frames)
        return doc

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Commit:
        frames = d.get("shard_frames")
        return cls(int(d["generation"]), d["index"], tuple(d["shards"]), tuple(d["label_names"]),
                   int(d["n_clips"]), int(d["n_errors"]),
                   tuple(Corpus(str(c["root"]), str(c["prefix"])) for c in d.get("corpora", [])),
                   None if frames is None else tuple(int(n) for n in frames))

    def check_names(self) -> None:
        """Refuse (``ValueError``) an index or shard name that is not the format's: no path leaves the store."""
        if self.index is not None and not (isinstance(self.index, str) and INDEX_NAME.fullmatch(self.index)):
            raise ValueError(f"commit.index {self.index!r} is not an index generation ({INDEX_GROUP}/gNNNNNN)")
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
        if version != FORMAT_VERSION:
            hint = (" (no chunk checksums, no writer lock): extract the corpus again into a new STORE path"
                    if isinstance(version, int) and version < FORMAT_VERSION else "")
            raise StoreCorrupt(f"{where} has store format version {version}; this specstore reads version "
                               f"{FORMAT_VERSION}{hint}")
        try:
            commit = Commit.from_dict(doc["commit"])
            commit.check_names()
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
        return replace(self, commit=commit)


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
