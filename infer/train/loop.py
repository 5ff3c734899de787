"""``make train``: fit a model on a store's labelled clips, resumably.

Flow: open the store (index only) -> split the labelled rows by work or
content (:mod:`infer.split`; duplicates and works never straddle it) -> fit
the model's input normalisation on training frames -> the engine
(:mod:`infer.runtime`) measures the model's training memory per padded
clip-frame and gives the :class:`~infer.budget.Budget` -> every epoch a fresh
:func:`infer.planner.training_plan` over the (cropped) lengths -> random
crops read straight from the store's mmap views, SpecAugment masks inside
real frames (:mod:`.augment`) -> AdamW with warm-up and cosine decay
(:mod:`.schedule`), autocast on CUDA -> validation on whole held-out clips
with the engine's prediction loop -> the best checkpoint (validation
accuracy, then validation loss; training loss when nothing is held out) at
``model_path``, ``metrics.csv`` (one row per epoch) and the resolved
configuration (``<model>.config.json``) beside it.

Resuming: after every epoch ``<model>.resume.pt`` (:mod:`.resume`) is
written.  Rerunning with the same configuration on the same data continues
after the last finished epoch; every random draw of an epoch is seeded from
``(seed, epoch)``, so a resumed run follows the uninterrupted run's path.  An
existing checkpoint is never replaced silently: training to a ``model_path``
that holds a model from another configuration or other data (or with no
resume file) is refused unless ``overwrite=True``.
"""

from __future__ import annotations

import copy
import csv
import ctypes
import hashlib
import io
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from store import ConfigError, Store, check_output_path, open_store, write_atomic

from ..augment import Augment, SpecAugment
from ..budget import Budget
from ..checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from ..contract import ModelSpec, masks_padding, spec_of, time_stride, window_frames
from ..data import BudgetBatchSampler, PadCollate, StoreDataset, feature_specs, prefetch
from ..models import count_parameters
from ..runtime import Engine, RunOptions
from ..split import SplitError, SplitRule, training_fingerprint, training_rows
from ..trust import Trust, UntrustedModelError, with_named
from .config import TrainConfig, TrainError
from .resume import ResumeState, load_resume, resume_path_for, save_resume
from .schedule import lr_at

__all__ = ["TrainResult", "config_path_for", "default_training_feature", "metrics_path_for", "train"]

log = logging.getLogger("infer.train")

METRICS_COLUMNS = ("epoch", "loss", "train_accuracy", "val_accuracy", "val_f1", "val_loss", "lr", "efficiency",
                   "batches", "seconds")
"""Columns of ``metrics.csv``, one row per finished epoch."""


def metrics_path_for(model_path: str | os.PathLike[str]) -> Path:
    """``models/genre.pt`` -> ``models/genre.metrics.csv``."""
    p = Path(model_path)
    return p.with_name(p.stem + ".metrics.csv")


def config_path_for(model_path: str | os.PathLike[str]) -> Path:
    """``models/genre.pt`` -> ``models/genre.config.json`` (the resolved training configuration)."""
    p = Path(model_path)
    return p.with_name(p.stem + ".config.json")


