"""``make train``: fit a model on a store's labelled clips, resumably.

Flow: :func:`~.prepare.prepare_run` opens the store (index only), splits the
labelled rows by work or content (:mod:`specstore.infer.data.split`; duplicates and works
never straddle it) and resolves the ``auto`` options from the training split
(:mod:`.recipe`) -> :func:`~.prepare.prepare_model` fits the model's input
normalisation on training frames and its statistics head on training clips
(:mod:`.stats_head`) -> :func:`~.prepare.prepare_data`: the engine
(:mod:`specstore.infer.engine.runtime`) measures the model's training memory per padded
clip-frame and gives the :class:`~specstore.infer.batching.budget.Budget`, which sets the crop
and the budgeted batch sampler -> every epoch (:func:`~.epoch.run_epoch`) a fresh
plan over the cropped lengths, random crops read straight from the store's
mmap views, augmentation inside real frames (:mod:`specstore.infer.data.augment`), AdamW
with warm-up and cosine decay (:mod:`.schedule`), autocast on CUDA ->
validation (every ``val_every`` epochs and after the last) on whole
held-out clips with the engine's prediction loop -> the checkpoint at
``model_path`` (:func:`_end_epoch`), ``metrics.csv`` and the resolved
configuration (``<model>.config.json``) beside it.

Which weights are saved: by default (``select="last"``) those at the end of
the fixed schedule, so a few validation clips choose nothing; validation
reports, and at the end :func:`~.report.held_out_report` scores the model and
each of its experts on the held-out clips with intervals, and a temperature
is fitted on the kept model's held-out logits and recorded in the checkpoint
(:mod:`specstore.infer.models.calibration`; none without held-out clips: uncalibrated).  ``select="best"``
keeps the epoch with the best validation accuracy (then loss).

Resuming: after every epoch ``<model>.resume.pt`` (:mod:`.resume`) is
written.  Rerunning with the same configuration on the same data continues
after the last finished epoch; every random draw of an epoch is seeded from
``(seed, epoch)``, so a resumed run follows the uninterrupted run's path.  An
existing checkpoint is never replaced silently: training to a ``model_path``
that holds a model from another configuration or other data (or with no
resume file) is refused unless ``overwrite=True``.

Several processes: started by ``torchrun`` (``make train NPROC=N``), every
rank runs :func:`train` with DistributedDataParallel over its share of each
epoch's batches (:mod:`.distributed`: the smallest budget of all ranks, the
sampler's replica split, BatchNorm running statistics averaged at each epoch's
end, validation's clips shared out); rank 0 alone writes the checkpoint, the
resume file, the metrics and the config.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn
from tqdm.auto import tqdm

from specstore.common import write_atomic
from specstore.infer.models.calibration import Calibration, fit_temperature
from specstore.infer.models.checkpoint import Checkpoint, load_checkpoint, save_checkpoint
from specstore.infer.models.contract import ModelSpec
from specstore.infer.models.trust import Trust, with_named
from specstore.store import Store

from ..models import MaskedClassifier, count_parameters
from .batches import TrainData, prepare_data
from .config import TrainConfig
from .distributed import Dist, barrier, broadcast_object, from_env, process_group, quiet_unless_main, wrap
from .epoch import run_epoch, validate, validates
from .prepare import Learner, Run, default_training_feature, prepare_model, prepare_run, release_freed_memory
from .report import Scalars, held_out_report, held_out_text, metrics_csv
from .resume import ResumeState, save_resume
from .stats_head import DEFAULT_WEIGHT, WeightChoice, choose_weight, stats_logits

__all__ = ["TrainResult", "config_path_for", "default_training_feature", "metrics_path_for", "train"]

log = logging.getLogger("specstore.infer.train")


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
    ``best_epoch``: the saved epoch (the last one with ``select="last"``);
    ``extra``: what the checkpoint records besides the weights (``recipe``:
    the requested config, the rules that resolved its ``auto`` options and
    the training facts; ``held_out``: the saved model's validation figures).
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
        if self.best_val_accuracy is not None:
            how = "kept" if self.config.select == "last" else "best"
            best = (f"{how} epoch {self.best_epoch}: validation accuracy {self.best_val_accuracy:.1%} on "
                    f"{self.n_val} clips")
        else:
            best = f"kept epoch {self.best_epoch} (no validation clips)"
        if not self.epochs_run:
            return (f"already trained: {self.resumed_from} of {self.config.epochs} epochs done (delete "
                    f"{self.resume_path} to train again); {best}; checkpoint {self.model_path}")
        return (f"trained epochs {self.resumed_from + 1}-{self.resumed_from + self.epochs_run} of "
                f"{self.config.epochs} on {self.n_train} clips in {self.seconds:.1f} s; {best}; "
                f"checkpoint {self.model_path}")

    def summary(self) -> str:
        """What ``make train`` prints: :meth:`line`, the recipe's automatic choices and the held-out report."""
        lines = [self.line()]
        rules: dict[str, str] = self.extra.get("recipe", {}).get("rules", {})
        for name, why in rules.items():
            if name != "stats_weight" or not self.extra.get("stats_weight"):
                lines.append(f"  {name} (auto): {why}")
        if self.extra.get("stats_weight"):
            lines.append(f"  stats_weight (auto): {self.extra['stats_weight']['how']}")
        fit = self.extra.get("stats_head")
        chosen = fit.get("cv", {}).get(f"{fit['C']:g}") if isinstance(fit, dict) and fit.get("folds") else None
        if isinstance(fit, dict) and chosen:
            lines.append(f"  statistics head alone (the simple baseline): accuracy {chosen['accuracy']:.3f} by "
                         f"{fit['folds']}-fold grouped cross-validation on the training clips (C {fit['C']:g})")
        if self.extra.get("held_out"):
            lines.append("  " + held_out_text(self.extra["held_out"], self.n_val))
        lines.append("  " + Calibration.from_extra(self.extra).describe())
        return "\n".join(lines)


