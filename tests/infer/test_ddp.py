"""DistributedDataParallel for real: 2 processes on CPU (gloo) train a few steps on BudgetBatchSampler's
per-rank batches, and their gradients equal one process's over the same batches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from factories import make_separable_store

from specstore.infer.batching.budget import Budget
from specstore.infer.data import BudgetBatchSampler, PadCollate, StoreDataset
from specstore.infer.models import ModelConfig, build_model
from specstore.infer.options.defaults import PLAIN_MODEL

pytestmark = pytest.mark.slow

WORLD = 2
STEPS = 3
BUDGET = Budget(2_000_000, 2000.0, max_batch=6, frame_align=4)
CONFIG = ModelConfig(**PLAIN_MODEL, n_bins=16, n_classes=3, width=4, depth=2, dropout=0.0)


def _data(store: str, rank: int) -> tuple[StoreDataset, BudgetBatchSampler]:
    ds = StoreDataset(store, crop_frames=64, seed=11)
    sampler = BudgetBatchSampler(ds, BUDGET, shuffle=True, seed=5, num_replicas=WORLD, rank=rank)
    sampler.set_epoch(1)
    return ds, sampler


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(CONFIG).train()


def _flat_grads(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def _rank_main(rank: int, store: str, init: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        torch.set_num_threads(1)
        ds, sampler = _data(store, rank)
        ddp = torch.nn.parallel.DistributedDataParallel(_model())
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        collate = PadCollate(BUDGET.frame_align)
        grads, batches = [], []
        for step, ids in enumerate(sampler):
            if step == STEPS:
                break
            batch = collate([ds[i] for i in ids])
            opt.zero_grad()
            F.cross_entropy(ddp(batch.x, batch.lengths), batch.labels).backward()
            grads.append(_flat_grads(ddp.module).clone())
            batches.append(list(ids))
            opt.step()
        torch.save({"grads": grads, "batches": batches, "n_batches": len(sampler)}, f"{out}.{rank}")
    finally:
        torch.distributed.destroy_process_group()


def test_two_process_ddp_matches_one_process(tmp_path: Path) -> None:
    store = str(make_separable_store(tmp_path / "s.zarr", n=40, lengths=(20, 200)))
    out = str(tmp_path / "result")
    mp.start_processes(_rank_main, args=(store, f"file://{tmp_path / 'rendezvous'}", out), nprocs=WORLD,
                       join=True, start_method="spawn")
    results = [torch.load(f"{out}.{r}", weights_only=True) for r in range(WORLD)]
    assert results[0]["n_batches"] == results[1]["n_batches"] >= STEPS  # the same number of batches per rank
    for r0, r1 in zip(results[0]["batches"], results[1]["batches"], strict=True):
        assert not set(r0) & set(r1)  # disjoint

    # One process, the same batches: the gradient of each rank's batch, averaged (what DDP's all-reduce does).
    ds, _ = _data(store, 0)
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    collate = PadCollate(BUDGET.frame_align)
    for step in range(STEPS):
        per_rank = []
        for r in range(WORLD):
            model.zero_grad()
            batch = collate([ds[i] for i in results[r]["batches"][step]])
            F.cross_entropy(model(batch.x, batch.lengths), batch.labels).backward()
            per_rank.append(_flat_grads(model).clone())
        mean = torch.stack(per_rank).mean(dim=0)
        for r in range(WORLD):
            torch.testing.assert_close(results[r]["grads"][step], mean, rtol=1e-4, atol=1e-6)
        for p, g in zip(model.parameters(), _split_like(mean, model), strict=True):
            p.grad = g
        opt.step()
    # and over a whole epoch every clip is seen exactly once across the ranks
    epoch = [i for r in range(WORLD) for b in _data(store, r)[1] for i in b]
    assert sorted(epoch) == list(range(len(ds)))


def _split_like(flat: torch.Tensor, model: torch.nn.Module) -> list[torch.Tensor]:
    out, k = [], 0
    for p in model.parameters():
        out.append(flat[k:k + p.numel()].view_as(p).clone())
        k += p.numel()
    assert k == flat.numel() and np.isfinite(flat.numpy()).all()
    return out
