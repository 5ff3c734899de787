"""``make train``: fit a masked CNN on a store's labelled clips, resumably.

Flow: open the store (index only) -> split the labelled rows by content hash
(:mod:`infer.split`; duplicates never straddle it) -> fit the model's input
normalisation on training frames -> measure the model's training memory per
padded clip-frame -> every epoch, a fresh :func:`infer.planner.shuffled_training_plan`
over the (cropped) lengths under the memory budget -> random crops read
straight from the store's mmap views, SpecAugment-style masks inside real
frames -> AdamW with linear warm-up then cosine decay, autocast on CUDA ->
validation on whole held-out clips with the prediction path
(:func:`infer.predict.logits_for_rows`: length-sorted batches, windows for
clips too long for a batch) -> the best checkpoint (validation accuracy, then
validation loss; training loss when nothing is held out) at ``model_path``.

Resuming: after every epoch ``<model>.resume.pt`` (weights, optimiser, grad
scaler, epoch, history, best score; plain containers, read with
``torch.load(weights_only=True)``) is written atomically next to the
checkpoint.  Rerunning with the same configuration on the same data continues
after the last finished epoch.  Every random draw of an epoch (batches, crops,
masks, dropout) is seeded from ``(seed, epoch)``, so an interrupted and resumed
run follows the same path as an uninterrupted one.  A changed configuration
(other than device, precision and memory budget) or changed data starts afresh
with a warning.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import math
import os
import pickle
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from store import FeatureView, Store, open_store

from .checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from .collate import collate
from .cost import CostModel, measure_cost_per_frame
from .device import choose_device, memory_budget, set_cpu_threads
from .predict import logits_for_rows
from .models import ARCHS, MaskedClassifier, ModelConfig, build_model, count_parameters
from .planner import DEFAULT_BATCH_OVERHEAD_FRAMES, Plan, shuffled_training_plan
from .predict import PRECISIONS, _autocast_dtype
from .split import SplitRule

__all__ = [
    "DEFAULT_CPU_TRAIN_BUDGET_MB",
    "MIN_EFFICIENCY",
    "TrainConfig",
    "TrainError",
    "TrainResult",
    "crop_starts",
    "lr_at",
    "resume_path_for",
    "spec_augment",
    "train",
    "training_plan",
    "training_rows",
]

log = logging.getLogger(__name__)

DEFAULT_CPU_TRAIN_BUDGET_MB = 1024.0
"""Memory for one training batch on CPU (MiB) unless configured (activations saved for backward)."""

MIN_EFFICIENCY = 0.95
"""Padding efficiency (real / computed frames) a training plan is expected to reach; lower is logged."""

RESUME_FORMAT = "specstore-resume"
RESUME_VERSION = 1

#: TrainConfig fields that may change between an interrupted run and its resumption.
_RUNTIME_FIELDS = ("device", "precision", "budget_mb")


class TrainError(ValueError):
    """Training cannot start or continue (no labels, nothing to train on, bad config, diverged)."""


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a training run; JSON-able, saved in the checkpoint's ``extra``.

    Optimisation: ``epochs``; ``lr`` (peak learning rate of AdamW, reached
    after ``warmup_fraction`` of the epochs, then cosine decay to
    ``lr * final_lr_ratio``); ``weight_decay`` (not applied to BN weights and
    biases); ``label_smoothing``; ``class_weighted`` (cross-entropy weights
    inversely proportional to each class's training count, mean 1).
    Batches: ``max_batch`` clips, ``budget_mb`` MiB per batch (None: 1024 on
    CPU, free GPU memory minus a margin on CUDA).  Data: ``crop_seconds``
    (random crop per clip per epoch; None = whole clips); SpecAugment:
    ``time_masks`` masks of up to ``time_mask_frames`` frames and
    ``freq_masks`` of up to ``freq_mask_bins`` bins per clip (0 disables);
    ``val_fraction`` and ``seed`` (the content-hash split, and every random
    draw).  Model: ``arch``, ``width``, ``depth``, ``dropout`` (see
    :class:`infer.models.ModelConfig`); ``feature`` (None = the store's
    default).  Run: ``device`` (auto/cpu/cuda[:N]), ``precision`` (auto: bf16
    autocast on CUDA when supported, else fp16 with a grad scaler; fp32 on
    CPU; or fp32/bf16/fp16).
    """

    epochs: int = 30
    lr: float = 3e-3
    weight_decay: float = 1e-2
    warmup_fraction: float = 0.1
    final_lr_ratio: float = 0.01
    label_smoothing: float = 0.0
    class_weighted: bool = False
    max_batch: int = 16
    budget_mb: float | None = None
    crop_seconds: float | None = 10.0
    time_masks: int = 2
    time_mask_frames: int = 24
    freq_masks: int = 2
    freq_mask_bins: int = 12
    val_fraction: float = 0.2
    seed: int = 0
    arch: str = "cnn"
    width: int = 32
    depth: int = 4
    dropout: float = 0.1
    feature: str | None = None
    device: str = "auto"
    precision: str = "auto"

    def __post_init__(self) -> None:
        if not isinstance(self.epochs, int) or self.epochs < 1:
            raise TrainError(f"epochs must be a positive integer, got {self.epochs!r}")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise TrainError(f"lr must be positive, got {self.lr!r}")
        if self.weight_decay < 0 or not 0 <= self.warmup_fraction < 1 or not 0 < self.final_lr_ratio <= 1:
            raise TrainError("weight_decay must be >= 0, warmup_fraction in [0, 1), final_lr_ratio in (0, 1]")
        if not 0 <= self.label_smoothing < 1:
            raise TrainError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        if self.max_batch < 1:
            raise TrainError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.budget_mb is not None and not self.budget_mb > 0:
            raise TrainError(f"budget_mb must be positive, got {self.budget_mb}")
        if self.crop_seconds is not None and not self.crop_seconds > 0:
            raise TrainError(f"crop_seconds must be positive (or None for whole clips), got {self.crop_seconds}")
        if min(self.time_masks, self.time_mask_frames, self.freq_masks, self.freq_mask_bins) < 0:
            raise TrainError("SpecAugment mask counts and widths must be >= 0")
        if not 0 <= self.val_fraction < 1:
            raise TrainError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}")
        if self.seed < 0:
            raise TrainError(f"seed must be >= 0, got {self.seed}")
        if self.arch not in ARCHS:
            raise TrainError(f"arch must be one of {', '.join(ARCHS)}, not {self.arch!r}")
        if self.precision not in PRECISIONS:
            raise TrainError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TrainError(f"unknown training config field(s): {', '.join(unknown)}")
        return cls(**data)

    def resume_key(self) -> dict[str, Any]:
        """The fields a resumed run must share with the interrupted one."""
        return {k: v for k, v in self.to_dict().items() if k not in _RUNTIME_FIELDS}