def _named(model: nn.Module | str | None) -> list[str]:
    """The import path the caller named (trusted: the caller chose it), if any."""
    if isinstance(model, str):
        return [model]
    return [f"{type(model).__module__}:{type(model).__qualname__}"] if isinstance(model, nn.Module) else []


def _show(bar: tqdm, entry: dict[str, Any]) -> None:
    """One finished epoch on the progress bar: its loss and validation accuracy."""
    bar.update(1)
    bar.set_postfix_str(f"loss {entry['loss']:.3f}" + (
        f", val acc {entry['val_accuracy']:.3f}" if entry["val_accuracy"] is not None else ""))


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
    """Train a classifier on ``specstore.store``'s labelled clips; the checkpoint goes to ``model_path``.

    ``model``: None (the config's ``arch``), an import path
    ``package.module:Class``, or an ``nn.Module`` instance following the
    contract of :mod:`specstore.infer.models.contract`; ``model_args``: its constructor's
    keyword arguments (JSON values), recorded in the checkpoint so it can be
    rebuilt without pickle.  ``model`` is trusted (you name it); an import
    path in the config's ``arch`` (which may come from a file) needs
    ``trust_model_code`` (True, or the trusted import paths; see
    :mod:`specstore.infer.models.trust`).  ``config`` fields may also be given as keyword
    ``overrides``; options left ``auto`` are resolved from the training data
    (:mod:`.recipe`).  ``threads``:
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
    trust = with_named(trust_model_code, *_named(model))
    dist = from_env(cfg.run.device)
    with process_group(dist) if dist is not None else contextlib.nullcontext(), quiet_unless_main(dist):
        return _train(store, model_path, cfg, dist, progress=progress, threads=threads, margin_mb=margin_mb,
                      overwrite=overwrite, model=model, model_args=model_args, on_epoch_end=on_epoch_end, trust=trust)


def _train(store: str | os.PathLike[str] | Store, model_path: str | os.PathLike[str], cfg: TrainConfig,
           dist: Dist | None, *, progress: bool, threads: int | None, margin_mb: float | None, overwrite: bool,
           model: nn.Module | str | None, model_args: dict[str, Any] | None,
           on_epoch_end: Callable[[dict[str, Any]], None] | None, trust: Trust) -> TrainResult:
    """:func:`train` in this process: the whole run, or this rank's part of a distributed one (``dist``)."""
    t0 = time.perf_counter()
    run = prepare_run(store, model_path, cfg, model=model, threads=threads, margin_mb=margin_mb,
                      overwrite=overwrite, dist=dist)
    learner = prepare_model(run, model, model_args, trust)
    data = prepare_data(run, learner)
    if dist is not None:
        learner.wrapped = wrap(learner.net, dist)
    _log_start(run, learner, data)
    extra = _base_extra(run, learner)
    if run.is_main:
        _write_config(run, learner, extra)
    scalars = Scalars(run.model_path, enabled=run.is_main)
    epochs_run = 0
    val_logits: np.ndarray | None = None
    bar = tqdm(total=run.cfg.epochs, initial=learner.start_epoch, unit="epoch", desc="training",
               disable=not progress or not run.is_main)
    try:
        for epoch in range(learner.start_epoch, run.cfg.epochs):
            entry = run_epoch(run, learner, data, epoch, bar)
            if validates(run.cfg, epoch + 1):  # every rank: each computes its share of the clips
                val_logits = validate(run, learner, data, entry)
            _end_epoch(run, learner, extra, entry)
            scalars.add(entry)
            epochs_run += 1
            _show(bar, entry)
            if on_epoch_end is not None:
                on_epoch_end(entry)
    finally:
        bar.close()
        scalars.close()
        if run.engine.device.type == "cpu":
            release_freed_memory()  # prepare_run kept freed memory for the steps; not beyond them
    if epochs_run and run.is_main:
        _finish(run, learner, extra, val_logits, trust)
    if not epochs_run:  # a finished run again: what its checkpoint recorded
        barrier(dist)
        extra.update(load_checkpoint(run.model_path).extra)
        if not run.is_main:
            learner.history, learner.best_epoch = list(extra["history"]), int(extra.get("best_epoch", 0))
    elif dist is not None:  # rank 0's record to every rank, once it has written the final checkpoint
        extra, learner.history, learner.best_epoch = broadcast_object(
            (extra, learner.history, learner.best_epoch), dist)
    best_entry = learner.history[learner.best_epoch - 1] if learner.best_epoch else {}
    return TrainResult(
        model_path=run.model_path, resume_path=run.resume_path, history=learner.history,
        best_epoch=learner.best_epoch, best_val_accuracy=best_entry.get("val_accuracy"),
        resumed_from=learner.start_epoch, epochs_run=epochs_run, n_train=len(run.train_rows),
        n_val=len(run.val_rows), seconds=time.perf_counter() - t0, config=run.cfg, model_spec=learner.spec,
        extra=extra,
    )


