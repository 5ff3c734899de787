"""A diagnostic of data-parallel training, read from the environment, off unless set (documented in
docs/distributed.md, "Training on several processes").

``SPECSTORE_TRAIN_DUMP_FIRST_STEP=DIR``: every rank writes ``DIR/first-step.rank<R>.pt`` after the run's first
backward pass: its batch as the model saw it (``x``, ``lengths``, ``labels``), the flattened gradient after DDP's
all-reduce (``grad``: the mean of the ranks' batch gradients) and the weights and buffers before the step
(``initial``).  Recomputing each rank's gradient in one process from it shows whether the ranks average what they
should (tests/infer/test_train_ddp.py does).  The gradient after the all-reduce exists only inside the step, so
nothing outside the run can observe it; a run's processes under torchrun take no Python callback, hence the
variable.  It costs one environment lookup per run when unset; the dump is plain tensors (``torch.save``, read
with ``weights_only=True``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specstore.infer.models.checkpoint import save_torch_file

__all__ = ["DUMP_FIRST_STEP", "dump_first_step", "dump_folder", "initial_state"]

log = logging.getLogger("specstore.infer.train")

DUMP_FIRST_STEP = "SPECSTORE_TRAIN_DUMP_FIRST_STEP"


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
