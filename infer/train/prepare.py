"""Training set-up, before the first step: the run (data, split, recipe, engine, resume), the model, the batches.

:func:`prepare_run` opens the store, splits the labelled rows
(:mod:`specstore.infer.data.split`), resolves the ``auto`` options from the training data
(:mod:`.recipe`) and reads a resume file that fits; :func:`prepare_model`
builds (or restores) the model with its input normalisation and statistics
head, the optimiser and the weight average; :func:`~.batches.prepare_data`
(:mod:`.batches`, re-exported here) turns the engine's memory budget into a
crop length, the augmentation, the dataset and the budgeted batch sampler.
:mod:`.loop` runs the epochs over what they return.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from specstore.common import ConfigError, check_output_path
from specstore.common.heap import KEPT_THRESHOLDS, set_malloc_thresholds
from specstore.common.limits import usable_cores
from specstore.infer.data.split import (
    SplitRule,
    split_keys,
    training_fingerprint,
    training_rows,
    ungrouped_split_warning,
)
from specstore.infer.engine.runtime import Engine
from specstore.infer.errors import SplitError, UntrustedModelError
from specstore.infer.models.checkpoint import load_checkpoint
from specstore.infer.models.contract import ModelSpec, spec_of, time_stride
from specstore.infer.models.trust import Trust, with_named
from specstore.store import FeatureSpec, Store, open_store

from ..data import StoreDataset, feature_specs
from ..errors import TrainError
from ..models import ARCHS, MaskedClassifier
from .batches import TrainData, augment_for, prepare_data, stride_frames
from .config import TrainConfig, model_options
from .distributed import Dist, barrier, broadcast_object, broadcast_state, same_on_every_rank
from .frames import FrameStats, frame_stats
from .recipe import DataFacts, data_facts, resolve, resolve_validation
from .resume import ResumeState, load_resume, resume_path_for
from .stats_head import DEFAULT_WEIGHT, fit_stats_head
from .steps import WeightAverage, param_groups

__all__ = [
    "FrameStats", "Learner", "Run", "TrainData", "augment_for", "default_training_feature", "frame_stats",
    "keep_freed_memory", "model_spec_for", "prepare_data", "prepare_model", "prepare_run", "release_freed_memory",
]

log = logging.getLogger("specstore.infer.train")


def default_training_feature(store: Store) -> str:
    """What training uses when the config names no feature: every stored feature, stacked (``mel+cqt``).

    A store with one feature (``FEATURES=mel``) trains on that one.
    """
    return "+".join(store.specs)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed memory for reuse instead of returning it to the system.

    CPU training allocates and frees activations of tens of MiB every step;
    by default glibc serves those with fresh ``mmap`` s and unmaps them on
    free, so every step page-faults its activations in again (a large share
    of a training run's CPU time spent in the kernel: docs/measurements.md).
    Raising the mmap and trim thresholds keeps them in the heap; the values
    are the same.  A no-op (False) where the C library is not glibc.
    """
    return set_malloc_thresholds(1 << 30, (1 << 31) - 1)


def release_freed_memory() -> bool:
    """Undo :func:`keep_freed_memory` when training ends: the ceiling glibc's own adjustment reaches
    (``specstore.common.heap.KEPT_THRESHOLDS``: 32 MiB each) again, and the memory the heap kept handed back
    (``malloc_trim``).

    Kept, the raised thresholds would outlive the run in the caller's process: a notebook or ``make train``
    that goes on to run a large model (musicnn's patch activations) would then grow its heap by fragments of
    freed activations instead of mapping and unmapping them (docs/measurements.md: GBs resident after a CNN
    training and a musicnn pass in one process).  Not glibc's initial 128 KiB: set explicitly, that value would also end
    glibc's own adjustment and leave the process slower than it found it (``specstore.common.heap``).  A no-op (False)
    where the C library is not glibc.
    """
    return set_malloc_thresholds(*KEPT_THRESHOLDS, trim=True)


# -- the run ---------------------------------------------------------------------------------------

