"""Prediction over a whole store: length-binned batches under a memory budget, top-k CSV out.

Flow: open the store (index only) -> load the checkpoint and refuse a
feature-spec mismatch -> measure the model's bytes per padded clip-frame ->
plan batches of distinct contents under the budget -> a loader thread reads
and pads batches from the store's mmap views while the model runs -> clips
too long for any batch run in windows whose pooled sums are combined ->
softmax -> one CSV row per indexed path.  Raw audio is never involved.
"""

from __future__ import annotations

import contextlib
import csv
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from store import FeatureView, Store, open_store

from .checkpoint import Checkpoint, check_store_matches, load_checkpoint
from .cost import CostModel, measure_cost_per_frame
from .device import Budget, anon_rss_bytes, choose_device, memory_budget, set_cpu_threads
from .loader import prefetch_batches, to_device
from .models import MaskedClassifier
from .planner import Plan, plan_batches
from .windows import run_windowed

__all__ = ["PredictOptions", "PredictStats", "Predictions", "RowLogits", "logits_for_rows", "make_plan", "predict",
           "write_predictions_csv"]

log = logging.getLogger(__name__)

PRECISIONS = ("auto", "fp32", "bf16", "fp16")


@dataclass(frozen=True)
class PredictOptions:
    """How to run prediction.

    ``budget_mb``: memory for one batch in MiB (CPU default 2048; on CUDA the
    free memory minus ``margin_mb`` (default 1536), capped by ``budget_mb``).
    ``precision``: ``auto`` (bf16 autocast on CUDA when supported, else fp16;
    fp32 on CPU), ``fp32``, ``bf16`` or ``fp16`` (CUDA only).
    ``channels_last``: None = on for CPU, where it is faster for these convs.
    """

    device: str = "auto"
    budget_mb: float | None = None
    margin_mb: float | None = None
    max_batch: int = 16
    topk: int = 5
    precision: str = "auto"
    channels_last: bool | None = None
    threads: int | None = None
    prefetch: int = 2
    progress: bool = True

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.max_batch < 1 or self.topk < 1:
            raise ValueError("max_batch and topk must be at least 1")


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


@dataclass
class Predictions:
    """Per-row probabilities (``(n_rows, n_classes)``, rows as in the store) and the run's stats."""

    paths: list[str]
    probs: np.ndarray
    label_names: list[str]
    truth: list[str | None]
    stats: PredictStats = field(default_factory=PredictStats)

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Indices ``(n_rows, k)`` and probabilities of the ``k`` best classes, best first."""
        k = min(k, self.probs.shape[1])
        idx = np.argsort(-self.probs, axis=1, kind="stable")[:, :k]
        return idx, np.take_along_axis(self.probs, idx, axis=1)


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "fp32" or (precision == "auto" and device.type == "cpu"):
        return None
    if precision == "fp16":
        if device.type != "cuda":
            raise ValueError("fp16 autocast needs a CUDA device; use bf16 or fp32 on CPU")
        return torch.float16
    if precision == "auto":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16


def _amp(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def distinct_rows(store: Store) -> tuple[np.ndarray, np.ndarray]:
    """``(first row of each distinct content, content id of every row)``: duplicates run once."""
    return _distinct(np.arange(len(store), dtype=np.int64), store.hashes)


def _distinct(rows: np.ndarray, hashes: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """For store ``rows``: the first row of each distinct content hash, and each row's content id."""
    ids: dict[str, int] = {}
    content = np.fromiter((ids.setdefault(hashes[int(r)], len(ids)) for r in rows), dtype=np.int64, count=len(rows))
    _, first = np.unique(content, return_index=True)  # content ids are 0..n-1 in first-seen order
    return rows[first], content


def make_plan(model: MaskedClassifier, lengths: np.ndarray, device: torch.device, budget_bytes: int,
              max_batch: int, autocast: torch.dtype | None, cost: CostModel | None = None) -> tuple[Plan, CostModel]:
    """Plan batches of ``lengths`` (frames) for ``model``, measuring its memory cost unless given."""
    if cost is None:
        cost = measure_cost_per_frame(model, model.config.n_bins, device=device, autocast=autocast)
    plan = plan_batches(lengths, budget_bytes=budget_bytes, cost_per_frame=cost.bytes_per_frame,
                        max_batch=max_batch, fixed_overhead=cost.fixed_bytes, frame_align=model.time_stride)
    return plan, cost


