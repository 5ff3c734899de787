"""The resume file: everything an interrupted training run needs to continue after its last finished epoch.

``<model>.resume.pt`` (next to the checkpoint) is a ``torch.save`` file of
plain containers and tensors, read with ``torch.load(weights_only=True)``:
the configuration and its resume key, a fingerprint of the training data,
the model's :class:`~specstore.infer.models.contract.ModelSpec`, model / optimiser / grad-scaler states, the epoch, the
history and the best score so far (and the weight average, with ``ema``), and ``world_size``: the processes that
trained it (``make train NPROC=N``; 1 in files written before it was recorded).  The file is written only after an
epoch ends (by rank 0 in a distributed run), so every resume starts at an epoch boundary, the one place where the
number of processes may change: a run resumed with another ``NPROC`` continues with that many ranks from there.
It holds no random-number state because none is needed: every random draw of an epoch (batches, crops, masks,
dropout) is seeded from ``(seed, epoch)``, so a resumed run follows the
uninterrupted run's path exactly.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specstore.infer.errors import CheckpointError
from specstore.infer.models.checkpoint import read_torch_file, save_torch_file

__all__ = ["RESUME_FORMAT", "RESUME_VERSION", "ResumeState", "load_resume", "resume_path_for", "save_resume"]

log = logging.getLogger(__name__)

RESUME_FORMAT = "specstore-resume"
RESUME_VERSION = 3


def resume_path_for(model_path: str | os.PathLike[str]) -> Path:
    """``models/genre.pt`` -> ``models/genre.resume.pt``."""
    p = Path(model_path)
    return p.with_name(p.stem + ".resume.pt") if p.suffix else p.with_name(p.name + ".resume.pt")


@dataclass
class ResumeState:
    """What :func:`save_resume` writes and :func:`load_resume` gives back."""

    config: dict[str, Any]
    config_key: dict[str, Any]
    data: str
    model_spec: dict[str, Any]
    epoch: int
    complete: bool
    model: dict[str, Any]
    optimizer: dict[str, Any]
    scaler: dict[str, Any]
    history: list[dict[str, Any]]
    best_epoch: int
    best_score: list[float] | None
    averaged: dict[str, Any] | None = None
    world_size: int = 1


def save_resume(state: ResumeState, path: str | os.PathLike[str]) -> Path:
    """Write ``state`` atomically."""
    payload = {"format": RESUME_FORMAT, "version": RESUME_VERSION, **vars(state)}
    return save_torch_file(payload, path)


def load_resume(path: str | os.PathLike[str]) -> ResumeState | None:
    """The state in ``path``, or None when there is none or it cannot be used (logged: the run starts afresh)."""
    p = Path(path)
    if not p.is_file():
        return None
    try:
        raw = read_torch_file(p, "resume file")
    except CheckpointError as e:
        log.warning("ignoring %s; starting afresh", e)
        return None
    if raw.get("format") != RESUME_FORMAT or raw.get("version") != RESUME_VERSION:
        log.warning("ignoring %s: not a specstore resume file of version %d; starting afresh", p, RESUME_VERSION)
        return None
    try:
        return ResumeState(**{k: v for k, v in raw.items() if k not in ("format", "version")})
    except TypeError as e:
        log.warning("ignoring %s: unreadable resume state (%s); starting afresh", p, e)
        return None
