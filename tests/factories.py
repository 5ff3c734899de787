"""Shared test factories: small corpora, stores and checkpoints, built on the fly (nothing committed).

Import from any test (``tests/`` is on ``sys.path``)::

    from factories import make_corpus, make_store, make_checkpoint, store_content

* :func:`make_corpus` writes real, short, music-like audio files in mixed
  formats, sample rates and channel counts, one folder per label;
* :func:`make_store` writes a store directly (random dB values, no audio),
  with any labels, lengths and features;
* :func:`make_separable_store` writes a store whose classes a small CNN
  learns in a few epochs;
* :func:`make_checkpoint` saves a small untrained model with non-trivial
  BatchNorm statistics;
* :func:`store_content` / :func:`assert_same_content` compare two stores by
  what they hold, whatever their shard names, layout or commit history.

Everything is deterministic for a given ``seed``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from specstore.store import FeatureSpec, IndexRow, create_store, open_store

__all__ = [
    "LABELS", "SMALL_SPECS", "SPEC16", "assert_same_content", "make_checkpoint", "make_corpus",
    "make_separable_store", "make_store", "store_content",
]

#: The labels most tests use (a model's label list).
LABELS = ["ambient", "jazz", "rock"]
#: A 16-bin log-mel spec: tiny models run on it in milliseconds.
SPEC16 = FeatureSpec.mel(n_bins=16)
#: Small features keep extraction fast; values are still the real log-mel / CQT.
SMALL_SPECS = {"mel": FeatureSpec.mel(n_bins=32), "cqt": FeatureSpec.cqt(n_bins=24)}

_FORMATS = ("wav", "flac", "ogg", "mp3")


def make_corpus(root: Path, n: int = 8, seconds: float = 2.0, *, step: float = 0.37,
                labels: Sequence[str] = ("rock", "jazz", "ambient")) -> list[Path]:
    """``n`` labelled music-like files under ``root/<label>/t<k>.<ext>``; returns their paths.

    File ``k`` lasts ``seconds + step * k`` seconds, cycles through wav, flac,
    ogg and mp3, 22 050 / 44 100 Hz, and is stereo when ``k % 3 == 1``.
    """
    from specstore.pipeline.testing import write_music_like  # audio libraries only where audio is written

    return [write_music_like(root / labels[k % len(labels)] / f"t{k:02d}.{_FORMATS[k % 4]}", seconds + step * k,
                             seed=k, sr=(22050, 44100)[k % 2], channels=1 + (k % 3 == 1))
            for k in range(n)]


def make_store(
    path: Path | str,
    labels: Sequence[str | None] | None = None,
    *,
    lengths: Sequence[int] | None = None,
    label_names: Sequence[str] = LABELS,
    specs: Mapping[str, FeatureSpec] | None = None,
    seed: int = 0,
    mean: float = -45.0,
    std: float = 12.0,
    layout: str = "raw",
) -> Path:
    """A store written directly: clip ``k`` has ``labels[k]`` and ``lengths[k]`` frames of N(mean, std) dB.

    Without ``labels`` clips cycle through ``label_names``; without
    ``lengths`` each is 10-119 frames.  Clip ``k``'s path is
    ``<label or "none">/c<k:03d>.wav`` and its content hash ``h<k>``.
    ``specs`` default to :data:`SPEC16` as ``mel``.
    """
    rng = np.random.default_rng(seed)
    specs = dict(specs or {"mel": SPEC16})
    n = len(labels) if labels is not None else len(lengths) if lengths is not None else 12
    if labels is None:
        labels = [label_names[k % len(label_names)] if label_names else None for k in range(n)]
    if lengths is None:
        lengths = [int(rng.integers(10, 120)) for _ in range(n)]
    if len(lengths) != len(labels):
        raise ValueError("labels and lengths differ in length")
    w = create_store(path, specs, layout=layout, label_names=list(label_names))
    arrays = {k: [rng.normal(mean, std, (int(m), s.n_bins)).astype(np.float32) for m in lengths]
              for k, s in specs.items()}
    frame = next(iter(specs.values())).frame_seconds
    rows = [{"path": f"{lab or 'none'}/c{k:03d}.wav", "hash": f"h{k}", "label": lab, "duration": int(m) * frame}
            for k, (lab, m) in enumerate(zip(labels, lengths, strict=False))]
    with w:  # releases the writer lock
        w.add_clips(rows, arrays)
    return Path(path)


def make_separable_store(path: Path | str, n: int = 48, *, seed: int = 0, labelled: bool = True,
                         duplicates: int = 0, spec: FeatureSpec = SPEC16,
                         lengths: tuple[int, int] = (20, 160)) -> Path:
    """Clips whose class is band energy: class k lifts bins ``[0, 6k)`` by 15 dB over N(-50 dB, 6 dB) noise.

    Lengths are uniform in ``lengths`` frames.  ``duplicates`` more rows
    index the content of the first clips under other paths (same hash, same
    label).
    """
    rng = np.random.default_rng(seed)
    w = create_store(path, {"mel": spec}, label_names=LABELS if labelled else [])
    arrays, rows = [], []
    for k in range(n):
        lab = k % len(LABELS)
        length = int(rng.integers(*lengths))
        a = rng.normal(-50.0, 6.0, (length, spec.n_bins)).astype(np.float32)
        a[:, :6 * lab] += 15.0
        arrays.append(a)
        rows.append({"path": f"{LABELS[lab]}/c{k:03d}.wav", "hash": f"content-{seed}-{k}",
                     "duration": length * spec.frame_seconds, "label": LABELS[lab] if labelled else None})
    with w:  # releases the writer lock
        w.add_clips(rows, {"mel": arrays})
        if duplicates:
            w.commit(rows=[IndexRow(f"copies/d{j:03d}.wav", rows[j]["hash"], rows[j]["label"])
                           for j in range(duplicates)])
    return Path(path)


def make_checkpoint(path: Path | str, *, spec: FeatureSpec = SPEC16, labels: Sequence[str] = LABELS, seed: int = 0,
                    extra: dict[str, Any] | None = None, **config: Any) -> Path:
    """Save an untrained small model (width 4, depth 2 unless ``config`` says otherwise) for ``spec``.

    Its BatchNorm running statistics are random, so eval-mode BN is not the
    identity and masking mistakes show.
    """
    import torch

    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint
    from specstore.infer.options.defaults import PLAIN_MODEL

    torch.manual_seed(seed)
    model = build_model(ModelConfig(n_bins=spec.n_bins, n_classes=len(labels), **{**PLAIN_MODEL,
                                                                      "width": 4, "depth": 2, **config}))
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    save_checkpoint(Checkpoint.from_model(model, list(labels), "mel", spec, extra=dict(extra or {})), path)
    return Path(path)


def budget_mb_holding(checkpoint: Path | str, frames: int) -> float:
    """A CPU budget (MB) under which ``checkpoint``'s model holds one clip of ``frames`` frames and no longer
    one: a store with a longer clip makes that clip run in windows."""
    from specstore.infer.engine.cost import measure_cost_per_frame
    from specstore.infer.models.checkpoint import load_checkpoint

    ckpt = load_checkpoint(checkpoint)
    cost = measure_cost_per_frame(ckpt.build(), ckpt.n_bins)
    return (cost.fixed_bytes + cost.bytes_per_frame * frames) / 2**20


def store_content(where: str | Path) -> dict[str, tuple[Any, ...]]:
    """Everything a store holds, keyed by path, independent of layout, shard names and commit history."""
    s = open_store(where)
    out = {}
    for i, p in enumerate(s.paths):
        lab = s.label_names[s.labels[i]] if s.labels[i] >= 0 else None
        feats = tuple(np.ascontiguousarray(s.feature(f).frames(i)).tobytes() for f in sorted(s.specs))
        out[p] = (s.hashes[i], lab, int(s.lengths[i]), float(s.durations[i]), *feats)
    return out


def assert_same_content(got: dict[str, tuple[Any, ...]], expected: dict[str, tuple[Any, ...]]) -> None:
    """``got == expected`` for :func:`store_content` results, naming the paths and fields that differ."""
    assert sorted(got) == sorted(expected)
    names = ("hash", "label", "n_frames", "duration")
    differ = {}
    for p, want in expected.items():
        fields = {names[k] if k < len(names) else "features"
                  for k, (a, b) in enumerate(zip(got[p], want, strict=False)) if a != b}
        if fields:
            differ[p] = sorted(fields)
    assert not differ, f"rows differ: {differ}"


def index_group(where: Path | str) -> str:
    """The group path of a store's whole index, for tests that forge it with plain zarr.

    The store's index is first rewritten as one segment (``StoreWriter.compact``), so editing that
    segment's columns (``<group>/<column>``, ``<group>/shards/name``, ``<group>/shards/n_frames``) edits
    what every reader sees.
    """
    import zarr

    from specstore.store import StoreWriter

    with StoreWriter.open(where) as writer:
        if writer.index_segments != 1:
            writer.compact()
    return str(zarr.open_group(str(where), mode="r").attrs["specstore"]["commit"]["segments"][0])