@dataclass
class Run:
    """What is fixed before a model exists: the resolved config, the data and its split, the engine, resume state.

    ``requested``: the config as given (``auto`` options unresolved);
    ``rules``: why each ``auto`` option got its value; ``state``: the resume
    file's state when this run continues an interrupted one.
    """

    cfg: TrainConfig
    requested: TrainConfig
    rules: dict[str, str]
    facts: DataFacts
    store: Store
    specs: dict[str, FeatureSpec]
    rule: SplitRule
    train_rows: np.ndarray
    val_rows: np.ndarray
    engine: Engine
    model_path: Path
    resume_path: Path
    fingerprint: str
    state: ResumeState | None
    dist: Dist | None = None

    @property
    def is_main(self) -> bool:
        """Whether this process writes the run's files: always in a single process, rank 0 in a distributed one."""
        return self.dist is None or self.dist.is_main

    @property
    def feature(self) -> str:
        return "+".join(self.specs)

    @property
    def n_bins(self) -> int:
        return sum(p.n_bins for p in self.specs.values())

    @property
    def n_classes(self) -> int:
        return len(self.store.label_names)

    @property
    def train_labels(self) -> np.ndarray:
        return self.store.labels[self.train_rows].astype(np.int64)

    @property
    def device(self) -> torch.device:
        return self.engine.device

    @property
    def frame_seconds(self) -> float:
        """Seconds per frame of the training feature (its parts share one frame grid)."""
        return next(iter(self.specs.values())).frame_seconds


def _split(s: Store, rule: SplitRule) -> tuple[np.ndarray, np.ndarray]:
    try:
        train_rows, val_rows = training_rows(s, rule)
    except SplitError as e:
        raise TrainError(str(e)) from None
    if len(train_rows) == 0:
        raise TrainError(f"all {len(val_rows)} labelled clips fell in the validation split; lower val_fraction")
    labels = s.labels[train_rows]
    if len(np.unique(labels)) < 2:
        raise TrainError(f"the training split holds only one label ({s.label_names[int(labels[0])]}); "
                         "a classifier needs at least two")
    # Said once per command: cross-validation's folds share one split, and fold 1 is the one at offset 0.
    if len(val_rows) and rule.val_offset == 0 and (why := ungrouped_split_warning(s)):
        log.warning("%s", why)
    return train_rows, val_rows


def prepare_run(store: str | os.PathLike[str] | Store, model_path: str | os.PathLike[str], cfg: TrainConfig, *,
                model: nn.Module | str | None, threads: int | None, margin_mb: float | None,
                overwrite: bool, dist: Dist | None = None) -> Run:
    """Open, split, resolve the recipe, make the engine and find a resume state (see :class:`Run`).

    ``dist``: this rank of a distributed run (:mod:`.distributed`): its engine uses the rank's GPU
    (``cuda:LOCAL_RANK``) or, on CPU, its share of the machine's cores unless ``threads`` is given; every rank
    must find the same resume state.
    """
    requested = cfg
    path = check_output_path(model_path, what="MODEL", stream=False)
    s = store if isinstance(store, Store) else open_store(store)
    try:
        specs = feature_specs(s, cfg.feature or default_training_feature(s))
    except ConfigError as e:
        raise TrainError(str(e)) from None
    if cfg.feature is None:
        log.info("training on %s (the default: every feature the store holds, stacked frame by frame)",
                 "+".join(specs))
    cfg, val_rule = resolve_validation(cfg, int((s.labels >= 0).sum()))
    rule = SplitRule(cfg.val_fraction or 0.0, cfg.seed, cfg.val_offset)
    train_rows, val_rows = _split(s, rule)
    builtin = (cfg.arch in ARCHS) if model is None else (isinstance(model, str) and model in ARCHS)
    facts = data_facts(s, train_rows, split_keys(s))
    recipe = resolve(cfg, facts, builtin=builtin)
    if val_rule is not None:
        recipe.rules["val_fraction"] = val_rule
    if not len(val_rows):
        recipe.rules.pop("val_every", None)  # nothing to validate: the rule says nothing
    for name, why in recipe.rules.items():
        log.info("%s (auto): %s", name, why)
    resolved = recipe.config
    if not len(val_rows) and resolved.select == "best":
        log.warning("no validation clips (val_fraction %.2f): the best checkpoint is chosen by training loss",
                    resolved.val_fraction)
    engine = Engine(_rank_options(resolved, dist, margin_mb, threads))
    if engine.device.type == "cpu":
        keep_freed_memory()
    resume_path = resume_path_for(path)
    fingerprint = training_fingerprint(s, rule, "+".join(specs))
    state = _resumable(load_resume(resume_path), resolved, fingerprint, path, overwrite)
    if dist is not None:
        same_on_every_rank(-1 if state is None else int(state.epoch), dist, "the epoch to resume after")
        barrier(dist)  # every rank has read the resume file before rank 0 may write the next one
        if state is not None and state.world_size != dist.world:
            log.info("resuming after epoch %d with %d processes (the interrupted run had %d): allowed at an epoch "
                     "boundary; the batches per step change from here on", state.epoch, dist.world, state.world_size)
    elif state is not None and state.world_size != 1:
        log.info("resuming after epoch %d in one process (the interrupted run had %d)", state.epoch,
                 state.world_size)
    return Run(resolved, requested, recipe.rules, facts, s, specs, rule, train_rows, val_rows, engine, path,
               resume_path, fingerprint, state, dist)