@dataclass
class TrainResult:
    """What a call to :func:`train` did.

    ``history``: one dict per finished epoch (this run's and any resumed
    ones): ``epoch`` (1-based), ``loss`` (mean training loss), ``train_accuracy``,
    ``val_accuracy``/``val_loss`` (None without a validation set), ``lr`` (at
    the epoch's end), ``seconds``, ``batches``, ``efficiency`` (padding).
    ``resumed_from``: epochs already done when this call started.
    """

    model_path: Path
    resume_path: Path
    history: list[dict[str, Any]]
    best_epoch: int
    best_val_accuracy: float | None
    resumed_from: int
    epochs_run: int
    n_train: int
    n_val: int
    seconds: float
    config: TrainConfig
    model_config: ModelConfig
    extra: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        """The one-line summary ``make train`` prints."""
        best = (f"best epoch {self.best_epoch}: validation accuracy {self.best_val_accuracy:.1%} on {self.n_val} clips"
                if self.best_val_accuracy is not None else f"best epoch {self.best_epoch} (by training loss; "
                "no validation clips)")
        if not self.epochs_run:
            return (f"already trained: {self.resumed_from} of {self.config.epochs} epochs done (delete "
                    f"{self.resume_path} to train again); {best}; checkpoint {self.model_path}")
        return (f"trained epochs {self.resumed_from + 1}-{self.resumed_from + self.epochs_run} of "
                f"{self.config.epochs} on {self.n_train} clips in {self.seconds:.1f} s; {best}; "
                f"checkpoint {self.model_path}")