class _Runner:
    """Runs batches on the model; on a CUDA out-of-memory, splits the batch and retries."""

    def __init__(self, model: MaskedClassifier, device: torch.device, autocast: torch.dtype | None,
                 channels_last: bool) -> None:
        self.model, self.device, self.autocast, self.channels_last = model, device, autocast, channels_last
        self.oom_retries = 0

    def logits(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        try:
            if self.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with torch.inference_mode(), _amp(self.device, self.autocast):
                return self.model(x, lengths).float()
        except torch.cuda.OutOfMemoryError:
            if x.shape[0] == 1:
                raise
            self.oom_retries += 1
            torch.cuda.empty_cache()
            half = x.shape[0] // 2
            log.warning("CUDA out of memory on a batch of %d x %d frames; retrying as two halves",
                        x.shape[0], x.shape[-1])
            return torch.cat([self.logits(x[:half], lengths[:half]), self.logits(x[half:], lengths[half:])])


@dataclass
class RowLogits:
    """Logits ``(len(rows), n_classes)`` float32, in the order of the requested rows, and run figures."""

    logits: np.ndarray
    distinct: int = 0
    batches: int = 0
    efficiency: float = 1.0
    windowed: int = 0
    oom_retries: int = 0
    peak_rss: int = 0


def logits_for_rows(
    model: MaskedClassifier,
    view: FeatureView,
    rows: np.ndarray,
    *,
    device: torch.device,
    budget_bytes: int,
    max_batch: int = 16,
    autocast: torch.dtype | None = None,
    channels_last: bool = False,
    hashes: Sequence[str] | None = None,
    cost: CostModel | None = None,
    progress: bool = False,
    desc: str = "evaluating",
) -> RowLogits:
    """Run ``model`` (in eval mode; its mode is restored after) on store ``rows`` of ``view``.

    Whole clips, as :func:`infer.predict.predict` runs them: with ``hashes``
    (the store's, indexed by row) each distinct content runs once; lengths
    are planned by :func:`infer.planner.plan_batches` under ``budget_bytes``
    with the model's measured inference ``cost`` (measured here if None);
    clips too long for a batch of one run in windows.  The model must already
    be on ``device`` (and in channels-last format if ``channels_last``).
    """
    rows = np.asarray(rows, dtype=np.int64)
    n_classes = model.config.n_classes
    if hashes is not None:
        distinct, content = _distinct(rows, hashes)
    else:
        distinct, content = rows, np.arange(len(rows), dtype=np.int64)
    out = RowLogits(np.zeros((len(rows), n_classes), dtype=np.float32), distinct=len(distinct))
    if not len(rows):
        return out
    was_training = model.training
    model.eval()
    try:
        # the length index: no feature data is read to plan
        plan, _ = make_plan(model, view.lengths[distinct], device, budget_bytes, max_batch, autocast, cost)
        out.batches, out.efficiency, out.windowed = plan.n_batches, plan.efficiency, len(plan.too_long)
        runner = _Runner(model, device, autocast, channels_last)
        logits = np.zeros((len(distinct), n_classes), dtype=np.float32)
        peak = anon_rss_bytes()
        with tqdm(total=len(distinct), unit="clip", desc=desc, disable=not progress, leave=False) as bar:
            for batch in prefetch_batches(view, plan.batches, rows=distinct, multiple_of=model.time_stride,
                                          pin=device.type == "cuda"):
                b = to_device(batch, device)
                logits[batch.ids] = runner.logits(b.x, b.lengths).cpu().numpy()
                bar.update(len(batch))
                peak = max(peak, anon_rss_bytes())
            for cid in plan.too_long:
                arr = np.asarray(view[int(distinct[cid])], dtype=np.float32)
                with torch.inference_mode():
                    logits[cid] = run_windowed(model, arr, plan.max_window, device=device,
                                               autocast=autocast).float().cpu().numpy()
                bar.update(1)
                peak = max(peak, anon_rss_bytes())
        out.oom_retries, out.peak_rss = runner.oom_retries, peak
    finally:
        model.train(was_training)
    out.logits = logits[content]
    return out


def open_inputs(store: str | Store, checkpoint: str | os.PathLike[str] | Checkpoint,
                options: PredictOptions | None, overrides: dict[str, Any]) -> tuple[PredictOptions, Store, Checkpoint]:
    """Options (``options`` updated by keyword ``overrides``), the store and the checkpoint, spec-checked."""
    opts = options or PredictOptions()
    if overrides:
        opts = PredictOptions(**{**opts.__dict__, **overrides})
    s = store if isinstance(store, Store) else open_store(store)
    ckpt = checkpoint if isinstance(checkpoint, Checkpoint) else load_checkpoint(checkpoint)
    check_store_matches(ckpt, s)
    return opts, s, ckpt


@dataclass
class RunSetup:
    """A checkpoint's model ready to run under ``PredictOptions``: device, precision, layout, budget."""

    model: MaskedClassifier
    device: torch.device
    autocast: torch.dtype | None
    channels_last: bool
    budget: Budget

    @classmethod
    def for_checkpoint(cls, ckpt: Checkpoint, opts: PredictOptions) -> "RunSetup":
        """Choose the device (and CPU threads), autocast dtype and memory layout; build the model."""
        device = choose_device(opts.device)
        if device.type == "cpu":
            set_cpu_threads(opts.threads)
        autocast = _autocast_dtype(opts.precision, device)
        channels_last = opts.channels_last if opts.channels_last is not None else device.type == "cpu"
        model = ckpt.build(device)
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
        return cls(model, device, autocast, channels_last, memory_budget(device, opts.budget_mb, opts.margin_mb))


def predict(
    store: str | Store,
    checkpoint: str | os.PathLike[str] | Checkpoint,
    out: str | os.PathLike[str] | None = None,
    *,
    options: PredictOptions | None = None,
    **overrides: Any,
) -> Predictions:
    """Classify every indexed path of ``store`` with ``checkpoint``; write a CSV to ``out`` if given.

    Options come from ``options`` and/or keyword overrides
    (``predict(s, m, device="cpu", budget_mb=512)``).  Raises
    ``StoreError``/``CheckpointError`` (spec mismatch included) and
    ``DeviceError`` with one-line messages.
    """
    t0 = time.perf_counter()
    opts, s, ckpt = open_inputs(store, checkpoint, options, overrides)
    run = RunSetup.for_checkpoint(ckpt, opts)
    model, device, autocast, channels_last, budget = run.model, run.device, run.autocast, run.channels_last, run.budget

    stats = PredictStats(clips=len(s), audio_seconds=float(s.durations.sum()), budget_bytes=budget.bytes,
                         device=str(device))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        stats.peak_kind = "GPU allocated"
    res = logits_for_rows(model, s.feature(ckpt.feature), np.arange(len(s)), device=device, budget_bytes=budget.bytes,
                          max_batch=opts.max_batch, autocast=autocast, channels_last=channels_last,
                          hashes=s.hashes, progress=opts.progress, desc="predicting")
    stats.distinct, stats.batches, stats.efficiency = res.distinct, res.batches, res.efficiency
    stats.windowed, stats.oom_retries = res.windowed, res.oom_retries
    stats.peak_bytes = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else res.peak_rss
    probs = torch.softmax(torch.from_numpy(res.logits), dim=1).numpy()
    truth = [s.label_names[l] if l >= 0 else None for l in s.labels.tolist()]
    stats.wall_seconds = time.perf_counter() - t0
    result = Predictions(list(s.paths), probs, list(ckpt.label_names), truth, stats)
    if out is not None:
        write_predictions_csv(result, out, topk=opts.topk)
    return result


def write_predictions_csv(pred: Predictions, out: str | os.PathLike[str], *, topk: int = 5) -> Path:
    """Write ``path,pred,prob,topk,truth`` (``topk`` = ``label:prob`` pairs joined by ``;``, best first)."""
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    idx, pr = pred.top(topk)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["path", "pred", "prob", "topk", "truth"])
        for i, path in enumerate(pred.paths):
            names = [pred.label_names[j] for j in idx[i]]
            pairs = ";".join(f"{n}:{q:.4f}" for n, q in zip(names, pr[i]))
            w.writerow([path, names[0], f"{pr[i, 0]:.4f}", pairs, pred.truth[i] or ""])
    os.replace(tmp, p)
    return p
