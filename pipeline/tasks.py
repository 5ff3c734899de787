"""One pipeline task: decode a group of files and write them as one whole shard.

This runs inside a joblib worker.  Raw audio exists only inside
:func:`pipeline.features.compute_features`, one file (or one block of a long
file) at a time; what the task keeps are the float16 feature arrays of its
files until the shard is written.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from store import FeatureSpec, ShardInfo, write_shard

from .audio import AudioError
from .features import compute_features

__all__ = ["TaskItem", "TaskResult", "run_task"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskItem:
    """A distinct content to decode: one representative file and its hash."""

    source: str
    hash: str


@dataclass
class TaskResult:
    """What a task returns to the driver (small: no feature data)."""

    shard: ShardInfo | None
    failed: dict[str, str] = field(default_factory=dict)  # hash -> reason
    seconds: float = 0.0
    files: int = 0


class _SilenceDecoderStderr:
    """Send the C decoders' own stderr chatter (libmpg123's "part2_3_length ... too large") to /dev/null.

    Only in worker processes, where it would interleave with the driver's
    progress bar; every problem that matters reaches the driver as an
    :class:`AudioError` reason instead.  Reusable; restores fd 2 on exit.
    """

    def __enter__(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 2)
        os.close(devnull)

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)


def run_task(
    store_url: str,
    items: list[TaskItem],
    specs: dict[str, dict[str, Any]],
    block_seconds: float,
    storage_options: dict[str, Any] | None = None,
) -> TaskResult:
    """Decode ``items``, compute every feature once per file, write one shard.

    Per-file audio problems become ``failed`` entries with their reason and
    never stop the task.  Errors writing the shard (a full disk, say)
    propagate: the driver stops the run and the store stays at its last commit.
    """
    feature_specs = {k: FeatureSpec.from_dict(v) for k, v in specs.items()}
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in feature_specs}
    hashes: list[str] = []
    durations: list[float] = []
    result = TaskResult(shard=None, files=len(items))
    quiet = _SilenceDecoderStderr() if multiprocessing.parent_process() is not None else nullcontext()
    for item in items:
        try:
            with quiet:
                feats = compute_features(item.source, feature_specs, block_seconds=block_seconds,
                                         out_dtypes={k: s.dtype for k, s in feature_specs.items()})
        except AudioError as e:
            result.failed[item.hash] = e.reason
            continue
        except MemoryError:
            result.failed[item.hash] = "out of memory while decoding"
            continue
        except Exception as e:  # a decoder bug on one odd file must not cost the others
            log.debug("unexpected failure on %s", item.source, exc_info=True)
            result.failed[item.hash] = f"decode failed: {type(e).__name__}: {e}".splitlines()[0]
            continue
        for k, spec in feature_specs.items():
            # Already in the storage dtype (out_dtypes), so a long file never holds its features in
            # float32 as well; pop drops the result's reference before the shard is written.
            arrays[k].append(feats.arrays.pop(k).astype(spec.dtype, copy=False))
        hashes.append(item.hash)
        durations.append(feats.duration)
        result.seconds += feats.duration
        del feats
    if hashes:
        result.shard = write_shard(store_url, arrays, hashes, durations, storage_options=storage_options)
    log.debug("task of %d files done in pid %d", len(items), os.getpid())
    return result