@dataclass
class TrainResult:
    """What a call to :func:`train` did.

    ``history``: one dict per finished epoch (this run's and any resumed
    ones): ``epoch`` (1-based), ``loss`` (mean training loss), ``train_accuracy``,
    ``val_accuracy``/``val_f1``/``val_loss`` (None without a validation set),
    ``lr`` (at the epoch's end), ``seconds``, ``batches``, ``efficiency``
    (padding).  ``resumed_from``: epochs already done when this call started.
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
    model_spec: ModelSpec
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


def _epoch_seed(seed: int, epoch: int, stream: int) -> int:
    """A 63-bit seed for one random stream of one epoch."""
    digest = hashlib.blake2b(f"{seed}:{epoch}:{stream}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass(frozen=True)
class FrameStats:
    """Mean and standard deviation (dB) of a sample of training frames: overall, and per bin."""

    mean: float
    std: float
    bin_mean: np.ndarray
    bin_std: np.ndarray


def frame_stats(dataset: StoreDataset, seed: int, max_clips: int = 128, max_frames: int = 2048) -> FrameStats:
    """:class:`FrameStats` of up to ``max_clips`` items (a window of ``max_frames`` each), float64 sums."""
    rng = np.random.default_rng(_epoch_seed(seed, 0, 99))
    n = len(dataset)
    pick = np.arange(n) if n <= max_clips else rng.choice(n, size=max_clips, replace=False)
    total = np.zeros(dataset.n_bins)
    total_sq = np.zeros(dataset.n_bins)
    count = 0
    for i in pick.tolist():
        length = int(dataset.full_lengths[i])
        start = int(rng.integers(0, length - max_frames + 1)) if length > max_frames else 0
        a = dataset.window(i, start, min(length, start + max_frames)).astype(np.float64)
        total += a.sum(axis=1)
        total_sq += np.square(a).sum(axis=1)
        count += a.shape[1]
    bin_mean = total / count
    bin_std = np.sqrt(np.maximum(total_sq / count - bin_mean**2, 0.0))
    mean = float(total.sum() / (count * dataset.n_bins))
    std = math.sqrt(max(float(total_sq.sum() / (count * dataset.n_bins)) - mean * mean, 0.0))
    return FrameStats(mean, max(std, 1e-3), bin_mean, np.maximum(bin_std, 1e-3))


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of returning it to the system.

    CPU training allocates and frees activations of tens of MiB every step;
    by default glibc serves those with fresh ``mmap`` s and unmaps them on
    free, so every step page-faults its activations in again (measured: a
    third of a training run's CPU time spent in the kernel on 2 cores).
    Raising the mmap and trim thresholds keeps them in the heap; the values
    are the same.  A no-op (False) where the C library is not glibc.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 1 << 30)) and bool(libc.mallopt(m_trim_threshold, (1 << 31) - 1))
    except (OSError, AttributeError):
        return False


def default_training_feature(store: Store) -> str:
    """What training uses when the config names no feature: every stored feature, stacked (``mel+cqt``).

    A store with one feature (``FEATURES=mel``) trains on that one.
    """
    return "+".join(store.specs)


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    decay: list[torch.Tensor] = []
    no_decay: list[torch.Tensor] = []
    for p in model.parameters():
        (decay if p.ndim > 1 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _class_weights(labels: np.ndarray, n_classes: int) -> np.ndarray:
    counts = np.bincount(labels, minlength=n_classes).astype(np.float64)
    present = counts > 0
    w = np.ones(n_classes, dtype=np.float64)
    w[present] = counts[present].sum() / (present.sum() * counts[present])
    return w


@dataclass
class _Step:
    loss: float  # mean loss of the batch (weighted mean with class weights)
    correct: int
    oom_splits: int


@dataclass(frozen=True)
class _Mix:
    """A batch mixed with itself: ``lam * x + (1 - lam) * x[perm]``, targets likewise (mixup)."""

    lam: float
    perm: Tensor


def _mixup(x: Tensor, lengths: Tensor, y: Tensor, alpha: float, generator: torch.Generator
           ) -> tuple[Tensor, Tensor, Tensor, _Mix | None]:
    """Mix the batch (dB values) with a shuffled copy of itself; lengths become the shorter of each pair.

    The mixing weight is drawn from Beta(alpha, alpha) and folded to >= 0.5,
    so the first clip dominates (its label counts for the accuracy).
    """
    if alpha <= 0 or len(y) < 2:
        return x, lengths, y, None
    draw = int(torch.randint(0, 2**62, (1,), generator=generator))
    lam = float(np.random.default_rng(draw).beta(alpha, alpha))
    lam = max(lam, 1.0 - lam)
    perm = torch.randperm(len(y), generator=generator).to(y.device)
    mixed = x * lam + x[perm] * (1.0 - lam)
    return mixed, torch.minimum(lengths, lengths[perm]), y, _Mix(lam, perm)


class WeightAverage:
    """An exponential moving average of a model's weights and buffers, updated after every optimiser step.

    ``decay`` per step, warmed up as ``min(decay, (1 + t) / (10 + t))`` so the
    first steps do not drag the random initial weights along.  BatchNorm
    running statistics are averaged alike (``num_batches_tracked`` is copied).
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        self.model = copy.deepcopy(model).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.decay = decay
        self.steps = 0

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.steps += 1
        keep = min(self.decay, (1.0 + self.steps) / (10.0 + self.steps))
        mine = self.model.state_dict()
        for name, value in model.state_dict().items():
            if value.dtype.is_floating_point:
                mine[name].lerp_(value, 1.0 - keep)
            else:
                mine[name].copy_(value)

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "model": {k: v.detach().cpu() for k, v in self.model.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.model.load_state_dict(state["model"])


def _forward_backward(model: torch.nn.Module, engine: Engine, x: Tensor, lengths: Tensor, y: Tensor, *,
                      weights: Tensor | None, label_smoothing: float, scaler: torch.amp.GradScaler,
                      mix: _Mix | None = None) -> _Step:
    """Forward and backward of one batch, gradients accumulated into the parameters.

    On a CUDA out-of-memory the batch is split in halves, each contributing
    its share of the batch's loss, so the gradient is the whole batch's
    (only the BatchNorm statistics then come from the halves).  ``mix``: the
    batch was mixed (:func:`_mixup`); the loss is the same mix of the two
    targets' losses.
    """
    denom = weights[y].sum() if weights is not None else torch.tensor(float(len(y)), device=y.device)
    y_other = y[mix.perm] if mix is not None else None

    def run(xs: Tensor, ls: Tensor, ys: Tensor, others: Tensor | None = None) -> tuple[float, int, int]:
        try:
            with engine.amp():
                logits = model(xs, ls)
            per_clip = F.cross_entropy(logits.float(), ys, weight=weights, label_smoothing=label_smoothing,
                                       reduction="none")
            if mix is not None and others is not None:
                per_clip = mix.lam * per_clip + (1.0 - mix.lam) * F.cross_entropy(
                    logits.float(), others, weight=weights, label_smoothing=label_smoothing, reduction="none")
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
            a = run(xs[:half], ls[:half], ys[:half], None if others is None else others[:half])
            b = run(xs[half:], ls[half:], ys[half:], None if others is None else others[half:])
            return a[0] + b[0], a[1] + b[1], a[2] + b[2] + 1

    loss, correct, splits = run(x, lengths, y, y_other)
    return _Step(loss, correct, splits)


def _score(entry: dict[str, Any]) -> tuple[float, float]:
    """Larger is better: (val accuracy, -val loss), or (-train loss, 0) without validation."""
    if entry.get("val_accuracy") is not None:
        return float(entry["val_accuracy"]), -float(entry["val_loss"])
    return -float(entry["loss"]), 0.0


def _macro_f1(truth: np.ndarray, pred: np.ndarray) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(truth, pred, average="macro", zero_division=0))


