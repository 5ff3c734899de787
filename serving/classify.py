"""``specstore classify FILE_OR_DIR... --model M``: top-k genres of audio files, with no store to build.

Flow: expand the arguments (folders: their audio files, recursively, by
extension; files named on the command line are all tried, whatever their
name) -> hash each file (SHA-256, the content hash of new stores) so identical
contents decode and run once -> decode the distinct contents with the
checkpoint's FeatureSpecs in ``jobs`` worker processes
(:func:`specstore.serving.clips.decode_file`, the values a store would hold) ->
:class:`specstore.serving.model.Classifier` runs them through the same Engine,
Budget and planner as ``make infer`` -> one row per file.  With a cache folder, contents decoded before are
read back instead of decoded (:mod:`specstore.serving.cache`).  A file that
cannot be read or decoded is one :class:`FileFailure` (one line on
stderr); the others go through.  What the C decoders print on stderr
(libmpg123's notes on frames it conceals) is logged under
``specstore.decoder`` from the worker processes (``-v`` shows it) or left
on stderr when decoding in-process, and counted: the run ends with one
summary line (:mod:`specstore.pipeline.decoder_log`).
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from specstore.common import ConfigError
from specstore.infer.engine.predictions import NO_UNKNOWN_FOR_TAGS, PredictionsError, answer, check_unknown_below
from specstore.infer.models.trust import Trust
from specstore.infer.options.run_options import RunOptions
from specstore.pipeline.corpus import AUDIO_EXTENSIONS
from specstore.pipeline.corpus_hashes import hash_batch
from specstore.pipeline.decoder_log import DecoderLogListener, DecoderWarnings, captured_stderr, log_summary
from specstore.store import FeatureSpec
from specstore.store.layout import CONTENT_HASH

from .cache import ClipCache
from .clips import DecodedClip, decode_or_reason
from .model import Classifier, top_k
from .segments import Segment, check_segment_length, segment_rows, segment_spans

__all__ = ["ClassifyResult", "FileFailure", "FileResult", "classify", "classify_files", "expand_inputs"]


@dataclass(frozen=True)
class FileResult:
    """One classified file: its path as given, seconds of audio, the top-k ``(label, probability)`` pairs, and
    the answer: the top label, or ``unknown`` when its probability is below ``unknown_below`` (empty for a
    tagger, whose top-k are tags with independent scores, not one answer)."""

    path: str
    duration: float
    top: list[tuple[str, float]]
    probs: np.ndarray = field(repr=False)
    answer: str = ""
    segments: list[Segment] = field(default_factory=list)
    """Genre over time, one :class:`~specstore.serving.segments.Segment` per window (empty unless asked for)."""
    frames: int = 0
    """The clip's feature frames (the model's input length)."""


@dataclass(frozen=True)
class FileFailure:
    """A file that could not be classified and why (one line)."""

    path: str
    reason: str


@dataclass
class ClassifyResult:
    """Every input file as a result or a failure, in input order, and the run's figures; ``outputs``:
    ``"classes"`` or ``"tags"`` (:class:`~specstore.serving.model.Classifier`)."""

    results: list[FileResult]
    failures: list[FileFailure]
    label_names: list[str]
    outputs: str = "classes"
    distinct: int = 0
    cached: int = 0
    batches: int = 0
    efficiency: float = 1.0
    windowed: int = 0
    oom_retries: int = 0
    decoder: DecoderWarnings = field(default_factory=DecoderWarnings)


def expand_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Files to classify: each file argument as given, each folder's audio files (recursive, sorted).

    Raises :class:`~specstore.common.ConfigError` for an argument that does not exist
    or a folder holding no audio files.
    """
    out: list[str] = []
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.suffix.lower() in AUDIO_EXTENSIONS and f.is_file())
            if not found:
                raise ConfigError(f"{p} holds no audio files ({', '.join(sorted(AUDIO_EXTENSIONS))})")
            out.extend(found)
        elif p.exists() or p.is_symlink():
            out.append(os.fspath(arg))
        else:
            raise ConfigError(f"no such file or folder: {p}")
    if not out:
        raise ConfigError("no files to classify")
    return out