def _log_start(run: Run, learner: Learner, data: TrainData) -> None:
    log.info("training %s (%d parameters) on %d clips, validating on %d; %s; %s", learner.spec.target,
             count_parameters(learner.net), len(run.train_rows), len(run.val_rows), run.device,
             data.budget.describe())


def _base_extra(run: Run, learner: Learner) -> dict[str, Any]:
    """What every saved checkpoint of this run records besides the weights and the epoch."""
    s = run.store
    return {
        "trained": True, "train_config": run.cfg.to_dict(), "split": run.rule.to_dict(), "store": str(s.location),
        "data_fingerprint": run.fingerprint, "n_train": int(len(run.train_rows)), "n_val": int(len(run.val_rows)),
        "train_label_counts": {s.label_names[k]: int(c) for k, c in
                               enumerate(np.bincount(run.train_labels, minlength=run.n_classes))},
        "recipe": {"requested": run.requested.to_dict(), "rules": run.rules, "facts": run.facts.to_dict()},
        **({"stats_head": learner.stats_fit} if learner.stats_fit is not None else {}),
    }


def _write_config(run: Run, learner: Learner, extra: dict[str, Any]) -> None:
    """``<model>.config.json``: the resolved config, the model spec, the split, the recipe's rules (and, once
    training ends, the held-out report)."""
    record: dict[str, Any] = {
        "train_config": run.cfg.to_dict(), "model": learner.spec.to_dict(), "split": run.rule.to_dict(),
        "store": str(run.store.location), "feature": run.feature,
        **{k: extra[k] for k in ("recipe", "stats_head", "stats_weight", "held_out", "calibration") if k in extra}}
    write_atomic(config_path_for(run.model_path), json.dumps(record, indent=2) + "\n")


def _score(entry: dict[str, Any], select: str, validated: bool) -> tuple[float, float]:
    """Larger is better: the epoch (``last``); or (val accuracy, -val loss), (-train loss, 0) without validation
    clips (``validated``: the run has some; its epochs without validation are then never kept)."""
    if select == "last":
        return float(entry["epoch"]), 0.0
    if entry.get("val_accuracy") is not None:
        return float(entry["val_accuracy"]), -float(entry["val_loss"])
    if validated:  # an epoch between validations is no candidate when validation chooses
        return -math.inf, 0.0
    return -float(entry["loss"]), 0.0


