"""The train/validation split: a pure function of each clip's split key (its group, else its content hash).

A clip is held out when ``blake2b("<seed>:<key>")`` read as a 64-bit
big-endian integer, divided by ``2**64``, falls below ``val_fraction``.  The
key is the clip's group when the store records one (a manifest's ``group``
column: the musical work, so movements of one work stay together), else its
content hash (:func:`split_keys`).  Consequences:

* duplicates (the same content under several paths) always land on the same
  side, so a copy of a validation clip can never leak into training; with
  groups, every clip of a group lands on the same side;
* the split does not depend on row order, on which other clips a store holds
  or on the machine, so a checkpoint records only ``(val_fraction, seed)``
  (:meth:`SplitRule.to_dict`) and :func:`specstore.infer.evaluation.evaluate.evaluate` can rebuild
  the held-out set from any store later;
* adding clips to a store never moves an existing clip across the split.

The split is not stratified: each class's held-out share is ``val_fraction``
in expectation (binomial spread), which is what a content-addressed rule can
promise.

Without groups, only identical files are kept together: the stems of one
song, excerpts of one recording or movements of one work are different
contents and land on both sides, so held-out figures on a small corpus can
be near-perfect and mean nothing.  :func:`ungrouped_split_warning` says so
when a store with no groups and fewer than :data:`MIN_CLIPS_UNGROUPED`
clips in its smallest class is split (``make train`` with a validation
share, ``make cv``, ``make eval`` of the validation split); groups come
from a manifest's ``group`` column or ``specstore-features --group-by``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specstore.infer.errors import SplitError
from specstore.store import Store

__all__ = [
    "MIN_CLIPS_UNGROUPED", "RULE", "RULE_OFFSET", "SPLITS", "SplitError", "SplitRule", "split_keys", "split_score",
    "split_scores", "training_fingerprint", "training_rows", "ungrouped_split_warning",
]

RULE = "blake2b-64(seed:key) / 2**64 < val_fraction; key = the clip's group, else its content hash"
"""The rule, spelled out in checkpoints so that a reader without this package can redo it."""
RULE_OFFSET = ("val_offset <= blake2b-64(seed:key) / 2**64 < val_offset + val_fraction; key = the clip's group, "
               "else its content hash")
"""The same rule with the held-out interval moved to ``val_offset`` (cross-validation folds); a checkpoint
spells it only when the offset is not 0, so earlier checkpoints and readers keep :data:`RULE`."""
_LEGACY_RULES = ("blake2b-64(seed:hash) / 2**64 < val_fraction",)
"""Earlier spellings of the same rule (stores without groups: the key is the content hash)."""

SPLITS = ("all", "train", "val")
MIN_CLIPS_UNGROUPED = 30
"""Below this many clips in its smallest class, a split of a store without groups is warned about
(:func:`ungrouped_split_warning`): one near-duplicate pair across the split then moves a class's figure by
several points."""


def split_keys(store: Store) -> list[str]:
    """Each row's split key: its group (a manifest's ``group`` column) when set, else its content hash."""
    groups = getattr(store, "groups", None)
    if groups is None:
        return list(store.hashes)
    return [g or h for g, h in zip(groups, store.hashes, strict=True)]


def ungrouped_split_warning(store: Store) -> str | None:
    """One line for a split of ``specstore.store`` by content hash alone on a small corpus, else None.

    Said when no labelled clip of ``specstore.store`` has a group and its smallest
    class (of the labelled clips, duplicates counted per path) has fewer
    than :data:`MIN_CLIPS_UNGROUPED` clips.
    """
    labels = np.asarray(store.labels)
    labelled = np.flatnonzero(labels >= 0)
    groups = getattr(store, "groups", None)
    if not len(labelled) or (groups is not None and any(groups[int(r)] for r in labelled)):
        return None
    counts = np.bincount(labels[labelled].astype(np.int64))
    present = np.flatnonzero(counts)
    smallest = int(present[np.argmin(counts[present])])
    if counts[smallest] >= MIN_CLIPS_UNGROUPED:
        return None
    return (f"the train/validation split of {store.location} is by content hash (it records no groups) and its "
            f"smallest class, {store.label_names[smallest]!r}, has {int(counts[smallest])} clips (under "
            f"{MIN_CLIPS_UNGROUPED}): near-duplicates (stems or excerpts of one song, movements of one work) can "
            "land on both sides and make held-out figures optimistic; give the store groups: rerun `make features` "
            "with GROUP_BY=parent (--group-by parent) or a regular expression over the path (nothing is decoded "
            "again), or use a manifest's group column")


def split_score(key: str, seed: int = 0) -> float:
    """Uniform number in ``[0, 1)`` for one split key (see the module docstring)."""
    digest = hashlib.blake2b(f"{int(seed)}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def split_scores(keys: Sequence[str], seed: int = 0) -> np.ndarray:
    """:func:`split_score` of every key, as a float64 array."""
    return np.fromiter((split_score(k, seed) for k in keys), dtype=np.float64, count=len(keys))


@dataclass(frozen=True)
class SplitRule:
    """Which clips are held out: ``val_offset <= split_score(key, seed) < val_offset + val_fraction``.

    Keys: :func:`split_keys`.  ``val_offset`` is 0 for a training run's
    validation split; fold ``k`` of a ``K``-fold cross-validation holds out
    ``[k / K, (k + 1) / K)`` (:meth:`fold`), so the folds partition the keys.
    """

    val_fraction: float = 0.2
    seed: int = 0
    val_offset: float = 0.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise SplitError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}")
        if not 0.0 <= self.val_offset < 1.0 or self.val_offset + self.val_fraction > 1.0 + 1e-12:
            raise SplitError(f"val_offset must be in [0, 1 - val_fraction], got {self.val_offset!r}")

    @classmethod
    def fold(cls, k: int, folds: int, seed: int = 0) -> SplitRule:
        """Fold ``k`` (0-based) of ``folds``: the keys whose score lies in ``[k / folds, (k + 1) / folds)``."""
        if not isinstance(folds, int) or folds < 2 or not 0 <= k < folds:
            raise SplitError(f"a fold needs 0 <= k < folds and folds >= 2, got k={k!r}, folds={folds!r}")
        return cls(val_fraction=1.0 / folds, seed=seed, val_offset=k / folds)

    def is_val(self, keys: Sequence[str]) -> np.ndarray:
        """Boolean mask: True where the key is held out for validation."""
        if self.val_fraction == 0.0:
            return np.zeros(len(keys), dtype=bool)
        scores = split_scores(keys, self.seed)
        if self.val_offset == 0.0:
            return scores < self.val_fraction
        return (scores >= self.val_offset) & (scores < self.val_offset + self.val_fraction)

    def select(self, keys: Sequence[str], split: str) -> np.ndarray:
        """Row ids (int64) of ``split`` (``all``, ``train`` or ``val``) among ``keys``."""
        if split not in SPLITS:
            raise SplitError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        if split == "all":
            return np.arange(len(keys), dtype=np.int64)
        val = self.is_val(keys)
        return np.flatnonzero(val if split == "val" else ~val).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint records (JSON-ready); ``val_offset`` only when it is not 0."""
        if self.val_offset:
            return {"rule": RULE_OFFSET, "val_fraction": float(self.val_fraction), "seed": int(self.seed),
                    "val_offset": float(self.val_offset)}
        return {"rule": RULE, "val_fraction": float(self.val_fraction), "seed": int(self.seed)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SplitRule:
        """Inverse of :meth:`to_dict`; refuses a rule this version does not implement."""
        if data.get("rule", RULE) not in (RULE, RULE_OFFSET, *_LEGACY_RULES):
            raise SplitError(f"unknown split rule {data.get('rule')!r}; this specstore implements {RULE!r}")
        try:
            return cls(val_fraction=float(data["val_fraction"]), seed=int(data["seed"]),
                       val_offset=float(data.get("val_offset", 0.0)))
        except (KeyError, TypeError, ValueError) as e:
            raise SplitError(f"unreadable split record {data!r}: {e}") from None


def training_rows(store: Store, rule: SplitRule) -> tuple[np.ndarray, np.ndarray]:
    """``(train rows, val rows)`` of the labelled rows of ``specstore.store`` under ``rule``.

    Training rows keep one row per distinct ``(content, label)`` (a duplicate
    file is not trained on twice); validation keeps every labelled row (the
    prediction loop runs each content once and counts every path, like
    ``make eval``).  Raises :class:`SplitError` for a store without labels.
    """
    labelled = np.flatnonzero(store.labels >= 0)
    if not len(labelled):
        raise SplitError(f"{store.location} has no labelled clips ({len(store)} unlabelled); training needs "
                         "labels: a folder-per-label corpus or a path,label CSV")
    keys = split_keys(store)
    val = rule.is_val([keys[int(i)] for i in labelled])
    seen: set[tuple[str, int]] = set()
    train: list[int] = []
    for row, is_val in zip(labelled.tolist(), val.tolist(), strict=True):
        key = (store.hashes[row], int(store.labels[row]))
        if not is_val and key not in seen:
            seen.add(key)
            train.append(row)
    return np.array(train, dtype=np.int64), labelled[val]


def training_fingerprint(store: Store, rule: SplitRule, feature: str) -> str:
    """Digest of the training data's identity under ``rule``: (content, label name) pairs of each split,
    the label names and the feature spec.  Equal digests mean a model saw the same data."""
    train_rows, val_rows = training_rows(store, rule)
    h = hashlib.blake2b(digest_size=16)
    specs = [sorted(store.specs[part].to_dict().items()) for part in feature.split("+")]
    h.update(repr((store.label_names, feature, specs if "+" in feature else specs[0])).encode())
    for tag, rows in (("train", train_rows), ("val", val_rows)):
        h.update(tag.encode())
        for key in sorted((store.hashes[int(r)], store.label_names[int(store.labels[r])]) for r in rows):
            h.update(f"{key[0]}\x00{key[1]}\x01".encode())
    return h.hexdigest()
