"""The train/validation split: a pure function of each clip's content hash.

A clip is held out when ``blake2b("<seed>:<content hash>")`` read as a
64-bit big-endian integer, divided by ``2**64``, falls below
``val_fraction``.  Consequences:

* duplicates (the same content under several paths) always land on the same
  side, so a copy of a validation clip can never leak into training;
* the split does not depend on row order, on which other clips a store holds
  or on the machine, so a checkpoint records only ``(val_fraction, seed)``
  (:meth:`SplitRule.to_dict`) and :func:`infer.evaluate.evaluate` can rebuild
  the held-out set from any store later;
* adding clips to a store never moves an existing clip across the split.

The split is not stratified: each class's held-out share is ``val_fraction``
in expectation (binomial spread), which is what a content-addressed rule can
promise.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["RULE", "SPLITS", "SplitError", "SplitRule", "split_score", "split_scores"]

RULE = "blake2b-64(seed:hash) / 2**64 < val_fraction"
"""The rule, spelled out in checkpoints so that a reader without this package can redo it."""

SPLITS = ("all", "train", "val")


class SplitError(ValueError):
    """Bad split parameters, or a split asked of a checkpoint that recorded none."""


def split_score(content_hash: str, seed: int = 0) -> float:
    """Uniform number in ``[0, 1)`` for one content hash (see the module docstring)."""
    digest = hashlib.blake2b(f"{int(seed)}:{content_hash}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def split_scores(hashes: Sequence[str], seed: int = 0) -> np.ndarray:
    """:func:`split_score` of every hash, as a float64 array."""
    return np.fromiter((split_score(h, seed) for h in hashes), dtype=np.float64, count=len(hashes))


@dataclass(frozen=True)
class SplitRule:
    """Which contents are held out: ``split_score(hash, seed) < val_fraction``."""

    val_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.val_fraction < 1.0:
            raise SplitError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}")

    def is_val(self, hashes: Sequence[str]) -> np.ndarray:
        """Boolean mask: True where the content is held out for validation."""
        if self.val_fraction == 0.0:
            return np.zeros(len(hashes), dtype=bool)
        return split_scores(hashes, self.seed) < self.val_fraction

    def select(self, hashes: Sequence[str], split: str) -> np.ndarray:
        """Row ids (int64) of ``split`` (``all``, ``train`` or ``val``) among ``hashes``."""
        if split not in SPLITS:
            raise SplitError(f"split must be one of {', '.join(SPLITS)}, not {split!r}")
        if split == "all":
            return np.arange(len(hashes), dtype=np.int64)
        val = self.is_val(hashes)
        return np.flatnonzero(val if split == "val" else ~val).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        """What a checkpoint records (JSON-ready)."""
        return {"rule": RULE, "val_fraction": float(self.val_fraction), "seed": int(self.seed)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SplitRule:
        """Inverse of :meth:`to_dict`; refuses a rule this version does not implement."""
        if data.get("rule", RULE) != RULE:
            raise SplitError(f"unknown split rule {data.get('rule')!r}; this specstore implements {RULE!r}")
        try:
            return cls(val_fraction=float(data["val_fraction"]), seed=int(data["seed"]))
        except (KeyError, TypeError, ValueError) as e:
            raise SplitError(f"unreadable split record {data!r}: {e}") from None
