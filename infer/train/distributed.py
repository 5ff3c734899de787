"""Training on several processes: ``make train NPROC=N`` runs :func:`~.loop.train` under ``torchrun`` with
DistributedDataParallel (gloo on CPU, nccl on GPU, one GPU per ``LOCAL_RANK``).

What each rank does and why (docs/distributed.md, "Training on several processes"):

* :func:`from_env` reads torchrun's environment (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``);
  without it, or with ``WORLD_SIZE=1``, training is today's single process and nothing here runs.
* :func:`process_group` initialises the group (or joins one the caller already made) and destroys what it made.
* :func:`smallest_budget`: every rank measures its memory budget and all take the smallest (bytes: MIN; cost per
  frame and fixed overhead: MAX), so every rank plans the same epoch and the sampler's replica split
  (:class:`~specstore.infer.data.BudgetBatchSampler` ``num_replicas``/``rank``) gives every clip once, nothing
  padded or dropped.
* :func:`broadcast_object`/:func:`broadcast_state`: the normalisation and the statistics head are fitted once (rank
  0) and sent to the others.
* :func:`average_running_stats`: the masked BatchNorm is *not* converted to SyncBatchNorm (which would count padded
  frames); each rank keeps its own running statistics (DDP's ``broadcast_buffers`` off) and they are averaged
  across ranks at the end of every epoch, so every rank, the checkpoint and the resume file hold the same ones.
* :func:`sum_over_ranks`: an epoch's loss and accuracy over every rank's clips (what rank 0 reports).
* :func:`shared_logits` (:func:`split_by_length`, :func:`gather_shares`): validation's distinct clips dealt to
  the ranks by length, each rank's logits gathered on every rank (a masked model's logits do not depend on which
  clips share a batch, so they are the ones one process computes).

Rank 0 alone writes the checkpoint, the resume file, the metrics and the config; the model path must therefore
lie on a file system every rank reads (a resumed run's ranks all read the resume file).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from specstore.infer.batching.budget import Budget
from specstore.infer.engine.runtime import Engine, distinct_rows
from specstore.store import Store

from ..errors import TrainError

__all__ = ["TORCHRUN_VARS", "Dist", "average_running_stats", "barrier", "broadcast_object", "broadcast_state",
           "from_env", "gather_shares", "one_process_only", "process_group", "quiet_unless_main", "same_on_every_rank",
           "shared_logits", "smallest_budget", "split_by_length", "sum_over_ranks", "wrap"]

log = logging.getLogger("specstore.infer.train")

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")
"""The variables torchrun (and ``srun torchrun``) sets in each worker: all of them mean "a distributed run"."""


@dataclass(frozen=True)
class Dist:
    """This process's place in a distributed run: ``rank`` of ``world`` processes, ``local_rank`` on its machine
    (its GPU index), ``local_world`` processes on its machine (they share its cores), the ``backend``."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    backend: str

    @property
    def is_main(self) -> bool:
        """Rank 0: the one process that writes files and logs epochs."""
        return self.rank == 0

    @property
    def device(self) -> torch.device:
        """Where collectives' tensors live: this rank's GPU for nccl, else the CPU."""
        return torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")


