"""The pretrained backbone beside the default CNN: a transfer row per corpus, and throughput and memory per clip.

* :func:`transfer_figures`: on a corpus of the model grid (:mod:`.bench_model`), a head on the shipped
  ``musicnn-msd`` backbone (``make train ARCH=musicnn``: the backbone's one pass, then the head) trained on the
  same training store and scored on the same test store as the default recipe: held-out accuracy with its
  bootstrap interval and the training minutes (the backbone's pass included), side by side.
* :func:`backbone_throughput`: clips per second (CPU) and the engine's measured bytes per clip of the backbone's
  embedding pass and of the default CNN's forward, on the same number of clips of the same length (each model
  on its own feature: musicnn's mel at 62.5 frames/s, the default mel+CQT at 43 frames/s), timed in interleaved
  repeats with the order rotated.

Where the shipped backbone or its feature kind is not available in this install, the figures are reported as
not measured, with the reason.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .bench_common import CpuWindow, Figure, log, median, rotated

BACKBONE = "musicnn-msd"


def available() -> str | None:
    """Why the backbone cannot be measured here (None: it can; its feature kind is then registered, since its
    spec was made)."""
    try:
        backbone_feature()
    except Exception as e:  # noqa: BLE001 -- any failure to load is the reason reported
        return f"not measured: {BACKBONE} does not load here ({str(e).splitlines()[0]})"
    return None


def backbone_feature() -> str:
    """The feature the backbone reads (its kind's name), which the grid's stores must hold for the transfer row."""
    from specstore.infer.models.shipped import load_shipped

    return load_shipped(BACKBONE).feature


def transfer_figures(name: str, title: str, stores: dict[str, Path], work: Path) -> list[Figure]:
    """The transfer row of one corpus: train a head on the backbone (stores hold its feature), score the test."""
    from specstore.infer.evaluation.evaluate import evaluate
    from specstore.infer.options.run_options import RunOptions
    from specstore.infer.train import TrainConfig
    from specstore.infer.train.transfer import train_transfer

    model = work / f"{name}-transfer.pt"
    t0 = time.perf_counter()
    res = train_transfer(stores["train"], model, TrainConfig(backbone=BACKBONE, run=RunOptions(device="cpu")),
                         progress=False, overwrite=True, cache_path=work / f"{name}-transfer.embeddings.npz")
    minutes = (time.perf_counter() - t0) / 60
    report = evaluate(stores["test"], model, split="all", device="cpu", progress=False)
    lo, hi = report.accuracy_ci
    log.info("%s transfer: accuracy %.3f [%.3f, %.3f], %.1f min", name, report.accuracy, lo, hi, minutes)
    details: dict[str, Any] = {"accuracy_ci": [lo, hi], "train_minutes": round(minutes, 2),
                               "backbone_seconds": round(res.backbone_seconds, 1), "head": res.fit}
    return [Figure(f"model_{name}_transfer_accuracy", f"{title}: a head on {BACKBONE}, held-out accuracy",
                   round(report.accuracy, 4), "fraction", f"{report.n_clips} test clips, 95% bootstrap interval "
                   f"{lo:.3f}-{hi:.3f}; trained in {minutes:.2f} min ({res.backbone_seconds:.0f} s of it the "
                   "backbone's pass)", details=details),
            Figure(f"model_{name}_transfer_train_minutes", f"{title}: `make train ARCH=musicnn` wall time",
                   round(minutes, 2), "min", "the backbone's pass over the training clips, then the head")]


def _inputs(n_bins: int, frames: int, n_clips: int) -> list[Any]:
    import numpy as np

    rng = np.random.default_rng(0)
    return [(rng.normal(-40.0 if n_bins != 96 else 1.0, 10.0 if n_bins != 96 else 0.5, (n_bins, frames))
             ).astype(np.float32) for _ in range(n_clips)]


def backbone_throughput(*, n_clips: int, seconds: float, repeats: int) -> list[Figure]:
    """Clips per second and bytes per clip of the backbone's embedding pass and the default CNN's forward."""
    why = available()
    if why is not None:
        return [Figure("model_backbone_clips_per_s", f"{BACKBONE} embedding pass, clips/s (CPU)", None, "clips/s",
                       why, note=why)]
    from specstore.infer.data import ArrayDataset
    from specstore.infer.engine.runtime import Engine, RunOptions
    from specstore.infer.models import ModelConfig, build_model
    from specstore.infer.models.shipped import load_shipped
    from specstore.infer.train.transfer import _Embedder
    from specstore.store import FeatureSpec

    shipped = load_shipped(BACKBONE)
    engine = Engine(RunOptions(device="cpu", progress=False))
    specs = {"default CNN": (FeatureSpec.mel().n_bins + FeatureSpec.cqt().n_bins, FeatureSpec.mel().frame_seconds),
             BACKBONE: (shipped.n_bins, shipped.spec.frame_seconds)}
    models = {"default CNN": engine.prepare(build_model(ModelConfig(n_bins=specs["default CNN"][0], n_classes=10))),
              BACKBONE: engine.prepare(_Embedder(shipped.build()))}
    arrays = {k: _inputs(b, int(seconds / fs), n_clips) for k, (b, fs) in specs.items()}
    data = {k: ArrayDataset(v) for k, v in arrays.items()}
    budgets = {k: engine.budget(m, specs[k][0]) for k, m in models.items()}
    for k in models:  # warm-up
        engine.clip_logits(models[k], ArrayDataset(arrays[k][:1]), budget=budgets[k])
    times: dict[str, list[float]] = {k: [] for k in models}
    for r in range(repeats):
        for k in rotated(list(models), r):
            with CpuWindow() as w:
                engine.clip_logits(models[k], data[k], budget=budgets[k])
            times[k].append(w.wall)
    rate = {k: n_clips / median(v) for k, v in times.items()}
    per_clip = {k: budgets[k].cost_per_frame * int(seconds / specs[k][1]) / 2**20 for k in models}
    details = {"clips": n_clips, "seconds": seconds, "repeats": repeats,
               "clips_per_s": {k: round(v, 2) for k, v in rate.items()},
               "mib_per_clip": {k: round(v, 2) for k, v in per_clip.items()},
               "mib_per_batch": {k: round(budgets[k].fixed_overhead / 2**20, 1) for k in models}}
    log.info("backbone throughput: %s", details)
    return [Figure("model_backbone_clips_per_s", f"{BACKBONE} embedding pass, clips/s (CPU)",
                   round(rate[BACKBONE], 2), "clips/s", f"{n_clips} clips of {seconds:g} s, engine batches under "
                   f"the budget; the default CNN on mel+CQT: {rate['default CNN']:.2f} clips/s", details=details),
            Figure("model_backbone_speed_ratio", f"{BACKBONE} / default CNN clips per second (CPU)",
                   round(rate[BACKBONE] / rate["default CNN"], 3), "x", "same clips, side by side"),
            Figure("model_backbone_mib_per_clip", f"{BACKBONE} memory per {seconds:g} s clip (engine's measure)",
                   round(per_clip[BACKBONE], 2), "MiB", f"bytes per padded frame measured by the cost probe x "
                   f"frames, plus {budgets[BACKBONE].fixed_overhead / 2**20:.0f} MiB per batch; the default CNN: "
                   f"{per_clip['default CNN']:.2f} MiB, plus {budgets['default CNN'].fixed_overhead / 2**20:.0f} "
                   "MiB per batch")]