def _decode_all(todo: dict[str, str], specs: dict[str, FeatureSpec], jobs: int, progress: bool,
                decoder: DecoderWarnings) -> Iterator[tuple[str, DecodedClip | str]]:
    """``(hash, clip or reason)`` for each distinct content ``hash -> path``, in ``jobs`` processes.

    The C decoders' messages on stderr are counted into ``decoder`` (once
    the generator is done): in-process they stay on stderr; from worker
    processes they are logged at INFO under ``specstore.decoder``.
    """
    bar = tqdm(total=len(todo), unit="file", desc="decoding", disable=not progress, leave=False)
    listener = DecoderLogListener()
    try:
        if jobs <= 1 or len(todo) <= 1:
            for h, path in todo.items():
                with captured_stderr(decoder):
                    got = decode_or_reason(path, specs, h)
                yield h, got
                bar.update(1)
            return
        # spawn: this process has torch's threads running, which a fork would copy half-started
        with cf.ProcessPoolExecutor(max_workers=min(jobs, len(todo)), mp_context=multiprocessing.get_context("spawn"),
                                    **listener.pool_options(stop_on_interrupt=True)) as pool:
            try:
                futures = {pool.submit(decode_or_reason, path, specs, h): h for h, path in todo.items()}
                for fut in cf.as_completed(futures):
                    yield futures[fut], fut.result()
                    bar.update(1)
            except BaseException:  # Ctrl-C, say: no job not started yet is begun
                pool.shutdown(wait=False, cancel_futures=True)
                raise
    finally:
        bar.close()
        decoder.add(listener.close())  # after the pool: its workers' last lines are in


def _segments(classifier: Classifier, clips: Sequence[DecodedClip], seconds: float | None, topk: int,
              unknown_below: float | None, progress: bool) -> list[list[Segment] | None] | None:
    """Each clip's segments of ``seconds`` (None: not asked), all run as clips of their own in one engine run;
    None for a clip whose segment probabilities are not all finite."""
    if seconds is None:
        return None
    spans = [segment_spans(c.n_frames, c.duration, seconds, classifier.frame_seconds, classifier.window_align)
             for c in clips]
    pieces = [c.features[:, a:b] for c, s in zip(clips, spans, strict=True) for _, _, a, b in s]
    probs = classifier.run(pieces, progress=progress, desc="segments").probs
    out: list[list[Segment] | None] = []
    at = 0
    for s in spans:
        p = probs[at:at + len(s)]
        at += len(s)
        out.append(segment_rows(p, s, classifier.label_names, topk, unknown_below) if np.isfinite(p).all()
                   else None)
    return out


def _check_args(classifier: Classifier, topk: int, jobs: int, unknown_below: float | None,
                segments: float | None) -> tuple[float | None, float | None]:
    """:func:`classify_files`'s arguments checked before any decoding (a bad value is one line at once):
    ``unknown_below`` and ``segments`` as they will be used."""
    if not isinstance(topk, int) or topk < 1:
        raise ConfigError(f"topk must be a positive integer, got {topk!r}")
    if jobs < 1:
        raise ConfigError(f"jobs must be at least 1, got {jobs}")
    try:
        unknown_below = check_unknown_below(unknown_below)
    except PredictionsError as e:
        raise ConfigError(str(e)) from None
    if classifier.outputs == "tags" and unknown_below is not None:
        raise ConfigError(NO_UNKNOWN_FOR_TAGS)
    if segments is not None:
        segments = check_segment_length(segments, classifier.frame_seconds, classifier.window_align)
    return unknown_below, segments


