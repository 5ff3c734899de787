"""One training epoch and its validation: the pass over the epoch's batches (:func:`run_epoch`), when validation
runs (:func:`validates`) and its figures on the held-out clips (:func:`validate`).

Split from :mod:`.loop`, which calls these once per epoch and then records the epoch (checkpoint, resume file,
``metrics.csv``).  In a distributed run (:mod:`.distributed`) every rank runs :func:`run_epoch` over its share of
the batches and the epoch's figures are summed over the ranks; validation's clips are shared out among the ranks
and every rank gets every logit.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import TrainError
from . import debug
from .batches import TrainData
from .config import TrainConfig
from .distributed import average_running_stats, shared_logits, sum_over_ranks
from .prepare import Learner, Run
from .report import macro_f1
from .schedule import lr_at
from .steps import epoch_seed, forward_backward, mixup

__all__ = ["run_epoch", "validate", "validates"]


def run_epoch(run: Run, learner: Learner, data: TrainData, epoch: int, bar: Any) -> dict[str, Any]:
    """One pass over this epoch's batches; the history entry without validation figures."""
    cfg, net, device = run.cfg, learner.stepped, run.device
    dump = debug.dump_folder() if epoch == learner.start_epoch else None
    e0 = time.perf_counter()
    torch.manual_seed(epoch_seed(cfg.seed, epoch, 0))
    mix_rng = torch.Generator().manual_seed(epoch_seed(cfg.seed, epoch, 1))
    data.sampler.set_epoch(epoch)
    n_batches = len(data.sampler)
    net.train()
    loss_sum, correct, seen, oom_splits = 0.0, 0, 0, 0
    lr = lr_at(epoch, cfg)
    for bi, batch in enumerate(data.batches(cfg.run.loader_workers, pin=device.type == "cuda")):
        lr = lr_at(epoch + bi / n_batches, cfg)
        for group in learner.optimizer.param_groups:
            group["lr"] = lr
        b = batch.to(device, non_blocking=True) if device.type != "cpu" else batch
        assert b.labels is not None
        learner.optimizer.zero_grad(set_to_none=True)
        bx, bl, by, mix = mixup(b.x, b.lengths, b.labels, cfg.mixup, mix_rng)
        initial = debug.initial_state(learner.net) if dump is not None and bi == 0 else None
        step = forward_backward(net, run.engine, bx, bl, by, weights=data.weights,
                                label_smoothing=cfg.label_smoothing, scaler=learner.scaler, mix=mix,
                                split_on_oom=run.dist is None)
        if dump is not None and initial is not None:
            debug.dump_first_step(dump, run.dist.rank if run.dist else 0, learner.net, initial, (bx, bl, by))
        if not math.isfinite(step.loss) and not learner.scaler.is_enabled():
            raise TrainError(f"training diverged (loss {step.loss}) in epoch {epoch + 1}; lower the LR")
        learner.scaler.step(learner.optimizer)  # skips the step if fp16 gradients overflowed
        learner.scaler.update()
        if learner.averaged is not None:
            learner.averaged.update(net)
        oom_splits += step.oom_splits
        if math.isfinite(step.loss):
            loss_sum += step.loss * len(batch)
            correct += step.correct
            seen += len(batch)
        bar.set_postfix_str(f"loss {loss_sum / max(seen, 1):.3f}", refresh=False)
    if run.dist is not None:  # the epoch's figures over every rank's clips; one set of running statistics
        loss_sum, correct_f, seen_f, splits_f = sum_over_ranks([loss_sum, correct, seen, oom_splits], run.dist)
        correct, seen, oom_splits = int(correct_f), int(seen_f), int(splits_f)
        average_running_stats(learner.net, run.dist)
        if learner.averaged is not None:
            average_running_stats(learner.averaged.model, run.dist)
    return {
        "epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_accuracy": correct / max(seen, 1),
        "val_accuracy": None, "val_f1": None, "val_loss": None, "lr": lr, "batches": n_batches,
        "efficiency": data.sampler.plan.efficiency,
        "oom_splits": oom_splits, "seconds": time.perf_counter() - e0,
    }


def validates(cfg: TrainConfig, epoch: int) -> bool:
    """Whether validation runs after ``epoch`` (1-based): every ``val_every`` epochs and after the last."""
    return epoch == cfg.epochs or epoch % (cfg.val_every or 1) == 0


def validate(run: Run, learner: Learner, data: TrainData, entry: dict[str, Any]) -> np.ndarray | None:
    """Validation figures into ``entry`` (accuracy, macro-F1, loss of the scored model); its logits."""
    if not len(run.val_rows):
        return None
    v0 = time.perf_counter()
    logits = _val_logits(run, learner, data)
    truth = run.store.labels[run.val_rows].astype(np.int64)
    pred = logits.argmax(axis=1)
    entry["val_accuracy"] = float((pred == truth).mean())
    entry["val_f1"] = macro_f1(truth, pred)
    entry["val_loss"] = float(F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(truth)))
    entry["seconds"] += time.perf_counter() - v0
    return logits


def _val_logits(run: Run, learner: Learner, data: TrainData) -> np.ndarray:
    """The validation rows' logits ``(len(val_rows), C)``: in one process, or shared out among the ranks
    (:func:`~.distributed.shared_logits`: 1/N of one process's time, and no rank waits on another's)."""
    if run.dist is None:
        return run.engine.logits(learner.scored, run.store, run.val_rows, feature=run.feature,
                                 budget=data.eval_budget).logits
    return shared_logits(run.engine, learner.scored, run.store, run.val_rows, feature=run.feature,
                         budget=data.eval_budget, width=run.n_classes, d=run.dist)
