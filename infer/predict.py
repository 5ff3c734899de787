"""``make infer``: classify every indexed path of a store and write the predictions CSV.

Flow: open the store (index only) -> load the checkpoint and refuse a
feature-spec mismatch -> the engine (:mod:`infer.runtime`) measures the
model's bytes per padded clip-frame, plans length-sorted batches of distinct
contents under the memory budget, reads and pads them ahead of the model
from the store's mmap views, and runs clips too long for any batch in
windows -> softmax -> one CSV row per indexed path
(:mod:`infer.explore.predictions`).  Raw audio is never involved.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from store import ConfigError, Store, check_output_path, open_store

from .checkpoint import Checkpoint, check_store_matches, load_checkpoint
from .explore.predictions import Predictions, write_predictions_csv
from .runtime import Engine, RunOptions

__all__ = ["PredictStats", "Predictions", "open_inputs", "predict"]

log = logging.getLogger(__name__)


@dataclass
class PredictStats:
    """Figures of one run. Times in seconds, memory in bytes, efficiency = real / computed frames."""

    clips: int = 0
    distinct: int = 0
    audio_seconds: float = 0.0
    wall_seconds: float = 0.0
    batches: int = 0
    efficiency: float = 1.0
    windowed: int = 0
    oom_retries: int = 0
    peak_bytes: int = 0
    peak_kind: str = "anonymous RSS"
    budget_bytes: int = 0
    device: str = "cpu"

    def line(self) -> str:
        """The one-line summary printed after a run."""
        wall = max(self.wall_seconds, 1e-9)
        return (f"{self.clips} clips ({self.distinct} distinct) in {self.wall_seconds:.1f} s: "
                f"{self.clips / wall:.1f} clips/s, {self.audio_seconds / wall:,.0f} s audio/s; "
                f"{self.batches} batches, padding efficiency {self.efficiency:.3f}, "
                f"{self.windowed} windowed; peak {self.peak_kind} {self.peak_bytes / 2**20:.0f} MiB "
                f"(budget {self.budget_bytes / 2**20:.0f} MiB) on {self.device}; OOM retries {self.oom_retries}")


def open_inputs(store: str | Store, checkpoint: str | os.PathLike[str] | Checkpoint,
                options: RunOptions | None, overrides: dict[str, Any]) -> tuple[RunOptions, Store, Checkpoint]:
    """Options (``options`` updated by keyword ``overrides``), the store and the checkpoint, spec-checked."""
    opts = options or RunOptions()
    if overrides:
        try:
            opts = dataclasses.replace(opts, **overrides)
        except TypeError as e:
            raise ConfigError(f"unknown run option: {e}") from None
    s = store if isinstance(store, Store) else open_store(store)
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    check_store_matches(ckpt, s)
    return opts, s, ckpt


def predict(
    store: str | Store,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    out: str | os.PathLike[str] | None = None,
    *,
    topk: int = 5,
    options: RunOptions | None = None,
    **overrides: Any,
) -> Predictions:
    """Classify every indexed path of ``store`` with ``checkpoint``; write the CSV to ``out`` if given.

    Run options come from ``options`` and/or keyword overrides
    (``predict(s, m, device="cpu", budget_mb=512)``; see
    :class:`infer.runtime.RunOptions`); ``topk`` labels are listed per clip.
    ``out`` is checked before any work.  Raises ``StoreError``,
    ``CheckpointError`` (spec mismatch included), ``DeviceError`` and
    ``ConfigError`` with one-line messages.
    """
    t0 = time.perf_counter()
    if not isinstance(topk, int) or topk < 1:
        raise ConfigError(f"topk must be a positive integer, got {topk!r}")
    if out is not None:
        check_output_path(out, what="predictions")
    opts, s, ckpt = open_inputs(store, checkpoint, options, overrides)
    engine = Engine(opts)
    model = engine.prepare(ckpt.build())
    view = s.feature(ckpt.feature)
    res = engine.logits(model, view, np.arange(len(s)), hashes=s.hashes, desc="predicting")
    stats = PredictStats(
        clips=len(s), distinct=res.distinct, audio_seconds=float(s.durations.sum()), batches=res.batches,
        efficiency=res.efficiency, windowed=res.windowed, oom_retries=res.oom_retries, peak_bytes=res.peak_bytes,
        peak_kind="GPU allocated" if engine.device.type == "cuda" else "anonymous RSS", budget_bytes=res.budget_bytes,
        device=str(engine.device))
    probs = torch.softmax(torch.from_numpy(res.logits), dim=1).numpy() if len(s) else np.zeros(
        (0, len(ckpt.label_names)), dtype=np.float32)
    truth = [s.label_names[label] if label >= 0 else None for label in s.labels.tolist()]
    stats.wall_seconds = time.perf_counter() - t0
    result = Predictions(list(s.paths), probs, list(ckpt.label_names), truth, stats)
    if out is not None:
        write_predictions_csv(result, out, topk=topk)
    return result
