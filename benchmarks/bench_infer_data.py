"""The synthetic inputs of the inference, reads, library and serving benchmarks: dB-like float16 features, a
median arrival order, a store of them and an untrained checkpoint (speed does not depend on the weights)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from .bench_plan import FPS

__all__ = ["LABELS", "make_checkpoint", "make_store", "synthetic_features", "typical_order"]

LABELS = [f"genre{k}" for k in range(10)]


def synthetic_features(lengths: np.ndarray, n_bins: int, seed: int) -> list[np.ndarray]:
    """dB-like float16 ``(n_frames, n_bins)`` arrays: a spectral slope, time-correlated noise."""
    rng = np.random.default_rng(seed)
    slope = np.linspace(-20.0, -60.0, n_bins, dtype=np.float32)
    out = []
    for n in lengths.tolist():
        noise = rng.standard_normal((n, n_bins)).astype(np.float32) * 6.0
        noise[1:] += 0.5 * noise[:-1]
        out.append((slope + noise).astype(np.float16))
    return out


def typical_order(lengths: np.ndarray, seed: int, batch_size: int = 4, tries: int = 1001) -> np.ndarray:
    """A median arrival order: of ``tries`` random orders of ``lengths``, the one whose fixed-batch
    padding efficiency is the median, so a small store is neither a lucky nor an unlucky draw for
    the fixed-batch baseline."""
    from specstore.infer.batching.planner_baselines import fixed_batches

    rng = np.random.default_rng(seed)
    perms = [rng.permutation(len(lengths)) for _ in range(tries)]
    eff = np.array([fixed_batches(lengths[p], batch_size).efficiency for p in perms])
    return lengths[perms[int(np.argsort(eff)[tries // 2])]]


def make_store(path: Path, lengths: np.ndarray, n_bins: int = 128, seed: int = 0, per_shard: int = 64,
               layout: str = "raw") -> Path:
    """A store with ``lengths`` (frames) of synthetic features, ``per_shard`` clips per shard.

    Paths sort in the order of ``lengths``, so store rows (kept sorted by
    path) are in that order: the arrival order a fixed batch sees."""
    from specstore.store import FeatureSpec, IndexRow, create_store, write_shard

    spec = FeatureSpec.mel(n_bins=n_bins)
    w = create_store(path, {"mel": spec}, label_names=LABELS, layout=layout)
    shards, rows = [], []
    for s0 in range(0, len(lengths), per_shard):
        chunk = lengths[s0:s0 + per_shard]
        feats = synthetic_features(chunk, n_bins, seed + s0)
        hashes = [f"h{s0 + k:07d}" for k in range(len(chunk))]
        shards.append(write_shard(path, {"mel": feats}, hashes, [n / FPS for n in chunk.tolist()]))
        rows += [IndexRow(f"clip{s0 + k:07d}-{LABELS[(s0 + k) % 10]}.flac", h, LABELS[(s0 + k) % 10])
                 for k, h in enumerate(hashes)]
    w.commit(shards, rows)
    return path


def make_checkpoint(path: Path, n_bins: int = 128, **config: Any) -> Path:
    import torch

    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint
    from specstore.infer.options.defaults import PLAIN_MODEL
    from specstore.store import FeatureSpec

    torch.manual_seed(0)
    model = build_model(ModelConfig(n_bins=n_bins, n_classes=len(LABELS), **{**PLAIN_MODEL, **config})).eval()
    save_checkpoint(Checkpoint.from_model(model, LABELS, "mel", FeatureSpec.mel(n_bins=n_bins)), path)
    return path
