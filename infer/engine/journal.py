"""The journal of a cluster inference run: the units whose logits are committed, in a folder beside the output.

Only the driver writes it (:mod:`specstore.infer.engine.distributed`); workers write nothing.  The folder
(``<out>.journal/``) holds:

* ``run.json``: the run key, what makes two runs' logits interchangeable: the store (its location and
  generation), the model file's sha256, the feature and the options that change the numbers (device
  kind, precision).  A journal of another run key is refused in one line naming what changed
  (``restart`` discards it instead);
* ``part-NNNNNN.npz``: the units committed at one commit, each part written to a temporary name and
  renamed (atomic: a part is whole or absent), numpy arrays only (no pickle): ``units`` (keys),
  ``counts`` (clips per unit), ``hashes`` (their contents in order) and ``logits`` (float32, one row per
  content).

Committing appends a part (the cost of a commit is the units since the last one, not the whole run), so
the driver commits every few seconds.  A unit already committed (a duplicate result) is dropped and
counted.  The folder is removed once the CSV is written.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specstore.infer.errors import PredictionsError

__all__ = ["FORMAT", "Journal"]

log = logging.getLogger(__name__)

FORMAT = 1
"""The journal's own format number (part of the run key)."""

_RUN = "run.json"


def _changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """What differs between two run keys, in words: ``model sha256 1a2b3c4d5e6f -> 6f5e4d3c2b1a; ...``."""
    def shown(value: Any) -> str:
        text = str(value)
        return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text

    parts = [f"{k} {shown(old.get(k, 'none'))} -> {shown(new.get(k, 'none'))}"
             for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    return "; ".join(parts)


def _write_atomic(path: Path, write: Any) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, flush it to disk, then rename it to ``path``."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class Journal:
    """The committed units of one run (see the module docstring), read back by :meth:`open`.

    ``done``: unit key -> (content hashes, logits); ``dropped``: results for units already committed (or
    pending commit) that were dropped; ``commits``: parts written by this process.  ``folder`` None: a journal
    in memory only (an output written straight through a FIFO or ``/dev/stdout`` has no folder beside it, so
    such a run does not resume).
    """

    def __init__(self, folder: Path | None, run_key: Mapping[str, Any]) -> None:
        self.folder, self.run_key = folder, dict(run_key)
        self.done: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
        self.pending: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}
        self.dropped = 0
        self.commits = 0
        self._seq = 0

    @classmethod
    def open(cls, folder: str | os.PathLike[str], run_key: Mapping[str, Any], *, restart: bool = False) -> Journal:
        """The journal in ``folder`` for ``run_key``: the units it holds, or a new one (created now).

        A journal of another run key is refused (:class:`PredictionsError`, one line naming what changed),
        or discarded when ``restart``.  A part that cannot be read (damaged by hand) is skipped, logged: its
        units are computed again.
        """
        journal = cls(Path(folder), {"format": FORMAT, **run_key})
        assert journal.folder is not None
        path = journal.folder / _RUN
        if journal.folder.exists():
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                old = None
            if old != journal.run_key:
                if not restart:
                    what = _changed(old, journal.run_key) if isinstance(old, dict) else "no readable run.json"
                    raise PredictionsError(f"{journal.folder} is the journal of another run ({what}); rerun with "
                                           "--restart to discard it, or write the output elsewhere")
                log.warning("discarding the journal %s of another run (--restart)", journal.folder)
                shutil.rmtree(journal.folder)
        if journal.folder.exists():
            journal._load()
        else:
            journal.folder.mkdir(parents=True)
            _write_atomic(path, lambda f: f.write(json.dumps(journal.run_key, sort_keys=True).encode("utf-8")))
        return journal

    def _load(self) -> None:
        assert self.folder is not None
        for part in sorted(self.folder.glob("part-*.npz")):
            try:
                with np.load(part, allow_pickle=False) as z:
                    units, counts, hashes, logits = z["units"], z["counts"], z["hashes"], z["logits"]
            except (OSError, ValueError, KeyError, zipfile.BadZipFile) as e:
                log.warning("skipping the unreadable journal part %s (%s); its units are computed again", part, e)
                continue
            start = 0
            for key, n in zip(units.tolist(), counts.tolist(), strict=True):
                self.done.setdefault(str(key), (tuple(map(str, hashes[start:start + n].tolist())),
                                                logits[start:start + n]))
                start += n
            self._seq = max(self._seq, int(part.stem.split("-")[1]) + 1)

    def has(self, key: str) -> bool:
        """Whether unit ``key`` is committed or pending commit."""
        return key in self.done or key in self.pending

    def add(self, key: str, hashes: Sequence[str], logits: np.ndarray) -> bool:
        """Take one unit's result for the next commit; False (dropped and counted) when the unit has one already."""
        if self.has(key):
            self.dropped += 1
            log.info("a second result for unit %s was dropped (the unit is committed once)", key)
            return False
        self.pending[key] = (tuple(hashes), np.asarray(logits, dtype=np.float32))
        return True

    def commit(self) -> int:
        """Write the pending units as one part (atomically); how many were committed."""
        if not self.pending:
            return 0
        items = list(self.pending.items())
        width = max(v[1].shape[1] if v[1].ndim == 2 else 0 for _, v in items)
        units = np.array([k for k, _ in items])
        counts = np.array([len(h) for _, (h, _) in items], dtype=np.int64)
        hashes = np.array([h for _, (hs, _) in items for h in hs])
        logits = np.concatenate([v.reshape(len(h), width) for _, (h, v) in items]).astype(np.float32)
        if self.folder is not None:
            _write_atomic(self.folder / f"part-{self._seq:06d}.npz",
                          lambda f: np.savez(f, units=units, counts=counts, hashes=hashes, logits=logits))
            self._seq += 1
            self.commits += 1
        self.done.update(self.pending)
        self.pending.clear()
        return len(items)

    def logits_by_content(self) -> dict[str, np.ndarray]:
        """Every committed content's logits (one row each), by content hash."""
        out: dict[str, np.ndarray] = {}
        for hashes, logits in self.done.values():
            for i, h in enumerate(hashes):
                out.setdefault(h, logits[i])
        return out

    def remove(self) -> None:
        """Delete the journal (the CSV is written: nothing is left to resume)."""
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
