"""The variants the inference figures time: our prediction loop (end to end and set-up excluded), the fixed
batch of 4 users write, and the dense no-padding limit (see bench_infer)."""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .bench_infer_data import LABELS

__all__ = ["DenseLimit", "FixedCore", "OursCore", "run_fixed", "run_ours"]


def run_ours(store: Path, ckpt: Path, device: str = "cpu") -> Any:
    from specstore.infer.engine.predict import predict

    return predict(str(store), str(ckpt), device=device, progress=False)


def run_fixed(store: Path, ckpt: Path, batch_size: int = 4, device: str = "cpu",
              autocast: Any = None) -> np.ndarray:
    """Batches of ``batch_size`` in arrival order: open, load, read ahead, pad, run, softmax."""
    import contextlib

    import torch

    from specstore.infer.batching.planner_baselines import fixed_batches
    from specstore.infer.data import PadCollate, StoreDataset, prefetch
    from specstore.infer.models.checkpoint import load_checkpoint
    from specstore.infer.models.contract import time_stride
    from specstore.store import open_store

    dev = torch.device(device)
    s = open_store(str(store))
    model = load_checkpoint(ckpt).build(dev)
    channels_last = dev.type == "cpu"
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    plan = fixed_batches(s.lengths, batch_size)
    out = np.zeros((len(s), len(LABELS)), dtype=np.float32)
    amp = torch.autocast(device_type=dev.type, dtype=autocast) if autocast is not None else contextlib.nullcontext()
    with torch.inference_mode(), amp:
        for batch in prefetch(StoreDataset(s, "mel"), plan.batches, PadCollate(time_stride(model)),
                              pin=dev.type == "cuda"):
            b = batch.to(dev, non_blocking=True)
            x = b.x.contiguous(memory_format=torch.channels_last) if channels_last else b.x
            out[batch.ids] = torch.softmax(model(x, b.lengths).float(), dim=1).cpu().numpy()
    return out


class DenseLimit:
    """The store's real frames as dense ``(16, 1, n_bins, T)`` channels-last batches, in memory."""

    def __init__(self, store: Path, ckpt: Path, batch: int = 16, frames: int = 2048) -> None:
        import torch

        from specstore.infer.models.checkpoint import load_checkpoint
        from specstore.store import open_store

        s = open_store(str(store))
        self.model = load_checkpoint(ckpt).build("cpu").to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        flat = np.concatenate([np.asarray(s.feature("mel").frames(i), dtype=np.float32) for i in range(len(s))])
        total = flat.shape[0]
        per = batch * frames
        self.batches = []
        for s0 in range(0, total, per):
            part = flat[s0:s0 + per]
            b = max(1, part.shape[0] // frames)
            t = part.shape[0] // b  # last batch: fewer rows and/or shorter, no padding
            x = torch.from_numpy(np.ascontiguousarray(part[: b * t].reshape(b, t, -1).transpose(0, 2, 1)))
            rest = part[b * t:]
            self.batches.append((x[:, None].contiguous(memory_format=torch.channels_last),
                                 torch.full((b,), t, dtype=torch.int64)))
            if rest.shape[0]:
                x = torch.from_numpy(np.ascontiguousarray(rest.T))[None, None]
                self.batches.append((x.contiguous(memory_format=torch.channels_last),
                                     torch.tensor([rest.shape[0]], dtype=torch.int64)))
        self.frames = sum(int(x.shape[0] * x.shape[-1]) for x, _ in self.batches)
        assert self.frames == total, (self.frames, total)

    def warm(self) -> None:
        """The model's first call (one small batch), untimed."""
        import torch

        x, _ = self.batches[-1]
        with torch.inference_mode():
            self.model(x[:1, ..., :256], torch.tensor([min(256, x.shape[-1])]))

    def __call__(self) -> None:
        import torch

        with torch.inference_mode():
            for x, lengths in self.batches:
                torch.softmax(self.model(x, lengths), dim=1)


class OursCore:
    """Our prediction loop as :func:`specstore.infer.engine.predict.predict` runs it, set-up excluded.

    Set-up (untimed, once): open the store, load the checkpoint, resolve
    device/precision/layout exactly as ``predict`` does (:class:`specstore.infer.engine.runtime.Engine`)
    and measure the model's memory budget.  A call is :meth:`Engine.logits`
    over every row (plan by length under the budget, read + pad on the
    loader thread, run) plus the softmax.
    """

    def __init__(self, store: Path, ckpt: Path) -> None:
        from specstore.infer.engine.runtime import Engine, RunOptions
        from specstore.infer.models.checkpoint import load_checkpoint
        from specstore.store import open_store

        self.store = open_store(str(store))
        checkpoint = load_checkpoint(ckpt)
        self.engine = Engine(RunOptions(device="cpu", progress=False))
        self.model = self.engine.prepare(checkpoint.build())
        self.feature = checkpoint.feature
        self.budget = self.engine.budget(self.model, self.store.specs[self.feature].n_bins)

    def __call__(self) -> Any:
        import torch

        out = self.engine.logits(self.model, self.store, np.arange(len(self.store)), feature=self.feature,
                                 budget=self.budget)
        torch.softmax(torch.from_numpy(out.logits), dim=1)
        return out


class FixedCore:
    """The loop users write, set-up excluded: batches of ``batch_size`` in arrival order, read ahead by the
    same loader thread, padded to their longest clip, same model, precision and layout."""

    def __init__(self, store: Path, ckpt: Path, batch_size: int = 4) -> None:
        import torch

        from specstore.infer.batching.planner_baselines import fixed_batches
        from specstore.infer.models.checkpoint import load_checkpoint
        from specstore.store import open_store

        self.store = open_store(str(store))
        self.model = load_checkpoint(ckpt).build("cpu").to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.plan = fixed_batches(self.store.lengths, batch_size)

    def __call__(self) -> np.ndarray:
        import torch

        from specstore.infer.data import PadCollate, StoreDataset, prefetch

        out = np.zeros((len(self.store), len(LABELS)), dtype=np.float32)
        with torch.inference_mode():
            for b in prefetch(StoreDataset(self.store, "mel"), self.plan.batches, PadCollate(self.model.time_stride)):
                logits = self.model(b.x.contiguous(memory_format=torch.channels_last), b.lengths)
                out[b.ids] = torch.softmax(logits, dim=1).numpy()
        return out


def _profile(fn: Callable[[], Any], top: int = 16) -> str:
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return "\n".join(lines[start:start + top + 1])