def _rank_options(cfg: TrainConfig, dist: Dist | None, margin_mb: float | None, threads: int | None) -> Any:
    """The engine's run options: the config's, with the machine's margin and threads; in a distributed run the
    rank's GPU (nccl), or on CPU an equal share of the cores for each process on this machine."""
    options = dataclasses.replace(cfg.run, margin_mb=margin_mb, threads=threads)
    if dist is None:
        return options
    if dist.backend == "nccl":
        return dataclasses.replace(options, device=f"cuda:{dist.local_rank}")
    if threads is None:
        options = dataclasses.replace(options, threads=max(1, usable_cores() // dist.local_world))
    return dataclasses.replace(options, device="cpu")


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


# -- the model -------------------------------------------------------------------------------------

@dataclass
class Learner:
    """The model being trained and everything that moves with it from step to step and epoch to epoch.

    ``scored``: what is validated and saved (the weight average with
    ``ema``, else ``net``); ``stats_fit``: how the statistics head was
    fitted (None without one); ``best_score``: of the saved epoch;
    ``wrapped``: ``net`` in DistributedDataParallel (a distributed run).
    """

    net: nn.Module
    scored: nn.Module
    spec: ModelSpec
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    averaged: WeightAverage | None
    frames: FrameStats
    stats_fit: dict[str, Any] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)
    start_epoch: int = 0
    best_epoch: int = 0
    best_score: tuple[float, float] | None = None
    wrapped: nn.Module | None = None

    @property
    def stepped(self) -> nn.Module:
        """What the training steps call: ``net`` in DistributedDataParallel in a distributed run, else ``net``."""
        return self.wrapped if self.wrapped is not None else self.net


def model_spec_for(cfg: TrainConfig, model: nn.Module | str | None, model_args: dict[str, Any] | None,
                   available: dict[str, Any], stats: FrameStats | None = None, trust: Trust = False,
                   frame_seconds: float | None = None) -> ModelSpec:
    """How to build the model: the config's built-in architecture or import path, or a given module.

    ``available``: the store's facts a constructor may take (n_bins, n_classes, input_mean, input_std); ``stats``:
    the training frames' statistics (per-bin normalisation of the built-ins); ``trust``: the model code that may be
    imported (:mod:`specstore.infer.models.trust`); ``frame_seconds``: the feature's hop, which turns
    ``pool_seconds`` into frames (rounded down to the model's time stride, as the training crop is).
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
    if target in ARCHS:
        kwargs = {**available, **{k: getattr(cfg, k) for k in model_options(cfg)},  # checked by cfg.model
                  "stats_head": bool(cfg.stats_head),
                  "stats_weight": DEFAULT_WEIGHT if cfg.stats_weight is None else cfg.stats_weight}
        if cfg.normalization == "bin" and stats is not None:
            kwargs["bin_mean"] = [round(float(v), 3) for v in stats.bin_mean]
            kwargs["bin_std"] = [round(float(v), 3) for v in stats.bin_std]
        if cfg.pool_seconds and frame_seconds:
            stride = time_stride(ModelSpec(target, kwargs).build())
            kwargs["pool_window"] = stride_frames(cfg.pool_seconds, frame_seconds, stride)
        return ModelSpec(target, kwargs)
    try:
        return ModelSpec.for_class(target, args, trust_model_code=trust, source="the training config", **available)
    except UntrustedModelError:
        raise
    except ConfigError as e:
        raise TrainError(str(e)) from None


def prepare_model(run: Run, model: nn.Module | str | None, model_args: dict[str, Any] | None,
                  trust: Trust = False) -> Learner:
    """The model (built fresh, its statistics head fitted, or restored from the resume state) and its optimiser.

    ``trust``: the model code that may be imported (:mod:`specstore.infer.models.trust`).
    """
    cfg, state = run.cfg, run.state
    frames = frame_stats(StoreDataset(run.store, run.feature, rows=run.train_rows), cfg.seed) if run.is_main \
        else None
    if run.dist is not None:  # fitted once (rank 0), the same on every rank
        frames = broadcast_object(frames, run.dist)
    assert frames is not None
    if state is not None:
        spec = ModelSpec.from_dict(state.model_spec)
    else:
        spec = model_spec_for(cfg, model, model_args, {"n_bins": run.n_bins, "n_classes": run.n_classes,
                                                       "input_mean": round(frames.mean, 4),
                                                       "input_std": round(frames.std, 4)}, frames, trust,
                              run.frame_seconds)
    torch.manual_seed(cfg.seed)
    net = run.engine.prepare(model if isinstance(model, nn.Module) else
                             spec.build(trust, source="the training config"), train=True)
    if cfg.grad_checkpoint:
        if not hasattr(net, "grad_checkpoint"):
            raise TrainError(f"{type(net).__name__} has no grad_checkpoint attribute: it does not support "
                             "gradient checkpointing")
        setattr(net, "grad_checkpoint", True)  # noqa: B010 - a plain attribute, see infer.contract
    stats_fit: dict[str, Any] | None = None
    if isinstance(net, MaskedClassifier) and net.stats_linear is not None and run.is_main:
        if state is None:
            stats_fit = fit_stats_head(net, run.store, run.feature, run.train_rows, seed=cfg.seed).to_dict()
        else:
            stats_fit = load_checkpoint(run.model_path).extra.get("stats_head")
    if run.dist is not None:  # the head fitted on rank 0 (its weights and buffers), on every rank
        stats_fit = broadcast_object(stats_fit, run.dist)
        broadcast_state(net, run.dist)
    optimizer = torch.optim.AdamW(param_groups(net, cfg.weight_decay), lr=cfg.lr)
    averaged = WeightAverage(net, cfg.ema) if cfg.ema > 0 else None
    scaler = torch.amp.GradScaler(run.device.type, enabled=run.engine.autocast == torch.float16)
    learner = Learner(net, averaged.model if averaged is not None else net, spec, optimizer, scaler, averaged,
                      frames, stats_fit)
    if state is not None:
        net.load_state_dict(state.model)
        optimizer.load_state_dict(state.optimizer)
        if state.scaler:
            scaler.load_state_dict(state.scaler)
        if averaged is not None and state.averaged:
            averaged.load_state_dict(state.averaged)
        learner.history = list(state.history)
        learner.start_epoch, learner.best_epoch = int(state.epoch), int(state.best_epoch)
        learner.best_score = (float(state.best_score[0]), float(state.best_score[1])) if state.best_score else None
        log.info("resuming %s after epoch %d of %d", run.model_path, learner.start_epoch, cfg.epochs)
    return learner