def _end_epoch(run: Run, learner: Learner, extra: dict[str, Any], entry: dict[str, Any]) -> None:
    """Record the epoch: the checkpoint if it is the one kept, the resume file, ``metrics.csv``, the log."""
    cfg, epoch = run.cfg, entry["epoch"]
    learner.history.append(entry)
    if not run.is_main:  # rank 0 alone writes
        return
    score = _score(entry, cfg.select, len(run.val_rows) > 0)
    if learner.best_score is None or score > learner.best_score:
        learner.best_score, learner.best_epoch = score, epoch
        save_checkpoint(Checkpoint.from_model(learner.scored, run.store.label_names, run.feature, run.specs, extra={
            **extra, "epoch": epoch, "best_epoch": epoch, "val_accuracy": entry["val_accuracy"],
            "history": learner.history}, model_spec=learner.spec), run.model_path)
    net, averaged = learner.net, learner.averaged
    save_resume(ResumeState(
        config=cfg.to_dict(), config_key=cfg.resume_key(), data=run.fingerprint,
        model_spec=learner.spec.to_dict(), epoch=epoch, complete=epoch == cfg.epochs,
        model={k: v.detach().cpu() for k, v in net.state_dict().items()},
        optimizer=learner.optimizer.state_dict(), scaler=learner.scaler.state_dict(), history=learner.history,
        best_epoch=learner.best_epoch, best_score=list(learner.best_score),
        averaged=averaged.state_dict() if averaged is not None else None,
        world_size=run.dist.world if run.dist else 1), run.resume_path)
    write_atomic(metrics_path_for(run.model_path), metrics_csv(learner.history))
    log.info("epoch %d/%d: loss %.4f, train acc %.3f, val acc %s, lr %.2e, %d batches (efficiency %.3f), "
             "%.1f s", epoch, cfg.epochs, entry["loss"], entry["train_accuracy"],
             "-" if entry["val_accuracy"] is None else f"{entry['val_accuracy']:.3f}", entry["lr"],
             entry["batches"], entry["efficiency"], entry["seconds"])


def _finish(run: Run, learner: Learner, extra: dict[str, Any], last_logits: np.ndarray | None,
            trust: Trust) -> None:
    """The kept checkpoint gets the whole history, its statistics head's weight (when auto) and the held-out
    report (also in ``config.json``)."""
    ckpt = load_checkpoint(run.model_path)
    if len(run.val_rows):
        logits, model = last_logits, learner.scored
        if run.cfg.select != "last" or logits is None:  # the kept epoch is not the last one: score it again
            model = run.engine.prepare(ckpt.build(run.device, trust_model_code=trust))
            logits = run.engine.logits(model, run.store, run.val_rows, feature=run.feature).logits
        truth = run.store.labels[run.val_rows].astype(np.int64)
        cnn = stats = None
        if isinstance(model, MaskedClassifier) and model.stats_linear is not None:
            stats = stats_logits(model, run.store, run.feature, run.val_rows)
            cnn = logits - model.config.stats_weight * stats
            if run.cfg.stats_weight is None:
                _set_weight(ckpt, learner, extra, choose_weight(cnn, stats, truth))
            logits = cnn + ckpt.model.kwargs["stats_weight"] * stats
        extra["held_out"] = held_out_report(truth, logits, cnn, stats)
        log.info("%s", held_out_text(extra["held_out"], len(run.val_rows)))
        extra["calibration"] = fit_temperature(logits, truth).to_dict()  # the kept model's validation logits
        log.info("%s", Calibration.from_extra(extra).describe())
    elif run.cfg.stats_weight is None and learner.stats_fit is not None:
        _set_weight(ckpt, learner, extra, WeightChoice(DEFAULT_WEIGHT, f"{DEFAULT_WEIGHT:g}: no validation clips"))
    final: dict[str, Any] = {k: extra[k] for k in ("held_out", "stats_weight", "calibration") if k in extra}
    ckpt.extra.update({"history": learner.history, "epochs_done": len(learner.history), "complete": True, **final})
    save_checkpoint(ckpt, run.model_path)
    _write_config(run, learner, extra)


def _set_weight(ckpt: Checkpoint, learner: Learner, extra: dict[str, Any], choice: WeightChoice) -> None:
    """Write the statistics head's weight into the checkpoint's model spec (the model is rebuilt from it)."""
    ckpt.model = ModelSpec(ckpt.model.target, {**ckpt.model.kwargs, "stats_weight": choice.weight})
    learner.spec = ckpt.model
    extra["stats_weight"] = choice.to_dict()
    log.info("stats_weight: %s", choice.how)

