"""The store's metadata document (the root group's ``specstore`` attribute)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .errors import StoreCorrupt, StoreError
from .layout import ATTR_KEY, FORMAT_NAME, FORMAT_VERSION, LAYOUTS, empty_commit
from .spec import FeatureSpec

__all__ = ["StoreMetadata", "Commit"]


@dataclass(frozen=True)
class Commit:
    """One committed state: which index generation and which shards are visible."""

    generation: int
    index: str | None
    shards: tuple[str, ...]
    label_names: tuple[str, ...]
    n_clips: int
    n_errors: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "generation": self.generation, "index": self.index, "shards": list(self.shards),
            "label_names": list(self.label_names), "n_clips": self.n_clips, "n_errors": self.n_errors,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Commit":
        return cls(int(d["generation"]), d["index"], tuple(d["shards"]), tuple(d["label_names"]),
                   int(d["n_clips"]), int(d["n_errors"]))


@dataclass(frozen=True)
class StoreMetadata:
    """Everything in the root attributes: format, layout, feature specs, the current commit."""

    layout: str
    features: dict[str, FeatureSpec]
    default_feature: str
    commit: Commit = field(default_factory=lambda: Commit.from_dict(empty_commit()))
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise StoreError(f"unknown store layout {self.layout!r}; choose from {', '.join(LAYOUTS)}")
        if not self.features:
            raise StoreError("a store needs at least one feature")
        if self.default_feature not in self.features:
            raise StoreError(f"default feature {self.default_feature!r} is not one of {sorted(self.features)}")
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
            "default_feature": self.default_feature,
            "features": {k: v.to_dict() for k, v in self.features.items()},
            "commit": self.commit.to_dict(),
        }

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any], where: str) -> "StoreMetadata":
        """Parse and check the root attributes; a one-line error when they are not a store's."""
        doc = attrs.get(ATTR_KEY)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
            raise StoreCorrupt(f"{where} is a zarr group but not a specstore store (no '{ATTR_KEY}' attributes)")
        version = doc.get("format_version")
        if version != FORMAT_VERSION:
            raise StoreCorrupt(f"{where} has store format version {version}; this specstore reads version {FORMAT_VERSION}")
        try:
            return cls(
                layout=doc["layout"],
                features={k: FeatureSpec.from_dict(v) for k, v in doc["features"].items()},
                default_feature=doc["default_feature"],
                commit=Commit.from_dict(doc["commit"]),
                format_version=version,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise StoreCorrupt(f"{where} has unreadable store metadata: {e}") from None

    def with_commit(self, commit: Commit) -> "StoreMetadata":
        return StoreMetadata(self.layout, self.features, self.default_feature, commit, self.format_version)
