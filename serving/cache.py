"""A folder of decoded clips keyed by content hash, for ``specstore classify --cache DIR``.

Classifying the same files again (another model with the same feature
settings, another ``--topk``) skips decoding: a clip is stored as
``<content hash>-<specs key>.npz`` (``features`` float32, ``duration`` in
seconds), written atomically and read with ``allow_pickle=False``.  The
specs key is a digest of the FeatureSpecs in order, so a checkpoint with
other feature settings never reads another's values.  A damaged entry is
ignored (and rewritten), never trusted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from store import FeatureSpec, atomic_path

from .clips import DecodedClip

__all__ = ["ClipCache", "specs_key"]

log = logging.getLogger(__name__)


def specs_key(specs: Mapping[str, FeatureSpec]) -> str:
    """A short digest of the specs, in order (names included)."""
    text = json.dumps([[name, s.to_dict()] for name, s in specs.items()], sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class ClipCache:
    """Decoded clips in ``folder`` for one set of ``specs``; see the module docstring."""

    def __init__(self, folder: str | os.PathLike[str], specs: Mapping[str, FeatureSpec]) -> None:
        self.folder = Path(folder)
        self.key = specs_key(specs)
        self.hits = 0

    def _path(self, digest: str) -> Path:
        return self.folder / f"{digest}-{self.key}.npz"

    def get(self, digest: str) -> DecodedClip | None:
        """The cached clip of content ``digest``, or None."""
        p = self._path(digest)
        if not p.is_file():
            return None
        try:
            with np.load(p, allow_pickle=False) as z:
                clip = DecodedClip(np.asarray(z["features"], dtype=np.float32), float(z["duration"]), digest)
        except (OSError, ValueError, KeyError) as e:
            log.warning("ignoring a damaged cache entry %s: %s", p.name, e)
            return None
        self.hits += 1
        return clip

    def put(self, clip: DecodedClip) -> None:
        """Store ``clip`` (atomically: a reader never sees half a file)."""
        with atomic_path(self._path(clip.hash)) as tmp, open(tmp, "wb") as f:
            np.savez(f, features=clip.features, duration=np.float64(clip.duration))
