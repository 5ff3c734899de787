"""The CUDA paths (``gpu``-marked; skipped without CUDA, run by ``make gpu-check`` on a GPU machine), and the
parts of their logic that can be proven on a CPU (out-of-memory split and retry, autocast batched == alone).

This module imports only ``specstore.store`` and ``specstore.infer`` (plus torch and numpy), so the GPU machine needs no
audio libraries to run it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from specstore.infer.batching.budget import Budget
from specstore.infer.data import PadCollate, StoreDataset
from specstore.infer.engine.cost import measure_cost_per_frame
from specstore.infer.engine.device import memory_bytes
from specstore.infer.engine.predict import predict
from specstore.infer.engine.runtime import Engine, RunOptions
from specstore.infer.models import ModelConfig, build_model
from specstore.infer.models.checkpoint import Checkpoint, save_checkpoint
from specstore.infer.options.defaults import PLAIN_MODEL
from specstore.infer.train import TrainConfig, train
from specstore.store import FeatureSpec, create_store, open_store

SPEC = FeatureSpec.mel(n_bins=32)
LABELS = ["a", "b", "c"]
MIB = 1 << 20


def make_store(path: Path, lengths: list[int], seed: int = 0, separable: bool = False) -> Path:
    """Random dB clips (class k lifts bins [0, 8k) by 12 dB when ``separable``)."""
    rng = np.random.default_rng(seed)
    w = create_store(path, {"mel": SPEC}, label_names=LABELS)
    arrays, rows = [], []
    for k, n in enumerate(lengths):
        a = rng.normal(-45.0, 10.0, (n, SPEC.n_bins)).astype(np.float32)
        if separable:
            a[:, : 8 * (k % 3)] += 12.0
        arrays.append(a)
        rows.append({"path": f"{LABELS[k % 3]}/c{k:04d}.wav", "hash": f"g{seed}-{k}", "label": LABELS[k % 3],
                     "duration": n * SPEC.frame_seconds})
    w.add_clips(rows, {"mel": arrays})
    with contextlib.suppress(AttributeError):
        w.close()  # release the writer lock where the store has one
    return path


def make_checkpoint(path: Path, seed: int = 0, **config: object) -> Path:
    torch.manual_seed(seed)
    model = build_model(ModelConfig(n_bins=SPEC.n_bins, n_classes=3, **{**PLAIN_MODEL,
                                    "width": 8, "depth": 3, **config}))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    save_checkpoint(Checkpoint.from_model(model, LABELS, "mel", SPEC), path)
    return path


@contextlib.contextmanager
def no_tf32() -> Iterator[None]:
    """Exact fp32 on CUDA (TF32 convolutions and matmuls round to 10 bits)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def alone_probs(store: Path, ckpt: Path, device: str, precision: str) -> np.ndarray:
    """Every clip in a batch of its own (the reference for batched == alone)."""
    from specstore.infer.models.checkpoint import load_checkpoint

    s = open_store(store)
    engine = Engine(RunOptions(device=device, precision=precision, progress=False))
    model = engine.prepare(load_checkpoint(ckpt).build())
    out = []
    for i in range(len(s)):
        x = torch.from_numpy(np.asarray(s[i], dtype=np.float32))[None, None].to(engine.device)
        if engine.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.inference_mode(), engine.amp():
            logits = model(x, torch.tensor([x.shape[-1]], device=engine.device)).float()
        out.append(torch.softmax(logits, dim=1)[0].cpu().numpy())
    return np.stack(out)


# -- logic proven on the CPU ------------------------------------------------------------------------------

class _OomAbove(nn.Module):
    """Wraps a model; raises CUDA's out-of-memory error for batches larger than ``limit`` clips."""

    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner, self.limit, self.calls = inner, limit, 0
        self.time_stride = inner.time_stride

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        if x.shape[0] > self.limit:
            raise torch.cuda.OutOfMemoryError("simulated")
        return self.inner(x, lengths)


def test_out_of_memory_is_split_and_retried_with_no_clip_lost(tmp_path: Path) -> None:
    from specstore.infer.models.checkpoint import load_checkpoint

    store = make_store(tmp_path / "s.zarr", [40 + 7 * k for k in range(30)])
    ckpt = load_checkpoint(make_checkpoint(tmp_path / "m.pt"))
    s = open_store(store)
    engine = Engine(RunOptions(device="cpu", max_batch=16, progress=False))
    plain = engine.logits(engine.prepare(ckpt.build()), s, np.arange(len(s)))
    flaky = _OomAbove(engine.prepare(ckpt.build()), limit=3)
    budget = engine.budget(ckpt.build(), SPEC.n_bins)
    res = engine.logits(flaky, s, np.arange(len(s)), budget=budget)
    assert res.oom_retries > 0 and plain.oom_retries == 0
    np.testing.assert_allclose(res.logits, plain.logits, atol=1e-4)