def from_env(device: str = "auto") -> Dist | None:
    """The distributed run torchrun started this process in, or None (a single process).

    ``device``: the run options' device (``auto``, ``cpu``, ``cuda[:N]``): nccl when it resolves to CUDA, else
    gloo.  A partial torchrun environment is refused in one line (it would otherwise hang at the rendezvous).
    """
    present = [k for k in TORCHRUN_VARS if k in os.environ]
    if not present:
        return None
    if len(present) != len(TORCHRUN_VARS):
        missing = ", ".join(k for k in TORCHRUN_VARS if k not in os.environ)
        raise TrainError(f"a distributed run needs {', '.join(TORCHRUN_VARS)} (torchrun sets them); {missing} "
                         "missing")
    try:
        rank, world, local = (int(os.environ[k]) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    except ValueError as e:
        raise TrainError(f"unreadable torchrun environment: {e}") from None
    if world <= 1:
        return None
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return Dist(rank, world, local, max(1, local_world), "nccl" if cuda else "gloo")


@contextlib.contextmanager
def process_group(d: Dist) -> Iterator[Dist]:
    """The process group for ``d``, destroyed on leaving unless the caller had made it already."""
    made = not dist.is_initialized()
    if made:
        if d.backend == "nccl":
            torch.cuda.set_device(d.local_rank)
            dist.init_process_group("nccl", device_id=d.device)
        else:
            dist.init_process_group("gloo")
        log.info("rank %d of %d joined the %s process group", d.rank, d.world, d.backend)
    elif dist.get_world_size() != d.world or dist.get_rank() != d.rank:
        raise TrainError(f"the existing process group (rank {dist.get_rank()} of {dist.get_world_size()}) is not "
                         f"the environment's (rank {d.rank} of {d.world})")
    try:
        yield d
    finally:
        if made and dist.is_initialized():
            dist.destroy_process_group()


def wrap(net: nn.Module, d: Dist) -> nn.Module:
    """``net`` in DistributedDataParallel: rank 0's weights and buffers to every rank now, gradients averaged
    every step; buffers (BatchNorm's running statistics) left per rank (:func:`average_running_stats`)."""
    ids = [d.local_rank] if d.backend == "nccl" else None
    ddp = nn.parallel.DistributedDataParallel
    if "forward_sync_buffers" in inspect.signature(ddp.__init__).parameters:  # torch >= 2.13's name for it
        return ddp(net, device_ids=ids, forward_sync_buffers=False)
    return ddp(net, device_ids=ids, broadcast_buffers=False)


def smallest_budget(budget: Budget, d: Dist) -> Budget:
    """The smallest of every rank's ``budget``: bytes MIN, cost per frame and fixed overhead MAX (batches that
    fit on every rank, the same on every rank)."""
    t = torch.tensor([-float(budget.budget_bytes), float(budget.cost_per_frame), float(budget.fixed_overhead)],
                     dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    smallest = replace(budget, budget_bytes=int(-t[0].item()), cost_per_frame=float(t[1].item()),
                       fixed_overhead=int(t[2].item()))
    if smallest != budget:
        log.info("rank %d: the smallest budget of the %d ranks: %s", d.rank, d.world, smallest.describe())
    return smallest


def broadcast_object(value: Any, d: Dist) -> Any:
    """Rank 0's ``value`` (plain data: numbers, strings, arrays, dicts of them) on every rank."""
    box = [value if d.is_main else None]
    dist.broadcast_object_list(box, src=0, device=d.device if d.backend == "nccl" else None)
    return box[0]


@torch.no_grad()
def broadcast_state(module: nn.Module, d: Dist) -> None:
    """Rank 0's parameters and buffers of ``module`` copied into every rank's (e.g. a head fitted on rank 0)."""
    for t in [*module.parameters(), *module.buffers()]:
        dist.broadcast(t.data, src=0)


def _running_stats(module: nn.Module) -> list[torch.Tensor]:
    """The floating-point ``running_*`` buffers (BatchNorm's running mean and variance), in a fixed order."""
    return [b for name, b in module.named_buffers() if name.rsplit(".", 1)[-1].startswith("running_")
            and b.dtype.is_floating_point]


@torch.no_grad()
def average_running_stats(module: nn.Module, d: Dist) -> int:
    """Replace every rank's running statistics of ``module`` by their mean over the ranks; how many buffers."""
    stats = _running_stats(module)
    if stats:
        flat = torch.cat([b.detach().flatten().to(torch.float64) for b in stats]).to(d.device)
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= d.world
        k = 0
        for b in stats:
            b.copy_(flat[k:k + b.numel()].view_as(b).to(b.device, b.dtype))
            k += b.numel()
    return len(stats)


def sum_over_ranks(values: list[float], d: Dist) -> list[float]:
    """``values`` summed over the ranks (float64)."""
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return [float(v) for v in t.tolist()]


def split_by_length(lengths: np.ndarray, d: Dist) -> list[np.ndarray]:
    """Positions ``0..len(lengths)`` dealt to the ranks: sorted by length (frames) and dealt round robin, so every
    rank gets about the same work; the same split on every rank (a pure function of the lengths)."""
    order = np.argsort(np.asarray(lengths), kind="stable")
    return [order[r::d.world] for r in range(d.world)]


def gather_shares(part: np.ndarray, shares: list[np.ndarray], width: int, d: Dist) -> np.ndarray:
    """Every rank's ``part`` (float32 rows, one per position of its share in ``shares``) put together, on every
    rank: an array of ``sum(len(share))`` rows of ``width`` columns, row ``p`` from the rank whose share holds ``p``."""
    most = max(len(share) for share in shares)
    mine = torch.zeros((most, width), dtype=torch.float32, device=d.device)
    mine[:len(part)] = torch.from_numpy(np.ascontiguousarray(part, dtype=np.float32)).to(d.device)
    got = [torch.empty_like(mine) for _ in range(d.world)]
    dist.all_gather(got, mine)
    out = np.empty((sum(len(share) for share in shares), width), dtype=np.float32)
    for share, rows in zip(shares, got, strict=True):
        out[share] = rows[:len(share)].cpu().numpy()
    return out


def shared_logits(engine: Engine, model: nn.Module, store: Store, rows: np.ndarray, *, feature: str, budget: Budget,
                  width: int, d: Dist) -> np.ndarray:
    """The logits ``(len(rows), width)`` of store ``rows``, on every rank, each rank computing its share of the
    distinct contents (:func:`split_by_length`); ``model`` must be the same on every rank (it is, after
    :func:`average_running_stats`).  Equal to one process's ``engine.logits`` (a masked model's logits do not
    depend on which clips share a batch; ``budget`` is the ranks' smallest, so a long clip's windows match)."""
    first, content = distinct_rows(rows, store.hashes)
    shares = split_by_length(store.lengths[first], d)
    mine = first[shares[d.rank]]
    part = np.zeros((0, width), np.float32)
    if len(mine):
        part = engine.logits(model, store, mine, feature=feature, budget=budget).logits
    return gather_shares(part, shares, width, d)[content]


def same_on_every_rank(value: int, d: Dist, what: str) -> None:
    """Refuse in one line when ranks disagree on ``value`` (e.g. the epoch their resume file says)."""
    t = torch.tensor([value, -value], dtype=torch.int64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if int(t[0]) != -int(t[1]):
        raise TrainError(f"the ranks disagree on {what} ({-int(t[1])} to {int(t[0])}); MODEL must lie on a file "
                         "system every rank shares")


@contextlib.contextmanager
def quiet_unless_main(d: Dist | None) -> Iterator[None]:
    """On ranks other than 0, only errors of ``specstore``'s loggers while inside (rank 0 says it all once)."""
    logger = logging.getLogger("specstore")
    before = logger.level
    if d is not None and not d.is_main:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def one_process_only(what: str) -> None:
    """Refuse ``what`` in one line under torchrun: it has no distributed path, and every rank would write the
    same files."""
    if any(k in os.environ for k in TORCHRUN_VARS) and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise TrainError(f"{what} runs in one process only; drop NPROC (make train NPROC=N trains the CNN from "
                         "scratch only, e.g. with ARGS='--backbone none')")


def barrier(d: Dist | None) -> None:
    """Wait for every rank (a no-op in a single process)."""
    if d is not None:
        dist.barrier()