# -- pure pieces -----------------------------------------------------------------------------

def lr_at(progress: float, config: TrainConfig) -> float:
    """Learning rate at ``progress`` epochs into training (a float; 0 = start).

    Linear warm-up from ``lr / 25`` to ``lr`` over ``warmup_fraction * epochs``
    epochs, then a cosine decay to ``lr * final_lr_ratio`` at ``epochs``.
    """
    total = float(config.epochs)
    warm = config.warmup_fraction * total
    peak = config.lr
    if progress < warm:
        return peak * (0.04 + 0.96 * progress / warm)
    span = max(total - warm, 1e-9)
    t = min(max((progress - warm) / span, 0.0), 1.0)
    low = peak * config.final_lr_ratio
    return low + 0.5 * (peak - low) * (1.0 + math.cos(math.pi * t))


def crop_starts(lengths: np.ndarray, crop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Uniform random start frame of a ``crop``-frame window inside each clip of ``lengths`` frames."""
    room = np.asarray(lengths, dtype=np.int64) - np.asarray(crop, dtype=np.int64)
    if (room < 0).any():
        raise ValueError("crops must not be longer than their clips")
    return np.floor(rng.random(len(room)) * (room + 1)).astype(np.int64)


def spec_augment(
    x: Tensor,
    lengths: Tensor,
    rng: np.random.Generator,
    *,
    time_masks: int,
    time_mask_frames: int,
    freq_masks: int,
    freq_mask_bins: int,
    fill: float,
) -> Tensor:
    """SpecAugment-style masking of ``x (B, 1, n_bins, T)`` in place; returns ``x``.

    Per clip, ``time_masks`` bands of a uniform width in ``[0, time_mask_frames]``
    (at most a fifth of the clip) set to ``fill`` inside the clip's real
    frames ``[0, length)``, and ``freq_masks`` bands of width in
    ``[0, freq_mask_bins]`` bins across the real frames.  Padding stays zero,
    so the model's masking is unaffected.  ``fill`` is the model's input mean
    (dB): a masked value becomes 0 after normalisation.
    """
    n_bins = x.shape[2]
    for b, length in enumerate(lengths.tolist()):
        for _ in range(time_masks):
            width = int(rng.integers(0, min(time_mask_frames, length // 5) + 1))
            if width:
                t0 = int(rng.integers(0, length - width + 1))
                x[b, :, :, t0:t0 + width] = fill
        for _ in range(freq_masks):
            width = int(rng.integers(0, min(freq_mask_bins, n_bins // 2) + 1))
            if width:
                f0 = int(rng.integers(0, n_bins - width + 1))
                x[b, :, f0:f0 + width, :length] = fill
    return x


def training_plan(
    lengths: np.ndarray,
    *,
    budget_bytes: int,
    cost: CostModel,
    max_batch: int,
    seed: int,
    epoch: int,
    frame_align: int,
    min_efficiency: float = MIN_EFFICIENCY,
) -> Plan:
    """One epoch's shuffled batches (:func:`infer.planner.shuffled_training_plan`) with efficiency >= the target.

    The planner's default price of a batch (1024 padded frames) suits
    inference over long clips; on short clips it keeps batches full at the
    cost of padding.  Here the price is halved until the plan's padding
    efficiency reaches ``min_efficiency`` (real / computed frames, computed
    frames rounded up to ``frame_align``), so batches stay as large as that
    target allows.  If even a zero price misses it (alignment padding of very
    short clips), the most efficient plan is returned and a warning logged.
    """
    best: Plan | None = None
    overhead = DEFAULT_BATCH_OVERHEAD_FRAMES
    while True:
        plan = shuffled_training_plan(lengths, budget_bytes=budget_bytes, cost_per_frame=cost.bytes_per_frame,
                                      max_batch=max_batch, seed=seed, epoch=epoch, fixed_overhead=cost.fixed_bytes,
                                      frame_align=frame_align, batch_overhead_frames=overhead)
        if best is None or plan.efficiency > best.efficiency:
            best = plan
        if plan.efficiency >= min_efficiency or overhead == 0.0:
            break
        overhead = overhead / 2 if overhead > 1.0 else 0.0
    if best.efficiency < min_efficiency:
        log.warning("epoch %d: training plan padding efficiency %.3f is below %.2f (clips shorter than a few "
                    "multiples of the model's time stride, %d frames)", epoch + 1, best.efficiency, min_efficiency,
                    frame_align)
    return best


def training_rows(store: Store, rule: SplitRule) -> tuple[np.ndarray, np.ndarray]:
    """``(train rows, val rows)`` of the labelled rows of ``store`` under ``rule``.

    Training rows keep one row per distinct ``(content, label)`` (a duplicate
    file is not trained on twice); validation keeps every labelled row (the
    prediction path runs each content once and counts every path, like
    ``make eval``).  Raises :class:`TrainError` for a store without labels.
    """
    labelled = np.flatnonzero(store.labels >= 0)
    if not len(labelled):
        raise TrainError(f"{store.location} has no labelled clips ({len(store)} unlabelled); training needs "
                         "labels: a folder-per-label corpus or a path,label CSV")
    hashes = [store.hashes[int(i)] for i in labelled]
    val = rule.is_val(hashes)
    seen: set[tuple[str, int]] = set()
    train: list[int] = []
    for row, h, is_val in zip(labelled.tolist(), hashes, val.tolist()):
        key = (h, int(store.labels[row]))
        if not is_val and key not in seen:
            seen.add(key)
            train.append(row)
    return np.array(train, dtype=np.int64), labelled[val]


def resume_path_for(model_path: str | os.PathLike[str]) -> Path:
    """``models/genre.pt`` -> ``models/genre.resume.pt``."""
    p = Path(model_path)
    return p.with_name(p.stem + ".resume.pt") if p.suffix else p.with_name(p.name + ".resume.pt")


def _data_fingerprint(store: Store, train_rows: np.ndarray, val_rows: np.ndarray, feature: str) -> str:
    """Digest of the data's identity: (hash, label name) pairs of each split, label names, feature spec."""
    h = hashlib.blake2b(digest_size=16)
    h.update(repr((store.label_names, feature, sorted(store.specs[feature].to_dict().items()))).encode())
    for tag, rows in (("train", train_rows), ("val", val_rows)):
        h.update(tag.encode())
        for key in sorted((store.hashes[int(r)], store.label_names[int(store.labels[r])]) for r in rows):
            h.update(f"{key[0]}\x00{key[1]}\x01".encode())
    return h.hexdigest()


def _epoch_seed(seed: int, epoch: int, stream: int) -> int:
    """A 63-bit seed for one random stream of one epoch."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


# -- the training run ------------------------------------------------------------------------

@dataclass
class _Data:
    """The rows and arrays one run uses."""

    view: FeatureView
    train_rows: np.ndarray
    train_labels: np.ndarray
    train_lengths: np.ndarray
    val_rows: np.ndarray
    val_labels: np.ndarray
    crop_frames: np.ndarray  # per training clip: frames fed per epoch (crop, budget and length limited)


def _fit_normalisation(view: FeatureView, rows: np.ndarray, seed: int, max_clips: int = 128,
                       max_frames: int = 2048) -> tuple[float, float]:
    """Mean and standard deviation (dB) of a sample of training frames (float64 accumulation)."""
    rng = np.random.default_rng(_epoch_seed(seed, 0, 99))
    pick = rows if len(rows) <= max_clips else rng.choice(rows, size=max_clips, replace=False)
    total = 0.0
    total_sq = 0.0
    count = 0
    for r in pick.tolist():
        frames = view.frames(int(r))
        if len(frames) > max_frames:
            start = int(rng.integers(0, len(frames) - max_frames + 1))
            frames = frames[start:start + max_frames]
        a = np.asarray(frames, dtype=np.float64)
        total += float(a.sum())
        total_sq += float(np.square(a).sum())
        count += a.size
    mean = total / count
    std = math.sqrt(max(total_sq / count - mean * mean, 0.0))
    return mean, max(std, 1e-3)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.ndim > 1 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _class_weights(labels: np.ndarray, n_classes: int) -> np.ndarray:
    counts = np.bincount(labels, minlength=n_classes).astype(np.float64)
    present = counts > 0
    w = np.ones(n_classes, dtype=np.float64)
    w[present] = counts[present].sum() / (present.sum() * counts[present])
    return w


def _make_batch(data: _Data, ids: np.ndarray, rng: np.random.Generator, stride: int) -> tuple[Tensor, Tensor]:
    """Random crops of training clips ``ids`` read from the store, padded to the stride."""
    crop = data.crop_frames[ids]
    starts = crop_starts(data.train_lengths[ids], crop, rng)
    arrays = [data.view.frames(int(r))[s:s + c].T for r, s, c in zip(data.train_rows[ids].tolist(),
                                                                       starts.tolist(), crop.tolist())]
    batch = collate(arrays, multiple_of=stride)
    return batch.x, batch.lengths


@dataclass
class _Step:
    loss: float  # mean loss of the batch (weighted mean with class weights)
    correct: int
    oom_splits: int


def _forward_backward(model: MaskedClassifier, x: Tensor, lengths: Tensor, y: Tensor, *,
                      autocast: torch.dtype | None, weights: Tensor | None, label_smoothing: float,
                      scaler: torch.amp.GradScaler) -> _Step:
    """Forward and backward of one batch, gradients accumulated into the parameters.

    On a CUDA out-of-memory the batch is split in halves, each contributing
    its share of the batch's loss, so the gradient is the whole batch's
    (only the BatchNorm statistics then come from the halves).
    """
    denom = weights[y].sum() if weights is not None else torch.tensor(float(len(y)), device=y.device)

    def run(xs: Tensor, ls: Tensor, ys: Tensor) -> tuple[float, int, int]:
        try:
            with torch.autocast(xs.device.type, dtype=autocast, enabled=autocast is not None):
                logits = model(xs, ls)
            per_clip = F.cross_entropy(logits.float(), ys, weight=weights, label_smoothing=label_smoothing,
                                       reduction="none")
            part = per_clip.sum() / denom
            scaler.scale(part).backward()
            return float(part.detach()), int((logits.detach().argmax(1) == ys).sum()), 0
        except torch.cuda.OutOfMemoryError:
            if len(ys) == 1:
                raise
            torch.cuda.empty_cache()
            log.warning("CUDA out of memory on a training batch of %d x %d frames; splitting it", len(ys),
                        xs.shape[-1])
            half = len(ys) // 2
            a = run(xs[:half], ls[:half], ys[:half])
            b = run(xs[half:], ls[half:], ys[half:])
            return a[0] + b[0], a[1] + b[1], a[2] + b[2] + 1

    loss, correct, splits = run(x, lengths, y)
    return _Step(loss, correct, splits)


def _save_atomic(payload: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _load_resume(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError, OSError) as e:
        log.warning("ignoring unreadable resume file %s (%s); starting afresh", path, type(e).__name__)
        return None
    if not isinstance(raw, dict) or raw.get("format") != RESUME_FORMAT or raw.get("version") != RESUME_VERSION:
        log.warning("ignoring %s: not a specstore resume file of version %d; starting afresh", path, RESUME_VERSION)
        return None
    return raw


def _score(entry: dict[str, Any]) -> tuple[float, float]:
    """Larger is better: (val accuracy, -val loss), or (-train loss, 0) without validation."""
    if entry.get("val_accuracy") is not None:
        return float(entry["val_accuracy"]), -float(entry["val_loss"])
    return -float(entry["loss"]), 0.0


def train(
    store: str | Store,
    model_path: str | os.PathLike[str],
    config: TrainConfig | None = None,
    *,
    progress: bool = True,
    threads: int | None = None,
    margin_mb: float | None = None,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train a classifier on ``store``'s labelled clips; the best checkpoint goes to ``model_path``.

    ``config`` fields may also be given as keyword ``overrides``.  ``threads``:
    CPU threads (default all cores); ``margin_mb``: GPU memory kept free
    (see :func:`infer.device.memory_budget`).
    ``on_epoch_end(entry)`` is called with each epoch's history entry after
    the checkpoint and resume file are written (an exception there stops
    training as an interruption would; a rerun resumes).  Raises
    :class:`TrainError` (e.g. a store without labels), ``StoreError``,
    ``DeviceError`` with one-line messages.
    """
    cfg = config or TrainConfig()
    if overrides:
        cfg = TrainConfig.from_dict({**cfg.to_dict(), **overrides})
    t0 = time.perf_counter()
    s = store if isinstance(store, Store) else open_store(store)
    feature = cfg.feature or s.default_feature
    if feature not in s.specs:
        raise TrainError(f"store has no feature {feature!r}; it has {', '.join(s.specs)}")
    spec = s.specs[feature]
    rule = SplitRule(cfg.val_fraction, cfg.seed)
    train_rows, val_rows = training_rows(s, rule)
    if len(train_rows) == 0:
        raise TrainError(f"all {len(val_rows)} labelled clips fell in the validation split; lower val_fraction")
    n_classes = len(s.label_names)
    train_labels = s.labels[train_rows].astype(np.int64)
    if len(np.unique(train_labels)) < 2:
        raise TrainError(f"the training split holds only one label ({s.label_names[int(train_labels[0])]}); "
                         "a classifier needs at least two")
    if not len(val_rows):
        log.warning("no validation clips (val_fraction %.2f): the best checkpoint is chosen by training loss",
                    cfg.val_fraction)

    device = choose_device(cfg.device)
    if device.type == "cpu":
        set_cpu_threads(threads)
    try:
        autocast = _autocast_dtype(cfg.precision, device)
    except ValueError as e:
        raise TrainError(str(e)) from None
    model_path = Path(model_path)
    resume_path = resume_path_for(model_path)
    fingerprint = _data_fingerprint(s, train_rows, val_rows, feature)

    # -- resume or start ---------------------------------------------------------------------
    state = _load_resume(resume_path)
    if state is not None and (state.get("config_key") != cfg.resume_key() or state.get("data") != fingerprint):
        what = "configuration" if state.get("config_key") != cfg.resume_key() else "training data"
        log.warning("%s was written for a different %s; starting afresh (it will be overwritten)", resume_path, what)
        state = None
    if state is not None and not model_path.is_file():
        log.warning("%s is missing (its best weights are lost); starting afresh", model_path)
        state = None
    if state is not None:
        model_cfg = ModelConfig.from_dict(state["model_config"])
    else:
        mean, std = _fit_normalisation(s.feature(feature), train_rows, cfg.seed)
        model_cfg = ModelConfig(arch=cfg.arch, n_bins=spec.n_bins, n_classes=n_classes, width=cfg.width,
                                depth=cfg.depth, dropout=cfg.dropout, input_mean=round(mean, 4),
                                input_std=round(std, 4))
    torch.manual_seed(cfg.seed)
    model = build_model(model_cfg).to(device)
    optimizer = torch.optim.AdamW(_param_groups(model, cfg.weight_decay), lr=cfg.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=autocast == torch.float16)
    history: list[dict[str, Any]] = []
    best_score: tuple[float, float] | None = None
    best_epoch = 0
    start_epoch = 0
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        history = list(state["history"])
        start_epoch = int(state["epoch"])
        best_epoch = int(state["best_epoch"])
        best_score = tuple(state["best_score"]) if state.get("best_score") is not None else None  # type: ignore[assignment]
        log.info("resuming %s after epoch %d of %d", model_path, start_epoch, cfg.epochs)

    # -- budget, crops ------------------------------------------------------------------------
    stride = model.time_stride
    budget_mb = cfg.budget_mb if cfg.budget_mb is not None or device.type == "cuda" else DEFAULT_CPU_TRAIN_BUDGET_MB
    budget = memory_budget(device, budget_mb, margin_mb)
    train_cost = measure_cost_per_frame(copy.deepcopy(model).train(), spec.n_bins, device=device,
                                        autocast=autocast, training=True)
    eval_cost = measure_cost_per_frame(copy.deepcopy(model).eval(), spec.n_bins, device=device, autocast=autocast)
    max_frames = int((budget.bytes - train_cost.fixed_bytes) // train_cost.bytes_per_frame) // stride * stride
    if max_frames < stride:
        raise TrainError(f"a memory budget of {budget.bytes / 2**20:.0f} MiB cannot hold one clip of {stride} "
                         f"frames for training ({train_cost.bytes_per_frame / 1024:.1f} KiB/frame); raise BUDGET_MB")
    train_lengths = s.lengths[train_rows].astype(np.int64)
    limit = max_frames
    if cfg.crop_seconds is not None:
        limit = min(limit, max(stride, int(round(cfg.crop_seconds / spec.frame_seconds)) // stride * stride))
    crop_frames = np.minimum(train_lengths, limit)
    cut = int((train_lengths > max_frames).sum())
    if cut:
        log.warning("%d training clip(s) exceed the memory budget whole; they are trained on random crops of "
                    "%d frames", cut, max_frames)
    data = _Data(s.feature(feature), train_rows, train_labels, train_lengths, val_rows,
                 s.labels[val_rows].astype(np.int64), crop_frames)
    weights = torch.tensor(_class_weights(train_labels, n_classes), dtype=torch.float32, device=device) \
        if cfg.class_weighted else None
    log.info("training %s (%d parameters) on %d clips, validating on %d; %s; budget %.0f MiB (%s), "
             "%.1f KiB per padded clip-frame in training", model_cfg.arch, count_parameters(model), len(train_rows),
             len(val_rows), device, budget.bytes / 2**20, budget.source, train_cost.bytes_per_frame / 1024)

    split_record = rule.to_dict()
    base_extra: dict[str, Any] = {
        "trained": True, "train_config": cfg.to_dict(), "split": split_record, "store": str(s.location),
        "n_train": int(len(train_rows)), "n_val": int(len(val_rows)),
        "train_label_counts": {s.label_names[k]: int(c) for k, c in
                               enumerate(np.bincount(train_labels, minlength=n_classes))},
    }

    def write_resume(epoch: int, complete: bool) -> None:
        _save_atomic({
            "format": RESUME_FORMAT, "version": RESUME_VERSION, "config": cfg.to_dict(),
            "config_key": cfg.resume_key(), "data": fingerprint, "model_config": model_cfg.to_dict(),
            "epoch": epoch, "complete": complete, "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "history": history,
            "best_epoch": best_epoch, "best_score": list(best_score) if best_score is not None else None,
            "rng_torch": torch.get_rng_state(),
        }, resume_path)

    # -- epochs -------------------------------------------------------------------------------
    epochs_run = 0
    bar = tqdm(total=cfg.epochs, initial=start_epoch, unit="epoch", desc="training", disable=not progress)
    try:
        for epoch in range(start_epoch, cfg.epochs):
            e0 = time.perf_counter()
            torch.manual_seed(_epoch_seed(cfg.seed, epoch, 0))
            rng = np.random.default_rng(_epoch_seed(cfg.seed, epoch, 1))
            plan = training_plan(crop_frames, budget_bytes=budget.bytes, cost=train_cost, max_batch=cfg.max_batch,
                                 seed=cfg.seed, epoch=epoch, frame_align=stride)
            model.train()
            loss_sum, correct, seen, oom_splits = 0.0, 0, 0, 0
            lr = lr_at(epoch, cfg)
            for bi, ids in enumerate(plan.batches):
                lr = lr_at(epoch + bi / len(plan.batches), cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, lengths = _make_batch(data, ids, rng, stride)
                if cfg.time_masks or cfg.freq_masks:
                    spec_augment(x, lengths, rng, time_masks=cfg.time_masks, time_mask_frames=cfg.time_mask_frames,
                                 freq_masks=cfg.freq_masks, freq_mask_bins=cfg.freq_mask_bins,
                                 fill=model_cfg.input_mean)
                y = torch.from_numpy(train_labels[ids]).to(device)
                x, lengths = x.to(device, non_blocking=True), lengths.to(device)
                optimizer.zero_grad(set_to_none=True)
                step = _forward_backward(model, x, lengths, y, autocast=autocast, weights=weights,
                                         label_smoothing=cfg.label_smoothing, scaler=scaler)
                if not math.isfinite(step.loss) and not scaler.is_enabled():
                    raise TrainError(f"training diverged (loss {step.loss}) in epoch {epoch + 1}; lower the LR")
                scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
                scaler.update()
                oom_splits += step.oom_splits
                if math.isfinite(step.loss):
                    loss_sum += step.loss * len(ids)
                    correct += step.correct
                    seen += len(ids)
                bar.set_postfix_str(f"loss {loss_sum / max(seen, 1):.3f}" + (
                    f", val acc {history[-1]['val_accuracy']:.3f}"
                    if history and history[-1]["val_accuracy"] is not None else ""), refresh=False)
            entry: dict[str, Any] = {
                "epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_accuracy": correct / max(seen, 1),
                "val_accuracy": None, "val_loss": None, "lr": lr, "batches": plan.n_batches,
                "efficiency": plan.efficiency, "oom_splits": oom_splits,
            }
            if len(val_rows):
                res = logits_for_rows(model, data.view, val_rows, device=device, budget_bytes=budget.bytes,
                                      max_batch=cfg.max_batch, autocast=autocast, hashes=s.hashes, cost=eval_cost)
                vl = torch.from_numpy(res.logits)
                vy = torch.from_numpy(data.val_labels)
                entry["val_accuracy"] = float((vl.argmax(1) == vy).float().mean())
                entry["val_loss"] = float(F.cross_entropy(vl, vy))
            entry["seconds"] = time.perf_counter() - e0
            history.append(entry)
            score = _score(entry)
            if best_score is None or score > best_score:
                best_score, best_epoch = score, epoch + 1
                save_checkpoint(Checkpoint.from_model(model, s.label_names, feature, spec, extra={
                    **base_extra, "epoch": epoch + 1, "best_epoch": epoch + 1,
                    "val_accuracy": entry["val_accuracy"], "history": history}), model_path)
            write_resume(epoch + 1, complete=epoch + 1 == cfg.epochs)
            epochs_run += 1
            bar.update(1)
            bar.set_postfix_str(f"loss {entry['loss']:.3f}" + (
                f", val acc {entry['val_accuracy']:.3f}" if entry["val_accuracy"] is not None else ""))
            log.info("epoch %d/%d: loss %.4f, train acc %.3f, val acc %s, lr %.2e, %d batches (efficiency %.3f), "
                     "%.1f s", epoch + 1, cfg.epochs, entry["loss"], entry["train_accuracy"],
                     "-" if entry["val_accuracy"] is None else f"{entry['val_accuracy']:.3f}", lr, plan.n_batches,
                     plan.efficiency, entry["seconds"])
            if on_epoch_end is not None:
                on_epoch_end(entry)
    finally:
        bar.close()

    # The checkpoint at model_path keeps the best weights; give it the whole history.
    if epochs_run:
        ckpt = load_checkpoint(model_path)
        ckpt.extra.update({"history": history, "epochs_done": len(history), "complete": True})
        save_checkpoint(ckpt, model_path)
    best_entry = history[best_epoch - 1] if best_epoch else {}
    return TrainResult(
        model_path=model_path, resume_path=resume_path, history=history, best_epoch=best_epoch,
        best_val_accuracy=best_entry.get("val_accuracy"), resumed_from=start_epoch, epochs_run=epochs_run,
        n_train=len(train_rows), n_val=len(val_rows), seconds=time.perf_counter() - t0, config=cfg,
        model_config=model_cfg, extra=base_extra,
    )