def classify_files(inputs: Sequence[str | os.PathLike[str]], classifier: Classifier, *, topk: int = 5,
                   jobs: int = 1, progress: bool = True, cache: str | os.PathLike[str] | None = None,
                   unknown_below: float | None = None, segments: float | None = None) -> ClassifyResult:
    """Classify every file of ``inputs`` (files and folders, see :func:`expand_inputs`) with ``classifier``.

    ``jobs``: decode worker processes.  Identical contents (same bytes)
    decode and run once.  ``cache``: a folder of decoded clips keyed by
    content hash (:class:`~specstore.serving.cache.ClipCache`): files decoded before
    with the same feature settings are not decoded again; an entry that
    fails its checks is logged, and the file decoded and the entry
    rewritten.  ``unknown_below`` (a probability in (0, 1], None: off):
    each result's ``answer`` is ``unknown`` where the top probability is
    below it (segment rows too).  ``segments`` (seconds, None: off): each
    result also lists its windows of that many seconds with their own
    top-k (:mod:`specstore.serving.segments`: each window classified alone, masked,
    so exact under batching).  A file whose probabilities come out non-finite is a
    failure, never a row with NaN in it.  Raises
    :class:`~specstore.common.ConfigError` for bad arguments; unreadable or
    undecodable files become failures.
    """
    unknown_below, segments = _check_args(classifier, topk, jobs, unknown_below, segments)
    tags = classifier.outputs == "tags"
    paths = expand_inputs(inputs)
    hashes: dict[str, str] = {}
    reasons: dict[str, str] = {}
    for path in tqdm(paths, unit="file", desc="hashing", disable=not progress or len(paths) < 50, leave=False):
        # the corpus scan's rule (make features): stat before opening, so a FIFO or a device is one reason,
        # never a read that waits or runs for ever
        [(fp, reason)] = hash_batch([path], CONTENT_HASH)
        if fp is not None:
            hashes[path] = fp.hash
        else:
            reasons[path] = reason or "unreadable"
    todo: dict[str, str] = {}
    for path, h in hashes.items():
        todo.setdefault(h, path)
    clips: dict[str, DecodedClip] = {}
    failed: dict[str, str] = {}
    store = ClipCache(cache, classifier.specs) if cache is not None else None
    decoder = DecoderWarnings()
    if store is not None:
        for h in list(todo):
            hit = store.get(h)
            if hit is not None:
                clips[h] = hit
    for h, got in _decode_all({h: p for h, p in todo.items() if h not in clips}, classifier.specs, jobs, progress,
                              decoder):
        if isinstance(got, str):
            failed[h] = got
        else:
            clips[h] = got
            if store is not None:
                store.put(got)
    order = [h for h in todo if h in clips]  # input order, whatever order the workers finished in
    res = classifier.run([clips[h].features for h in order], progress=progress)
    row = {h: i for i, h in enumerate(order)}
    windows = _segments(classifier, [clips[h] for h in order], segments, topk, unknown_below, progress)
    for h in order:  # not expected from finite inputs, but a NaN must never reach a table, a CSV or JSON
        if not np.isfinite(res.probs[row[h]]).all() or windows is not None and windows[row[h]] is None:
            failed[h] = "the model gave non-finite probabilities"
    out = ClassifyResult([], [], list(classifier.label_names), classifier.outputs, distinct=len(order),
                         cached=store.hits if store is not None else 0, batches=res.run.batches,
                         efficiency=res.run.efficiency, windowed=res.run.windowed, oom_retries=res.run.oom_retries,
                         decoder=decoder)
    for path in paths:
        if path in reasons:
            out.failures.append(FileFailure(path, reasons[path]))
        elif hashes[path] in failed:
            out.failures.append(FileFailure(path, failed[hashes[path]]))
        else:
            p = res.probs[row[hashes[path]]]
            top = top_k(p, classifier.label_names, topk)
            rows = windows[row[hashes[path]]] if windows is not None else None
            clip = clips[hashes[path]]
            out.results.append(FileResult(path, clip.duration, top, p,
                                          "" if tags else answer(top[0][0], top[0][1], unknown_below), rows or [],
                                          clip.n_frames))
    log_summary(decoder)  # the run's one line about the decoders' messages (none when there were none)
    return out


def classify(inputs: Sequence[str | os.PathLike[str]], model: str | os.PathLike[str], *, topk: int = 5,
             labels: str | list[str] | None = None, trust_model_code: Trust = False,
             options: RunOptions | None = None, **settings: Any) -> ClassifyResult:
    """Classify audio files and folders with ``model`` (a checkpoint, or a shipped tagger's name such as
    ``musicnn-msd``): what ``specstore classify`` runs, from Python.

    ``labels`` keeps only these of the model's labels; ``options`` are the run options (device, precision,
    memory budget; default :class:`~specstore.infer.options.run_options.RunOptions`); ``settings`` are
    :func:`classify_files`'s (``jobs``, ``progress``, ``cache``, ``unknown_below``, ``segments``).  Raises
    :class:`~specstore.common.SpecstoreError` subclasses with one line; files that cannot be classified are
    listed in the result's ``failures``, not raised.
    """
    classifier = Classifier(model, options, labels=labels, trust_model_code=trust_model_code)
    return classify_files(inputs, classifier, topk=topk, **settings)