def test_batched_equals_alone_under_bf16_autocast_on_cpu(tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", [17, 64, 150, 33, 90])
    ckpt = make_checkpoint(tmp_path / "m.pt")
    batched = predict(store, ckpt, device="cpu", precision="bf16", progress=False).probs
    # bf16 keeps 8 bits of mantissa (relative step 2**-8): a few layers of rounding move probabilities by
    # about 1e-2, and batch composition only changes the kernels' summation order.
    np.testing.assert_allclose(batched, alone_probs(store, ckpt, "cpu", "bf16"), atol=2e-2)


# -- CUDA ------------------------------------------------------------------------------------------------

gpu = pytest.mark.gpu


@gpu
def test_budget_is_free_memory_minus_the_margin() -> None:
    device = torch.device("cuda")
    free, _ = torch.cuda.mem_get_info(device)
    got, source = memory_bytes(device, margin_mb=1536)
    assert abs(got - (free - 1536 * MIB)) < 256 * MIB and "free GPU memory" in source
    capped, _ = memory_bytes(device, budget_mb=1024)
    assert capped == 1024 * MIB


@gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cost_probe_bounds_the_real_peak(precision: str) -> None:
    device = torch.device("cuda")
    engine = Engine(RunOptions(device="cuda", precision=precision, progress=False))
    model = engine.prepare(build_model(ModelConfig(**PLAIN_MODEL, n_bins=128, n_classes=10)))
    cost = measure_cost_per_frame(model, 128, device=device, autocast=engine.autocast)
    rule = Budget.for_cost(2**40, cost, frame_align=model.time_stride)
    for batch, frames in ((4, 512), (16, 1024), (8, 4096)):
        x = torch.randn(batch, 1, 128, frames, device=device) * 20 - 40
        lengths = torch.full((batch,), frames, device=device)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        with torch.inference_mode(), engine.amp():
            model(x, lengths)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated(device) - base + x.numel() * x.element_size()
        planned = rule.bytes(batch, frames)
        assert peak <= planned * 1.02 + 8 * MIB, (precision, batch, frames, peak, planned)
        assert peak >= 0.5 * planned, (precision, batch, frames, peak, planned)  # not a wasteful over-estimate


@gpu
def test_pinned_batches_copy_without_blocking(tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    store = make_store(tmp_path / "s.zarr", [30, 50, 70, 90])
    ds = StoreDataset(store)
    loader = DataLoader(ds, batch_size=2, collate_fn=PadCollate(4), pin_memory=True)
    for batch in loader:
        assert batch.x.is_pinned() and batch.lengths.is_pinned() and batch.labels.is_pinned()
        on_gpu = batch.to("cuda", non_blocking=True)
        torch.cuda.synchronize()
        assert torch.equal(on_gpu.x.cpu(), batch.x) and on_gpu.x.device.type == "cuda"


@gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_training_under_autocast_with_the_grad_scaler(precision: str, tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", [40 + 5 * k for k in range(36)], separable=True)
    res = train(store, tmp_path / "m.pt", TrainConfig(epochs=3, width=8, depth=2, lr=0.02, crop_seconds=None,
                                                     run=RunOptions(device="cuda", precision=precision),
                                                     val_fraction=0.25),
                progress=False)
    losses = [h["loss"] for h in res.history]
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert res.best_val_accuracy is not None


@gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_batched_equals_alone_on_cuda(precision: str, tmp_path: Path) -> None:
    store = make_store(tmp_path / "s.zarr", [17, 64, 150, 33, 90, 400, 1000])
    ckpt = make_checkpoint(tmp_path / "m.pt")
    with no_tf32():
        batched = predict(store, ckpt, device="cuda", precision=precision, progress=False).probs
        alone = alone_probs(store, ckpt, "cuda", precision)
    # fp32 without TF32: float rounding only; bf16: 8-bit mantissas (see the CPU test above)
    np.testing.assert_allclose(batched, alone, atol=1e-4 if precision == "fp32" else 2e-2)


@gpu
def test_a_real_out_of_memory_is_split_and_retried(tmp_path: Path) -> None:
    device = torch.device("cuda", torch.cuda.current_device())  # the memory-fraction call needs an index
    store = make_store(tmp_path / "s.zarr", [3000] * 24)
    ckpt = make_checkpoint(tmp_path / "m.pt", width=32, depth=4)
    with no_tf32():
        reference = predict(store, ckpt, device="cuda", precision="fp32", max_batch=1, progress=False)
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        whole = predict(store, ckpt, device="cuda", precision="fp32", budget_mb=8192, max_batch=24, progress=False)
        peak = torch.cuda.max_memory_allocated(device) - base  # the one batch of 24, uncapped
        assert whole.stats.batches == 1 and whole.stats.oom_retries == 0
        torch.cuda.empty_cache()
        total = torch.cuda.get_device_properties(device).total_memory
        allowed = torch.cuda.memory_allocated(device) + peak // 3
        torch.cuda.set_per_process_memory_fraction(allowed / total, device)
        try:  # the planner is told 8 GiB; the allocator allows a third of what the batch of 24 needs
            squeezed = predict(store, ckpt, device="cuda", precision="fp32", budget_mb=8192, max_batch=24,
                               progress=False)
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
            torch.cuda.empty_cache()
    assert squeezed.stats.oom_retries > 0
    np.testing.assert_allclose(squeezed.probs, reference.probs, atol=1e-4)  # every clip, right values


@gpu
def test_training_steps_with_and_without_gradient_checkpointing() -> None:
    device = torch.device("cuda")
    peaks, costs = {}, {}
    for flag in (False, True):
        torch.manual_seed(0)
        model = build_model(ModelConfig(**PLAIN_MODEL,
                                        arch="resnet", n_bins=128, n_classes=10, dropout=0.0)).to(device).train()
        model.grad_checkpoint = flag
        costs[flag] = measure_cost_per_frame(model, 128, device=device, training=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(8, 1, 128, 2048, device=device) * 20 - 40
        lengths = torch.tensor([2048, 1900, 1500, 1200, 1000, 800, 600, 400], device=device)
        y = torch.arange(8, device=device) % 10
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x, lengths), y).backward()
            opt.step()
        torch.cuda.synchronize()
        peaks[flag] = torch.cuda.max_memory_allocated(device) - base
        assert np.isfinite(float(F.cross_entropy(model(x, lengths), y)))
    assert peaks[True] < peaks[False]
    assert costs[True].bytes_per_frame < costs[False].bytes_per_frame
