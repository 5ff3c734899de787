"""One pipeline task: decode a group of files and write them as one whole shard.

This runs where an executor runs its tasks (:mod:`specstore.common.executors`): a local
worker process, a dask or ray worker, or the driver's own process.  Raw audio exists only inside
:func:`specstore.pipeline.features.compute_features`, one file (or one block of a long
file) at a time, and each feature's frames go straight into the shard
(:class:`specstore.store.ShardWriter`) as they are computed, so a worker's memory does
not depend on how long its files are.

Each file is opened once and decoded through that open file; the content
hash recorded for the clip is the hash of the bytes decoded (see
:mod:`specstore.pipeline.hashing`): a file that changed since the driver hashed it is
hashed again, and one that changes while it is decoded is decoded again (up
to ``tries`` times, then recorded as bad).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
from dataclasses import dataclass, field
from typing import Any

from specstore.store import FeatureSpec, ShardInfo, ShardWriter

from .audio import AudioError
from .decoder_log import DecoderWarnings, captured_stderr, divert_stderr
from .features import compute_features
from .hashing import Fingerprint, Stamp, digest_fd

__all__ = ["DECODE_TRIES", "TaskItem", "TaskResult", "run_task"]

log = logging.getLogger(__name__)

#: How often a file that keeps changing while it is decoded is tried before it is recorded as bad.
DECODE_TRIES = 3


@dataclass(frozen=True)
class TaskItem:
    """A distinct content to decode: one representative file, the hash the driver found, and its fingerprint."""

    source: str
    hash: str
    fingerprint: Fingerprint | None = None


@dataclass(frozen=True)
class Decoded:
    """What a file turned out to hold when it was decoded: its content hash, size (bytes) and mtime (ns)."""

    hash: str
    size: int
    mtime_ns: int


@dataclass
class TaskResult:
    """What a task returns to the driver (small: no feature data). Keys are the driver's hashes."""

    shard: ShardInfo | None
    failed: dict[str, str] = field(default_factory=dict)  # hash -> reason (the content does not decode)
    unavailable: dict[str, str] = field(default_factory=dict)  # hash -> reason (the file itself: gone, changing)
    decoded: dict[str, Decoded] = field(default_factory=dict)  # hash -> what was actually decoded
    seconds: float = 0.0
    files: int = 0
    decoder: DecoderWarnings = field(default_factory=DecoderWarnings)  # the C decoders' messages, counted


def _fd_path(fd: int, source: str) -> str:
    """A path that opens the same file as ``fd`` even if ``source`` is renamed or replaced meanwhile."""
    proc = f"/proc/self/fd/{fd}"
    return proc if os.path.exists(proc) else source


def _open_reason(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "file not found (removed since the corpus was scanned)"
    if isinstance(e, PermissionError):
        return "unreadable: permission denied"
    return f"unreadable: {e.strerror or e}"


def _decode_one(item: TaskItem, shard: ShardWriter, specs: dict[str, FeatureSpec], block_seconds: float,
                tries: int) -> tuple[Decoded, float] | tuple[str, bool]:
    """Decode ``item`` into the shard's current clip: ``(what was decoded, seconds)`` or ``(reason, about_file)``.

    ``about_file`` is True when the reason concerns this file (gone, kept
    changing), not its content (other copies may still decode).  On failure
    the clip's frames are already dropped from the shard.
    """
    for _ in range(tries):
        try:
            fd = os.open(item.source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            return _open_reason(e), True
        try:
            before = Stamp.of(os.fstat(fd))
            fp = item.fingerprint
            known = fp is not None and fp.trusted and fp.stamp == before
            try:
                feats = compute_features(_fd_path(fd, item.source), specs, block_seconds=block_seconds,
                                         out_dtypes={k: s.dtype for k, s in specs.items()},
                                         sinks={k: shard.sink(k) for k in specs})
                failure = None
            except AudioError as e:
                failure = e.reason
            except MemoryError:
                failure = "out of memory while decoding"
            except OSError:
                raise  # writing the shard failed (a full disk): the run stops
            except Exception as e:  # a decoder bug on one odd file must not cost the others
                log.debug("unexpected failure on %s", item.source, exc_info=True)
                failure = f"decode failed: {type(e).__name__}: {e}".splitlines()[0]
            if Stamp.of(os.fstat(fd)) != before:  # changed while decoding: whatever came out is void
                shard.drop_clip()
                continue
            if failure is not None:
                shard.drop_clip()
                return failure, False
            digest = fp.hash if known and fp is not None else digest_fd(fd, shard.metadata.content_hash)
            if Stamp.of(os.fstat(fd)) != before:
                shard.drop_clip()
                continue
            return Decoded(digest, before.size, before.mtime_ns), feats.duration
        finally:
            os.close(fd)
    shard.drop_clip()
    return f"changed while being decoded ({tries} tries)", True


def run_task(
    store_url: str,
    items: list[TaskItem],
    specs: dict[str, dict[str, Any]],
    block_seconds: float,
    storage_options: dict[str, Any] | None = None,
    tries: int = DECODE_TRIES,
    driver_pid: int | None = None,
) -> TaskResult:
    """Decode ``items``, compute every feature once per file, stream them into one new shard.

    Per-file audio problems become ``failed`` entries with their reason and
    never stop the task.  Errors writing the shard (a full disk, say)
    propagate: the driver stops the run and the store stays at its last commit.

    In a worker process (not the driver's, ``driver_pid``; or any child of
    multiprocessing) the C decoders' lines on stderr are diverted and come
    back in ``result.decoder`` for the driver to log, so they do not
    interleave with its progress bar; run in the driver's process they stay
    on stderr and are counted (:mod:`specstore.pipeline.decoder_log`).
    """
    feature_specs = {k: FeatureSpec.from_dict(v) for k, v in specs.items()}
    result = TaskResult(shard=None, files=len(items))
    if multiprocessing.parent_process() is not None or driver_pid not in (None, os.getpid()):
        divert_stderr()
    with ShardWriter(store_url, storage_options=storage_options) as shard, captured_stderr(result.decoder):
        for item in items:
            outcome = _decode_one(item, shard, feature_specs, block_seconds, tries)
            if isinstance(outcome[0], str):
                reason, about_file = outcome
                (result.unavailable if about_file else result.failed)[item.hash] = reason
                continue
            decoded, seconds = outcome
            shard.end_clip(decoded.hash, seconds)
            result.decoded[item.hash] = decoded
            result.seconds += seconds
        result.shard = shard.close()
    log.debug("task of %d files done in pid %d", len(items), os.getpid())
    return result
