"""Library figures 4, ``library_prefetch_vs_workers1/2``: the same inference pass fed by the reader thread
(infer.data.prefetch) and by DataLoader workers (see bench_library)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .bench_common import CpuWindow, Figure, log, median, rotated
from .bench_library_shared import N_BINS, _cores, _lognormal_frames
from .bench_plan import FPS

__all__ = ["prefetch_vs_workers"]


def prefetch_vs_workers(work: Path, *, n_clips: int, median_s: float, repeats: int, model: dict[str, Any],
                        seed: int = 11) -> list[Figure]:
    import torch
    from torch.utils.data import DataLoader

    from specstore.infer.data import BudgetBatchSampler, PadCollate, StoreDataset, prefetch
    from specstore.infer.engine.runtime import Engine, RunOptions

    from .bench_infer_data import make_checkpoint, make_store

    torch.set_num_threads(_cores())
    lengths = _lognormal_frames(n_clips, median_s, seed)
    store = make_store(work / "loader.zarr", lengths)
    ckpt = make_checkpoint(work / "loader.pt", **model)
    from specstore.infer.models.checkpoint import load_checkpoint

    engine = Engine(RunOptions(device="cpu", progress=False))
    net = engine.prepare(load_checkpoint(ckpt).build())
    budget = engine.budget(net, N_BINS)
    ds = StoreDataset(str(store), "mel")
    plan = BudgetBatchSampler(ds, budget)  # raises if a clip does not fit the budget alone
    batches = list(plan)
    collate = PadCollate(budget.frame_align)

    def run(source: Any) -> int:
        done = 0
        with torch.inference_mode():
            for b in source:
                net(b.x.contiguous(memory_format=torch.channels_last), b.lengths)
                done += len(b)
        return done

    variants: dict[str, Callable[[], int]] = {
        "thread": lambda: run(prefetch(ds, batches, collate)),
        "workers1": lambda: run(DataLoader(ds, batch_sampler=batches, collate_fn=collate, num_workers=1)),
        "workers2": lambda: run(DataLoader(ds, batch_sampler=batches, collate_fn=collate, num_workers=2)),
    }
    run(prefetch(ds, batches[:1], collate))  # warm-up
    times: dict[str, list[float]] = {k: [] for k in variants}
    foreign: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(repeats):
        for name in rotated(list(variants), r):
            with CpuWindow() as w:
                done = variants[name]()
            if done != n_clips:
                raise RuntimeError(f"{name} ran {done} of {n_clips} clips")
            times[name].append(w.wall)
            foreign[name].append(w.foreign_cores)
        log.info("loader repeat %d/%d: %s", r + 1, repeats,
                 ", ".join(f"{k} {n_clips / v[-1]:.1f} clips/s" for k, v in times.items()))
    details = {"clips": n_clips, "median_s": median_s, "audio_seconds": round(float(lengths.sum() / FPS), 1),
               "batches": len(batches), "repeats": repeats,
               "clips_per_s": {k: round(n_clips / median(v), 2) for k, v in times.items()},
               "times_s": {k: [round(x, 3) for x in v] for k, v in times.items()},
               "foreign_cores": {k: round(median(v), 2) for k, v in foreign.items()},
               "model": dict(model) or "default CNN (width 32, depth 4)", "cores": _cores()}
    shutil.rmtree(store, ignore_errors=True)
    figures = []
    for k in (1, 2):
        ratio = median([o / t for t, o in zip(times["thread"], times[f"workers{k}"], strict=True)])
        figures.append(Figure(
            f"library_prefetch_vs_workers{k}", f"Inference feed: reader thread vs DataLoader({k} worker"
            f"{'s' if k > 1 else ''})", round(ratio, 3), "x",
            f"clips/s of the same inference pass (planned batches, float32 channels-last, CPU) fed by "
            f"infer.data.prefetch (one reader thread, the built-in default) / fed by DataLoader(num_workers={k}, "
            f"worker start included); > 1: the thread is faster", details=details if k == 1 else {}))
    return figures
