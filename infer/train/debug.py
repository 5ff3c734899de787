"""Two test hooks of the training loop, read from the environment, off unless set (documented in
docs/distributed.md, "Training on several processes"):

* ``SPECSTORE_TRAIN_DUMP_FIRST_STEP=DIR``: every rank writes ``DIR/first-step.rank<R>.pt`` after the run's first
  backward pass: its batch as the model saw it (``x``, ``lengths``, ``labels``), the flattened gradient after
  DDP's all-reduce (``grad``: the mean of the ranks' batch gradients) and the weights and buffers before the step
  (``initial``).  A test recomputes each rank's gradient in one process and compares (tests/infer/test_train_ddp.py).
* ``SPECSTORE_TRAIN_KILL_AFTER_EPOCH=N``: rank 0 (or the single process) kills itself with SIGKILL once epoch ``N``
  (1-based) is recorded, as a preempted job would be; torchrun then stops the other ranks.  A rerun resumes.

Both cost nothing when unset (one environment lookup per run, one per epoch); the dump is plain tensors
(``torch.save``, read with ``weights_only=True``).
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specstore.infer.models.checkpoint import save_torch_file

__all__ = ["DUMP_FIRST_STEP", "KILL_AFTER_EPOCH", "dump_first_step", "dump_folder", "kill_after"]

log = logging.getLogger("specstore.infer.train")

DUMP_FIRST_STEP = "SPECSTORE_TRAIN_DUMP_FIRST_STEP"
KILL_AFTER_EPOCH = "SPECSTORE_TRAIN_KILL_AFTER_EPOCH"


def dump_folder() -> Path | None:
    """Where the first step is dumped (None: not asked for)."""
    folder = os.environ.get(DUMP_FIRST_STEP)
    return Path(folder) if folder else None


def initial_state(net: nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of ``net``'s weights and buffers (taken before the first step changes them)."""
    return {k: v.detach().cpu().clone() for k, v in net.state_dict().items()}


def dump_first_step(folder: Path, rank: int, net: nn.Module, initial: dict[str, torch.Tensor],
                    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> Path:
    """Write the first step's batch, gradient and initial weights of this ``rank`` (see the module docstring)."""
    x, lengths, labels = (t.detach().cpu() for t in batch)
    grads = [p.grad.detach().flatten().cpu() for p in net.parameters() if p.requires_grad and p.grad is not None]
    payload: dict[str, Any] = {"x": x.contiguous(), "lengths": lengths, "labels": labels,
                               "grad": torch.cat(grads), "initial": initial}
    path = save_torch_file(payload, folder / f"first-step.rank{rank}.pt")
    log.info("wrote the first step's batch and gradient to %s (%s)", path, DUMP_FIRST_STEP)
    return path


def kill_after(epoch: int, is_main: bool) -> None:
    """SIGKILL this process if ``KILL_AFTER_EPOCH`` names ``epoch`` (1-based) and it is rank 0 (a test's
    preemption)."""
    wanted = os.environ.get(KILL_AFTER_EPOCH)
    if is_main and wanted and wanted.strip() == str(epoch):
        log.warning("%s=%s: killing this process after epoch %d", KILL_AFTER_EPOCH, wanted, epoch)
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