def _metrics_csv(history: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=METRICS_COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for entry in history:
        w.writerow({k: ("" if entry.get(k) is None else entry.get(k)) for k in METRICS_COLUMNS})
    return buf.getvalue()


class _Scalars:
    """TensorBoard scalars next to the checkpoint when ``tensorboard`` is installed; a no-op otherwise."""

    def __init__(self, model_path: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.writer = None
            return
        self.writer = SummaryWriter(log_dir=str(model_path.with_name(model_path.stem + ".tensorboard")))

    def add(self, entry: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for key in METRICS_COLUMNS[1:]:
            if entry.get(key) is not None:
                self.writer.add_scalar(key, float(entry[key]), entry["epoch"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _resumable(state: ResumeState | None, cfg: TrainConfig, fingerprint: str, model_path: Path,
               overwrite: bool) -> ResumeState | None:
    """The state to resume from, or None to start afresh; refuses to replace a model unless ``overwrite``."""
    if state is not None and (state.config_key != cfg.resume_key() or state.data != fingerprint):
        what = "configuration" if state.config_key != cfg.resume_key() else "training data"
        if not overwrite and model_path.exists():
            raise TrainError(f"{model_path} holds a model trained with a different {what}; choose another MODEL "
                             "or pass --overwrite to replace it")
        log.warning("%s was written for a different %s; starting afresh (it will be overwritten)",
                    resume_path_for(model_path), what)
        return None
    if state is not None and not model_path.is_file():
        log.warning("%s is missing (its best weights are lost); starting afresh", model_path)
        return None
    if state is None and model_path.exists() and not overwrite:
        raise TrainError(f"{model_path} already exists and has no resume file from this configuration; choose "
                         "another MODEL or pass --overwrite to replace it")
    return state


def train(
    store: str | os.PathLike[str] | Store,
    model_path: str | os.PathLike[str],
    config: TrainConfig | None = None,
    *,
    progress: bool = True,
    threads: int | None = None,
    margin_mb: float | None = None,
    overwrite: bool = False,
    model: nn.Module | str | None = None,
    model_args: dict[str, Any] | None = None,
    on_epoch_end: Callable[[dict[str, Any]], None] | None = None,
    trust_model_code: Trust = False,
    **overrides: Any,
) -> TrainResult:
    """Train a classifier on ``store``'s labelled clips; the best checkpoint goes to ``model_path``.

    ``model``: None (the config's ``arch``), an import path
    ``package.module:Class``, or an ``nn.Module`` instance following the
    contract of :mod:`infer.contract`; ``model_args``: its constructor's
    keyword arguments (JSON values), recorded in the checkpoint so it can be
    rebuilt without pickle.  ``model`` is trusted (you name it); an import
    path in the config's ``arch`` (which may come from a file) needs
    ``trust_model_code`` (True, or the trusted import paths; see
    :mod:`infer.trust`).  ``config`` fields may also be given as keyword
    ``overrides``.  ``threads``:
    CPU threads (default all cores); ``margin_mb``: GPU memory kept free.
    ``overwrite``: replace an existing ``model_path`` that this configuration
    cannot resume.  ``on_epoch_end(entry)`` is called with each epoch's
    history entry after the checkpoint and resume file are written (an
    exception there stops training as an interruption would; a rerun
    resumes).  Raises :class:`TrainError` (e.g. a store without labels),
    ``StoreError``, ``DeviceError`` with one-line messages.
    """
    cfg = config or TrainConfig()
    if overrides:
        cfg = TrainConfig.from_dict({**cfg.to_dict(), **overrides})
    named = model if isinstance(model, str) else (
        f"{type(model).__module__}:{type(model).__qualname__}" if isinstance(model, nn.Module) else None)
    trust = with_named(trust_model_code, *([named] if named else []))
    t0 = time.perf_counter()
    model_path = check_output_path(model_path, what="MODEL")
    s = store if isinstance(store, Store) else open_store(store)
    try:
        specs = feature_specs(s, cfg.feature or default_training_feature(s))
    except ConfigError as e:
        raise TrainError(str(e)) from None
    if cfg.feature is None:
        log.info("training on %s (the default: every feature the store holds, stacked frame by frame)",
                 "+".join(specs))
    feature = "+".join(specs)
    spec = next(iter(specs.values()))  # the frame grid every part shares
    n_bins = sum(p.n_bins for p in specs.values())
    rule = SplitRule(cfg.val_fraction, cfg.seed)
    try:
        train_rows, val_rows = training_rows(s, rule)
    except SplitError as e:
        raise TrainError(str(e)) from None
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

    engine = Engine(RunOptions(device=cfg.device, precision=cfg.precision, budget_mb=cfg.budget_mb,
                               margin_mb=margin_mb, max_batch=cfg.max_batch, threads=threads,
                               channels_last=False, progress=False))
    device = engine.device
    if device.type == "cpu":
        keep_freed_memory()
    resume_path = resume_path_for(model_path)
    fingerprint = training_fingerprint(s, rule, feature)
    state = _resumable(load_resume(resume_path), cfg, fingerprint, model_path, overwrite)

    # -- the model: resumed or fresh ---------------------------------------------------------------
    stats = frame_stats(StoreDataset(s, feature, rows=train_rows), cfg.seed)
    mean, std = stats.mean, stats.std
    if state is not None:
        model_spec = ModelSpec.from_dict(state.model_spec)
    else:
        model_spec = _model_spec(cfg, model, model_args, {
            "n_bins": n_bins, "n_classes": n_classes, "input_mean": round(mean, 4), "input_std": round(std, 4)},
            stats, trust)
    torch.manual_seed(cfg.seed)
    net = model if isinstance(model, nn.Module) else model_spec.build(trust, source="the training config")
    net = net.to(device)
    if cfg.grad_checkpoint:
        if not hasattr(net, "grad_checkpoint"):
            raise TrainError(f"{type(net).__name__} has no grad_checkpoint attribute: it does not support "
                             "gradient checkpointing")
        setattr(net, "grad_checkpoint", True)  # noqa: B010 - a plain attribute, see infer.contract
    optimizer = torch.optim.AdamW(_param_groups(net, cfg.weight_decay), lr=cfg.lr)
    averaged = WeightAverage(net, cfg.ema) if cfg.ema > 0 else None
    scored = averaged.model if averaged is not None else net  # what is validated and saved
    scaler = torch.amp.GradScaler(device.type, enabled=engine.autocast == torch.float16)
    history: list[dict[str, Any]] = []
    best_score: tuple[float, float] | None = None
    best_epoch = 0
    start_epoch = 0
    if state is not None:
        net.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        if state.scaler:
            scaler.load_state_dict(state.scaler)
        history = list(state.history)
        if averaged is not None and state.averaged:
            averaged.load_state_dict(state.averaged)
        start_epoch = int(state.epoch)
        best_epoch = int(state.best_epoch)
        best_score = (float(state.best_score[0]), float(state.best_score[1])) if state.best_score else None
        log.info("resuming %s after epoch %d of %d", model_path, start_epoch, cfg.epochs)

    # -- budget, data ------------------------------------------------------------------------------
    stride = time_stride(net)
    budget: Budget = engine.budget(net, n_bins, training=True)
    eval_budget: Budget = engine.budget(net, n_bins)
    train_lengths = s.lengths[train_rows].astype(np.int64)
    if masks_padding(net):
        limit = budget.max_window
        if cfg.crop_seconds is not None:
            limit = min(limit, max(stride, int(round(cfg.crop_seconds / spec.frame_seconds)) // stride * stride))
        pad_to = None
    else:  # equal windows: every training item is one window (short clips padded to it)
        limit = pad_to = window_frames(net)
        if not budget.fits(1, limit):
            raise TrainError(f"one training window of {limit} frames does not fit the memory budget; raise it")
    cut = int((train_lengths > budget.max_window).sum())
    if cut:
        log.warning("%d training clip(s) exceed the memory budget whole; they are trained on random crops of "
                    "%d frames", cut, budget.max_window)
    crop = limit if (cfg.crop_seconds is not None or cut or pad_to is not None) else None
    augment = _augment(cfg, model_spec, specs, mean)
    repeats = cfg.crops_per_clip if crop is not None else 1
    dataset = StoreDataset(s, feature, rows=np.repeat(train_rows, repeats), crop_frames=crop, spec_augment=augment,
                           seed=cfg.seed)
    sampler = BudgetBatchSampler(dataset, budget, shuffle=True, seed=cfg.seed, pad_to=pad_to)
    collate_fn = PadCollate(stride, pad_to=pad_to)
    val_labels = s.labels[val_rows].astype(np.int64)
    weights = torch.tensor(_class_weights(train_labels, n_classes), dtype=torch.float32, device=device) \
        if cfg.class_weighted else None
    mix_rng = torch.Generator()
    log.info("training %s (%d parameters) on %d clips, validating on %d; %s; %s", model_spec.target,
             count_parameters(net), len(train_rows), len(val_rows), device, budget.describe())

    base_extra: dict[str, Any] = {
        "trained": True, "train_config": cfg.to_dict(), "split": rule.to_dict(), "store": str(s.location),
        "data_fingerprint": fingerprint, "n_train": int(len(train_rows)), "n_val": int(len(val_rows)),
        "train_label_counts": {s.label_names[k]: int(c) for k, c in
                               enumerate(np.bincount(train_labels, minlength=n_classes))},
    }
    write_atomic(config_path_for(model_path), json.dumps(
        {"train_config": cfg.to_dict(), "model": model_spec.to_dict(), "split": rule.to_dict(),
         "store": str(s.location), "feature": feature}, indent=2) + "\n")
    scalars = _Scalars(model_path)

    def batches_of_epoch() -> Any:
        if cfg.loader_workers:
            return DataLoader(dataset, batch_sampler=sampler, collate_fn=collate_fn, num_workers=cfg.loader_workers,
                              pin_memory=device.type == "cuda")
        return prefetch(dataset, list(sampler), collate_fn, pin=device.type == "cuda")

    # -- epochs -----------------------------------------------------------------------------------
    epochs_run = 0
    bar = tqdm(total=cfg.epochs, initial=start_epoch, unit="epoch", desc="training", disable=not progress)
    try:
        for epoch in range(start_epoch, cfg.epochs):
            e0 = time.perf_counter()
            torch.manual_seed(_epoch_seed(cfg.seed, epoch, 0))
            mix_rng.manual_seed(_epoch_seed(cfg.seed, epoch, 1))
            sampler.set_epoch(epoch)
            n_batches = len(sampler)
            net.train()
            loss_sum, correct, seen, oom_splits = 0.0, 0, 0, 0
            lr = lr_at(epoch, cfg)
            for bi, batch in enumerate(batches_of_epoch()):
                lr = lr_at(epoch + bi / n_batches, cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                b = batch.to(device, non_blocking=True) if device.type != "cpu" else batch
                assert b.labels is not None
                optimizer.zero_grad(set_to_none=True)
                bx, bl, by, mix = _mixup(b.x, b.lengths, b.labels, cfg.mixup, mix_rng)
                step = _forward_backward(net, engine, bx, bl, by, weights=weights,
                                         label_smoothing=cfg.label_smoothing, scaler=scaler, mix=mix)
                if not math.isfinite(step.loss) and not scaler.is_enabled():
                    raise TrainError(f"training diverged (loss {step.loss}) in epoch {epoch + 1}; lower the LR")
                scaler.step(optimizer)  # skips the step if fp16 gradients overflowed
                scaler.update()
                if averaged is not None:
                    averaged.update(net)
                oom_splits += step.oom_splits
                if math.isfinite(step.loss):
                    loss_sum += step.loss * len(batch)
                    correct += step.correct
                    seen += len(batch)
                bar.set_postfix_str(f"loss {loss_sum / max(seen, 1):.3f}" + (
                    f", val acc {history[-1]['val_accuracy']:.3f}"
                    if history and history[-1]["val_accuracy"] is not None else ""), refresh=False)
            plan_efficiency = sampler.plan.efficiency
            entry: dict[str, Any] = {
                "epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_accuracy": correct / max(seen, 1),
                "val_accuracy": None, "val_f1": None, "val_loss": None, "lr": lr, "batches": n_batches,
                "efficiency": plan_efficiency, "oom_splits": oom_splits,
            }
            if len(val_rows):
                res = engine.logits(scored, s, val_rows, feature=feature, budget=eval_budget)
                vl = torch.from_numpy(res.logits)
                vy = torch.from_numpy(val_labels)
                entry["val_accuracy"] = float((vl.argmax(1) == vy).float().mean())
                entry["val_f1"] = _macro_f1(val_labels, vl.argmax(1).numpy())
                entry["val_loss"] = float(F.cross_entropy(vl, vy))
            entry["seconds"] = time.perf_counter() - e0
            history.append(entry)
            score = _score(entry)
            if best_score is None or score > best_score:
                best_score, best_epoch = score, epoch + 1
                save_checkpoint(Checkpoint.from_model(scored, s.label_names, feature, specs, extra={
                    **base_extra, "epoch": epoch + 1, "best_epoch": epoch + 1,
                    "val_accuracy": entry["val_accuracy"], "history": history}, model_spec=model_spec), model_path)
            save_resume(ResumeState(
                config=cfg.to_dict(), config_key=cfg.resume_key(), data=fingerprint,
                model_spec=model_spec.to_dict(), epoch=epoch + 1, complete=epoch + 1 == cfg.epochs,
                model={k: v.detach().cpu() for k, v in net.state_dict().items()},
                optimizer=optimizer.state_dict(), scaler=scaler.state_dict(), history=history,
                best_epoch=best_epoch, best_score=list(best_score) if best_score is not None else None,
                averaged=averaged.state_dict() if averaged is not None else None), resume_path)
            write_atomic(metrics_path_for(model_path), _metrics_csv(history))
            scalars.add(entry)
            epochs_run += 1
            bar.update(1)
            bar.set_postfix_str(f"loss {entry['loss']:.3f}" + (
                f", val acc {entry['val_accuracy']:.3f}" if entry["val_accuracy"] is not None else ""))
            log.info("epoch %d/%d: loss %.4f, train acc %.3f, val acc %s, lr %.2e, %d batches (efficiency %.3f), "
                     "%.1f s", epoch + 1, cfg.epochs, entry["loss"], entry["train_accuracy"],
                     "-" if entry["val_accuracy"] is None else f"{entry['val_accuracy']:.3f}", lr, n_batches,
                     plan_efficiency, entry["seconds"])
            if on_epoch_end is not None:
                on_epoch_end(entry)
    finally:
        bar.close()
        scalars.close()

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
        model_spec=model_spec, extra=base_extra,
    )


def _augment(cfg: TrainConfig, model_spec: ModelSpec, specs: dict[str, Any], mean: float) -> Augment | None:
    """The per-item augmentation the config asks for (None when it asks for none).

    Masked and rolled-in values are set to the model's input mean (per bin
    with a per-bin normalisation), which the model maps to 0.
    """
    bin_mean = model_spec.kwargs.get("bin_mean")
    fill: float | tuple[float, ...] = (tuple(float(v) for v in bin_mean) if bin_mean is not None
                                       else float(model_spec.kwargs.get("input_mean", mean)))
    spec_augment = SpecAugment(cfg.time_masks, cfg.time_mask_frames, cfg.freq_masks, cfg.freq_mask_bins, fill) \
        if (cfg.time_masks or cfg.freq_masks) else None
    pitch_rows: tuple[int, int] | None = None
    pitch_bins = 0
    start = 0
    parts: list[tuple[int, int]] = []
    for part in specs.values():
        if part.kind == "cqt" and cfg.pitch_shift:
            pitch_rows = (start, start + part.n_bins)
            pitch_bins = int(round(cfg.pitch_shift * (part.bins_per_octave or 12) / 12))
        parts.append((start, start + part.n_bins))
        start += part.n_bins
    if cfg.pitch_shift and pitch_rows is None:
        log.warning("pitch_shift needs a CQT in the training feature (%s); no pitch shift", "+".join(specs))
    if spec_augment is None and not cfg.gain_db and not cfg.tilt_db and not pitch_bins:
        return None
    return Augment(gain_db=cfg.gain_db, tilt_db=cfg.tilt_db, parts=tuple(parts), pitch_bins=pitch_bins,
                   pitch_rows=pitch_rows, fill=fill, spec_augment=spec_augment)


def _model_spec(cfg: TrainConfig, model: nn.Module | str | None, model_args: dict[str, Any] | None,
                available: dict[str, Any], stats: FrameStats | None = None, trust: Trust = False) -> ModelSpec:
    """How to build the model: the config's built-in architecture or import path, or a given module.

    ``available``: the store's facts a constructor may take (n_bins, n_classes, input_mean, input_std);
    ``stats``: the training frames' statistics (per-bin normalisation of the built-ins); ``trust``: the
    model code that may be imported (:mod:`infer.trust`).
    """
    if isinstance(model, nn.Module):
        spec = spec_of(model, model_args)
        if not spec.builtin:  # the checkpoint must be able to rebuild it
            try:
                rebuilt = spec.build(with_named(trust, spec.target))
                rebuilt.load_state_dict(model.state_dict())
            except (ConfigError, RuntimeError) as e:
                raise TrainError(f"{spec.target} cannot be rebuilt from its import path and arguments {spec.kwargs} "
                                 f"({str(e).splitlines()[0]}); pass model_args= with its constructor arguments"
                                 ) from None
        return spec
    target = model if isinstance(model, str) else cfg.arch
    args = model_args if model_args is not None else cfg.model_args
    if target in ("cnn", "resnet"):
        kwargs = {**available, "width": cfg.width, "depth": cfg.depth, "dropout": cfg.dropout, "pooling": cfg.pooling,
                  "input_time_pool": cfg.input_time_pool, "freq_pooling": cfg.freq_pooling,
                  "stem_freq_kernel": cfg.stem_freq_kernel}
        if cfg.normalization == "bin" and stats is not None:
            kwargs["bin_mean"] = [round(float(v), 3) for v in stats.bin_mean]
            kwargs["bin_std"] = [round(float(v), 3) for v in stats.bin_std]
        return ModelSpec(target, kwargs)
    try:
        return ModelSpec.for_class(target, args, trust_model_code=trust, source="the training config", **available)
    except UntrustedModelError:
        raise
    except ConfigError as e:
        raise TrainError(str(e)) from None
